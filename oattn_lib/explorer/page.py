"""The explorer's HTML: one self-contained file per model (plotly.js, the data and the page's
script inline; opens from disk with no network) and an index linking the models."""
from __future__ import annotations

import html
import json
import os
from importlib import resources

__all__ = ["render_page", "render_index", "resolution_note", "read_meta", "unit_name", "stored_heads_note",
           "shown_note", "masked_note"]

# The page's style sheet and script are files of their own language beside this module, shipped
# as package data and embedded verbatim in every page (`asset`). `__assets__` declares them to the
# code fingerprint (oattn_lib.fingerprint), which hashes them with this module: editing app.js
# reruns the explorer's pages as editing this file does.
#
# app.js is the glue between the embedded data and plotly.js: it draws no plot itself, every plot
# is a plotly trace (a view with nothing to show gets an HTML note that wraps in its panel). Its state: the sample, the selected head (unit u = position of its layer *
# n_head + position of its head among the stored ones), the grid's metric, the diffusion map's
# colouring and the tree level whose folder boundaries are drawn. Every label shows the model's
# own indices (`meta.layers`, `meta.heads`: a store may hold a subset of the model's layers and
# heads). Entries the model masks (its layer's mask, `mask_rules` in encode) are null in every
# view's z, so plotly leaves them to the grey plot background, and their hover text says
# "masked". Tokens show as `collect.shown_tokens` decodes them (a leading space as ␣), in the
# hover and, for a short sample, as the views' tick labels. Every change goes through
# `schedule`, which serialises renders;
# `window.oattn.idle()` resolves once the page shows the newest state (the browser tests wait on
# it).
__assets__ = ("page.css", "app.js")


def asset(name: str) -> str:
    """The text of one of this module's `__assets__` ("page.css", "app.js"), read from the
    installed package."""
    if name not in __assets__:
        raise ValueError(f"asset: {name!r} is not one of the explorer page's assets {__assets__}")
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


BODY = """
<header><h1>Organized attention explorer — {model}</h1>
<p>{subtitle}</p></header>
<div class="controls">
 <label>Sample <select id="sample"></select></label>
 <label>Head <select id="head"></select></label>
 <label>Grid colour <select id="metric"></select></label>
 <label>Diffusion map colour <select id="colorby"></select></label>
 <label>Tree level <input id="level" type="range" min="0" max="8" step="1"> <span id="level-value"></span></label>
 <button id="reset-zoom" type="button">Reset zoom</button>
</div>
<main>
<div class="row">
 <div class="panel"><h2>Heads (layer × head) — click to select; ◦ = 2-D organization computed</h2><div id="grid"></div></div>
 <div class="panel"><h2>Diffusion map of heads (ψ1, ψ2 of the head affinity, docs/method.md §8) — click a point</h2>
  <div id="dmap"></div></div>
</div>
<div id="info"></div>
<div class="row">
 <div class="panel"><div id="view-raw"></div></div>
 <div class="panel"><div id="view-org3d"></div></div>
 <div class="panel"><div id="view-org2d"></div></div>
 <div class="panel"><div id="view-resid"></div></div>
</div>
<p class="note">Click a cell of an organized view to zoom into its row and column folders at the chosen tree level
(white lines: the folder boundaries of that level); "Reset zoom" or a double click zooms out.</p>
<section id="resolution"><h3>What is shown, at which resolution</h3>{notes}</section>
<div id="tables"></div>
</main>
"""


def unit_name(meta: dict, u: int) -> str:
    """Unit u's name on the page, by the model's own layer and head indices (a store may hold a
    subset: its `layers` and `heads`), as the page's script names it."""
    nh = meta["n_head"]
    layers, heads = meta.get("layers") or range(meta["n_layer"]), meta.get("heads") or range(nh)
    return f"L{layers[u // nh]} H{heads[u % nh]}"


def stored_heads_note(meta: dict) -> str:
    """Which of the model's layers and heads the page holds: all, or the subset by the model's
    indices (extract.layers / extract.heads)."""
    nl, nh = meta["n_layer"], meta["n_head"]
    layers, heads = meta.get("layers") or list(range(nl)), meta.get("heads") or list(range(nh))
    ml, mh = meta.get("model_layers"), meta.get("model_heads")
    every_layer = layers == list(range(nl)) and ml in (None, nl)
    every_head = heads == list(range(nh)) and mh in (None, nh)
    if every_layer and every_head:
        return f"{nl} layers × {nh} heads"
    of = lambda m, what: f" of the model's {m} {what}" if m else ""  # noqa: E731
    return (f"layers {', '.join(map(str, layers))}{of(ml, 'layers')} × heads {', '.join(map(str, heads))}"
            f"{of(mh, 'heads')} (a subset of the model, labelled by the model's indices)")


def resolution_note(meta: dict) -> list[str]:
    """Sentences for the page saying what it shows at which resolution, from the build's plan."""
    p, nq, nk = meta["plan"], meta["n_query"], meta["n_key"]
    name = lambda u: unit_name(meta, u)  # noqa: E731
    out = []
    if p["full_mode"]:
        out.append(f"Every head of every sample at full resolution ({nq} × {nk} tokens).")
    else:
        full = {s: us for s, us in p["full_units"].items() if us}
        out.append(f"Level of detail: each view of each head is averaged over a cut of its own trees into at most "
                   f"{p['side']} × {p['side']} folders (token order: the balanced binary tree of the positions; "
                   f"3-D view: the network's query and key trees; 2-D view and residual: the head's own trees), "
                   f"of {nq} × {nk} tokens. The panel titles give the resolution shown.")
        out.append("Full resolution where you zoom in (a click into a folder, or a box zoom of at most 256 × 256 "
                   "tokens), for these heads only: " + (
            "; ".join(f"sample {s}: " + ", ".join(name(u) for u in us) for s, us in full.items())
            if full else "none within the budget") + ".")
    out.append("Values are quantised to 8 bits per matrix (steps of 1/255 of its range); hover shows them.")
    if meta.get("masked"):
        out.append("Entries the model may not attend to (its own mask: a causal decoder's future, a sliding window, "
                   "padding) are drawn grey, with the hover text 'masked', in every view of a head (permuted with "
                   "the view's rows and columns); they take no part in the colour range. A level-of-detail block "
                   "is the mean of its allowed entries only, and grey where it has none.")
    if meta.get("lengths"):
        out.append("Samples of their own lengths (query × key): " + ", ".join(
            f"sample {i}: {q} × {k}" for i, (q, k) in enumerate(meta["lengths"])) + f"; the longest, {nq} × {nk}, "
            "sets the resolution.")
    if meta.get("units_2d_note"):
        out.append(f"Own 2-D organization and paraproduct residual: {meta['units_2d_note']}.")
    else:
        out.append(f"Own 2-D organization (questionnaire2d, {meta['questionnaire2d_iters']} iterations, on the "
                   f"pre-softmax scores) and paraproduct residual: computed at build time for "
                   f"{len(meta['units_2d'])} of {meta['n_layer'] * meta['n_head']} heads per sample "
                   f"(explorer.heads_2d = {meta['heads_2d']}: the figure heads, then the lowest and highest mean Haar "
                   "entropy in turn): " + ", ".join(name(u) for u in meta["units_2d"]) + ".")
    out.append(f"Data embedded: about {p['estimated_bytes'] / 1e6:.2f} MB (8-bit codes, gzip, base64; budget "
               f"{p['budget_bytes'] / 1e6:.1f} MB, explorer.data_mb). Built in {meta['build_seconds']['total']:.1f} s "
               f"({meta['build_seconds']['organize_2d']:.1f} s of 2-D organizations).")
    return out


def _json_script(obj) -> str:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    # "<" only occurs inside JSON strings, where \u003c is the same character: no "</script>"
    return text.replace("<", "\\u003c")


def shown_note(meta: dict) -> str:
    """'N samples', or 'the first N of M samples' where the page shows only some
    (explorer.max_samples; pages built before it know only N)."""
    n, total = meta["n_samples"], meta.get("n_samples_total", meta["n_samples"])
    return f"{n} samples" if total == n else f"the first {n} of {total} samples"


def masked_note(meta: dict) -> list[str]:
    """What the analysis did with the scores the model masks (docs/method.md §9.5), for a page of
    scores whose heads mask some entries; [] otherwise."""
    if meta.get("quantity") != "scores" or "masked" not in meta:
        return []
    rule = ("set per row to the mean of the row's allowed scores (extract.masked: row_mean)"
            if meta["masked"] == "row_mean" else
            "kept as the model computed them before its mask (extract.masked: keep, the paper's convention)")
    return [f"Entries the model masks (drawn empty) were, for the 3-D organization, the Haar expansions and "
            f"the entropies, {rule}; the 2-D organizations and the paraproduct compare with the model's own "
            f"masked softmax."]


def render_page(payload: dict, plotly_js: str | None = None) -> str:
    """The self-contained page of one model: markup, the data as JSON, plotly.js and the page's
    script, in that order (the markup paints before the scripts are parsed)."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs
        plotly_js = get_plotlyjs()
    m = payload["meta"]
    q = m["quantity"]
    subtitle = (f"{m['kind']} model, {stored_heads_note(m)}, {'up to ' if m.get('lengths') else ''}"
                f"{m['n_query']} tokens, "
                f"{shown_note(m)}; heads show the {'post-softmax probabilities' if q == 'probs' else 'pre-softmax scores'} "
                f"({q}). Fasina et al., Intrinsic and Extrinsic Organized Attention.")
    notes = "".join(f"<p class='note'>{html.escape(s)}</p>" for s in resolution_note(m) + masked_note(m))
    body = BODY.format(model=html.escape(m["model"]), subtitle=html.escape(subtitle), notes=notes)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>oattn explorer: {html.escape(m['model'])}</title><link rel='icon' href='data:,'>"
            f"<script id='oattn-meta' type='application/json'>{_json_script(m)}</script>"
            f"<style>\n{asset('page.css')}</style></head><body>{body}"
            f"<script id='oattn-data' type='application/json'>{_json_script(payload)}</script>"
            f"<script>{plotly_js}</script><script>\n{asset('app.js')}</script></body></html>\n")


def read_meta(page) -> dict:
    """The `meta` a page embeds near its top (model, sizes, the resolution plan), read without
    parsing the page's data."""
    head = b""
    with open(page, "rb") as f:
        while b"</script>" not in head:
            block = f.read(1 << 16)
            if not block:
                raise ValueError(f"{page}: not an explorer page (no embedded meta)")
            head += block
    start = head.find(b"<script id='oattn-meta' type='application/json'>")
    if start < 0:
        raise ValueError(f"{page}: not an explorer page (no embedded meta)")
    text = head[start:].split(b">", 1)[1].split(b"</script>", 1)[0]
    return json.loads(text.decode("utf-8"))


def render_index(models: list[dict], index_path) -> str:
    """A page linking the models' explorer pages (`models`: dicts with `model`, `path`, `meta`),
    links relative to `index_path`."""
    rows = []
    for m in models:
        meta = m["meta"]
        href = os.path.relpath(m["path"], os.path.dirname(os.path.abspath(index_path)))
        size = os.path.getsize(m["path"]) / 1e6 if os.path.exists(m["path"]) else float("nan")
        res = "full" if meta["plan"]["full_mode"] else f"level of detail ≤ {meta['plan']['side']}²"
        rows.append(f"<tr><td><a href='{html.escape(href)}'>{html.escape(meta['model'])}</a></td>"
                    f"<td>{html.escape(meta['kind'])}</td><td>{html.escape(stored_heads_note(meta))}</td>"
                    f"<td>{meta['n_query']}</td><td>{html.escape(shown_note(meta))}</td><td>{res}</td><td>{size:.1f} MB</td></tr>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>oattn explorer</title>"
            f"<link rel='icon' href='data:,'><style>\n{asset('page.css')}</style></head><body>"
            "<header><h1>Organized attention explorer</h1><p>One self-contained page per model; "
            "each opens from disk with no network. The links are relative: open this index from the "
            "results directory (results/explorer.html), not from inside the Snakemake report.</p></header><main><table id='models'><thead><tr><th>model</th>"
            "<th>kind</th><th>layers × heads</th><th>tokens</th><th>samples</th><th>resolution</th><th>size</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></main></body></html>\n")
