"""The interactive explorer of organized attention: one self-contained HTML page per model
(plotly.js inline, no network), and an index linking the models.

`build.model_payload` reads a model's stores (each shown head's own 2-D organization and
paraproduct residual from the organize2d stage's, or made by `heads2d` without them); `encode` plans the
resolution that fits the page's budget (level of detail: heads averaged over tree folders,
`lod`); `page` writes the HTML around plotly.js and the page's own script and style sheet (the package
data `app.js` and `page.css`).
"""
from .build import model_payload
from .page import read_meta, render_index, render_page, resolution_note

__all__ = ["model_payload", "render_page", "render_index", "read_meta", "resolution_note"]
