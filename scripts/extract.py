"""Snakemake entry: scores and probabilities of every head for one sample, or for each of a
batch of a model's samples (param `samples`, in the order of the outputs; the model is loaded once)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.extract import extract_samples

setup_logging(snakemake.log[0], snakemake.threads)
p, i = snakemake.params, snakemake.input
outs = list(snakemake.output.store)
samples = list(p.samples)
extract_samples(p.model["kind"], p.model, i.npz, i.meta, i.checkpoint or None, outs, samples, device=p.device,
                config_slice=p.model, code=p.code, prepared=i.get("prepared"))
