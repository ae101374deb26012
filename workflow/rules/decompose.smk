# bi-/tri-Haar expansions, random-tree baselines, the figure heads' 2-D organization and
# paraproduct, and the diffusion map of heads (docs/method.md §3, §5.3, §7, §8).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One rule per sample, or one for each batch of a small model's samples (decompose_batch_<model>;
# jobs.batch_max_entries and batch_max_samples; oattn_lib.plan.StageRule).


for _rule in stage_rules("decompose"):

    rule:
        name:
            _rule.name
        input:
            attention=_rule.paths(ATTENTION),
            organized=_rule.paths(ORGANIZED),
        output:
            store=_rule.paths(DECOMPOSED),
        log:
            _rule.log,
        benchmark:
            _rule.benchmark
        wildcard_constraints:
            **_rule.constraints,
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **_rule.resources(analysis_resources("decompose")),
        params:
            analysis=_rule.bind(analysis_params),
            device=config["device"],
            decompose=config["decompose"],
            code=code_version(_rule.name, "decompose"),
        script:
            "../../scripts/decompose.py"
