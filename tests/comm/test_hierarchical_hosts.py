"""algorithm="hierarchical" through the public API, in real processes that report different hosts.

Each rank sets ``ZEROCOMM_HOST`` to its pretend host (uneven, interleaved, one host, one rank per
host), makes a fresh group over every rank that learns those hosts (``support.pretend_hosts``) and
runs all_reduce, reduce_scatter_tensor, all_gather_into_tensor and broadcast with every dtype and
op the cell admits, against numpy, on sizes that are empty, smaller than the group, not divisible
by a host's size, and large enough for several pipelined rounds.  The other collectives are
refused naming what to use.  gloo (sub-communicators are ProcessGroupGloo splits) and MPI.
"""

import numpy as np
import pytest
import torch

from support.dist import UnsupportedError, dist
from support.pretend_hosts import group_on_hosts
from support.reference import DTYPES, RTOL, admitted_ops, rank_input, reduce
from support.worlds import worlds

RUN_TIMEOUT_S = 240.0
#: Pretend hosts by world size.
LAYOUTS = {1: ["a"], 2: ["ab", "aa"], 3: ["aab", "aba"], 4: ["aaab", "abab", "aabb"]}
#: float32 elements: above the small-message bound and 2 MiB rounds (several rounds, a short last one).
LARGE = (5 << 20) // 4 + 3


def _close(got: torch.Tensor, expected: np.ndarray) -> bool:
    if got.dtype.is_floating_point:  # one rounding (avg's division) in the tensor's dtype
        return np.allclose(got.to(torch.float64).numpy(), expected, rtol=RTOL[got.dtype], atol=0.0)
    return np.array_equal(got.numpy(), expected.astype(got.numpy().dtype))


def _tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values).to(dtype)


def run_hierarchical(names: str) -> list:
    """On every rank: its checks that failed, as text (empty: all passed)."""
    failures = []
    with group_on_hosts(names) as group:
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        kw = {"group": group, "algorithm": "hierarchical"}
        for dtype in DTYPES:
            for op in admitted_ops(dtype):
                for count in (0, 1, 2 * n + 1):
                    inputs = [rank_input(r, count, dtype, op) for r in range(n)]
                    x = _tensor(inputs[rank], dtype)
                    dist.all_reduce(x, getattr(dist.ReduceOp, op.upper()), **kw)
                    if not _close(x, reduce(inputs, op)):
                        failures.append(f"all_reduce {dtype} {op} count={count}")
                    full = [rank_input(r, n * count, dtype, op, salt=1) for r in range(n)]
                    out = torch.empty(count, dtype=dtype)
                    dist.reduce_scatter_tensor(out, _tensor(full[rank], dtype), getattr(dist.ReduceOp, op.upper()),
                                               **kw)
                    if not _close(out, reduce(full, op)[rank * count:(rank + 1) * count]):
                        failures.append(f"reduce_scatter {dtype} {op} count={count}")
            blocks = [rank_input(r, 3, dtype) for r in range(n)]
            out = torch.empty(3 * n, dtype=dtype)
            dist.all_gather_into_tensor(out, _tensor(blocks[rank], dtype), **kw)
            if not _close(out, np.concatenate(blocks)):
                failures.append(f"all_gather {dtype}")
            for root in range(n):
                x = _tensor(blocks[rank], dtype)
                dist.broadcast(x, group_src=root, **kw)
                if not _close(x, blocks[root]):
                    failures.append(f"broadcast {dtype} root={root}")
        inputs = [rank_input(r, LARGE, torch.float32, "sum") for r in range(n)]
        x = _tensor(inputs[rank], torch.float32)
        dist.all_reduce(x, **kw)
        if not _close(x, reduce(inputs, "sum")):
            failures.append("all_reduce large float32")
        try:
            dist.gather(torch.zeros(1), [torch.zeros(1) for _ in range(n)] if rank == 0 else None, group_dst=0, **kw)
            failures.append("gather was not refused")
        except UnsupportedError as error:
            if "hierarchical" not in str(error) or "instead" not in str(error):
                failures.append(f"gather refusal names no alternative: {error}")
    return failures


@pytest.mark.parametrize("world", worlds(sizes=(1, 2, 3, 4)), indirect=True)
def test_hierarchical_on_pretend_hosts(world):
    for names in LAYOUTS[world.world_size]:
        reports = world.run(run_hierarchical, names, timeout=RUN_TIMEOUT_S)
        for rank, failures in enumerate(reports):
            assert failures == [], f"hosts {names!r}, rank {rank}: {failures}"
