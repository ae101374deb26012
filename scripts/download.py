"""Snakemake entry (local rule): fetch one dataset or the ViT-B/16 weights, checksummed."""
from oattn_lib.runtime import setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
if p.dataset == "vit_b_16_weights":
    from oattn_lib.models.vision_transformer import fetch_vit_b_16_weights as fetch  # the torch hub cache
else:
    from oattn_lib.data.download import fetch_cifar10, fetch_wikitext103
    fetch = {"wikitext103": fetch_wikitext103, "cifar10": fetch_cifar10}[p.dataset]
try:
    fetch() if p.dataset == "vit_b_16_weights" else fetch(p.root)
except (RuntimeError, OSError) as exc:
    raise RuntimeError(f"{exc}\nWithout internet access, provide the files yourself: "
                       f"{', '.join(snakemake.output)} (the rule is skipped once they exist).") from exc
