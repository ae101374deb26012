"""oattn: organized attention (Fasina et al., arXiv 2506.15541) as a reproducible workflow.

The numerical core follows docs/method.md, one module per section: `trees` (§2),
`haar` (§3), `emd` (§4), `questionnaire` (§5), `entropy` (§6), `paraproduct` (§7),
`diffusion` (§8). Models, data and extraction live in `models`, `data`, `extract`;
zarr storage in `store`; figures in `plots`.
"""
__version__ = "0.1.0"
