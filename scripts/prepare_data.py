"""Snakemake entry: build one model's dataset (text splits and vocabulary, or images)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.data import prepare_data

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
# the model's entry is read from the config, not a param: changing its n_samples must not prepare
# the data again (and so rerun every extract job); what decides the candidates counted is a param
# (`candidates`). A softmax-free run has no entry of its own and counts nothing.
names = [m["name"] for m in snakemake.config["models"]]
i = names.index(snakemake.wildcards.model) if snakemake.wildcards.model in names else None
model = None if i is None else snakemake.config["models"][i]
prepare_data(p.kind, p.data, snakemake.output.npz, snakemake.output.meta, data_root=p.data_root, model=model,
             n_samples=None if model is None else model["extract"]["n_samples"],
             where=None if model is None else f"models[{i}] ({model['name']})")
