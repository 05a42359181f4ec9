"""``zerocomm-bench cluster``: a simulated cluster on one machine, and all_reduce measured across it.

It builds ``--hosts`` H "hosts" as Linux network namespaces, each with its own hostname (a UTS
namespace: ``comm.topology`` tells hosts apart by hostname, as on real machines; nothing sets
``ZEROCOMM_HOST``), and one veth link from each to a bridge in a namespace of its own.  Each
link is shaped with ``tc``'s token bucket (``tbf``) to ``--rate`` in both directions, so a host
sends and receives at most that many bits per second, as through a full-duplex NIC; ranks on one
host talk over that namespace's loopback, unshaped.  In each host a small agent starts
``--ranks-per-host`` R ranks (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` as torchrun
sets them, ``GLOO_SOCKET_IFNAME`` so gloo binds the namespace's address), which time a
float32 all_reduce with each of ``--algorithms`` (``onebit``: ``compressed_all_reduce`` with a
ring inside) at each size; rank 0 writes the rows, and this process prints them.

Layout (``zc<pid>`` prefixes every name, so runs never collide and leftovers are recognised)::

    netns zc<pid>br:  bridge "sw0" -- port p<i> (tbf egress: into host i)
                                         |  veth
    netns zc<pid>h<i>: eth0 10.213.0.<i+1>/24 (tbf egress: out of host i), hostname zc<pid>-host<i>

Traffic only ever goes to these addresses.  Everything is torn down on exit, on failure, on
Ctrl-C and on SIGTERM (the agents' process groups are killed, then the namespaces deleted, which
deletes their links); a run first deletes what a dead earlier run (its pid gone) left behind.
Needs root and ``ip``, ``tc`` and ``unshare``; :func:`unavailable` says why not otherwise.
Timing is nccl-tests' (``report.TIMING_CONVENTION``): warmup calls, a barrier, ``--iters``
back-to-back calls timed together, per call, the maximum over ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .options import UsageError, list_of, positive_int
from .units import format_size, parse_size

HELP = "simulated cluster: hosts as network namespaces over a shaped link; all_reduce across them"

DESCRIPTION = """\
Builds a small cluster on this machine: each simulated host is a Linux network namespace with its
own hostname, joined to a bridge by one link shaped to --rate in both directions (as a full-duplex
NIC); ranks on one host talk over that host's loopback, unshaped.  Each host starts its ranks over
gloo, which time a float32 all_reduce with each algorithm at each size (onebit: the 1-bit
compressed all_reduce, --onebit-inner underneath), and the rows are printed with each one's time
over the ring's.  Everything is torn down on exit, on failure, on Ctrl-C and on SIGTERM.

Needs root and the ip, tc and unshare tools.

Examples:
  zerocomm-bench cluster --hosts 2 --ranks-per-host 2 --rate 1gbit --sizes 1MiB,16MiB
  zerocomm-bench cluster --zero 8         # ZeRO-3 beside ZeRO-3 + ZeRO++ (qwZ, hpZ, qgZ)
  zerocomm-bench cluster --cleanup        # remove what a dead earlier run left
"""

#: Every name this module creates starts with this and the creating process's pid.
PREFIX = "zc"
_STALE = re.compile(rf"^{PREFIX}(\d+)(br|h\d+)$")
SUBNET = "10.213.0"
MASTER_PORT = 29513
DEFAULT_ALGORITHMS = ("hierarchical", "ring", "native", "onebit")
#: The agent's job (JSON), and which host it runs.  Its optional ``rank_command`` replaces the benchmark's
#: rank (the fault-injection tests run their own); every rank reads the job from this variable too.
JOB_ENV = "ZEROCOMM_CLUSTER_JOB"
#: This module, as ``python -m`` runs it in each namespace.
MODULE = "zerocomm.benchmarks.cluster"
#: Seconds the whole launch may take after the cluster is up, by default.
DEFAULT_TIMEOUT_S = 600.0


def unavailable() -> Optional[str]:
    """``None`` when a cluster can be built here, else the reason (for skips and the CLI's error)."""
    if os.geteuid() != 0:
        return "building network namespaces needs root (run as root, or in a container that allows it)"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found on PATH (iproute2 and util-linux provide them)"
    probe = f"{PREFIX}{os.getpid()}h99999"  # a name the stale pass recognises, should this process die here
    made = _sh(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    try:
        qdisc = _sh(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1gbit",
                     "burst", "256kb", "latency", "100ms"], check=False)
        if qdisc.returncode != 0:
            return f"tc cannot add a tbf qdisc: {qdisc.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    return None


def _sh(command: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    listed = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _delete_namespace(name: str) -> None:
    """Kill what still runs in ``name`` (only ever our ranks) and delete it, with its links."""
    for pid in _sh(["ip", "netns", "pids", name], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _sh(["ip", "netns", "del", name], check=False)


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; the names removed."""
    removed = []
    for name in _namespaces():
        match = _STALE.match(name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            _delete_namespace(name)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
            removed.append(name)
    return removed


def _burst_bytes(rate_bits: int) -> int:
    # tbf drops packets bigger than its bucket; veth hands over segmentation-offloaded packets of up to
    # 64 KiB, so the bucket holds at least 256 KiB (and 2 ms at the rate for fast links).
    return max(256 << 10, rate_bits // 8 // 500)


def parse_rate(text: str) -> int:
    """``"1gbit"``, ``"10Gbit"``, ``"500mbit"`` -> bits per second."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit|b)?(?:/s)?\s*", text.lower())
    if not match:
        raise ValueError(f"rate {text!r}: expected a number of bits per second such as 1gbit or 500mbit")
    return int(float(match.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)])


@dataclass
class Cluster:
    """H namespaces joined by a bridge, each link shaped to ``rate_bits`` per second each way."""

    hosts: int
    rate_bits: int
    names_resolve: bool = True
    """Whether each host's ``/etc/hosts`` names every host (``/etc/netns/<ns>/hosts``).  False: as on clusters
    whose host names do not resolve to the link's address (several NICs, containers), only ``localhost``
    resolves; the ranks then need ``GLOO_SOCKET_IFNAME`` to bind the link's address."""
    prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    made: list = field(default_factory=list)
    made_files: list = field(default_factory=list)

    def host_ns(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def hostname(self, i: int) -> str:
        return f"{self.prefix}-host{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def build(self) -> None:
        bridge = f"{self.prefix}br"
        self._netns(bridge)
        _sh(["ip", "-n", bridge, "link", "add", "sw0", "type", "bridge"])
        _sh(["ip", "-n", bridge, "link", "set", "sw0", "up"])
        burst = str(_burst_bytes(self.rate_bits))
        shape = ["root", "tbf", "rate", str(self.rate_bits), "burst", burst, "latency", "100ms"]
        for i in range(self.hosts):
            ns, port = self.host_ns(i), f"p{i}"
            self._netns(ns)
            _sh(["ip", "-n", bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _sh(["ip", "-n", bridge, "link", "set", port, "master", "sw0", "up"])
            _sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"])
            _sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            _sh(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", *shape])  # out of the host
            _sh(["tc", "-n", bridge, "qdisc", "add", "dev", port, *shape])  # into the host
        self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        """``/etc/netns/<ns>/hosts`` for every host: ``ip netns exec`` mounts it over ``/etc/hosts``, so each
        host resolves every host's name to its address (torchrun's rendezvous passes names around), or, with
        ``names_resolve`` off, no host's name (a file of its own still stands in for the machine's)."""
        lines = ["127.0.0.1 localhost"]
        if self.names_resolve:
            lines += [f"{self.address(i)} {self.hostname(i)}" for i in range(self.hosts)]
        for i in range(self.hosts):
            folder = Path("/etc/netns") / self.host_ns(i)
            folder.mkdir(parents=True, exist_ok=True)
            self.made_files.append(folder)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def set_link(self, i: int, up: bool) -> None:
        """Bring host ``i``'s link down (or up again) at the bridge's end, as a pulled cable would: the
        host's ``eth0`` loses its carrier, nothing is reset, packets stop (the fault-injection tests)."""
        _sh(["ip", "-n", f"{self.prefix}br", "link", "set", f"p{i}", "up" if up else "down"])

    def _netns(self, name: str) -> None:
        _sh(["ip", "netns", "add", name])
        self.made.append(name)

    def teardown(self) -> None:
        for name in reversed(self.made):
            _delete_namespace(name)
        self.made.clear()
        for folder in self.made_files:
            shutil.rmtree(folder, ignore_errors=True)
        self.made_files.clear()


class _Interrupted(BaseException):
    """SIGTERM turned into an exception, so ``finally`` blocks tear the cluster down."""


def _on_signal(number, frame):
    raise _Interrupted(f"stopped by {signal.Signals(number).name}")


def launch(cluster: Cluster, ranks_per_host: int, job: dict, timeout_s: float) -> int:
    """Start one agent per host (in its namespace, with its own hostname); the worst exit status."""
    world = cluster.hosts * ranks_per_host
    agents = []
    try:
        for i in range(cluster.hosts):
            env = {k: v for k, v in os.environ.items() if k != "ZEROCOMM_HOST"}
            env[JOB_ENV] = json.dumps({**job, "host": i, "ranks_per_host": ranks_per_host, "world_size": world,
                                       "master": cluster.address(0)})
            command = ["ip", "netns", "exec", cluster.host_ns(i), "unshare", "--uts", "--",
                       sys.executable, "-m", MODULE, "--agent", cluster.hostname(i)]
            agents.append(subprocess.Popen(command, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        worst = 0
        for agent in agents:
            try:
                status = agent.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"zerocomm-bench cluster: the ranks did not finish within {timeout_s:g} s\n")
                return 1
            worst = worst or status
            if status != 0:  # the others wait for this one's peers: do not wait out their timeout
                break
        return worst
    finally:
        for agent in agents:
            if agent.poll() is None:
                try:
                    os.killpg(agent.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            agent.wait()


def _agent(hostname: str) -> int:
    """Inside a host's namespaces: take the hostname, start this host's ranks, wait for them."""
    import socket
    socket.sethostname(hostname)
    job = json.loads(os.environ[JOB_ENV])
    procs = []
    for local in range(job["ranks_per_host"]):
        env = dict(os.environ, RANK=str(job["host"] * job["ranks_per_host"] + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(job["world_size"]), MASTER_ADDR=job["master"], MASTER_PORT=str(MASTER_PORT),
                   OMP_NUM_THREADS="1")
        if job.get("ifname", "eth0"):  # the link's interface, named as on clusters with several NICs
            env["GLOO_SOCKET_IFNAME"] = job.get("ifname", "eth0")
        procs.append(subprocess.Popen(job.get("rank_command") or [sys.executable, "-m", MODULE, "--rank"], env=env))
    worst = 0
    for proc in procs:
        status = proc.wait()
        worst = worst or status
    return worst


# -- one rank ------------------------------------------------------------------------------------------

def _rank() -> int:
    import torch

    import zerocomm.comm as dist
    from zerocomm.ops import ErrorFeedback

    torch.set_num_threads(1)
    job = json.loads(os.environ[JOB_ENV])
    import datetime
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=job["timeout_s"]))
    rank, n = dist.get_rank(), dist.get_world_size()
    import socket
    hostnames = [None] * n
    dist.all_gather_object(hostnames, socket.gethostname())
    rows = []
    try:
        for nbytes in job["sizes"]:
            numel = nbytes // 4
            base = torch.arange(numel, dtype=torch.float32).remainder_(7)
            expected = base * n + n * (n - 1) / 2
            for algorithm in job["algorithms"]:
                x = base + rank
                state = ErrorFeedback(f"cluster {algorithm}")

                def call():
                    if algorithm == "onebit":
                        dist.compressed_all_reduce(x, state, algorithm=job["onebit_inner"])
                    else:
                        dist.all_reduce(x, algorithm=algorithm)

                call()
                correct = None if algorithm == "onebit" else bool(torch.equal(x, expected))
                for _ in range(job["warmup"]):
                    call()
                dist.barrier(algorithm="native")
                start = time.perf_counter()
                for _ in range(job["iters"]):
                    call()
                elapsed = torch.tensor([(time.perf_counter() - start) / job["iters"],
                                        0.0 if correct in (None, True) else 1.0], dtype=torch.float64)
                dist.all_reduce(elapsed, dist.ReduceOp.MAX, algorithm="native")
                rows.append({"size": nbytes, "algorithm": algorithm, "time_s": elapsed[0].item(),
                             "correct": None if correct is None else elapsed[1].item() == 0.0})
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(job["out"], "w") as handle:
            json.dump({"hostnames": hostnames, "rows": rows}, handle)
    return 0 if all(row["correct"] is not False for row in rows) else 1


# -- the command --------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=positive_int, default=2, metavar="H", help="simulated hosts (default: 2)")
    parser.add_argument("--ranks-per-host", type=positive_int, default=2, metavar="R", help="ranks on each host (default: 2)")
    parser.add_argument("--rate", default="1gbit", metavar="RATE", help="each host's link, each way: 1gbit, 10gbit ... (default: 1gbit)")
    parser.add_argument("--sizes", type=list_of(parse_size, "size"), default=[16 << 20], metavar="S[,S...]",
                        help="all_reduce sizes in bytes of float32 (default: 16MiB)")
    parser.add_argument("--algorithms", type=list_of(str, "algorithm"), default=list(DEFAULT_ALGORITHMS),
                        metavar="ALG[,ALG...]",
                        help="native, ring, tree, recursive_doubling, hierarchical, or onebit (the 1-bit "
                             f"compressed all_reduce) (default: {','.join(DEFAULT_ALGORITHMS)})")
    parser.add_argument("--onebit-inner", default="ring", metavar="ALG", help="algorithm inside onebit (default: ring)")
    parser.add_argument("-w", "--warmup", type=int, default=2, metavar="N", help="untimed calls per cell (default: 2)")
    parser.add_argument("-n", "--iters", type=positive_int, default=5, metavar="N", help="timed calls per cell (default: 5)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"seconds the ranks may run in all (default: {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", metavar="PATH", help="write the setup, load and rows as JSON")
    parser.add_argument("--plot", metavar="PNG", help="bar chart of the times (needs matplotlib)")
    parser.add_argument("--cleanup", action="store_true", help="only remove what dead earlier runs left, and exit")
    parser.add_argument("--unresolved-names", action="store_true",
                        help="write no host names into the hosts' /etc/hosts (as on clusters whose names do not resolve "
                             "to the link's address); the ranks bind the link by GLOO_SOCKET_IFNAME=eth0")
    parser.add_argument("--zero", type=positive_int, metavar="STEPS",
                        help="instead of all_reduce: train the ~10 M-parameter LM for STEPS steps with ZeRO-3 and with "
                             "ZeRO-3 + ZeRO++ (qwZ, hpZ, qgZ) and print step time, bytes over the links and losses")
    parser.add_argument("--zero-batch", type=positive_int, default=4, metavar="B",
                        help="--zero: sequences per rank per step (default: 4)")
    parser.add_argument("--zero-bits", type=int, choices=(4, 8), default=4,
                        help="--zero: bits of qgZ's gradient codes (default: 4)")
    parser.add_argument("--zero-profile", metavar="PATH",
                        help="--zero: rank 0 writes cProfile statistics of each variant's timed steps to PATH.0 "
                             "(ZeRO-3) and PATH.1 (ZeRO-3 + ZeRO++); read them with python -m pstats")


def run(args: argparse.Namespace) -> int:
    try:
        rate = parse_rate(args.rate)
    except ValueError as exc:
        raise UsageError(f"--rate: {exc}") from None
    why = unavailable()
    if why is not None:
        sys.stderr.write(f"zerocomm-bench cluster: cannot build a cluster here: {why}\n")
        return 2
    for name in remove_stale():
        print(f"# removed {name}, left by an earlier run")
    if args.cleanup:
        return 0
    if args.zero:
        from . import zeropp_bench
        job = zeropp_bench.job(steps=args.zero, batch=args.zero_batch, bits=args.zero_bits, lr=1e-3, job_env=JOB_ENV,
                               profile=args.zero_profile and os.path.abspath(args.zero_profile))
        ran = run_job(args.hosts, args.ranks_per_host, rate, job, args.timeout, names_resolve=not args.unresolved_names)
        if ran is None:
            return 1
        result = zeropp_bench.result(job, *ran, hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate_bits=rate)
        print(zeropp_bench.format_table(result))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=1)
        return 0
    result = measure(args.hosts, args.ranks_per_host, rate, args.sizes, args.algorithms, warmup=args.warmup,
                     iters=args.iters, timeout_s=args.timeout, onebit_inner=args.onebit_inner,
                     names_resolve=not args.unresolved_names)
    if result is None:
        return 1
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    if args.plot:
        plot(result, args.plot)
    return 0 if all(row["correct"] is not False for row in result["rows"]) else 1


def run_job(hosts: int, ranks_per_host: int, rate_bits: int, job: dict, timeout_s: float, *,
            names_resolve: bool = True) -> Optional[tuple]:
    """Build the cluster, run ``job`` in its ranks (rank 0 writes its JSON to ``job["out"]``, set here), tear it
    all down; ``(what rank 0 wrote, load before, load after)``, or ``None`` if a rank failed."""
    cluster = Cluster(hosts, rate_bits, names_resolve=names_resolve)
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with tempfile.TemporaryDirectory(prefix="zerocomm-cluster-") as folder:
            out = os.path.join(folder, "rows.json")
            cluster.build()
            load_before = os.getloadavg()
            status = launch(cluster, ranks_per_host, {**job, "out": out, "timeout_s": timeout_s}, timeout_s)
            if status != 0 or not os.path.exists(out):
                return None
            with open(out) as handle:
                measured = json.load(handle)
    finally:
        cluster.teardown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return measured, load_before, os.getloadavg()


def measure(hosts: int, ranks_per_host: int, rate_bits: int, sizes: Sequence[int], algorithms: Sequence[str], *,
            warmup: int = 2, iters: int = 5, timeout_s: float = DEFAULT_TIMEOUT_S,
            onebit_inner: str = "ring", names_resolve: bool = True) -> Optional[dict]:
    """Build the cluster, run the ranks, tear it all down; the setup, load and rows (``None`` if a rank failed)."""
    ran = run_job(hosts, ranks_per_host, rate_bits, {"sizes": list(sizes), "algorithms": list(algorithms),
                                                     "warmup": warmup, "iters": iters, "onebit_inner": onebit_inner},
                  timeout_s, names_resolve=names_resolve)
    if ran is None:
        return None
    measured, load_before, load_after = ran
    return {"hosts": hosts, "ranks_per_host": ranks_per_host, "rate_bits": rate_bits, "backend": "gloo",
            "names_resolve": names_resolve,
            "warmup": warmup, "iters": iters, "onebit_inner": onebit_inner, "load_before": load_before,
            "load_after": load_after, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "hostnames": measured["hostnames"], "rows": measured["rows"]}


def format_table(result: dict) -> str:
    rate = result["rate_bits"]
    lines = [f"# {result['hosts']} hosts x {result['ranks_per_host']} ranks, gloo, each link {rate / 1e9:g} Gbit/s "
             f"each way; hostnames {', '.join(result['hostnames'])}; load {' '.join(f'{x:.2f}' for x in result['load_before'])} (before), "
             f"{' '.join(f'{x:.2f}' for x in result['load_after'])} (after)"
             + ("" if result.get("names_resolve", True) else "; host names do not resolve (GLOO_SOCKET_IFNAME=eth0)"),
             f"# {'size':>10} {'algorithm':>13} {'time (ms)':>10} {'vs ring':>8} {'checked':>8}"]
    ring = {row["size"]: row["time_s"] for row in result["rows"] if row["algorithm"] == "ring"}
    for row in result["rows"]:
        ratio = ring.get(row["size"], float("nan")) / row["time_s"]
        checked = {None: "-", True: "ok", False: "WRONG"}[row["correct"]]
        lines.append(f"  {format_size(row['size']):>10} {row['algorithm']:>13} {row['time_s'] * 1e3:>10.1f} "
                     f"{ratio:>7.2f}x {checked:>8}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("zerocomm-bench cluster: matplotlib is missing; no plot (pip install 'zerocomm[bench]')\n")
        return
    sizes = sorted({row["size"] for row in result["rows"]})
    algorithms = list(dict.fromkeys(row["algorithm"] for row in result["rows"]))
    times = {(row["size"], row["algorithm"]): row["time_s"] * 1e3 for row in result["rows"]}
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(algorithms)
    for a, algorithm in enumerate(algorithms):
        xs = [s + a * width for s in range(len(sizes))]
        ax.bar(xs, [times.get((size, algorithm), 0.0) for size in sizes], width, label=algorithm)
    ax.set_xticks([s + 0.4 - width / 2 for s in range(len(sizes))], [format_size(size) for size in sizes])
    ax.set_ylabel("all_reduce time (ms, lower is better)")
    ax.set_title(f"{result['hosts']} hosts x {result['ranks_per_host']} ranks, {result['rate_bits'] / 1e9:g} Gbit/s links")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--agent"]:
        signal.signal(signal.SIGTERM, _on_signal)
        return _agent(argv[1])
    if argv[:1] == ["--rank"]:
        return _rank()
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
