"""The run's plan (oattn_lib.plan), decided from the config alone and read without Snakemake:
which rules a stage has, what each job reads and is asked for, and the targets of `all`."""
from __future__ import annotations

import copy
import inspect

import pytest

from oattn_lib import resources as job_resources
from oattn_lib.config import SCHEMA, validate_config
from oattn_lib.plan import BatchWildcards, Plan, name_pattern, on_model, rule_stage
from oattn_lib.stability import replicate_plan
from wfutil import TINY


class Wildcards(BatchWildcards):
    """A per-sample job's wildcards, as Snakemake gives them (attributes and keys())."""


def plan_of(results, **edits) -> Plan:
    cfg = copy.deepcopy(TINY)
    cfg["results"] = str(results)
    for model, extract in edits.get("extract", {}).items():
        next(m for m in cfg["models"] if m["name"] == model)["extract"] |= extract
    cfg |= {k: v for k, v in edits.items() if k != "extract"}
    validate_config(cfg, str(SCHEMA), check_disk=False)
    return Plan(cfg)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_of(tmp_path_factory.mktemp("plan") / "results")


def test_small_models_run_in_batches_and_the_rest_per_sample(plan):
    # the test preset: txl and vit are small enough for jobs.batch_max_entries, the hf model is not
    # (the softmax-free runs are models of the graph too, small ones here)
    assert plan.batched & set(plan.models) == {"txl", "vit"} and set(plan.sf_models) <= plan.batched
    rules = [r for r in plan.stage_rules("organize") if r.model in (None, "txl", "vit")]
    assert [r.name for r in rules] == ["organize", "organize_batch_txl", "organize_batch_vit"]
    one, txl = rules[0], rules[1]
    # the per-sample rule is constrained to the models not batched: a batched model's store has one producer
    assert one.constraints == {"model": name_pattern(["lm"])} and txl.constraints == {}
    assert one.paths(plan.attention) == [plan.attention]
    assert txl.paths(plan.attention) == [f"{plan.results}/txl/attention/sample{i}.zarr/zarr.json" for i in (0, 1)]
    assert txl.path(plan.entropy) == f"{plan.results}/txl/entropy.zarr/zarr.json"
    assert one.log == f"{plan.results}/logs/{{model}}/organize_sample{{sample}}.log"
    assert txl.log == f"{plan.results}/logs/txl/organize.log"
    assert txl.benchmark == f"{plan.results}/benchmarks/txl/organize.tsv"
    # stability_sample's per-sample files keep their own name, for its replicated models only
    stab = plan.stage_rules("stability_sample", plan.stability_batch_jobs, plan.stability_per_sample)
    assert [r.name for r in stab] == ["stability_sample", "stability_sample_batch_txl"]
    assert stab[0].log.endswith("/logs/{model}/stability_sample{sample}.log")
    assert stab[0].constraints == {"model": name_pattern(["lm"])} and stab[1].samples == (0,)


def test_a_model_of_several_batches_gets_a_rule_and_a_log_per_batch(tmp_path):
    plan = plan_of(tmp_path, extract={"txl": {"n_samples": 5}}, jobs={"batch_max_entries": 3000,
                                                                       "batch_max_samples": 2})
    rules = [r for r in plan.stage_rules("decompose") if r.model == "txl"]
    assert [(r.name, r.samples) for r in rules] == [("decompose_batch_txl_samples0_1", (0, 1)),
                                                   ("decompose_batch_txl_samples2_3", (2, 3)),
                                                   ("decompose_batch_txl_samples4_4", (4,))]
    assert [r.log.rsplit("/", 1)[1] for r in rules] == ["decompose_samples0-1.log", "decompose_samples2-3.log",
                                                        "decompose_samples4-4.log"]
    assert {rule_stage(r.name) for r in rules} == {"decompose"}
    # every sample is written by exactly one rule
    assert sorted(i for r in rules for i in r.samples) == list(range(5))


def test_a_batch_rules_functions_see_the_batch_as_their_wildcards(plan):
    txl = plan.stage_rules("extract")[1]
    samples = txl.bind(plan.job_samples)
    # Snakemake reads an input function's signature to pass it what it asks for: kept
    assert list(inspect.signature(samples).parameters) == ["wildcards"]
    assert samples(Wildcards()) == [0, 1] and txl.job_samples == [0, 1]
    assert txl.bind(on_model(plan.model_data))(Wildcards()) == {
        "npz": f"{plan.results}/txl/data/dataset.npz", "meta": f"{plan.results}/txl/data/meta.json"}
    one = plan.stage_rules("extract")[0]
    assert one.job_samples(Wildcards(model="lm", sample="1")) == [1]
    # resources: the callables bound, their keyword parameters (input, attempt) still named
    res = txl.resources({"mem_mb": plan.analysis_resources("organize")["mem_mb"], "gpu": 1})
    assert res["gpu"] == 1 and list(inspect.signature(res["mem_mb"]).parameters) == ["wildcards", "input", "attempt"]


def test_work_counts_what_one_job_analyses(plan):
    assert plan.analysis_work("organize", Wildcards(model="lm", sample="1")) == 1
    assert plan.analysis_work("organize", Wildcards(model="txl", batch=[0, 1])) == 2
    assert plan.analysis_work("entropy", Wildcards(model="lm")) == 2
    # stability: the job's samples times their replicates (the reference analysis is not redone)
    st = plan.models["lm"]["stability"]
    per_sample = len(replicate_plan(st["perturbations"], st["replicates"])) - 1
    assert per_sample > 1 and plan.analysis_work("stability", Wildcards(model="lm", sample="0")) == per_sample
    assert plan.analysis_work("stability", Wildcards(model="lm", batch=[0, 1])) == 2 * per_sample
    assert plan.analysis_work("explorer", Wildcards(model="lm", part="0")) == len(plan.explorer_part_samples("lm")[0])
    # the memory asked grows with the job's attempt, from the resources model of the stage
    mem = plan.analysis_resources("organize")["mem_mb"]
    assert mem(Wildcards(model="lm", sample="0"), [], 2) == job_resources.memory_mb("organize", 0.0, 2, 0.0)
    assert mem(Wildcards(model="lm", sample="0"), [], 2) > mem(Wildcards(model="lm", sample="0"), [], 1)


def test_params_read_only_what_the_stage_depends_on(plan):
    # probabilities are 0 at masked entries whatever the rule says: the rule is not a param there
    assert plan.analysis_params("vit") == {"quantity": "probs", "crop": None, "masked": "keep"}
    assert plan.analysis_params("txl")["masked"] == plan.models["txl"]["extract"]["masked"] == "row_mean"
    ex = plan.extraction_params("lm")
    assert not {"quantity", "crop", "masked"} & set(ex["extract"])
    assert not {"prune", "stability"} & set(ex) and ex["path"] == "minilm"
    assert plan.stability_replicate_settings("txl") == {
        k: v for k, v in plan.models["txl"]["stability"].items() if k not in ("samples", "bootstrap")}
    assert plan.masked_other == {"txl": "keep"}
    assert plan.masked_other_params("txl")["masked"] == "keep"


def test_inputs_of_the_jobs_that_read_a_whole_model(plan):
    R = plan.results
    summary = plan.summary_inputs()
    # pruned models' tables, stability where a model has the section, the other masked rule for txl
    assert {k for k in summary if k.startswith("table3_")} == {f"table3_{n}" for n in plan.pruned}
    assert {k for k in summary if k.startswith("stability_")} == {"stability_txl", "stability_lm"}
    assert summary["maskedentropy_txl"] == f"{R}/txl/masked_keep/entropy.zarr/zarr.json"
    assert "metrics_lm" not in summary and summary["metrics_txl"] == f"{R}/txl/model/metrics.json"
    # a batched model's page reads the shown samples' stores; another reads its plan and parts
    assert plan.explorer_inputs("txl")["organized2d"] == [f"{R}/txl/organized2d/sample{i}.zarr/zarr.json"
                                                          for i in plan.shown("txl")]
    lm = plan.explorer_inputs("lm")
    assert lm["plan"] == f"{R}/lm/explorer/plan.json" and "organized2d" not in lm
    assert lm["samples"] == [f"{R}/lm/explorer/part{k}.json.gz" for k in range(len(plan.explorer_part_samples("lm")))]
    assert plan.stability_input("vit") == [] and plan.stability_input("lm") == [f"{R}/lm/stability.zarr/zarr.json"]


def test_targets_of_all(tmp_path):
    plan = plan_of(tmp_path / "results")
    targets = plan.all_targets()
    assert {t for t in targets if t.endswith("fig7.png")} == {f"{plan.results}/{n}/figures/fig7.png"
                                                               for n in plan.pruned}
    assert all(f"{plan.results}/{n}/heads.parquet" in targets for n in plan.models)
    assert not any("softmax_free" in t for t in targets)
    # a softmax-free experiment run before stays in the report (its Table 5) when it is off
    (tmp_path / "results" / "softmax_free").mkdir(parents=True)
    (tmp_path / "results" / "softmax_free" / "table5.md").write_text("| |")
    assert f"{plan.results}/softmax_free/fig8.png" in plan.all_targets()
    compared = plan_of(tmp_path / "other", compare=[{"a": "txl", "b": "vit"}])
    assert f"{compared.results}/compare/txl_vs_vit/compare.html" in compared.all_targets()
