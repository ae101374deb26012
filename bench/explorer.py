"""Building and opening the explorer pages (a benchmark, not a test).

For each case, the page is built from stores (timed: the total, and the part spent on the
heads' own 2-D organizations), then opened in headless Chromium (Debian's `chromium`, driven
by playwright) from disk: first contentful paint, the time until every plot is drawn, and
the time a click on another head takes to redraw the four views.

Cases:
- `--results DIR`: every model of a finished run (DIR/<model>/...), rebuilt from its stores
  with the explorer's defaults (the pages the workflow writes);
- `default`: synthetic stores of the shapes of the default config (config.yaml: txl-tiny 64
  tokens and vit-tiny 65 tokens with 4 x 4 heads, minilm 64 tokens with 6 x 12 heads; 6 samples,
  8 heads organized in 2-D per sample with 10 questionnaire iterations);
- `lod`: synthetic 1024 tokens x 32 heads x 2 samples (the level of detail and full-resolution
  extras; 1 head in 2-D, 1 iteration), and the plan (resolution, size) of 1024 tokens x 270
  heads x 6 samples, the size of SmolLM2-135M (30 layers x 9 heads) at 1024 tokens.
Synthetic stores: oattn_lib.explorer.synthetic (the build cost does not depend on their trees).
Prints one line per page and one JSON object.
Usage: python bench/explorer.py [--results results] [--cases default,lod] [--no-browser]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from oattn_lib.explorer.encode import plan
from oattn_lib.explorer.synthetic import synthetic_model
from oattn_lib.stages.explorer import explorer
from oattn_lib.store import read_store

DEFAULTS = dict(heads_2d=8, max_side=128, data_mb=9.0)


def real_models(results: Path) -> list[dict]:
    out = []
    for base in sorted(p for p in results.iterdir() if (p / "entropy.zarr").exists() and (p / "tables").exists()):
        n = len(list((base / "attention").glob("sample*.zarr")))
        org = read_store(base / "organized/sample0.zarr")
        att = read_store(base / "attention/sample0.zarr")
        out.append({"name": base.name, "kind": att.attrs.get("kind", "?"), "quantity": org.attrs["quantity"],
                    "base": base, "n_samples": n})
    return out


def build(m: dict, out: Path, **kw) -> dict:
    base, n = m["base"], m["n_samples"]
    opt = {k: (base / sub if (base / sub).exists() else None) for k, sub in
           (("table3_csv", "tables/table3.csv"), ("table4_csv", "tables/table4.csv"),
            ("rankings_csv", "prune/rankings.csv"))}
    page = out / m["name"] / "explorer.html"
    t = time.perf_counter()
    explorer(m["name"], m["kind"], *[[base / f"{d}/sample{i}.zarr" for i in range(n)]
                                     for d in ("attention", "organized", "decomposed")],
             base / "entropy.zarr", base / "tables/table1.csv", base / "tables/table2.csv", page,
             quantity=m["quantity"], figure_heads=[[0, 0], [-1, -1]], **{**DEFAULTS, "questionnaire2d_iters": 10,
                                                                          **kw}, **opt)
    html = page.read_text()
    meta = json.loads(html.split("<script id='oattn-meta' type='application/json'>", 1)[1].split("</script>", 1)[0])
    return {"page": page, "build_s": time.perf_counter() - t, "organize_2d_s": meta["build_seconds"]["organize_2d"],
            "mb": page.stat().st_size / 1e6,
            "resolution": "full" if meta["plan"]["full_mode"] else f"lod {meta['plan']['side']}"}


def open_in_chromium(pages: list[Path]) -> list[dict]:
    from playwright.sync_api import sync_playwright

    exe = os.environ.get("OATTN_CHROMIUM") or shutil.which("chromium")
    out = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        for page in pages:
            pg = b.new_page(viewport={"width": 1500, "height": 1100})
            t = time.perf_counter()
            pg.goto(page.as_uri())
            pg.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
            ready = (time.perf_counter() - t) * 1000
            fcp = pg.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime")
            n_units = pg.evaluate("window.oattn.data.meta.n_layer * window.oattn.data.meta.n_head")
            t = time.perf_counter()
            pg.evaluate(f"window.oattn.select({n_units - 1})")
            pg.evaluate("window.oattn.idle()")
            out.append({"fcp_ms": fcp, "ready_ms": ready, "select_ms": (time.perf_counter() - t) * 1000})
            pg.close()
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--cases", default="default,lod")
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="oattn_explorer_bench_") as tmp:
        tmp = Path(tmp)
        jobs = []
        if args.results is not None:
            jobs += [("results", m, {}) for m in real_models(args.results)]
        cases = [c for c in args.cases.split(",") if c]
        if "default" in cases:
            for name, kind, n, nl, nh in (("txl-tiny", "txl", 64, 4, 4), ("vit-tiny", "vit", 65, 4, 4),
                                          ("minilm", "hf", 64, 6, 12)):
                jobs.append(("default", synthetic_model(tmp / "stores", name, kind, n, nl, nh, 6), {}))
        if "lod" in cases:
            jobs.append(("lod", synthetic_model(tmp / "stores", "llm-1024", "hf", 1024, 4, 8, 2),
                         {"heads_2d": 1, "questionnaire2d_iters": 1}))
        for case, m, kw in jobs:
            r = build(m, tmp / "pages" / case, **kw)
            rows.append({"case": case, "model": m["name"], **r})
            print(f"{case:8s} {m['name']:12s} built in {r['build_s']:6.1f} s ({r['organize_2d_s']:.1f} s 2-D), "
                  f"{r['mb']:5.2f} MB, {r['resolution']}", flush=True)
        if not args.no_browser:
            for row, b in zip(rows, open_in_chromium([r["page"] for r in rows])):
                row.update(b)
                print(f"{row['case']:8s} {row['model']:12s} first paint {b['fcp_ms']:6.0f} ms, drawn "
                      f"{b['ready_ms']:6.0f} ms, another head {b['select_ms']:5.0f} ms", flush=True)
    if "lod" in args.cases:
        p = plan(1024, 1024, 270, 6, list(range(8)), DEFAULTS["max_side"], int(DEFAULTS["data_mb"] * 1e6))
        print(f"plan for 1024 tokens x 270 heads x 6 samples, from the uncompressed bound (a build measures gzip "
              f"on its sample 0 and may afford a finer side): level of detail {p.side} x {p.side}, "
              f"{p.size / 1e6:.2f} MB of data, full resolution for {sum(len(v) for v in p.full.values())} "
              f"(sample, head) pairs")
        rows.append({"case": "plan-llm", **p.describe()})
    print(json.dumps([{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items()} for r in rows]))


if __name__ == "__main__":
    sys.exit(main())
