"""Ranks started exactly as users start them: torchrun (standalone, and across two simulated hosts with
the c10d rendezvous), ``python -m torch.distributed.run``, mpiexec, and torchrun's elastic restart.

Each test runs real launcher processes (no forked pool): a launcher's environment (torchrun's agent
store, its restart counter, MPI's variables) is what is under test.  Each launch has a deadline and is
killed with its whole process group when it passes it.
"""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.launchers import LAUNCH_TIMEOUT_S, clean_env as _env, launch as _launch, tool as _tool

SCRIPTS = Path(__file__).parent / "scripts"
README = Path(__file__).parents[2] / "README.md"


def _reports(done: subprocess.CompletedProcess, folder: Path, ranks: int) -> list:
    """Every rank's ``report-RANK.json`` from ``folder``, in rank order."""
    assert done.returncode == 0, f"{' '.join(done.args)} exited {done.returncode}:\n{done.stdout[-4000:]}"
    found = [json.loads(path.read_text()) for path in sorted(folder.glob("report-*.json"))]
    assert sorted(r["rank"] for r in found) == list(range(ranks)), done.stdout[-4000:]
    return sorted(found, key=lambda r: r["rank"])


def readme_example() -> str:
    """The README's example script, verbatim (the python block under "The API in one example")."""
    text = README.read_text()
    section = text.split("## The API in one example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _expected_line(backend: str, n: int) -> str:
    # all_reduce SUM of each rank's value, then AVG of n equal values; all_gather of [2r, 2r + 1].
    total = float(sum(range(n)))
    return f"{backend} {[total] * 4} {[float(i) for i in range(2 * n)]}"


LAUNCHERS = {
    "torchrun": lambda n: [_tool("torchrun"), "--standalone", "--nproc-per-node", str(n)],
    "torch.distributed.run": lambda n: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                        "--nproc-per-node", str(n)],
    "mpiexec": lambda n: [_tool("mpiexec"), "-n", str(n), sys.executable],
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_readme_example_runs_under_the_launcher(launcher, tmp_path):
    n = 4
    (tmp_path / "script.py").write_text(readme_example())
    done = _launch(LAUNCHERS[launcher](n) + ["script.py"], tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    backend = "mpi" if launcher == "mpiexec" else "gloo"
    printed = [line.strip() for line in done.stdout.splitlines() if line.startswith(backend + " [")]
    assert printed == [_expected_line(backend, n)], done.stdout[-4000:]


def _sampler_indices(length: int, n: int, rank: int) -> list:
    """DistributedSampler's indices without shuffling: the dataset padded with its own head to a multiple
    of n, then every n-th index from ``rank``."""
    padded = list(range(length))
    padded += padded[: -length % n]
    return padded[rank::n]


def _check_default_group(reports: list, n: int, backend: str) -> None:
    total = float(sum(range(1, n + 1)))
    for r in reports:
        assert (r["size"], r["zerocomm_backend"]) == (n, backend), r
        assert (r["torch_rank"], r["torch_size"], r["torch_backend"]) == (r["rank"], n, "zerocomm"), r
        assert r["sampler"] == _sampler_indices(10, n, r["rank"]), r
        assert r["torch_sum"] == total and r["zerocomm_sum"] == total, r
        if r["rank"] in (0, n - 1):
            assert r["ends_sum"] == (1.0 + n if n > 1 else 1.0), r
        assert r["gathered"] == [10 * i for i in range(n)], r
        assert r["initialized_after_destroy"] == [False, False], r


@pytest.mark.parametrize("launcher,n", [("torchrun", 3), ("mpiexec", 3), ("torchrun", 1)])
def test_torch_default_group_is_zerocomms_world(launcher, n, tmp_path):
    """After zerocomm's init, torch's API (ranks, DistributedSampler, collectives, new_group, object
    collectives) sees zerocomm's world; destroy_process_group ends both."""
    done = _launch(LAUNCHERS[launcher](n) + [str(SCRIPTS / "default_group.py")], tmp_path)
    _check_default_group(_reports(done, tmp_path, n), n, "mpi" if launcher == "mpiexec" else "gloo")


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_a_program_that_initialized_torch_first_keeps_its_group(tmp_path, launcher):
    done = _launch(LAUNCHERS[launcher](2) + [str(SCRIPTS / "torch_first.py")], tmp_path)
    for r in _reports(done, tmp_path, 2):
        assert r == {"rank": r["rank"], "torch_backend": "gloo", "torch_sum": 2.0, "zerocomm_sum": 2.0,
                     "torch_initialized_after_zerocomm_destroy": True}


def _params(path: Path) -> dict:
    return torch.load(path)


def test_elastic_restart_resumes_bit_for_bit(tmp_path):
    """A rank dies mid-run; torchrun restarts the worker group once; the new attempt resumes from the
    checkpoint root's ``latest``. Its final parameters equal an uninterrupted run's exactly."""
    steps, die_at = 7, 5
    whole = _launch(LAUNCHERS["torchrun"](2) + [str(SCRIPTS / "elastic_train.py"), str(tmp_path / "ckpt-whole"),
                                                str(tmp_path / "whole.pt"), str(steps), "-1"], tmp_path)
    assert whole.returncode == 0, whole.stdout[-4000:]
    restarted = _launch([_tool("torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                         str(SCRIPTS / "elastic_train.py"), str(tmp_path / "ckpt-restarted"),
                         str(tmp_path / "restarted.pt"), str(steps), str(die_at)], tmp_path)
    assert restarted.returncode == 0, restarted.stdout[-4000:]
    out = restarted.stdout
    assert "rank 1 attempt 0 starts at step 0" in out and "rank 1 attempt 1 starts at step 4" in out, out[-4000:]
    a, b = _params(tmp_path / "whole.pt"), _params(tmp_path / "restarted.pt")
    assert a.keys() == b.keys()
    largest = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"elastic restart: largest parameter difference against the uninterrupted run: {largest}")
    assert largest == 0.0, f"largest parameter difference after the restart: {largest}"


def test_torchrun_across_two_simulated_hosts(tmp_path):
    """Two hosts (network namespaces with their own hostnames, a 1 Gbit/s shaped link), one torchrun agent on
    each, meeting through the c10d rendezvous by host name; 2 ranks per host."""
    from zerocomm.benchmarks import cluster
    reason = cluster.unavailable()
    if reason:
        pytest.skip(f"simulated hosts cannot be built here: {reason}")
    cluster.remove_stale()
    hosts = cluster.Cluster(2, cluster.parse_rate("1gbit"))
    agents = []
    try:
        hosts.build()
        for i in range(2):
            command = ["ip", "netns", "exec", hosts.host_ns(i), "unshare", "--uts", "--", "sh", "-c",
                       'hostname "$0" && exec "$@"', hosts.hostname(i), _tool("torchrun"), "--nnodes", "2",
                       "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "zerocomm-test",
                       "--rdzv-endpoint", f"{hosts.hostname(0)}:29400", "--local-addr", hosts.address(i),
                       str(SCRIPTS / "default_group.py")]
            agents.append(subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outputs = []
        for agent in agents:
            try:
                outputs.append(agent.communicate(timeout=LAUNCH_TIMEOUT_S)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"torchrun on two hosts did not finish within {LAUNCH_TIMEOUT_S} s")
        for agent, out in zip(agents, outputs):
            assert agent.returncode == 0, out[-4000:]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        hosts.teardown()
    reports = _reports(subprocess.CompletedProcess([], 0, "".join(outputs)), tmp_path, 4)
    _check_default_group(reports, 4, "gloo")
    assert sorted({r["host"] for r in reports}) == sorted(hosts.hostname(i) for i in range(2))
    assert all(not Path("/etc/netns", hosts.host_ns(i)).exists() for i in range(2))


def _free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("scheme", ["env", "tcp", "file"])
def test_ranks_started_by_hand_meet_through_each_init_method(scheme, tmp_path):
    """No launcher: env:// (rank 0 serves the store on MASTER_PORT), tcp://host:port and file://, as in torch."""
    n, port = 3, _free_port()
    init_method = {"env": "env://", "tcp": f"tcp://127.0.0.1:{port}", "file": f"file://{tmp_path}/store"}[scheme]
    procs = []
    for rank in range(n):
        env = dict(_env(), RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / "rendezvous.py"), init_method, str(rank), str(n)],
                                      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=LAUNCH_TIMEOUT_S)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(outputs)[-4000:]
    reports = _reports(subprocess.CompletedProcess([], 0, ""), tmp_path, n)
    assert all(r == {"rank": r["rank"], "size": n, "sum": 6.0, "torch_rank": r["rank"]} for r in reports), reports
