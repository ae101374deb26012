"""The interactive explorer of organized attention: one self-contained HTML page per model
(plotly.js inline, no network), and an index linking the models.

`build.model_payload` reads a model's stores (each shown head's own 2-D organization and
paraproduct residual from the organize2d stage's, or made by `heads2d` without them); `encode` plans the
resolution that fits the page's budget (level of detail: heads averaged over tree folders,
`lod`); `page` writes the HTML around plotly.js and the page's own script and style sheet (the package
data `app.js` and `page.css`).

Names are imported on first use (PEP 562): the jobs that encode samples (`build.page_plan`,
`build.encode_page_sample`) import `build` alone, so their code fingerprint leaves out the page's
script and style sheet, and editing those reruns the pages only.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "build": ("model_payload", "page_plan", "encode_page_sample", "assemble_payload"),
    "page": ("render_page", "render_index", "read_meta", "resolution_note"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
