"""``srun python train.py``, simulated: each task started with only the variables srun gives it.

srun itself needs a Slurm controller, so these tests play its part: they start one process per task with the
``SLURM_*`` variables srun sets under its default block layout (tasks 0..k-1 on the first node, and so on)
and none of torch's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` removed).
Each task runs ``init_process_group()``, an all_reduce and an all_gather of host names
(``scripts/slurm_task.py``), and the test checks what every rank saw against the layout it gave.

One test runs on this host and always runs; the other runs two tasks on each of two simulated hosts (network
namespaces with their own hostnames, ``zerocomm.benchmarks.cluster``), the node list naming them in Slurm's
compressed form, and skips saying why where namespaces cannot be built.  Every launch has a deadline and is
killed with its process group when it passes it; the namespaces are torn down however the test ends.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.launchers import LAUNCH_TIMEOUT_S, clean_env

SCRIPT = Path(__file__).parent / "scripts" / "slurm_task.py"
TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def srun_env(procid: int, hosts: list, nodelist: str, tasks_per_node: list, tasks_per_node_text: str,
             job_id: int, **extra) -> dict:
    """The environment srun gives task ``procid`` of a step over ``hosts`` (written ``nodelist``) with
    ``tasks_per_node[k]`` tasks on node k, laid out in blocks; torch's launch variables removed."""
    node = next(k for k in range(len(hosts)) if procid < sum(tasks_per_node[:k + 1]))
    env = {k: v for k, v in clean_env().items() if k not in TORCH_VARIABLES and not k.startswith("SLURM_")}
    n = sum(tasks_per_node)
    env.update({
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid - sum(tasks_per_node[:node])),
        "SLURM_NODEID": str(node), "SLURM_NTASKS": str(n), "SLURM_NPROCS": str(n), "SLURM_STEP_NUM_TASKS": str(n),
        "SLURM_NNODES": str(len(hosts)), "SLURM_STEP_NUM_NODES": str(len(hosts)),
        "SLURM_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks_per_node_text, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text,
        "ZEROCOMM_TIMEOUT": "60",  # a rank that never comes fails the others in a minute, not five
    })
    env.update(extra)
    return env


def run_tasks(commands: list, cwd: Path) -> list:
    """Start every (command, env) at once, each in its own session; their outputs, once all have exited 0.
    On the deadline or a failure every task still running is killed with its process group."""
    procs = []
    try:
        for command, env in commands:
            procs.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True))
        outputs = []
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=LAUNCH_TIMEOUT_S)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"a task did not finish within {LAUNCH_TIMEOUT_S} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    failed = [(i, proc.returncode) for i, proc in enumerate(procs) if proc.returncode != 0]
    assert not failed, f"tasks (index, exit status) {failed} failed:\n" + "\n".join(o[-3000:] for o in outputs)
    return outputs


def check_reports(folder: Path, hosts: list, tasks_per_node: list, port: int, preset: dict = {}) -> list:
    """Every rank's report against the layout: rank = its Slurm task id, the world and this node's share of it,
    the master on the first node, the sums 1 + ... + n and 0 + ... + (n - 1), each rank's host.  ``preset``:
    torch's variables the tasks were started with (they keep their values)."""
    n = sum(tasks_per_node)
    reports = sorted((json.loads(p.read_text()) for p in folder.glob("report-*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == list(range(n))
    node_of = [k for k, count in enumerate(tasks_per_node) for _ in range(count)]
    host_of = [hosts[k] for k in node_of]
    for r in reports:
        rank = r["rank"]
        assert r["before"] == {**dict.fromkeys(TORCH_VARIABLES), **preset}, r  # nothing else of torch's was set
        assert r["slurm_procid"] == rank and r["size"] == n and r["backend"] == "gloo", r
        node = node_of[rank]
        assert r["after"] == {"RANK": str(rank), "WORLD_SIZE": str(n),
                              "LOCAL_RANK": str(rank - sum(tasks_per_node[:node])),
                              "LOCAL_WORLD_SIZE": str(tasks_per_node[node]), "MASTER_ADDR": hosts[0],
                              "MASTER_PORT": str(port)}, r
        assert r["sums"] == [n * (n + 1) / 2, n * (n - 1) / 2], r
        assert r["host"] == host_of[rank] and r["hosts"] == host_of, r
    return reports


def _resolvable_hostname() -> str:
    """This machine's hostname when it resolves (a node list names hosts), else ``localhost``."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        return "localhost"


def _free_job_id(host: str) -> int:
    """A job id whose derived port (15000 + id % 10000, as the module documents it) is free here now."""
    rng = random.Random()
    for _ in range(200):
        job_id = rng.randrange(10**5, 10**7)
        with socket.socket() as probe:
            try:
                probe.bind((socket.gethostbyname(host), 15000 + job_id % 10000))
                return job_id
            except OSError:
                continue
    pytest.skip("no free port in 15000-24999 to derive from a job id")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("port_from", ["SLURM_JOB_ID", "MASTER_PORT"])
def test_srun_on_one_host(port_from, tmp_path):
    """``srun --ntasks=2 python slurm_task.py`` on this host; the port derived from the job id, or the
    MASTER_PORT the batch script exported (which wins over the derived one)."""
    host = _resolvable_hostname()
    job_id = _free_job_id(host)
    port = 15000 + job_id % 10000
    extra = {}
    if port_from == "MASTER_PORT":
        port = _free_port()
        extra["MASTER_PORT"] = str(port)
    commands = [([sys.executable, str(SCRIPT)], srun_env(i, [host], host, [2], "2", job_id, **extra)) for i in range(2)]
    outputs = run_tasks(commands, tmp_path)
    print("".join(outputs))
    check_reports(tmp_path, [host], [2], port, extra)


def test_srun_across_two_simulated_hosts(tmp_path):
    """``srun --nodes=2 --ntasks-per-node=2 python slurm_task.py``: the node list ``<prefix>-host[0-1]`` names
    the two simulated hosts, whose names resolve through the hosts files the cluster writes."""
    from zerocomm.benchmarks import cluster
    reason = cluster.unavailable()
    if reason:
        pytest.skip(f"simulated hosts cannot be built here: {reason}")
    cluster.remove_stale()
    sim = cluster.Cluster(2, cluster.parse_rate("1gbit"))
    hosts = [sim.hostname(0), sim.hostname(1)]
    nodelist = f"{sim.prefix}-host[0-1]"
    job_id = 3141592  # the namespaces are fresh: its port, 16592, is free there
    try:
        sim.build()
        commands = []
        for i in range(4):
            node = i // 2
            env = srun_env(i, hosts, nodelist, [2, 2], "2(x2)", job_id, SLURM_NTASKS_PER_NODE="2",
                           GLOO_SOCKET_IFNAME="eth0")
            command = ["ip", "netns", "exec", sim.host_ns(node), "unshare", "--uts", "--", "sh", "-c",
                       'hostname "$0" && exec "$@"', hosts[node], sys.executable, str(SCRIPT)]
            commands.append((command, env))
        outputs = run_tasks(commands, tmp_path)
    finally:
        sim.teardown()
    print("".join(outputs))
    check_reports(tmp_path, hosts, [2, 2], 15000 + job_id % 10000)
    assert all(not Path("/etc/netns", sim.host_ns(i)).exists() for i in range(2))
