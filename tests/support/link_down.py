"""One rank of the link-down case (tests/comm/test_link_down.py), run inside a simulated host.

``zerocomm-bench cluster``'s agent starts it in the host's namespaces with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and the job in ``ZEROCOMM_CLUSTER_JOB``.  The rank joins the world
(a generous init timeout: ranks start over several seconds on a loaded machine), makes a group
with the case's short timeout, checks one all_reduce, says it is ready (a file in the job's
folder), then repeats the same long all_reduce until a call raises — the test takes a host's
link down meanwhile.  Every completed call is verified (no garbage before the fault).  It writes
its answer to ``answer<rank>.json``, then exits on its own:

    {"rank", "pid", "hostname", "calls", "wrong", "first": [type, time.time() when raised, message],
     "again": [type, seconds, message]}  (the call after the failure: the group must refuse at once)
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch

from support.faults import caught  # run as ``-m support.link_down``

#: Seconds the world's init may take (the ranks of both hosts start one by one on two cores).
INIT_TIMEOUT_S = 60.0
#: A rank that never sees the fault stops looping after this many seconds (the test then fails).
GIVE_UP_S = 60.0


def main() -> int:
    import zerocomm.comm as dist

    torch.set_num_threads(1)
    job = json.loads(os.environ["ZEROCOMM_CLUSTER_JOB"])
    folder = Path(job["folder"])
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    rank, n = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(timeout=datetime.timedelta(seconds=job["timeout_s"]))
    base = torch.arange(job["numel"], dtype=torch.float32).remainder_(7)
    expected = base * n + n * (n - 1) / 2  # integer-valued: exact in any order

    def one_call() -> bool:
        x = base + rank
        dist.all_reduce(x, group=group, algorithm=job["algorithm"])
        return bool(torch.equal(x, expected))

    calls, wrong = 1, int(not one_call())
    (folder / f"ready{rank}").write_text(str(os.getpid()))
    first = ["none", time.time(), f"no call raised within {GIVE_UP_S:g} s"]
    give_up = time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up:
        try:
            ok = one_call()
        except dist.CommError as error:
            first = [type(error).__name__, time.time(), str(error)]
            break
        calls += 1
        wrong += not ok
    again = caught(lambda: dist.all_reduce(torch.ones(1), group=group))
    answer = {"rank": rank, "pid": os.getpid(), "hostname": socket.gethostname(), "calls": calls,
              "wrong": wrong, "first": first, "again": again}
    (folder / f"answer{rank}.json").write_text(json.dumps(answer))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
