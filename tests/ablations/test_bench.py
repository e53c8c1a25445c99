"""The benchmark runs end to end and writes its report (speed itself is measured by `nox -s bench`, not asserted)."""

import json
from pathlib import Path

import pytest
import torch

from ablations.bench import scoring
from ablations.bench.cpu import profiling
from ablations.bench.cpu.measure import main
from ablations.bench.variants import FullReorderCache, StridedCrossCache, TorchOpsReorderCache
from ablations.data.bpe import PAD
from ablations.scoring.decoding import beam_search
from ablations.training import throughput
from ablations.training.throughput import choose_threads
from model import Transformer, TransformerConfig, kernels
from model.cache import KVCache
from tests.helpers import needs_data

TINY = "N=1,d_model=32,d_ff=64,h=2,d_k=16,d_v=16,vocab_size=1000"


def tiny_bench(out: Path, runs: Path, *extra: str) -> int:
    """`python -m ablations.bench` on one step and two short sentences of a one-layer model: every variant, quickly."""
    sizes = ["--steps", "1", "--batch-tokens", "300", "--decode-sentences", "2", "--decode-length", "6"]
    rest = ["--extra", "2", "--decode-reps", "1", "--sizes", "base", "--vocab", "1000", "--threads", "1"]
    data = ["--config", TINY, "--preset", "multi30k", "--out", str(out), "--runs", str(runs)]
    return main([*sizes, *rest, *data, *extra])


@needs_data
@pytest.mark.slow
def test_bench_writes_markdown_and_json_for_every_variant(tmp_path):
    out = tmp_path / "new-folder" / "bench.md"  # made when the report is written
    code = tiny_bench(out, tmp_path / "runs", "--warmup", "1")
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    variants = [r["variant"] for r in report["training"]]
    assert (
        variants[0] == "reference"
        and "before: all of the above" in variants
        and "torch.nn.Transformer adapter" in variants
    )
    assert all(r["tgt_tokens_per_s"] > 0 and 0 < r["gemm_fraction"] for r in report["training"])
    assert [d["system"] for d in report["decoding"]][:4] == [
        "reference",
        "before: attention through torch ops, no fused kernel",
        "before: cache rows moved by torch ops (gather, then write back)",
        "before: cross-attention keys/values per beam",
    ]
    assert "## What each speed choice changed (same run)" in out.read_text()


@pytest.mark.parametrize("cache", [FullReorderCache, StridedCrossCache, TorchOpsReorderCache])
def test_a_before_cache_decodes_the_same_hypotheses_as_the_reference(cache):
    cfg = TransformerConfig(N=2, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=50, P_drop=0.0)
    torch.manual_seed(0)
    reference = Transformer(cfg).eval()
    before = Transformer(cfg).eval()
    before.load_state_dict(reference.state_dict())
    before.new_cache = cache
    src = torch.randint(4, 50, (3, 7))
    src[0, 5:] = PAD
    hyps = [beam_search(m, src, src.eq(PAD), beam=4, extra_len=6) for m in (reference, before)]
    assert hyps[0] == hyps[1]


def test_the_strided_before_cache_keeps_cross_attention_keys_and_values_strided_where_the_reference_does_not():
    cfg = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8, vocab_size=50)
    model, src = Transformer(cfg).eval(), torch.randint(4, 50, (2, 5))
    caches = [KVCache(), StridedCrossCache()]
    with torch.no_grad():
        for cache in caches:
            model.decode(
                torch.ones(2, 1, dtype=torch.long),
                model.encode(src, src.eq(PAD)),
                src.eq(PAD),
                torch.zeros(2, 1, dtype=torch.bool),
                cache,
            )
    reference, strided = (cache.kv["cross.0"] for cache in caches)
    assert all(x.is_contiguous() for x in reference) and not any(x.is_contiguous() for x in strided)
    assert all(torch.equal(a, b) for a, b in zip(reference, strided))


@needs_data
@pytest.mark.slow
def test_bench_by_cpu_time_says_so_and_leaves_out_the_thread_count_variants(tmp_path):
    out = tmp_path / "bench.md"
    code = tiny_bench(out, tmp_path / "runs", "--warmup", "0", "--clock", "cpu")
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert not [r for r in report["training"] if "thread count" in r["variant"] or "all of the above" in r["variant"]]
    assert "before: torch's default thread count: not timed with --clock cpu" in " ".join(report["skipped"])
    assert "Times are this process's CPU time (`--clock cpu`)" in out.read_text()


def test_bench_bad_config_is_one_line(tmp_path, capsys):
    assert main(["--config", "d_model=0", "--out", str(tmp_path / "b.md")]) == 2
    assert capsys.readouterr().err.startswith("error: config field d_model=0")


def test_bench_unknown_size_is_one_line(tmp_path, capsys):
    assert main(["--sizes", "huge", "--out", str(tmp_path / "b.md")]) == 2
    assert "--sizes 'huge': choose from base, scaled" in capsys.readouterr().err


def test_thread_count_is_the_request_else_omp_num_threads_else_one_for_small_models(monkeypatch):
    small, base = TransformerConfig(d_model=64, d_ff=256, d_k=8, d_v=8), TransformerConfig()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert choose_threads(small) == 1
    assert 1 <= choose_threads(base) <= __import__("os").cpu_count()
    assert choose_threads(small, requested=3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(small) == 2
    with pytest.raises(ValueError, match="threads=0 must be at least 1"):
        choose_threads(small, requested=0)


def test_free_cores_are_the_cores_not_busy_now_not_the_lagging_load_average(monkeypatch):
    samples = iter([(1000, 500), (1400, 800)])  # (all, idle) ticks: 100 of 400 busy, a quarter of 4 CPUs
    monkeypatch.setattr(throughput, "cpu_times", lambda: next(samples))
    monkeypatch.setattr(throughput.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(throughput.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(throughput.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(throughput.os, "getloadavg", lambda: (3.9, 3.9, 3.9))  # a minute of an install just ended
    assert throughput.free_cores() == 3


def test_without_proc_stat_free_cores_fall_back_to_the_load_average(monkeypatch):
    def missing():
        raise OSError("no /proc/stat")

    monkeypatch.setattr(throughput, "cpu_times", missing)
    monkeypatch.setattr(throughput.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(throughput.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert throughput.free_cores() == 3


@needs_data
@pytest.mark.slow
def test_profile_shares_of_training_and_beam_search_sum_to_one(tmp_path):
    out = tmp_path / "profile.md"
    code = profiling.main(
        [
            "--steps",
            "1",
            "--decode-sentences",
            "2",
            "--decode-length",
            "6",
            "--extra",
            "2",
            "--out",
            str(out),
            "--runs",
            str(tmp_path / "runs"),
        ]
    )
    assert code == 0
    report = out.read_text()
    for title in ("training step", "beam search"):
        table = report.split(f"| {title} | share of op time |")[1].split("\n\n")[0]
        shares = [float(line.rsplit("|", 2)[1].strip(" %")) for line in table.splitlines()[2:]]
        assert shares and sum(shares) == pytest.approx(100, abs=0.1 * len(shares))
    assert "GEMM (mm, bmm, addmm)" in report and "d_model 8" in report


def test_profile_counts_each_kernel_of_the_reference_under_a_kind_of_its_own():
    named = {op for ops in profiling.KINDS.values() for op in ops}
    assert {
        kernels.PROFILER_NAME,
        kernels.NARROW_PROFILER_NAME,
        kernels.LOSS_PROFILER_NAME,
        kernels.REORDER_PROFILER_NAME,
    } <= named


@pytest.mark.parametrize("command", [main, profiling.main], ids=["bench", "profiling"])
def test_a_count_below_one_is_a_one_line_error(command, tmp_path, capsys):
    assert command(["--decode-sentences", "0", "--out", str(tmp_path / "out.md")]) == 2
    assert capsys.readouterr().err == "error: --decode-sentences 0: give a whole number of at least 1\n"


@pytest.mark.parametrize("command", [main, profiling.main], ids=["bench", "profiling"])
def test_an_output_path_it_cannot_write_is_a_one_line_error_before_any_measuring(command, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert command(["--out", str(blocker / "out.md"), "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {blocker}: cannot write there ({blocker} is not a writable folder)")
    assert err.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing read or cached: it stopped before the data


def test_a_reports_command_line_shows_absolute_paths_relative_to_the_working_directory():
    from ablations.bench.report import shown_args

    assert (
        shown_args(["--runs", str(Path.cwd().parent / "runs"), "--sizes", "scaled"]) == "--runs ../runs --sizes scaled"
    )


@pytest.mark.parametrize("flags", [["--rows", "0"], ["--repeats", "0"], ["--vocab", "-3"]])
def test_the_scoring_bench_refuses_a_count_below_one_in_one_line(flags, capsys):
    assert scoring.main(flags) == 2
    assert capsys.readouterr().err == f"error: {flags[0]} {flags[1]}: give a whole number of at least 1\n"
