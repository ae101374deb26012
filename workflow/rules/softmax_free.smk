# Softmax vs Tensor Attention (docs/method.md §10.5; oattn_lib/softmax_free.py): every selected txl/vit
# model trained with softmax and with each tensor-attention variant, several seeds, the same
# steps. Each run is a model of the graph (SF_MODELS, common.smk) named and stored as
# softmax_free/<model>/<attention>/seed<k>: trained here, then extracted, organized,
# decomposed (one job per sample) and its entropies computed by the ordinary rules; Table 5
# and Figure 8 are built from every run's stores. Its own target, `snakemake softmax_free`; in
# the default target only with softmax_free.enabled (or once it has been run, so that the
# report keeps Table 5).

SF_RUNS = PLAN.softmax_free_runs()


rule softmax_free_train:
    input:
        unpack(model_data),
    output:
        checkpoint=f"{R}/{{model}}/model/checkpoint.pt",
        metrics=f"{R}/{{model}}/model/metrics.json",
    log:
        f"{R}/logs/{{model}}/train.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/train.tsv"
    wildcard_constraints:
        model=name_pattern(SF_MODELS),
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **GPU_RESOURCES,
    params:
        kind=lambda w: model_cfg(w)["kind"],
        arch=lambda w: model_cfg(w)["arch"],
        train=lambda w: {k: v for k, v in model_cfg(w)["train"].items() if k != "seed"},
        data=lambda w: model_cfg(w)["data"],
        attention=lambda w: model_cfg(w)["softmax_free"]["attention"],
        seed=lambda w: model_cfg(w)["softmax_free"]["seed"],
        steps=SF["steps"],
        device=config["device"],
        code=code_version("softmax_free_train"),
    script:
        "../../scripts/softmax_free_train.py"


rule softmax_free_paraproduct:
    input:
        attention=paraproduct_attention,
        kernels=KERNELS,
    output:
        store=store(f"{R}/{{model}}/paraproduct.zarr"),
    log:
        f"{R}/logs/{{model}}/paraproduct.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/paraproduct.tsv"
    wildcard_constraints:
        model=name_pattern(SF_SOFTMAX),
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        # not measured: modelled as the figures stage (2-D questionnaires and paraproducts of heads)
        **analysis_resources("figures"),
    params:
        questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
        code=code_version("softmax_free_paraproduct"),
    script:
        "../../scripts/softmax_free_paraproduct.py"


rule softmax_free_table:
    input:
        metrics=[r["metrics"] for r in SF_RUNS],
        entropy=[store(r["entropy"]) for r in SF_RUNS],
        paraproduct=[store(r["paraproduct"]) for r in SF_RUNS if r["paraproduct"]],
    output:
        csv=f"{SF_DIR}/table5.csv",
        md=report(f"{SF_DIR}/table5.md", caption="../report/table5.rst", category="Softmax-free"),
        fig=report(f"{SF_DIR}/fig8.png", caption="../report/fig8.rst", category="Softmax-free"),
    log:
        f"{R}/logs/softmax_free/table5.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        runs=SF_RUNS,
        code=code_version("softmax_free_table"),
    script:
        "../../scripts/softmax_free_table.py"


rule softmax_free:
    input:
        rules.softmax_free_table.output,
