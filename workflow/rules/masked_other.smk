# A model's 3-D organization, Haar expansions and entropies under the other rule for the scores'
# masked entries (docs/method.md §9.5), for the claims' verdicts under both rules: the models of
# MASKED_OTHER (claims.both_masked, common.smk), each in one job for all its samples
# (masked_other_batch_<model>), writing results/<model>/masked_<rule>/{organized,decomposed}/ and
# its entropy.zarr. Target `masked_other`: every such model's.


for _suffix, _name, _samples in MASKED_OTHER_JOBS:

    rule:
        name:
            f"masked_other_batch_{_suffix}"
        input:
            attention=batch_paths(ATTENTION, _name, _samples),
            kernels=KERNELS,
        output:
            organized=masked_other_paths(MASKED_OTHER_ORGANIZED, _name),
            decomposed=masked_other_paths(MASKED_OTHER_DECOMPOSED, _name),
            entropy=masked_other_paths(MASKED_OTHER_ENTROPY, _name),
        log:
            f"{R}/logs/{_name}/masked_{MASKED_OTHER[_name]}.log",
        benchmark:
            f"{R}/benchmarks/{_name}/masked_{MASKED_OTHER[_name]}.tsv"
        # a long job that only the claims read: started with the long leaves (common.smk, PRIORITY)
        priority: PRIORITY["long_leaf"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **batch_resources(
                _name,
                _samples,
                oattn_resources.chained([analysis_resources(s) for s in ("organize", "decompose", "entropy")]),
            ),
        params:
            analysis=for_model(_name, _samples, masked_other_params),
            device=config["device"],
            organize=config["organize"],
            decompose=config["decompose"],
            entropy={k: config["entropy"][k] for k in ("head_top_k", "network_top_k")},
            code=code_version(f"masked_other_batch_{_suffix}", "masked_other"),
        script:
            "../../scripts/masked_other.py"


rule masked_other:
    input:
        [masked_other_paths(MASKED_OTHER_ENTROPY, name) for name in MASKED_OTHER],
