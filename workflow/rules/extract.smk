# Extraction (GPU-capable): scores and probabilities of every head, one zarr store per sample.
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or one job for all samples of a small model (extract_<k>_samples;
# jobs.batch_max_entries, common.smk), which loads the model once.


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


for _k in BATCH_SIZES:

    rule:
        name:
            f"extract_{_k}_samples"
        input:
            unpack(model_data),
            unpack(prepared_model),
            checkpoint=checkpoint_input,
            files=user_inputs,
        output:
            store=all_samples(ATTENTION, _k),
        log:
            f"{R}/logs/{{model}}/extract.log",
        benchmark:
            f"{R}/benchmarks/{{model}}/extract.tsv"
        wildcard_constraints:
            model=batched_pattern(_k),
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **model_job_resources("extract"),
        params:
            model=extraction_params,
            device=config["device"],
            code=code_version(f"extract_{_k}_samples", "extract"),
        script:
            "../../scripts/extract.py"
