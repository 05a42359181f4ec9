"""Stage 3's parameter offload (``offload_param``): the parameter shards in files (``nvme``) or in host memory
beside a CUDA model (``cpu``; forced onto a CPU model here to check its data movement, run for real by
test_zero_cuda.py on a GPU).

Offloading moves bytes, not arithmetic, so losses and parameters must equal stage 3 without offload within the
bound the stage tests use (1e-5 relative: stage 3's own runs differ in the last bits on this machine).
"""
import pytest

from support import zero_offload_checks, zero_param_offload_checks as checks
from support.worlds import worlds

REL = 1e-5
N2 = worlds(backends=("gloo",), sizes=(2,))


@pytest.mark.parametrize("world", N2, indirect=True)
def test_parameters_in_files_train_like_parameters_in_memory(world, tmp_path):
    cases = [("lm", "fp32", 1, 0.0), ("lm", "bf16", 1, 0.0), ("lm", "fp32", 2, 0.05), ("mlp", "fp16", 1, 0.5)]
    for rank, rows in enumerate(world.run(checks.equivalence, cases, str(tmp_path), timeout=300)):
        assert len(rows) == len(cases)
        for case, loss_err, param_err, store, read in rows:
            assert store == "FileShards", (rank, case, store)
            assert read > 0, (rank, case)  # the gathers read their inputs from the files
            assert loss_err <= REL and param_err <= REL, f"rank {rank} {case}: {loss_err:.1e} / {param_err:.1e}"


@pytest.mark.parametrize("world", N2, indirect=True)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_parameter_shards_are_on_disk_and_only_the_persistent_unit_in_memory(world, tmp_path, precision):
    for rank, seen in enumerate(world.run(checks.placement, str(tmp_path), precision)):
        assert seen["report"]["params"] == {"device": 0, "host": seen["persistent"], "disk": seen["shard_bytes"]}, seen
        assert seen["files"] and all(name.endswith(".param") for name in seen["files"]), seen["files"]


@pytest.mark.parametrize("world", N2, indirect=True)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_parameter_offloaded_checkpoints_save_and_reload(world, tmp_path, precision):
    folder = tmp_path / "nvme"
    folder.mkdir()
    for rank, seen in enumerate(world.run(zero_offload_checks.nvme_checkpoint, str(folder), str(tmp_path / "ckpt"), 3,
                                          precision, True, timeout=120)):
        for name in ("nvme", "plain"):  # reloaded with parameters in files, and into stage 3 without offload
            assert seen[name]["loss_err"] <= REL, (rank, name, seen)


def _peaks_in_fresh_ranks(folder: str, offloaded: bool, out: str) -> list:
    """``checks.training_peak`` on 2 ranks forked for this measurement alone: a pooled worker's heap, freed by
    earlier tests and kept by glibc, can take a run's allocations without raising the resident set."""
    import json
    import os

    import zerocomm.comm as dist
    from zerocomm.benchmarks.launch import run_forked

    def body(spec) -> int:
        dist.init_process_group(**spec.kwargs())
        seen = checks.training_peak(folder, offloaded)
        with open(os.path.join(out, f"{int(offloaded)}-{dist.get_rank()}.json"), "w") as handle:
            json.dump(seen, handle)
        dist.destroy_process_group()
        return 0

    assert run_forked(2, "gloo", body) == 0
    peaks = []
    for rank in range(2):
        with open(os.path.join(out, f"{int(offloaded)}-{rank}.json")) as handle:
            peaks.append(json.load(handle))
    return peaks


def test_parameter_shards_in_files_leave_the_resident_set(tmp_path):
    """Peak resident memory of training (state and gradients in files in both runs) falls by the parameter shard's
    bytes, less the buffers in flight: at most 4 unit shards (the one gathering, 2 prefetched, 1 read ahead).

    Each is measured twice, alternating, in ranks forked for the measurement, and its larger peak kept."""
    runs = {False: [], True: []}
    for _ in range(2):
        for offloaded in (False, True):
            runs[offloaded].append(_peaks_in_fresh_ranks(str(tmp_path), offloaded, str(tmp_path)))
    without, with_files = ([max(per_run, key=lambda seen: seen["peak"]) for per_run in zip(*runs[offloaded])]
                           for offloaded in (False, True))
    for rank, (a, b) in enumerate(zip(without, with_files)):
        expected = a["shard"] - 4 * a["unit_shard"]
        print(f"rank {rank}: peak {a['peak'] / 2**20:.1f} MiB -> {b['peak'] / 2**20:.1f} MiB, shard "
              f"{a['shard'] / 2**20:.1f} MiB, less buffers {expected / 2**20:.1f} MiB")
        assert a["peak"] - b["peak"] >= 0.8 * expected, (rank, a, b)


@pytest.mark.parametrize("world", N2, indirect=True)
def test_host_parameter_shards_copy_each_gather_and_train_alike(world):
    for rank, seen in enumerate(world.run(checks.forced_host_shards)):
        loss_err, param_err = seen["errors"]
        assert seen["store"] == "HostShards" and seen["state"] == "HostOptimizerState", seen
        assert loss_err <= REL and param_err <= REL, (rank, seen)
        assert seen["to_device"] >= 4 * seen["shard_bytes"], seen  # at least one copy of every shard per step
        assert seen["report"]["host"] >= seen["shard_bytes"], seen


@pytest.mark.parametrize("fields, words", [
    ({"offload_param": "nvme"}, "needs param_nvme_path or nvme_path"),
    ({"offload_param": "nvme", "nvme_path": "x"}, "needs offload_optimizer 'nvme', got 'none'"),
    ({"offload_param": "nvme", "nvme_path": "x", "offload_optimizer": "cpu"}, "got 'cpu'"),
])
def test_parameter_files_without_their_pair_are_refused_naming_it(fields, words):
    from zerocomm.zero import ZeroConfig, ZeroConfigError
    with pytest.raises(ZeroConfigError, match=words):
        ZeroConfig(stage=3, **fields)
    ZeroConfig(stage=2, **fields)  # stages 0-2 keep every parameter: accepted, with a logged line at initialize
