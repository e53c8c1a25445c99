"""Data-parallel training (DDP over gloo on CPU here; NCCL on GPUs takes the same code path) and its pieces."""

import shutil
import socket
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ablations.__main__ import main
from ablations.data.batching import BatchStream
from ablations.runs import folder as R
from ablations.training import train as T
from ablations.training.distributed import (
    SINGLE,
    Ranks,
    backend,
    check_accumulation,
    from_environment,
    setup,
    shard,
    step_seed,
    teardown,
)
from model import Transformer
from tests.ablations.test_gpu_path import TINY, tiny_run, varied_pairs
from tests.ablations.test_sync import steps_reading_back
from tests.helpers import (
    ablations_argv,
    logged,
    needs_data,
    only_run,
    result,
    run_ablations,
    run_ablations_forked,
    runs_folder,
    smoke_cache,
)

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
# Row D1 has no dropout. With dropout, every rank draws its own masks (seeded by run seed, step and rank), so a
# data-parallel run equals a single process in distribution, not number for number.
ROW = "D1"


def test_every_micro_batch_of_a_step_goes_to_exactly_one_rank():
    step = list(range(6))
    shares = [shard(step, Ranks(rank, 3)) for rank in range(3)]
    assert shares == [[0, 3], [1, 4], [2, 5]]
    assert sorted(sum(shares, [])) == step
    assert shard(step, SINGLE) == step


def test_micro_batches_that_cannot_be_split_evenly_are_a_one_line_error():
    check_accumulation(4, Ranks(0, 2))
    with pytest.raises(ValueError, match=r"^--accumulation 3 cannot be split among 2 processes; .* --accumulation 2 "):
        check_accumulation(3, Ranks(1, 2))


def test_ranks_come_from_torchruns_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert from_environment() == SINGLE
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert from_environment() == Ranks(3, 4, 1) and not from_environment().main


TORCHRUN_ONE = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


@pytest.fixture
def one_gloo_rank(monkeypatch):
    """torchrun's environment for one process, and (as `run --ddp` makes it) a gloo process group of one."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name, value in {**TORCHRUN_ONE, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    ranks = from_environment(force=True)
    setup(ranks, torch.device("cpu"))
    yield ranks
    teardown()


def test_ddp_forced_at_world_one_joins_a_process_group_wraps_the_model_and_all_reduces(
    one_gloo_rank, tmp_path, monkeypatch
):
    ranks = one_gloo_rank
    assert ranks == Ranks(0, 1, 0, forced=True) and ranks.parallel and backend(ranks) == "gloo"
    assert from_environment() == SINGLE and backend(SINGLE) is None  # the same environment without --ddp
    gradients, collectives = [], []  # DDP's gradient buckets all-reduced; every all-reduce through torch.distributed
    wrap, all_reduce = T.wrap, dist.all_reduce

    def wrapped(model, ranks, device):
        module = wrap(model, ranks, device)
        assert isinstance(module, DistributedDataParallel)
        module.register_comm_hook(
            None, lambda state, bucket: gradients.append(bucket.index()) or allreduce_hook(state, bucket)
        )
        return module

    monkeypatch.setattr(T, "wrap", wrapped)
    monkeypatch.setattr(
        dist, "all_reduce", lambda *args, **kwargs: collectives.append(1) or all_reduce(*args, **kwargs)
    )
    run, (src, tgt) = tiny_run(tmp_path, 12, 5, 4, compile=False), varied_pairs(200)

    def train(stream, on_step):
        T.train(Transformer(TINY), run, stream, (src[:4], tgt[:4]), torch.device("cpu"), on_step, ranks)

    # The ranks agree on a stop at logging and checkpoint steps, where the host waits for the device anyway.
    assert steps_reading_back(monkeypatch, train, BatchStream(src, tgt, 120, seed=1)) == {4, 5, 8, 10, 12}
    assert gradients == [0] * 12  # each step's one bucket of gradients
    assert len(collectives) == 12 + 12 + 5  # the gradients' and the loss's every step, and the 5 agreements on a stop


def test_ddp_without_torchruns_environment_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    for name in TORCHRUN_ONE:
        monkeypatch.delenv(name, raising=False)
    assert main(["run", "--ddp", "--device", "cpu", "--runs", str(tmp_path), "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --ddp: no torchrun environment (RANK and WORLD_SIZE are not set); ")
    assert err.count("\n") == 1


@needs_data
@pytest.mark.slow
def test_a_run_with_ddp_records_that_it_trained_data_parallel_and_over_which_backend(
    one_gloo_rank, tmp_path_factory, capsys
):
    runs = runs_folder(tmp_path_factory.mktemp("ddp"), smoke_cache(tmp_path_factory))
    assert main(ablations_argv(runs, ROW, "--ddp", steps=4, dev_pairs=4)) == 0
    assert "x 1 data-parallel processes (DDP over gloo)" in capsys.readouterr().err
    final = R.read_json(only_run(runs) / R.FINAL)
    assert (final["status"], final["ddp"], final["dist_backend"]) == ("finished", True, "gloo")


def test_dropout_seeds_differ_between_ranks_and_steps():
    seeds = {step_seed(1, step, rank) for step in range(100) for rank in range(8)}
    assert len(seeds) == 800


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, two micro-batches per step (the global batch the two ranks split between them), seeds 1 and 2."""
    cache = smoke_cache(tmp_path_factory)
    runs = runs_folder(tmp_path_factory.mktemp("single"), cache)
    code, output = run_ablations_forked(runs, ROW, "--accumulation", "2", "--seeds", "1,2")  # forked: no imports
    assert code == 0, output[-3000:]
    return {seed: only_run(runs, f"s{seed}") for seed in (1, 2)}, cache


@pytest.fixture(scope="module")
def parallel(tmp_path_factory, single):
    """The same two runs on two gloo ranks under torchrun: seed 2 from scratch, seed 1 resumed from the single
    process's checkpoint at step 8 (its latest checkpoint, step 12, and final.json removed)."""
    reference, cache = single
    runs = runs_folder(tmp_path_factory.mktemp("parallel"), cache)
    resumed = runs / "smoke" / reference[1].name
    shutil.copytree(reference[1], resumed)
    (resumed / R.FINAL).unlink()
    (resumed / R.CHECKPOINT).unlink()
    done = run_ablations(runs, ROW, "--accumulation", "2", "--seeds", "1,2", launcher=TORCHRUN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "x 2 data-parallel processes" in done.stderr
    return {seed: only_run(runs, f"s{seed}") for seed in (1, 2)}, done.stderr


# Tolerance. Each rank computes its micro-batch's gradient as the single process does (same shapes, one thread each);
# DDP divides by 2 and gloo adds the two ranks' gradients, where the single process added the second micro-batch's
# gradient onto the first. Halving and doubling are exact and a + b = b + a in IEEE arithmetic, so with two ranks the
# runs agree bitwise (measured: they do). With more ranks, or NCCL's ring on GPUs, the float32 sum is taken in another
# order (~1e-7 relative per step); rtol 1e-5 allows that over 12 steps. Checked by mutating the code, it still fails
# when both ranks train on the same micro-batch, when each rank weights by its own tokens rather than the step's,
# and when the logged loss is not summed over the ranks. Adam makes the update blind to a constant gradient scale,
# so a wrong scale shows only in the logged loss.
RTOL = 1e-5


def assert_same_run(ours, theirs):
    torch.testing.assert_close(logged(ours), logged(theirs), rtol=RTOL, atol=0)
    ours, theirs = result(ours), result(theirs)
    assert ours.pop("status") == theirs.pop("status") == "finished"
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=0)


@needs_data
@pytest.mark.slow
@pytest.mark.serial
def test_two_gloo_ranks_train_like_one_process_with_the_same_global_batch(single, parallel):
    (reference, _), (runs, _) = single, parallel
    assert runs[2].name == reference[2].name  # the same experiment: rows, batches and settings, so the same run
    # Rank 0 alone writes: one metrics line per logged step (a second writer would duplicate them).
    assert [r["step"] for r in logged(runs[2])] == [4, 8, 12]
    assert R.read_json(runs[2] / R.FINAL)["device"] == "2 x cpu (1 threads)"  # throughput and MFU are both ranks'
    assert_same_run(runs[2], reference[2])


@needs_data
@pytest.mark.slow
@pytest.mark.serial
def test_every_rank_resumes_from_rank_zeros_checkpoint(single, parallel):
    (reference, _), (runs, stderr) = single, parallel
    assert stderr.count(f"{ROW} s1: resuming from checkpoint.prev.pt at step 8") == 2  # both ranks
    assert_same_run(runs[1], reference[1])
