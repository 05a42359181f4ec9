"""Two simulated hosts whose names do not resolve, as on clusters with several NICs and in containers.

``zerocomm-bench cluster``'s pieces build them (benchmarks/cluster.py) with ``names_resolve=False``: each
host's ``/etc/hosts`` holds ``localhost`` alone, so a host's own name resolves nowhere and gloo, left to itself,
binds loopback.  The ranks (2 per host) name the link's interface with ``GLOO_SOCKET_IFNAME`` as users do, and
must then run as on hosts whose names resolve: ``init_process_group()``, the README's example verbatim, the
hierarchical all_reduce against numpy, and ZeRO++ beside plain ZeRO-3.  Without the variable they cannot
connect, and every rank must raise one of zerocomm's errors by its own deadline (``ZEROCOMM_TIMEOUT``), not
gloo's or the store's.  Every test tears its namespaces down, whatever happens.
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest

from zerocomm.benchmarks import cluster

from launchers.test_launchers import _expected_line, readme_example

TESTS_DIR = str(Path(__file__).resolve().parents[1])
RATE = "1gbit"
#: Seconds every rank may take to start, join and finish its checks on a loaded 2-core machine.
LAUNCH_LIMIT_S = 150.0
#: ZEROCOMM_TIMEOUT of the ranks that cannot connect, and the slack allowed past it (imports, exit).
DEADLINE_S = 12.0
SLACK_S = 15.0


@pytest.fixture
def unnamed_hosts(monkeypatch):
    """A built 2-host cluster whose host names do not resolve; torn down after the test, and checked."""
    why = cluster.unavailable()
    if why is not None:
        pytest.skip(f"no simulated cluster here: {why}")
    cluster.remove_stale()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    hosts = cluster.Cluster(2, cluster.parse_rate(RATE), names_resolve=False)
    try:
        hosts.build()
        for i in range(2):
            written = (Path("/etc/netns") / hosts.host_ns(i) / "hosts").read_text()
            assert hosts.hostname(i) not in written and hosts.address(i) not in written, written
        yield hosts
    finally:
        hosts.teardown()
    assert [n for n in cluster._namespaces() if n.startswith(hosts.prefix)] == []
    assert all(not (Path("/etc/netns") / hosts.host_ns(i)).exists() for i in range(2))


def _answers(folder: Path, world: int) -> list:
    found = sorted((json.loads(p.read_text()) for p in folder.glob("answer-*.json")), key=lambda a: a["rank"])
    assert [a["rank"] for a in found] == list(range(world)), found
    return found


def test_init_and_hierarchical_all_reduce_with_the_interface_named(unnamed_hosts, tmp_path):
    job = {"rank_command": [sys.executable, "-m", "support.unnamed_hosts"], "folder": str(tmp_path), "ifname": "eth0"}
    status = cluster.launch(unnamed_hosts, 2, job, LAUNCH_LIMIT_S)
    answers = _answers(tmp_path, 4)
    assert status == 0, answers
    for a in answers:
        assert "error" not in a, a
        assert a["ifname"] == "eth0" and a["hierarchical_equal"] and a["all_gather_equal"], a
        assert a["hosts"] == [unnamed_hosts.hostname(i // 2) for i in range(4)], a


def test_readme_example_verbatim(unnamed_hosts, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(readme_example())
    command = ["sh", "-c", 'exec "$0" "$1" > "$2/out-$RANK.txt" 2>&1', sys.executable, str(script), str(tmp_path)]
    status = cluster.launch(unnamed_hosts, 2, {"rank_command": command, "ifname": "eth0"}, LAUNCH_LIMIT_S)
    outputs = {p.name: p.read_text() for p in sorted(tmp_path.glob("out-*.txt"))}
    assert status == 0, outputs
    assert _expected_line("gloo", 4) in outputs["out-0.txt"], outputs


def test_zeropp_beside_plain_zero3(unnamed_hosts):
    """The cluster benchmark's ZeRO++ job, 3 steps: both variants train alike; ZeRO++ carries far fewer bytes
    over the links (the benchmark times it; here only what must hold on any machine is asserted)."""
    from zerocomm.benchmarks import zeropp_bench

    unnamed_hosts.teardown()  # run_job builds its own cluster of the same kind
    job = zeropp_bench.job(steps=3, batch=1, bits=4, lr=1e-3, job_env=cluster.JOB_ENV)
    ran = cluster.run_job(2, 2, cluster.parse_rate(RATE), job, LAUNCH_LIMIT_S, names_resolve=False)
    assert ran is not None, "a rank failed (its output is above)"
    plain, zeropp = ran[0]["rows"]
    assert (plain["variant"], zeropp["variant"]) == ("ZeRO-3", "ZeRO-3 + ZeRO++")
    assert zeropp["link_bytes_per_step"] * 4 < plain["link_bytes_per_step"], (plain, zeropp)
    for a, b in zip(plain["losses"], zeropp["losses"]):
        assert abs(a - b) <= 0.01 * abs(a), (plain["losses"], zeropp["losses"])


def test_without_the_interface_every_rank_fails_typed_by_its_deadline(unnamed_hosts, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROCOMM_TIMEOUT", str(DEADLINE_S))
    job = {"rank_command": [sys.executable, "-m", "support.unnamed_hosts"], "folder": str(tmp_path), "ifname": None}
    started = time.monotonic()
    cluster.launch(unnamed_hosts, 2, job, DEADLINE_S + SLACK_S + 30.0)
    took = time.monotonic() - started
    answers = _answers(tmp_path, 4)
    for a in answers:
        print(f"rank {a['rank']} on {a['hostname']}: {a.get('error')} after {a.get('seconds', 0):.1f} s: "
              f"{a.get('message', '')[:300]}")
    for a in answers:
        assert a["ifname"] is None, a
        assert a.get("error") in ("CommTimeoutError", "PeerError"), a
        assert a["error_module"] == "zerocomm.comm.errors", a
        assert a["seconds"] <= DEADLINE_S + SLACK_S, a
        assert f"rank {a['rank']}" in a["message"] and "init_process_group" in a["message"], a
    assert took <= DEADLINE_S + SLACK_S + 20.0, took
