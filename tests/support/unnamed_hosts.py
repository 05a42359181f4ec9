"""One rank on the simulated cluster whose host names do not resolve (``tests/launchers/test_unnamed_hosts.py``).

Started by the cluster's agent (``benchmarks/cluster.py``) with torchrun's variables and, where the job names
one, ``GLOO_SOCKET_IFNAME``.  It joins the world with ``init_process_group()`` and no arguments (the deadline is
``ZEROCOMM_TIMEOUT``'s), runs the hierarchical all_reduce and a few collectives against numpy, and writes
``answer-RANK.json`` into the job's folder: what it saw, or the error it raised and when.
"""
import json
import os
import socket
import sys
import time

import numpy as np
import torch

#: float32 elements of the hierarchical all_reduce: several 2 MiB rounds and a short last one.
NUMEL = (5 << 20) // 4 + 3


def main() -> int:
    import zerocomm.comm as dist
    from zerocomm.benchmarks.cluster import JOB_ENV

    job = json.loads(os.environ[JOB_ENV])
    rank = int(os.environ["RANK"])
    answer = {"rank": rank, "hostname": socket.gethostname(), "pid": os.getpid(),
              "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
    start = time.monotonic()
    try:
        dist.init_process_group()
        answer["init_s"] = time.monotonic() - start
        n = dist.get_world_size()
        base = torch.arange(NUMEL, dtype=torch.float32).remainder_(7)
        x = base + rank
        dist.all_reduce(x, algorithm="hierarchical")
        expected = base.numpy() * n + n * (n - 1) / 2
        answer["hierarchical_equal"] = bool(np.array_equal(x.numpy(), expected))
        hosts = [None] * n
        dist.all_gather_object(hosts, socket.gethostname())
        answer["hosts"] = hosts
        out = torch.empty(2 * n, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([rank, -rank]))
        answer["all_gather_equal"] = out.tolist() == [v for r in range(n) for v in (r, -r)]
        dist.destroy_process_group()
    except Exception as error:  # the test asserts the type: every failure must be one of zerocomm's
        answer.update(error=type(error).__name__, error_module=type(error).__module__, message=str(error)[:2000],
                      seconds=time.monotonic() - start)
    with open(os.path.join(job["folder"], f"answer-{rank}.json"), "w") as handle:
        json.dump(answer, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
