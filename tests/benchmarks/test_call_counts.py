"""``zerocomm-bench call-counts`` runs end to end at 2 forked gloo ranks and prints a row per call kind, with
torch's own count beside the native ones; ``--backend nccl-standin`` counts the NCCL backend's own path (its
methods over gloo's process group), checked and unchecked, within the target of 20 calls per call."""
import json
import subprocess
import sys


def test_call_counts_prints_every_kind_beside_torch():
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", "call-counts", "--calls", "3", "--warmup", "1"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("  ")[0]: line.split() for line in done.stdout.splitlines()
            if line.startswith(("all_", "reduce_", "broadcast", "default"))}
    assert len(rows) == 8, done.stdout
    for name, cells in rows.items():
        numbers = [c for c in cells if c.replace(".", "").isdigit()]
        if not name.startswith("default"):
            assert len(numbers) >= 3, (name, cells)  # zerocomm, torch, the ratio
            assert float(numbers[0]) > 0 and float(numbers[1]) > 0, (name, cells)


def _rows(stdout: str) -> dict:
    return {line.split("  ")[0]: line.split("  ")[1:] for line in stdout.splitlines()
            if line.startswith(("all_", "reduce_", "broadcast", "default"))}


def test_nccl_standin_counts_every_native_kind_checked_and_unchecked_within_the_target():
    """The NCCL backend's path without a GPU: every native kind with the check on and off beside torch's; with the
    check off each stays within 20 Python calls per call, and within 1.1x torch's (1.2x async + wait), the flight
    recorder included: it makes no call (counts, not timings)."""
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", "call-counts", "--backend", "nccl-standin",
                           "--calls", "5", "--warmup", "2"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Host-side Python calls only" in done.stdout, done.stdout
    rows = {name: [float(c) for c in cells if c.strip().replace(".", "").isdigit()]
            for name, cells in _rows(done.stdout).items()}
    assert sorted(rows) == sorted(["all_reduce 8 B SUM", "all_reduce 8 B MAX", "all_reduce async + wait",
                                   "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]), done.stdout
    for name, (checked, unchecked, theirs, *_) in rows.items():
        assert checked > 0 and unchecked > 0 and theirs > 0, (name, done.stdout)
        assert checked > unchecked, f"{name}: the check's round costs no call, so it did not run\n{done.stdout}"
        assert unchecked <= 20, f"{name}: {unchecked:.0f} Python calls per call with the check off\n{done.stdout}"
        # The NCCL targets in calls, without a device (world 1 on a GPU runs unchecked): a blocking call within
        # 1.1x torch's, async + wait within 1.2x.
        bound = 1.2 if "async" in name else 1.1
        assert unchecked <= bound * theirs, (
            f"{name}: {unchecked:.0f} calls with the check off against torch's {theirs:.0f} (at most {bound}x)"
            f"\n{done.stdout}")


_STANDIN_PATH = r'''
import cProfile, json, os, sys, threading
from zerocomm.benchmarks.launch import run_forked

def frames(call):
    profile = cProfile.Profile()
    profile.enable()
    call()
    profile.disable()
    profile.create_stats()
    return sorted({f"{path.rsplit('/', 1)[-1]}:{name}" for path, _, name in profile.stats})

def body(spec):
    import torch
    import zerocomm.comm as dist
    dist.init_process_group(**spec.kwargs())
    rank = dist.get_rank()
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, algorithm="native")  # planned; the next call is the cache hit
    checked = frames(lambda: dist.all_reduce(t, algorithm="native"))
    dist.configure(check=False)
    threads = threading.active_count()
    issued = frames(lambda: dist.all_reduce(t, async_op=True, algorithm="native").wait())
    out = {"rank": rank, "value": t.tolist(), "checked": checked, "issued": issued,
           "thread": threading.active_count() > threads}
    dist.destroy_process_group()
    os.write(1, (json.dumps(out) + "\n").encode())  # one write: the two ranks' reports never interleave
    return 0

sys.exit(run_forked(2, "nccl-standin", body))
'''


def test_nccl_standin_runs_the_nccl_backends_methods_checked_through_reduce_stage():
    """The stand-in's calls run the NCCL backend's own functions, checked through ``Backend.reduce_stage`` (never a
    shared-memory round), an async call issued directly (no executor thread), and give the right sums."""
    done = subprocess.run([sys.executable, "-c", _STANDIN_PATH], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == [0, 1], done.stdout
    for r in ranks:
        # Each rank starts at rank + 1 (1 and 2); three SUMs over the two ranks give 3, 6, then 12.
        assert r["value"] == [12.0, 12.0], r
        assert {"nccl.py:reduce_stage", "nccl.py:all_reduce", "check.py:through_backend"} <= set(r["checked"]), r
        assert not any(name.startswith(("check.py:in_", "shm.py:")) for name in r["checked"]), r
        assert "nccl.py:issue_all_reduce" in r["issued"] and "check.py:through_backend" not in r["issued"], r
        assert not r["thread"], r
