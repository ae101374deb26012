# Softmax vs Tensor Attention (issue 7): every selected txl/vit model trained with softmax and
# with each tensor-attention variant, several seeds, the same steps; Table 5 and Figure 8.
# Its own target, `snakemake softmax_free`; in the default target only with
# softmax_free.enabled (or once it has been run, so that the report keeps Table 5).

SF = config["softmax_free"]


def _softmax_free_models():
    eligible = [n for n, m in MODELS.items() if m["kind"] == "txl"
                or (m["kind"] == "vit" and m.get("arch", {}).get("variant", "custom") == "custom")]
    if not SF["models"]:
        return eligible
    bad = [n for n in SF["models"] if n not in eligible]
    if bad:
        raise ValueError(f"softmax_free.models: {bad} are not txl or custom vit models of `models`; "
                         f"allowed: {eligible}")
    return list(SF["models"])


SF_MODELS = _softmax_free_models()
SF_ATTENTIONS = ["softmax"] + list(SF["variants"])
SF_RUNS = [(m, a, s) for m in SF_MODELS for a in SF_ATTENTIONS for s in range(SF["seeds"])]
SF_DIR = f"{R}/softmax_free"
SF_RUN = f"{SF_DIR}/{{model}}/{{attention}}/seed{{seed}}"


def softmax_free_runs():
    """Every run of the experiment as the dict `softmax_free.table5` reads."""
    return [{"model": m, "kind": MODELS[m]["kind"], "attention": a, "seed": s,
             "metrics": f"{SF_DIR}/{m}/{a}/seed{s}/metrics.json",
             "analysis": f"{SF_DIR}/{m}/{a}/seed{s}/analysis"} for m, a, s in SF_RUNS]


rule softmax_free_train:
    input:
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
    output:
        checkpoint=f"{SF_RUN}/checkpoint.pt",
        metrics=f"{SF_RUN}/metrics.json",
    wildcard_constraints:
        attention="softmax|tensor_[a-z_]+",
        seed=r"\d+",
    params:
        kind=lambda w: model_cfg(w)["kind"],
        arch=lambda w: model_cfg(w)["arch"],
        train=lambda w: {k: v for k, v in model_cfg(w)["train"].items() if k != "seed"},
        data=lambda w: model_cfg(w)["data"],
        attention=lambda w: w.attention,
        seed=lambda w: int(w.seed),
        steps=SF["steps"],
        device=config["device"],
        code=code_version("softmax_free_train", "softmax_free"),
    log:
        f"{R}/logs/softmax_free/{{model}}_{{attention}}_seed{{seed}}_train.log",
    benchmark:
        f"{R}/benchmarks/softmax_free/{{model}}_{{attention}}_seed{{seed}}_train.tsv"
    threads: 1
    resources:
        **GPU_RESOURCES,
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/softmax_free.py"


rule softmax_free_analyse:
    input:
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
        checkpoint=f"{SF_RUN}/checkpoint.pt",
        metrics=f"{SF_RUN}/metrics.json",
    output:
        analysis=directory(f"{SF_RUN}/analysis"),
    wildcard_constraints:
        attention="softmax|tensor_[a-z_]+",
        seed=r"\d+",
    params:
        kind=lambda w: model_cfg(w)["kind"],
        model=lambda w: {"name": w.model, "data": model_cfg(w)["data"],
                         "extract": {"seed": model_cfg(w)["extract"]["seed"]}},
        n_samples=SF["n_samples"],
        quantity=SF["quantity"],
        paraproduct_samples=SF["paraproduct_samples"],
        organize=config["organize"],
        questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
        head_top_k=config["entropy"]["head_top_k"],
        network_top_k=config["entropy"]["network_top_k"],
        device=config["device"],
        code=code_version("softmax_free_analyse", "softmax_free"),
    log:
        f"{R}/logs/softmax_free/{{model}}_{{attention}}_seed{{seed}}_analyse.log",
    benchmark:
        f"{R}/benchmarks/softmax_free/{{model}}_{{attention}}_seed{{seed}}_analyse.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=config["resources"]["analysis_runtime"],
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/softmax_free.py"


rule softmax_free_table:
    input:
        metrics=[r["metrics"] for r in softmax_free_runs()],
        analysis=[r["analysis"] for r in softmax_free_runs()],
    output:
        csv=f"{SF_DIR}/table5.csv",
        md=report(f"{SF_DIR}/table5.md", caption="../report/table5.rst", category="Softmax-free"),
        fig=report(f"{SF_DIR}/fig8.png", caption="../report/fig8.rst", category="Softmax-free"),
    params:
        runs=softmax_free_runs(),
        code=code_version("softmax_free_table", "softmax_free"),
    log:
        f"{R}/logs/softmax_free/table5.log",
    threads: 1
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/softmax_free.py"


rule softmax_free:
    input:
        rules.softmax_free_table.output,
