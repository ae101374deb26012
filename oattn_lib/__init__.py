"""oattn: organized attention (Fasina et al., arXiv 2506.15541) as a reproducible workflow.

The numerical core follows ../shared/SPEC.md, one module per section: `trees` (1),
`haar` (2), `emd` and `questionnaire` (3), `entropy` (4), `paraproduct` (5),
`diffusion` (6). Models, data and extraction live in `models`, `data`, `extract`;
zarr storage in `store`; figures in `plots`.
"""
__version__ = "0.1.0"

import os as _os

# torch and numba bring separate OpenMP runtimes; with the default (active) wait policy
# their spinning threads starve each other on a busy machine (several times slower EMD).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
