# The numba kernels compiled once into their disk cache (beside oattn_lib, or the user's cache
# directory), before the organize and decompose jobs that run them: without it the first jobs
# of a run each compiled the same kernels at once. Consumers take KERNELS as an ancient()
# input: it orders them after this job, and recompiling never reruns them.


rule kernels:
    output:
        report=KERNELS,
    log:
        f"{R}/logs/kernels.log",
    benchmark:
        f"{R}/benchmarks/kernels.tsv"
    # with training: every organize job waits for it
    priority: PRIORITY["train"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        runtime=config["resources"]["analysis_runtime"],
    params:
        code=kernels_code(),
    script:
        "../../scripts/numba_kernels.py"
