# The 3-D questionnaire per sample: query, key and head trees and affinities (docs/method.md §5.2).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One rule per sample, or, for a model small enough (jobs.batch_max_entries), one rule for each
# batch of its samples (organize_batch_<model>, jobs.batch_max_samples at a time): the same
# per-sample stores, written by one process (oattn_lib.plan.StageRule).


for _rule in stage_rules("organize"):

    rule:
        name:
            _rule.name
        input:
            attention=_rule.paths(ATTENTION),
            kernels=KERNELS,
        output:
            store=_rule.paths(ORGANIZED),
        log:
            _rule.log,
        benchmark:
            _rule.benchmark
        wildcard_constraints:
            **_rule.constraints,
        # the analysis chain of a sample before the jobs that read all of it: a long leaf (an
        # LLM's prune) then starts early instead of alone at the end (oattn_lib.plan.PRIORITY)
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **_rule.resources(analysis_resources("organize")),
        params:
            analysis=_rule.bind(analysis_params),
            device=config["device"],
            organize=config["organize"],
            code=code_version(_rule.name, "organize"),
        script:
            "../../scripts/organize.py"
