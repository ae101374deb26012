# Extraction (GPU-capable): scores and probabilities of every head, one zarr store per sample.
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One rule per sample, or one for each batch of a small model's samples (extract_batch_<model>;
# jobs.batch_max_entries and batch_max_samples; oattn_lib.plan.StageRule), which loads the
# model once.


for _rule in stage_rules("extract"):

    rule:
        name:
            _rule.name
        input:
            unpack(_rule.bind(model_data)),
            unpack(_rule.bind(prepared_model)),
            checkpoint=_rule.bind(checkpoint_input),
            files=_rule.bind(user_inputs),
        output:
            store=_rule.paths(ATTENTION),
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
            **_rule.resources(model_job_resources("extract")),
        params:
            model=_rule.bind(extraction_params),
            samples=_rule.job_samples,
            device=config["device"],
            code=code_version(_rule.name, "extract"),
        script:
            "../../scripts/extract.py"
