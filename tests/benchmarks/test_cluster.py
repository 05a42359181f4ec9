"""``zerocomm-bench cluster``: the simulated cluster's pieces, and one end-to-end run of 2 hosts x 2 ranks.

The end-to-end tests need root, ``ip``, ``tc`` and ``unshare`` (they skip naming what is missing);
each is bounded in time and checks that no namespace of its run is left behind, after success
and after SIGTERM in the middle of a run.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from zerocomm.benchmarks import cluster

RUN_TIMEOUT_S = 300


def test_rates_parse_and_buckets_hold_offloaded_packets():
    assert cluster.parse_rate("1gbit") == 10**9
    assert cluster.parse_rate("10Gbit") == 10**10
    assert cluster.parse_rate("500mbit/s") == 5 * 10**8
    with pytest.raises(ValueError, match="bits per second"):
        cluster.parse_rate("fast")
    assert cluster._burst_bytes(10**9) >= 64 << 10
    assert cluster._burst_bytes(10**10) == 10**10 // 8 // 500


def test_only_this_modules_names_count_as_stale():
    assert cluster._STALE.match("zc123h0") and cluster._STALE.match("zc123br")
    assert not cluster._STALE.match("zctest") and not cluster._STALE.match("other123h0")


def test_table_states_the_link_load_and_ratio():
    result = {"hosts": 2, "ranks_per_host": 2, "rate_bits": 10**9, "load_before": (1.0, 2.0, 3.0),
              "load_after": (1.5, 2.0, 3.0), "hostnames": ["a", "a", "b", "b"],
              "rows": [{"size": 1 << 20, "algorithm": "ring", "time_s": 0.02, "correct": True},
                       {"size": 1 << 20, "algorithm": "hierarchical", "time_s": 0.01, "correct": True},
                       {"size": 1 << 20, "algorithm": "onebit", "time_s": 0.04, "correct": None}]}
    table = cluster.format_table(result)
    assert "1 Gbit/s" in table and "1.00 2.00 3.00" in table
    assert "2.00x" in table and "0.50x" in table and "hierarchical" in table


def test_zero_table_states_speedup_link_bytes_and_losses():
    from zerocomm.benchmarks import zeropp_bench

    losses = [9.0 - 0.01 * step for step in range(10)]
    result = {"hosts": 2, "ranks_per_host": 2, "rate_bits": 10**9, "steps": 10, "batch": 1, "bits": 4, "lr": 1e-3,
              "load_before": (1.0, 2.0, 3.0), "load_after": (1.5, 2.0, 3.0),
              "rows": [{"variant": "ZeRO-3", "step_s": 1.0, "link_bytes_per_step": 64 << 20, "losses": losses},
                       {"variant": "ZeRO-3 + ZeRO++", "step_s": 0.5, "link_bytes_per_step": 8 << 20,
                        "losses": [x * 1.01 for x in losses]}]}
    table = zeropp_bench.format_table(result)
    assert "1 Gbit/s" in table and "qgZ int4" in table and "1.00 2.00 3.00" in table
    assert "2.00x" in table and "64.0" in table and "8.0" in table and "8.00x" in table
    assert "step 8 1.00%" in table and "step 10 1.00%" in table and "mean of" not in table
    assert "CPU ms/step" in table and "faults/step" in table
    assert table.count(" nan") == 8  # rows written before the columns
    assert "held-out" not in table
    result["rows"][0]["eval_losses"], result["rows"][1]["eval_losses"] = [4.0, 2.0], [4.04, 2.03]
    table = zeropp_bench.format_table(result)
    assert "after step 8 1.00%" in table and "after step 10 1.50%" in table and "4.0400" in table
    result["rows"][0]["cpu_s"], result["rows"][1]["cpu_s"] = 1.25, 0.75
    result["rows"][0]["page_faults"], result["rows"][1]["page_faults"] = 34086.0, 15403.0
    for row, scale in zip(result["rows"], (1.0, 1.02)):
        row["losses"] = [x * scale for x in losses + losses]
    table = zeropp_bench.format_table({**result, "steps": 20})
    assert "1250" in table and "750" in table and "34086" in table and "15403" in table and "step 20 2.00%" in table and "mean of steps 11-20 2.00%" in table
    assert zeropp_bench._link_tx_bytes("lo") >= 0 and zeropp_bench._link_tx_bytes("no-such-interface") == 0


def _ours(pid: int) -> list:
    return [name for name in cluster._namespaces() if name.startswith(f"{cluster.PREFIX}{pid}")]


def _needs_cluster():
    why = cluster.unavailable()
    if why is not None:
        pytest.skip(f"no simulated cluster here: {why}")


def test_two_hosts_two_ranks_end_to_end(tmp_path):
    _needs_cluster()
    out = tmp_path / "cluster.json"
    proc = subprocess.Popen([sys.executable, "-m", cluster.MODULE, "--sizes", "256KiB", "--algorithms",
                             "hierarchical,ring,native", "-n", "1", "-w", "0", "--timeout", "240",
                             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.remove_stale()  # whatever happened, nothing of this run stays
    assert proc.returncode == 0, output
    result = json.loads(out.read_text())
    hosts = result["hostnames"]
    assert len(hosts) == 4 and hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert [row["algorithm"] for row in result["rows"]] == ["hierarchical", "ring", "native"]
    assert all(row["correct"] is True for row in result["rows"]), result["rows"]
    assert _ours(proc.pid) == []


def test_sigterm_tears_the_cluster_down(tmp_path):
    _needs_cluster()
    proc = subprocess.Popen([sys.executable, "-m", cluster.MODULE, "--sizes", "16MiB", "--algorithms", "ring",
                             "-n", "50", "--timeout", "240"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_ours(proc.pid)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(_ours(proc.pid)) == 3, "the cluster was not built within 60 s"
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = _ours(proc.pid)
        cluster.remove_stale()
    assert left == [], f"left behind after SIGTERM: {left}"
    assert proc.returncode != 0
