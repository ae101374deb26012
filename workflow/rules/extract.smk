# Extraction (GPU-capable): scores and probabilities of every head, one zarr store per sample.
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or one job for each batch of a small model's samples (extract_batch_<model>;
# jobs.batch_max_entries and batch_max_samples, common.smk), which loads the model once.


rule extract:
    input:
        unpack(model_data),
        unpack(prepared_model),
        checkpoint=checkpoint_input,
        files=user_inputs,
    output:
        store=[ATTENTION],
    log:
        f"{R}/logs/{{model}}/extract_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/extract_sample{{sample}}.tsv"
    wildcard_constraints:
        model=PER_SAMPLE_MODEL,
    # the analysis chain of a sample before the jobs that read all of it: a long leaf (an LLM's
    # prune) then starts early instead of alone at the end (common.smk, PRIORITY)
    priority: PRIORITY["chain"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **model_job_resources("extract"),
    params:
        model=extraction_params,
        device=config["device"],
        code=code_version("extract"),
    script:
        "../../scripts/extract.py"


for _suffix, _name, _samples in BATCH_JOBS:

    rule:
        name:
            f"extract_batch_{_suffix}"
        input:
            unpack(for_model(_name, _samples, model_data)),
            unpack(for_model(_name, _samples, prepared_model)),
            checkpoint=for_model(_name, _samples, checkpoint_input),
            files=for_model(_name, _samples, user_inputs),
        output:
            store=batch_paths(ATTENTION, _name, _samples),
        log:
            batch_file("logs", _name, "extract", _samples, BATCH_JOBS),
        benchmark:
            batch_file("benchmarks", _name, "extract", _samples, BATCH_JOBS)
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **batch_resources(_name, _samples, model_job_resources("extract")),
        params:
            model=for_model(_name, _samples, extraction_params),
            samples=_samples,
            device=config["device"],
            code=code_version(f"extract_batch_{_suffix}", "extract"),
        script:
            "../../scripts/extract.py"
