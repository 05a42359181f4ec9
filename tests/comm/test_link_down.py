"""Fault injection on the simulated cluster: a host whose link goes down in the middle of all_reduce.

``zerocomm-bench cluster``'s own pieces build it (benchmarks/cluster.py): two hosts as network
namespaces with their own hostnames, each joined to a bridge by a veth link shaped with tc tbf.
Its agents start the ranks (tests/support/link_down.py) on gloo.  While every rank repeats a
long all_reduce, the test takes host 1's link down at the bridge (``ip link set p1 down``: the
host's eth0 loses its carrier; nothing resets a connection, packets just stop — the case a
liveness check cannot learn from the kernel, so it ends by the deadline).  Asserted:

* every rank (both hosts: none of them can finish the call) raises PeerError or CommTimeoutError
  no later than the link going down + the group's timeout + GRACE_S, and the next call on the
  group fails at once naming the earlier failure;
* every call before the fault returned the right sum;
* every process exits by itself with status 0, and the cluster's teardown leaves no namespace (nor
  the bridge in it) and no ``/dev/shm`` segment of these ranks — teardown runs whatever happens.

Two shapes: 2 hosts x 1 rank with gloo's own all_reduce, and 2 hosts x 2 ranks with the
hierarchical algorithm (shared memory inside a host, gloo between hosts).

MPI is not run here: the cluster launches its ranks itself with torchrun's variables; MPICH's
launcher (hydra) would have to start a proxy inside each namespace and reach them from the root
namespace, which has no link to the bridge.
"""
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from support.faults import GRACE_S

from zerocomm.benchmarks import cluster

#: The group's timeout in the ranks: short, so the case is bounded.
TIMEOUT_S = 3.0
#: Each link, each way: slow enough that one all_reduce of NUMEL floats is long (tenths of a second).
RATE = "50mbit"
NUMEL = 1 << 18
#: Seconds for the ranks to start, join and check their first call (imports on a loaded 2-core machine).
READY_LIMIT_S = 40.0
#: Seconds after the ranks are ready that the link stays up: the fault lands inside a running call.
RUNNING_S = 0.5

CASES = [("native", 1), ("hierarchical", 2)]
TESTS_DIR = str(Path(__file__).resolve().parents[1])


def _ours(prefix: str) -> list:
    return [name for name in cluster._namespaces() if name.startswith(prefix)]


def _segments_of(pids) -> list:
    pids = list(pids)
    return [name for name in os.listdir("/dev/shm")
            if any(name.startswith(f"zerocomm-{pid}-") for pid in pids)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm,ranks_per_host", CASES, ids=[f"{a}-2x{r}" for a, r in CASES])
def test_host_link_down_mid_all_reduce(tmp_path, monkeypatch, algorithm, ranks_per_host):
    why = cluster.unavailable()
    if why is not None:
        pytest.skip(f"no simulated cluster here: {why}")
    cluster.remove_stale()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, *filter(None, [os.environ.get("PYTHONPATH")])]))
    world = 2 * ranks_per_host
    job = {"rank_command": [sys.executable, "-m", "support.link_down"], "folder": str(tmp_path),
           "timeout_s": TIMEOUT_S, "algorithm": algorithm, "numel": NUMEL}
    net = cluster.Cluster(2, cluster.parse_rate(RATE))
    outcome = {}
    launcher = threading.Thread(target=lambda: outcome.update(status=cluster.launch(
        net, ranks_per_host, job, READY_LIMIT_S + TIMEOUT_S + GRACE_S + 5.0)), daemon=True)
    down_at = None
    try:
        net.build()
        launcher.start()
        deadline = time.monotonic() + READY_LIMIT_S
        while len(list(tmp_path.glob("ready*"))) < world and time.monotonic() < deadline and launcher.is_alive():
            time.sleep(0.05)
        ready = sorted(p.name for p in tmp_path.glob("ready*"))
        assert len(ready) == world, f"only {ready} of {world} ranks got ready within {READY_LIMIT_S:g} s " \
                                    f"(launcher {outcome})"
        time.sleep(RUNNING_S)
        down_at = time.time()
        net.set_link(1, up=False)
        launcher.join(TIMEOUT_S + GRACE_S + 2.0)
        exited_in_time = not launcher.is_alive()
    finally:
        net.teardown()  # kills whatever still runs in the namespaces, deletes them with their links
        launcher.join(30)
    left = _ours(net.prefix)
    answers = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("answer*.json"))]
    assert [a["rank"] for a in answers] == list(range(world)), f"ranks that answered: {answers} (launcher: {outcome})"
    hostnames = [a["hostname"] for a in answers]
    assert len(set(hostnames)) == 2 and hostnames == sorted(hostnames), hostnames  # 2 hosts, ranks in host order
    for a in answers:
        kind, raised_at, message = a["first"]
        assert kind in ("PeerError", "CommTimeoutError"), a
        assert raised_at - down_at <= TIMEOUT_S + GRACE_S, (a["rank"], raised_at - down_at, message)
        assert a["wrong"] == 0 and a["calls"] >= 1, a
        again_kind, again_s, again_message = a["again"]
        assert again_kind == kind and "unusable after an earlier failure" in again_message, a
        assert again_s < 1.0, a  # at once, not after another deadline
    assert left == [], f"left behind: {left}"
    assert _segments_of(a["pid"] for a in answers) == []
    # A failed gloo group's handle is given up at destroy (GlooBackend.close(abandon=True)): its destructor
    # would wait for the unreachable peer for good.  So every rank must have exited, in time, on its own.
    assert exited_in_time, f"the ranks raised in time but did not exit: {outcome}"
    assert outcome.get("status") == 0, f"a rank exited with a failure: {outcome}"
    for a in answers:
        with pytest.raises(ProcessLookupError):
            os.kill(a["pid"], 0)
