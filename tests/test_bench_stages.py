"""bench/stages.py: the per-stage table of a finished run (the docs' measurements page shows the LLM
preset's), from the benchmark files Snakemake writes (one per job)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_stages", REPO / "bench" / "stages.py")
stages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stages)

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _bench(path: Path, s: float, rss: float, cpu: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{s}\t0:00:00\t{rss}\t1\t1\t1\t0\t0\t50\t{cpu}\n")


def test_jobs_of_a_rule_are_summed_and_their_peak_is_the_largest(tmp_path, capsys):
    b = tmp_path / "benchmarks"
    _bench(b / "lm" / "organize_sample0.tsv", 10.0, 900.0, 18.0)
    _bench(b / "lm" / "organize_sample1.tsv", 30.0, 2900.0, 55.0)
    _bench(b / "lm" / "organize_sample12.tsv", 20.0, 1500.0, 39.0)
    _bench(b / "lm" / "entropy.tsv", 4.0, 700.0, 3.0)
    _bench(b / "softmax_free" / "vit" / "tensor" / "seed0" / "train.tsv", 7.0, 300.0, 7.0)
    # each job's log opens with its start-up (runtime.setup_logging); the third job has no log
    for k, t in ((0, 2.5), (1, 3.25)):
        log = tmp_path / "logs" / "lm" / f"organize_sample{k}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"2026-11-25 18:00:00,000 INFO oattn: start-up {t} s (interpreter, imports; loaded: torch)\n"
                       "2026-11-25 18:00:09,000 INFO oattn: start-up 99 s, a later line\n")
    (tmp_path / "logs" / "lm" / "entropy.log").write_text("INFO oattn: start-up 1.5 s (loaded: none)\n")
    table = {(r["model"], r["rule"]): r for r in stages.summarise(stages.read_benchmarks(tmp_path))}
    org = table[("lm", "organize")]
    assert (org["jobs"], org["wall_s"], org["wall_max_s"], org["cpu_s"], org["peak_rss_mb"]) == (3, 60.0, 30.0, 112.0,
                                                                                                 2900)
    assert table[("lm", "entropy")]["jobs"] == 1
    assert table[("lm", "entropy")]["startup_s"] == 1.5
    # a job without a start-up line makes its stage's total unknown, not smaller; the largest is known
    assert org["startup_s"] != org["startup_s"] and org["startup_max_s"] == 3.25
    assert table[("softmax_free/vit/tensor/seed0", "train")]["peak_rss_mb"] == 300
    assert stages.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| lm | organize | 3 | 60 | 30 | 112 | 2900 | nan | 3.25 |" in out
    assert "5 jobs" in out and "largest peak RSS 2900 MB" in out


def test_a_file_that_is_not_a_benchmark_is_named(tmp_path):
    p = tmp_path / "benchmarks" / "lm" / "extract_sample0.tsv"
    p.parent.mkdir(parents=True)
    p.write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match=r"extract_sample0\.tsv: no column 's'"):
        stages.read_benchmarks(tmp_path)
    with pytest.raises(FileNotFoundError, match="no benchmarks"):
        stages.read_benchmarks(tmp_path / "elsewhere")


def test_the_logs_whole_job_usage_replaces_snakemakes_samples(tmp_path, capsys):
    """Snakemake stops sampling a job's CPU time at 15 s and then samples every 30 s: where the
    job's log ends with the kernel's count (runtime.job_usage), its CPU time is the log's and its
    peak the larger of the two; a job without that line keeps Snakemake's numbers."""
    b = tmp_path / "benchmarks"
    _bench(b / "lm" / "decompose_sample0.tsv", 43.0, 3000.0, 15.4)   # sampled until 15 s
    _bench(b / "lm" / "decompose_sample1.tsv", 44.0, 3100.0, 15.0)   # its log is older
    _bench(b / "lm" / "organize_sample0.tsv", 78.0, 2900.0, 72.0)    # log's peak below the sample's
    logs = tmp_path / "logs" / "lm"
    logs.mkdir(parents=True)
    line = "2026-11-27 20:33:10,000 INFO oattn: resources used: wall {} s, CPU {} s, peak RSS {} MB\n"
    (logs / "decompose_sample0.log").write_text("x INFO oattn: start-up 4.0 s (loaded: torch)\n"
                                                + line.format(42.9, 41.25, 3600.5))
    (logs / "decompose_sample1.log").write_text("x INFO oattn: start-up 4.0 s (loaded: torch)\n")
    (logs / "organize_sample0.log").write_text(line.format(77.9, 75.0, 2800.0))
    table = {(r["model"], r["rule"]): r for r in stages.summarise(stages.read_benchmarks(tmp_path))}
    dec, org = table[("lm", "decompose")], table[("lm", "organize")]
    assert (dec["cpu_s"], dec["peak_rss_mb"], dec["logged"]) == (56.2, 3600, 1)
    assert (org["cpu_s"], org["peak_rss_mb"], org["logged"]) == (75.0, 2900, 1)
    assert stages.main([str(tmp_path)]) == 0
    assert "CPU and peaks of 2 jobs from their logs" in capsys.readouterr().out
