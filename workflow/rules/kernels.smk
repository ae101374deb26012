# The numba kernels compiled once into their disk cache (beside oattn_lib, or the user's cache
# directory), before the organize and decompose jobs that run them: without it the first jobs
# of a run each compiled the same kernels at once. Its code param is the fingerprint of the
# kernels' own modules (emd, sweep and what they import), not of the stages its warm-up runs:
# it reruns only for an edit that reruns every consumer anyway (common.smk, KERNELS).


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
        code=code_version("kernels", "numba_kernels", modules=KERNEL_MODULES),
    script:
        "../../scripts/numba_kernels.py"
