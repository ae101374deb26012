# Each sample's own 2-D organization of the heads the explorer shows in 2-D (explorer.heads_2d:
# the figure heads, whose organization the decompose stage made, then the entropy extremes),
# after the entropy stage that ranks them (docs/method.md §12.3), for the samples the page shows
# (its first explorer.max_samples). One rule per sample, beside the rest of the run (an LLM's
# prune), or one for each batch of a small model's shown samples (organize2d_batch_<model>;
# oattn_lib.plan.StageRule); the explorer's page job only reads them.


for _rule in stage_rules("organize2d", SHOWN_BATCH_JOBS):

    rule:
        name:
            _rule.name
        input:
            attention=_rule.paths(ATTENTION),
            decomposed=_rule.paths(DECOMPOSED),
            entropy=_rule.path(ENTROPY),
        output:
            store=_rule.paths(ORGANIZED_2D),
        log:
            _rule.log,
        benchmark:
            _rule.benchmark
        wildcard_constraints:
            **_rule.constraints,
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **_rule.resources(analysis_resources("organize2d")),
        params:
            analysis=_rule.bind(analysis_params),
            device=config["device"],
            organize2d=ORGANIZE2D,
            code=code_version(_rule.name, "organize2d"),
        script:
            "../../scripts/organize2d.py"
