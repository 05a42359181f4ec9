"""``zerocomm-bench step-calls`` end to end: every variant's count of Python calls per training step beside torch
DDP's, and the host-cost target it measures (counts, not times: the same on a loaded machine)."""
import json
import os
import subprocess
import sys

import pytest

from zerocomm.benchmarks import step_calls


@pytest.mark.timeout(300)
def test_every_zero_stage_calls_at_most_a_tenth_more_python_than_ddp(tmp_path):
    json_path = tmp_path / "step_calls.json"
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", "step-calls", "--json", str(json_path)],
                          capture_output=True, text=True, timeout=280, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    per_rank = json.loads(json_path.read_text())["per_rank"]
    assert len(per_rank) == 2
    expected = {f"DDP {p}" for p in step_calls.PRECISIONS} | {
        f"ZeRO-{s} {label} {p}" for s in step_calls.STAGES for p in step_calls.PRECISIONS
        for label in step_calls.ALGORITHMS.values()}
    for rank, counts in enumerate(per_rank):
        assert set(counts) == expected, (rank, sorted(counts))
        for name, (calls, threads, _) in counts.items():
            peer = counts["DDP " + name.split()[-1]][0]
            assert calls > 0 and peer > 1000, (rank, name, calls, peer)
            assert calls <= step_calls.TARGET * peer, f"rank {rank}: {name}: {calls} calls, DDP {peer}"
            # gloo's own async collectives are issued directly, but one made while a call of its group is queued
            # goes behind it through the executor (and the shm rows use it): at most one thread per group
            assert threads <= 1, f"rank {rank}: {name}: {threads} executor threads alive"
    assert "× DDP (same precision)" in done.stdout and "load average at the end" in done.stdout
