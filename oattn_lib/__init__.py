"""oattn: organized attention (Fasina et al., arXiv 2506.15541) as a reproducible workflow.

The numerical core follows docs/method.md, one module per section: `trees` (§2),
`haar` (§3), `emd` (§4), `questionnaire` (§5), `entropy` (§6), `paraproduct` (§7),
`diffusion` (§8). Models, data and extraction live in `models`, `data`, `extract`;
zarr storage in `store`; figures in `plots`.

`analyze(model, prompts)` (`analysis`) runs the workflow's whole analysis of one model on a
user's prompts and returns its tables, claims, a head drawn inline and the explorer page;
`compare(a, b)` (`comparison`) sets two of them side by side; `from_transformer_lens` and
`from_nnsight` (`adapters`) take attention from those tools' runs. The
Python API (`api`), on labelled xarray objects, is exported here and imported on first
use (PEP 562), so `import oattn_lib` imports neither torch nor transformers:
`extract` (attention of a Hugging Face model on prompts), `organize` (the 3-D
questionnaire), `entropies` (Haar entropies and sparsity), `paraproduct_residual`
(Theorem 1 on one head), `stability_replicates` (how far those numbers move under perturbations that
carry no information) and `explorer_page` (the interactive page). examples/api_tour.py
walks through them. `oattn_lib.stages.kernels.compile_kernels` compiles the numba kernels into
their disk cache ahead of the first call, which otherwise does it once per machine
(`kernel_notice`); it is not exported here, so that no stage's code fingerprint depends on it.
"""
from ._lazy import lazy_exports

__version__ = "0.5.0"  # written here only: pyproject.toml reads it; CITATION.cff, CHANGELOG.md agree

_EXPORTS = {"api": ("extract", "organize", "entropies", "paraproduct_residual", "stability_replicates", "explorer_page"),
            "analysis": ("analyze", "Analysis"), "comparison": ("compare", "Comparison"),
            "adapters": ("from_transformer_lens", "from_nnsight")}
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
