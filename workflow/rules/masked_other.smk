# A model's 3-D organization, Haar expansions and entropies under the other rule for the scores'
# masked entries (docs/method.md §9.5), for the claims' verdicts under both rules: the models of
# MASKED_OTHER (claims.both_masked, common.smk), each in one job for all its samples
# (masked_other_batch_<model>), writing results/<model>/masked_<rule>/{organized,decomposed}/ and
# its entropy.zarr. Target `masked_other`: every such model's.


for _rule in stage_rules("masked_other", MASKED_OTHER_JOBS, per_sample=False):

    rule:
        name:
            _rule.name
        input:
            attention=_rule.paths(ATTENTION),
            kernels=KERNELS,
        output:
            organized=masked_other_paths(MASKED_OTHER_ORGANIZED, _rule.model),
            decomposed=masked_other_paths(MASKED_OTHER_DECOMPOSED, _rule.model),
            entropy=masked_other_paths(MASKED_OTHER_ENTROPY, _rule.model),
        log:
            f"{R}/logs/{_rule.model}/masked_{MASKED_OTHER[_rule.model]}.log",
        benchmark:
            f"{R}/benchmarks/{_rule.model}/masked_{MASKED_OTHER[_rule.model]}.tsv"
        # a long job that only the claims read: started with the long leaves (oattn_lib.plan.PRIORITY)
        priority: PRIORITY["long_leaf"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **_rule.resources(
                oattn_resources.chained([analysis_resources(s) for s in ("organize", "decompose", "entropy")])
            ),
        params:
            analysis=_rule.bind(masked_other_params),
            device=config["device"],
            organize=config["organize"],
            decompose=config["decompose"],
            entropy=ENTROPY_TOP_K,
            code=code_version(_rule.name, "masked_other"),
        script:
            "../../scripts/masked_other.py"


rule masked_other:
    input:
        [masked_other_paths(MASKED_OTHER_ENTROPY, name) for name in MASKED_OTHER],
