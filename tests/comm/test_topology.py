"""Host identity: every rank learns every rank's host once, from ZEROCOMM_HOST or the hostname."""
import socket
import time

import pytest

from tests.support.local_transport import run_ranks
from zerocomm.comm import topology


def _learn(t, names):
    # Threads share one environment, so each rank passes its pretend host name.
    first = topology.hosts(t, tag=7, deadline=time.monotonic() + 10, name=names[t.rank])
    again = topology.hosts(t, tag=8, deadline=time.monotonic() + 10)  # cached: no messages
    return first, again, topology.local_ranks(t, tag=9, deadline=time.monotonic() + 10)


@pytest.mark.parametrize("names", [("a",), ("a", "b", "a"), ("h1", "h1", "h2", "h2", "h3"),
                                   ("x" * 300, "ü", "", "ü")])
def test_hosts_are_gathered_once(names):
    results = run_ranks(len(names), _learn, names)
    expected = tuple(n.encode()[:256].decode(errors="replace") for n in names)
    for rank, (first, again, local) in enumerate(results):
        assert first == expected and again == expected
        assert local == tuple(r for r, h in enumerate(expected) if h == expected[rank])


def test_local_host_reads_the_environment(monkeypatch):
    monkeypatch.setenv(topology.HOST_ENV, "node-7")
    assert topology.local_host() == "node-7"
    monkeypatch.setenv(topology.HOST_ENV, "")
    assert topology.local_host() == socket.gethostname()
