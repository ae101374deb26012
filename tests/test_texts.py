"""The user's own texts as an hf model's samples (`data.texts`, `data.chat`, `n_samples: all`):
the four file forms, one sample per text at its own length, the chat template, the held-out
texts of the ablation (padded and masked), and the whole workflow on prompts of different
lengths. Real files, the real all-MiniLM-L6-v2 and tiny random decoders; nothing downloaded.
"""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
import yaml

from oattn_lib.config import ConfigError, complete_model
from oattn_lib.data.prompts import read_texts, unescape_line
from oattn_lib.models import hf_recording
from oattn_lib.models.files import minilm_path
from oattn_lib.models.kinds.hf import encode_text, padded
from oattn_lib.stages.data import prepare_data
from oattn_lib.stages.extract import extract_samples

import wfutil

PROMPTS = ["When Mary and John went to the store, John gave a drink to",
           "red blue green seven red blue green seven red blue green",
           "def add(a, b):\\n    return a + b",
           "Paris is the capital of",
           "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen"]
TEXTS = [unescape_line(p) for p in PROMPTS]
SMALL = {"head_top_k": 16, "network_top_k": 10}


def write_forms(d: Path) -> dict:
    """The same texts in each of the four forms under `d`: {form: (path, field)}."""
    import datasets

    (d / "prompts.txt").write_text("\n".join(PROMPTS[:2]) + "\n\n" + "\n".join(PROMPTS[2:]) + "\n")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    (d / "txt").mkdir()
    for i, t in enumerate(TEXTS):
        (d / "txt" / f"{i:02d}.txt").write_text(t)
    datasets.Dataset.from_dict({"content": TEXTS, "n": list(range(len(TEXTS)))}).save_to_disk(str(d / "ds"))
    return {"lines": (d / "prompts.txt", None), "jsonl": (d / "prompts.jsonl", "prompt"),
            "txt_dir": (d / "txt", None), "dataset": (d / "ds", "content")}


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    return write_forms(tmp_path_factory.mktemp("texts"))


@pytest.mark.parametrize("form", ["lines", "jsonl", "txt_dir", "dataset"])
def test_every_form_reads_the_same_texts_in_order(forms, form):
    path, field = forms[form]
    assert read_texts(path, field) == TEXTS
    # the escape: one line of the file is a multi-line text
    assert TEXTS[2] == "def add(a, b):\n    return a + b"


def test_escapes_of_a_prompts_file():
    assert unescape_line(r"a\nb") == "a\nb"
    assert unescape_line(r"a\\nb") == "a\\nb"  # a doubled backslash is one backslash, then n
    assert unescape_line(r"c:\\dir") == "c:\\dir"


@pytest.mark.parametrize("content, expect", [
    (None, "does not exist"),
    ("", "holds no text"),
    ("\n  \n", "holds no text"),
    ('{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
    ('{"text": "a"}\n', "line 1 has no field 'prompt'"),
    ('{"prompt": 3}\n', "is a int, not a string"),
])
def test_bad_texts_are_one_line_naming_the_key_and_line(tmp_path, content, expect):
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as err:
        read_texts(path, "prompt", key="models[0].data.texts")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("models[0].data.texts: ") and expect in msg and str(path) in msg


def test_a_saved_dataset_without_the_column_names_its_columns(forms):
    path, _ = forms["dataset"]
    with pytest.raises(ValueError, match=r"no column 'text'.*\['content', 'n'\]"):
        read_texts(path)


# -- the config -------------------------------------------------------------------------------
def model(path, **data):
    return {"name": "p", "kind": "hf", "path": "minilm", "data": {"texts": str(path), **data},
            "extract": {"n_samples": "all", "max_length": 24}}


def test_n_samples_all_counts_the_texts_and_a_larger_number_is_refused(forms):
    path, field = forms["jsonl"]
    assert complete_model(model(path, field=field), entropy=SMALL)["extract"]["n_samples"] == len(TEXTS)
    m = model(path, field=field)
    m["extract"]["n_samples"] = len(TEXTS) + 1
    with pytest.raises(ConfigError, match=rf"extract.n_samples: {len(TEXTS) + 1} samples requested but the model's "
                                          rf"inputs hold {len(TEXTS)}"):
        complete_model(m, entropy=SMALL)
    corpus = {"name": "c", "kind": "hf", "path": "minilm", "extract": {"n_samples": "all"}}
    with pytest.raises(ConfigError, match="n_samples: all needs inputs counted before the run"):
        complete_model(corpus, entropy=SMALL)


@pytest.mark.parametrize("edit, expect", [
    (lambda m: m["data"].update(texts="/nonexistent/prompts.txt"), r"models\[0\].data.texts: /nonexistent/prompts.txt "
                                                                     "does not exist"),
    (lambda m: m["data"].update(chat=True), r"models\[0\].data.chat: the tokenizer of 'minilm' has no chat template"),
    (lambda m: m["data"].update(field="prompt"), r"data.texts: .*prompts.txt is a plain text file; a field name"),
    (lambda m: m["data"].pop("texts") and m["data"].update(chat=True), r"models\[0\].data.chat: only applies"),
])
def test_bad_texts_config_is_one_line(forms, edit, expect):
    m = model(forms["lines"][0])
    m["extract"]["n_samples"] = 2
    edit(m)
    with pytest.raises(ConfigError) as err:
        complete_model(m, entropy=SMALL)
    assert re.search(expect, str(err.value)) and "\n" not in str(err.value)


# -- extraction -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def extracted(forms, tmp_path_factory):
    """Every text of the prompts file extracted by minilm at max_length 20 (the last text is cut)."""
    d = tmp_path_factory.mktemp("extract")
    m = complete_model({**model(forms["lines"][0]), "extract": {"n_samples": "all", "max_length": 20}}, entropy=SMALL)
    prepare_data("hf", m["data"], d / "d.npz", d / "meta.json")
    outs = [d / f"s{i}.zarr" for i in range(len(TEXTS))]
    extract_samples("hf", m, d / "d.npz", d / "meta.json", None, outs, list(range(len(TEXTS))), device="cpu")
    return [xr.open_zarr(o, consolidated=False) for o in outs]


def test_each_text_is_one_sample_at_its_own_length_in_file_order(extracted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    for i, ds in enumerate(extracted):
        want = tok(TEXTS[i], truncation=True, max_length=20)["input_ids"]
        assert ds["token"].values.tolist() == want, i
        assert ds.sizes["query"] == ds.sizes["key"] == len(want)
        assert ds.attrs["text_index"] == i and ds.attrs["source_index"] == i
        assert ds.attrs["n_tokens_full"] == len(tok(TEXTS[i])["input_ids"])
    lengths = [ds.sizes["query"] for ds in extracted]
    assert len(set(lengths)) == len(TEXTS) and max(lengths) == 20
    assert extracted[-1].attrs["n_tokens_full"] > 20  # truncated, and recorded so


def test_a_sample_is_the_models_attention_on_that_text_alone(extracted):
    model_, tok = hf_recording.load_hf("minilm")
    res = hf_recording.hf_attention(model_, tok, [TEXTS[3]], max_length=20)
    got = extracted[3]["probs"].values
    np.testing.assert_allclose(got, res["probs"][0].numpy(), rtol=0, atol=2e-6)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """all-MiniLM-L6-v2 copied with a chat template added to its tokenizer (a real model, a real
    template that puts marker words around the user's text)."""
    d = tmp_path_factory.mktemp("chat") / "minilm-chat"
    shutil.copytree(minilm_path(), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}[CLS] {{ m['role'] }} : {{ m['content'] }} [SEP]"
                            "{% endfor %}{% if add_generation_prompt %}[MASK] assistant :{% endif %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_chat_wraps_each_text_in_the_template(chat_model, forms, tmp_path):
    from transformers import AutoTokenizer

    m = complete_model({**model(forms["lines"][0], chat=True), "path": str(chat_model),
                        "extract": {"n_samples": 2, "max_length": 64}}, entropy=SMALL)
    prepare_data("hf", m["data"], tmp_path / "d.npz", tmp_path / "meta.json")
    extract_samples("hf", m, tmp_path / "d.npz", tmp_path / "meta.json", None, [tmp_path / "s.zarr"], [1],
                    device="cpu")
    ds = xr.open_zarr(tmp_path / "s.zarr", consolidated=False)
    tok = AutoTokenizer.from_pretrained(chat_model)
    words = json.loads(ds.attrs["token_text"])
    # the template's special tokens are tokens of the sample, and the tokenizer adds none of its own
    assert words[:3] == ["[CLS]", "user", ":"] and words[-4:] == ["[SEP]", "[MASK]", "assistant", ":"]
    assert ds["token"].values.tolist() == encode_text(tok, TEXTS[1], chat=True, max_length=64)[0]
    assert ds.attrs["chat"] == 1


# -- the ablation on texts of different lengths -------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, pad_token_id=0)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("lm")
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    return d


def test_padded_rows_score_as_each_row_alone(tiny_lm):
    """Right padding with the mask gives every row the NLL (lm) and embedding (encoder) it has
    unpadded: dropping the mask from the model or from the mean changes both."""
    from oattn_lib.ablation import evaluate_masks
    from oattn_lib.models.kinds import HeldOut
    from oattn_lib.models.gating import head_layout, register_gated_attention, row_outputs

    rows = [[5, 9, 3, 7, 11, 2, 8], [4, 6, 10], [12, 13, 14, 15, 16]]
    ids, mask = padded(rows, 0)
    assert ids.shape == (3, 7) and mask.sum(1).tolist() == [7, 3, 5]
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(tiny_lm, attn_implementation=register_gated_attention()).eval()
    layout = head_layout(net, "hf")
    assert layout.objective == "lm"
    with torch.no_grad():
        together = row_outputs(net, layout, ids, mask=mask)
        alone = torch.cat([row_outputs(net, layout, torch.tensor([r])) for r in rows])
        unmasked = row_outputs(net, layout, ids)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unmasked[1:], alone[1:], atol=1e-3)
    # the evaluation of a mask batch weighs each row by its own mean, as alone
    gates = torch.ones((2, *layout.shape))
    gates[1, 0, 1] = 0
    batched = evaluate_masks(net, layout, HeldOut(ids, mask=mask), gates, batch_size=4)
    one = [evaluate_masks(net, layout, HeldOut(torch.tensor([r])), gates, batch_size=4) for r in rows]
    want = np.exp(np.mean([np.log(o) for o in one], axis=0))
    np.testing.assert_allclose(batched, want, rtol=1e-5)


def test_minilm_embeddings_pool_only_real_tokens():
    from oattn_lib.models.gating import head_layout, register_gated_attention, row_outputs

    net, tok = hf_recording.load_hf("minilm")
    net.set_attn_implementation(register_gated_attention())
    layout = head_layout(net, "hf")
    rows = [tok(t)["input_ids"] for t in TEXTS[:3]]
    ids, mask = padded(rows, tok.pad_token_id)
    with torch.no_grad():
        together = row_outputs(net, layout, ids, mask=mask)
        alone = torch.cat([row_outputs(net, layout, torch.tensor([r])) for r in rows])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)


# -- the workflow ------------------------------------------------------------------------------
def texts_config(forms) -> dict:
    """The tiny config with three minilm models on the user's texts: a prompts file (pruned, its
    held-out texts the ones not extracted), a JSONL and a saved dataset."""
    cfg = dict(wfutil.TINY)
    base = {"kind": "hf", "path": "minilm", "extract": {"quantity": "probs", "n_samples": 3, "max_length": 16}}
    cfg["models"] = [
        {**base, "name": "lines", "data": {"texts": str(forms["lines"][0])},
         "prune": {"held_out": {"hf_windows": 2}, "fraction_step": 0.5, "random_seeds": 1}},
        {**base, "name": "jsonl", "data": {"texts": str(forms["jsonl"][0]), "field": "prompt"},
         "extract": {**base["extract"], "n_samples": 2}, "prune": {"enabled": False}},
        {**base, "name": "ds", "data": {"texts": str(forms["dataset"][0]), "field": "content"},
         "extract": {**base["extract"], "n_samples": "all"}, "prune": {"enabled": False}},
    ]
    cfg["explorer"] = {"heads_2d": 2}
    # each stage one job per model (16^2 tokens x 72 heads at most): fewer job start-ups
    cfg["jobs"] = {"batch_max_entries": 20000}
    return cfg


def texts_targets() -> list[str]:
    """What the workflow tests read of a run of `texts_config`: every model's attention stores (one
    form of the texts each), and the pruned model's chain through its ablation and explorer page.
    The figures, Theorem 1 and the summary read the stores as any model's and are not made."""
    def stores(name, stage, n):
        return [f"results/{name}/{stage}/sample{i}.zarr/zarr.json" for i in range(n)]

    return (stores("lines", "attention", 3) + stores("jsonl", "attention", 2) + stores("ds", "attention", len(TEXTS))
            + stores("lines", "organized", 3)
            + ["results/lines/entropy.zarr/zarr.json", "results/lines/prune/curves.csv",
               "results/lines/explorer.html"])


@pytest.fixture(scope="module")
def texts_run(forms, tmp_path_factory):
    work = tmp_path_factory.mktemp("texts_workflow")
    wfutil.snakemake(work, texts_config(forms), *texts_targets())
    return work


@pytest.mark.workflow
def test_workflow_runs_texts_of_their_own_lengths_end_to_end(texts_run):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path())
    res = texts_run / "results"
    # each form's texts, one sample per text at its own length in file order; `all` is every text
    assert len(list((res / "ds" / "attention").glob("sample*.zarr"))) == len(TEXTS)
    for name, n in (("lines", 3), ("jsonl", 2), ("ds", len(TEXTS))):
        lengths = []
        for i in range(n):
            att = xr.open_zarr(res / name / "attention" / f"sample{i}.zarr", consolidated=False)
            want = tok(TEXTS[i], truncation=True, max_length=16)["input_ids"]
            assert att["token"].values.tolist() == want, (name, i)
            lengths.append(len(want))
        assert len(set(lengths)) > 1
    # the analysis after extraction reads the stores whatever form their texts came in: one model's
    for i in range(3):
        n = len(tok(TEXTS[i], truncation=True, max_length=16)["input_ids"])
        org = xr.open_zarr(res / "lines" / "organized" / f"sample{i}.zarr", consolidated=False)
        assert org.sizes["query"] == org.sizes["key"] == n
    ent = xr.open_zarr(res / "lines" / "entropy.zarr", consolidated=False)
    assert ent.sizes["sample"] == 3 and np.isfinite(ent["head_entropy"].values).all()
    page = (res / "lines" / "explorer.html").read_text()
    assert "mary" in page
    table1 = (res / "lines" / "tables" / "table1.md").read_text()
    assert "lines" in table1 or "|" in table1


@pytest.mark.workflow
def test_the_ablation_holds_out_the_texts_not_extracted(texts_run):
    log = (texts_run / "results" / "logs" / "lines" / "prune.log").read_text()
    m = re.search(r"held out: (\d+) texts of data.texts \((\d+) to (\d+) tokens\): \[([\d, ]+)\]; the extracted "
                  r"samples are texts \[([\d, ]+)\]", log)
    assert m, log[-2000:]
    held, used = {int(x) for x in m.group(4).split(",")}, {int(x) for x in m.group(5).split(",")}
    assert used == {0, 1, 2} and held <= {3, 4} and len(held) == int(m.group(1)) == 2
    curves = (texts_run / "results" / "lines" / "prune" / "curves.csv").read_text()
    assert curves.count("\n") > 3


@pytest.mark.workflow
def test_editing_a_prompt_reruns_from_the_data(texts_run, forms):
    path = Path(forms["jsonl"][0])
    cfg, targets = texts_config(forms), texts_targets()
    plan = wfutil.planned_jobs(wfutil.snakemake(texts_run, cfg, "-n", *targets))
    assert plan == {}, plan
    before = path.read_text()
    try:
        path.write_text(before.replace("Paris", "Rome"))  # one prompt edited
        planned = wfutil.planned_jobs(wfutil.snakemake(texts_run, cfg, "-n", *targets))
    finally:
        path.write_text(before)
    jobs = wfutil.by_stage(planned)
    assert jobs.get("prepare_data") == 1 and planned.get("extract_batch_jsonl") == 1
    # the other models' extraction and ablation read nothing of it
    assert jobs.get("prune", 0) == 0 and jobs.get("extract") == 1, planned


@pytest.mark.workflow
@pytest.mark.parametrize("edit, expect", [
    (lambda m, d: m["data"].update(texts=str(d / "missing.txt")), "models[0].data.texts: "),
    (lambda m, d: (d / "empty.jsonl").write_text("") or m["data"].update(texts=str(d / "empty.jsonl")),
     "holds no text"),
    (lambda m, d: m["data"].update(field="nope"), "no field 'nope'"),
    (lambda m, d: m["data"].update(chat=True), "no chat template"),
])
def test_bad_texts_stop_the_workflow_at_start_up(forms, tmp_path, edit, expect):
    cfg = texts_config(forms)
    cfg["models"] = [dict(cfg["models"][1], data=dict(cfg["models"][1]["data"]))]
    edit(cfg["models"][0], tmp_path)
    proc = wfutil.snakemake(tmp_path, cfg, "-n", check=False)
    assert proc.returncode != 0
    err = [line for line in (proc.stdout + proc.stderr).splitlines() if expect in line]
    assert err and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "results").exists()


def test_the_prompts_preset_plans_every_stage_for_smollm2():
    preset = yaml.safe_load((wfutil.REPO / "workflow" / "presets" / "prompts.yaml").read_text())
    m = preset["models"][0]
    assert m["data"]["chat"] is True and Path(wfutil.REPO / m["data"]["texts"]).is_file()
    n_prompts = len(read_texts(wfutil.REPO / m["data"]["texts"]))
    assert n_prompts > m["extract"]["n_samples"] >= 20  # the rest are the held-out texts
