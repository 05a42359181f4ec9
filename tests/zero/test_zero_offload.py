"""Optimizer-state offload: to host memory (ZeRO-Offload) and to files (ZeRO-Infinity's optimizer offload).

Offloading moves bytes, not arithmetic: the same elementwise optimizer runs on the same float32 values, so
losses and parameters must equal the same stage without offload.  They are compared with the bound the
stage tests use (1e-5 relative): stage 3's own runs differ from each other in the last bits on this machine
(torch's CPU kernels with several threads), and the bound covers that; stages 1-2 come out bit-identical.

Host offload of a CPU model is the device placement (the host *is* the device), so the host-offload
class is forced onto CPU tensors here (support/zero_offload_checks.py) to check its data movement; on a
CUDA machine test_zero_cuda.py's ranks run the real thing.
"""
import pytest

from support import zero_offload_checks
from support.worlds import worlds

REL = 1e-5

# (model, stage, precision, gradient_accumulation_steps, gradient_clipping, offload device)
EQUIVALENCE = [
    ("lm", 1, "fp32", 1, 0.0, "nvme"), ("lm", 2, "fp32", 2, 0.0, "nvme"), ("lm", 3, "fp32", 1, 0.0, "nvme"),
    ("lm", 2, "bf16", 1, 0.0, "nvme"), ("mlp", 2, "fp16", 1, 0.5, "nvme"), ("mlp", 0, "fp32", 1, 0.5, "nvme"),
    ("lm", 1, "fp32", 1, 0.0, "cpu"), ("lm", 2, "fp32", 2, 0.05, "cpu"), ("lm", 3, "bf16", 1, 0.0, "cpu"),
    ("mlp", 2, "fp16", 1, 0.0, "cpu"),
]


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_offloaded_runs_match_the_same_stage_without_offload(world, tmp_path):
    rows_per_rank = world.run(zero_offload_checks.offload_equivalence, EQUIVALENCE, str(tmp_path), timeout=300)
    for rank, rows in enumerate(rows_per_rank):
        assert len(rows) == len(EQUIVALENCE)
        for case, loss_err, param_err, part in rows:
            expected = "NvmeOptimizerState" if case[-1] == "nvme" else "HostOptimizerState"
            assert part == expected, (rank, case, part)
            assert loss_err <= REL and param_err <= REL, f"rank {rank} {case}: {loss_err:.1e} / {param_err:.1e}"
            if case[1] in (1, 2) and case[4] == 0.0:
                assert loss_err == 0.0 and param_err == 0.0, f"rank {rank} {case}: not bit-identical"


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
@pytest.mark.parametrize("stage", [1, 2])
def test_host_offload_moves_one_shard_each_way_and_overlaps_backward(world, stage):
    for rank, seen in enumerate(world.run(zero_offload_checks.host_data_movement, stage)):
        shard = seen["shard_numel"]
        assert seen["to_host"] == 4 * shard, (rank, seen)  # float32 gradient elements of this rank's shard
        assert seen["to_device"] == 4 * shard, (rank, seen)  # updated fp32 parameters of the shard
        assert seen["copies"] == seen["buckets"], (rank, seen)  # one copy per bucket
        assert not seen["shared_storage"] and seen["masters_on"] == "cpu"
        if stage == 2:  # stage 2 waits for reductions inside backward (max_inflight_buckets=1): copies start there
            assert seen["copies_before_backward_end"] >= seen["buckets"] - 1, (rank, seen)
        state = seen["report"]["optimizer_state"]
        assert state["host"] == 16 * shard + 4 * seen["buckets"], (rank, seen)  # master, grad, 2 moments, step
        assert state["device"] == state["disk"] == 0


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nvme_state_lives_in_files_and_memory_holds_only_the_slots(world, tmp_path, precision):
    for rank, seen in enumerate(world.run(zero_offload_checks.nvme_files_and_memory, str(tmp_path), precision)):
        buckets, shard = len(seen["shards"]), sum(seen["shards"])
        per_bucket = ["exp_avg", "exp_avg_sq"] + (["master"] if precision == "bf16" else [])
        files = len(per_bucket) + 1  # and the streamed gradient shard
        assert seen["elementwise"] == ["exp_avg", "exp_avg_sq"]
        assert len(seen["files"]) == buckets * files, seen["files"]
        assert sum(seen["sizes"].values()) == 4 * shard * files
        # per step: the gradient written once during backward and read once; the state read and written once
        assert seen["read"] == seen["written"] == 4 * shard * files, (rank, seen)
        slots = 3 * files * 500 * 4  # offload_buffer_count x files x offload_buffer_numel x 4 bytes
        assert seen["slot_rows"] == [files] * 3
        assert seen["state_bytes"]["optimizer_state"] == slots + 4 * buckets, (rank, seen)  # + Adam's step scalars
        assert seen["state_bytes"]["grads"] == 0, (rank, seen)  # no gradient shard in memory after the step
        report = seen["report"]
        assert report["optimizer_state"] == {"device": 0, "host": slots + 4 * buckets,
                                             "disk": 4 * shard * len(per_bucket)}, report
        assert report["grads"] == {"device": 0, "host": 0, "disk": 4 * shard}, report
        assert seen["removed"], "the state folder outlived its optimizer"


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
@pytest.mark.parametrize("stage, precision", [(2, "fp32"), (3, "fp32"), (2, "bf16")])
def test_nvme_offloaded_state_saves_and_reloads(world, tmp_path, stage, precision):
    folder, checkpoint = tmp_path / "nvme", tmp_path / "ckpt"
    folder.mkdir()
    for rank, seen in enumerate(world.run(zero_offload_checks.nvme_checkpoint, str(folder), str(checkpoint), stage,
                                          precision, timeout=120)):
        for name in ("nvme", "plain"):  # reloaded into NVMe offload, and into the same stage without offload
            if stage == 3:
                assert seen[name]["loss_err"] <= REL, (rank, name, seen)
            else:
                assert seen[name]["same_losses"] and seen[name]["same_params"], (rank, name, seen)


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_memory_report_follows_the_offload_formulas(world, tmp_path):
    """docs/zero.md's table: optimizer state is 8Φ/S (fp32) or 12Φ/S (mixed) in memory without offload, 16Φ/S on the
    host with host offload, and 8Φ/S or 12Φ/S on disk with NVMe offload (S = 1 for stage 0, N otherwise)."""
    cases = [(stage, precision, kind) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")
             for kind in ("none", "cpu", "nvme")]
    n = world.world_size
    for rank, rows in enumerate(world.run(zero_offload_checks.memory_report_cases, str(tmp_path), cases, timeout=300)):
        for (stage, precision, kind), padded, buckets, report in rows:
            owned = padded if stage == 0 else padded // n
            state = 8 if precision == "fp32" else 12
            steps = 4 * buckets  # Adam's step scalars
            if kind == "none":
                want = {"device": 0, "host": state * owned + steps, "disk": 0}
            elif kind == "cpu":
                want = {"device": 0, "host": 16 * owned + steps, "disk": 0}
            else:
                files = (2 if precision == "fp32" else 3) + 1  # + the gradient
                want = {"device": 0, "host": report["host"], "disk": state * owned}
                # in memory: Adam's step scalars and at most offload_buffer_count (2) slots of 700 elements per file
                assert steps < report["host"] <= steps + 2 * files * 700 * 4, (rank, stage, report)
            assert report == want, (rank, stage, precision, kind, report, want)
