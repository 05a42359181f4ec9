"""Run one collective algorithm on the in-process fake transport and check it against numpy.

Each ``check_*`` takes the algorithm function (so ring, tree and any later algorithm share
the checks), builds every rank's inputs from :mod:`support.references`, runs the ranks as
threads, and asserts: the result on every rank that holds one, the buffers that must stay
untouched, and that no message was left unmatched.  Every wait is bounded by a deadline.
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from support.local_transport import LocalFabric, run_ranks
from support.references import assert_matches, rank_values, reference, to_numpy, to_torch

DEADLINE_S = 20.0


def deadline() -> float:
    return time.monotonic() + DEADLINE_S


def on_pretend_hosts(fn, names: str):
    """``fn`` run after each rank learnt ``names[rank]`` as its host (the first exchange of its transport;
    threads share one environment, so ``ZEROCOMM_HOST`` cannot tell them apart)."""
    from zerocomm.comm import topology

    @functools.wraps(fn)
    def wrapped(t, *args, tag, **kw):
        topology.hosts(t, tag=tag, deadline=deadline(), name=names[t.rank])
        fn(t, *args, tag=tag, **kw)

    return wrapped


def _run(n: int, body: Callable, fabric: Optional[LocalFabric] = None) -> list:
    fabric = fabric if fabric is not None else LocalFabric(n)
    results = run_ranks(n, body, fabric=fabric, timeout_s=DEADLINE_S + 10)
    assert fabric.pending() == 0, f"{fabric.pending()} posted messages were never matched"
    return results


def check_all_reduce(fn, n, numel, dtype, op, segment_bytes, *, tag=7, fabric=None):
    inputs = [rank_values(r, numel, dtype, op) for r in range(n)]
    expected = reference(inputs, op)

    def body(t):
        x = to_torch(inputs[t.rank], dtype)
        fn(t, x, op, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return x

    results = _run(n, body, fabric)
    for r, out in enumerate(results):
        assert_matches(out, expected, f"{fn.__name__} n={n} numel={numel} {dtype} {op}: rank {r}")
        # Every rank holds the same bits: results that differ in the last place across ranks
        # make replicas drift apart in data-parallel training.
        assert torch.equal(out, results[0]), f"{fn.__name__}: rank {r}'s result differs from rank 0's"


def check_reduce(fn, n, numel, dtype, op, root, segment_bytes, *, tag=7):
    inputs = [rank_values(r, numel, dtype, op) for r in range(n)]
    expected = reference(inputs, op)

    def body(t):
        x = to_torch(inputs[t.rank], dtype)
        fn(t, x, op, root, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return x

    for r, out in enumerate(_run(n, body)):
        what = f"{fn.__name__} n={n} numel={numel} {dtype} {op} root={root}: rank {r}"
        assert_matches(out, expected if r == root else inputs[r], what)


def check_broadcast(fn, n, numel, dtype, root, segment_bytes, *, tag=7):
    inputs = [rank_values(r, numel, dtype, "max") for r in range(n)]

    def body(t):
        x = to_torch(inputs[t.rank], dtype)
        fn(t, x, root, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return x

    for r, out in enumerate(_run(n, body)):
        assert_matches(out, inputs[root], f"{fn.__name__} n={n} numel={numel} root={root}: rank {r}")


def _blocks(n: int, m: int, dtype: torch.dtype, op: str = "max") -> list[np.ndarray]:
    return [rank_values(r, m, dtype, op, salt=3) for r in range(n)]


def check_all_gather(fn, n, m, dtype, segment_bytes, *, in_place=False, tag=7):
    inputs = _blocks(n, m, dtype)
    expected = np.concatenate(inputs)

    def body(t):
        if in_place:
            output = torch.zeros(n * m, dtype=dtype)
            input = output[t.rank * m : (t.rank + 1) * m]
            input.copy_(to_torch(inputs[t.rank], dtype))
        else:
            output = torch.zeros(n * m, dtype=dtype)
            input = to_torch(inputs[t.rank], dtype)
        fn(t, output, input, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return output, input

    for r, (out, inp) in enumerate(_run(n, body)):
        assert_matches(out, expected, f"{fn.__name__} n={n} m={m} in_place={in_place}: rank {r}")
        if not in_place:
            assert_matches(inp, inputs[r], f"{fn.__name__}: rank {r}'s input was modified")


def check_gather(fn, n, m, dtype, root, segment_bytes, *, tag=7):
    inputs = _blocks(n, m, dtype)

    def body(t):
        output = torch.zeros(n * m, dtype=dtype) if t.rank == root else None
        input = to_torch(inputs[t.rank], dtype)
        fn(t, output, input, root, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return output, input

    for r, (out, inp) in enumerate(_run(n, body)):
        if r == root:
            assert_matches(out, np.concatenate(inputs), f"{fn.__name__} n={n} m={m} root={root}")
        assert_matches(inp, inputs[r], f"{fn.__name__}: rank {r}'s input was modified")


def check_scatter(fn, n, m, dtype, root, segment_bytes, *, tag=7):
    blocks = _blocks(n, m, dtype)
    whole = np.concatenate(blocks)

    def body(t):
        input = to_torch(whole, dtype) if t.rank == root else None
        output = torch.zeros(m, dtype=dtype)
        fn(t, output, input, root, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return output, input

    for r, (out, inp) in enumerate(_run(n, body)):
        assert_matches(out, blocks[r], f"{fn.__name__} n={n} m={m} root={root}: rank {r}")
        if r == root:
            assert_matches(inp, whole, f"{fn.__name__}: root's input was modified")


def check_reduce_scatter(fn, n, m, dtype, op, segment_bytes, *, in_place=False, tag=7):
    inputs = [rank_values(r, n * m, dtype, op) for r in range(n)]
    expected = reference(inputs, op) if n * m else np.zeros(0, dtype=to_numpy(torch.zeros(0, dtype=dtype)).dtype)

    def body(t):
        input = to_torch(inputs[t.rank], dtype)
        output = input[t.rank * m : (t.rank + 1) * m] if in_place else torch.zeros(m, dtype=dtype)
        fn(t, output, input, op, tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return output, input

    for r, (out, inp) in enumerate(_run(n, body)):
        what = f"{fn.__name__} n={n} m={m} {dtype} {op} in_place={in_place}: rank {r}"
        assert_matches(out, expected[r * m : (r + 1) * m], what)
        if not in_place:
            assert_matches(inp, inputs[r], f"{fn.__name__}: rank {r}'s input was modified")


def check_all_to_all(fn, counts: Sequence[Sequence[int]], dtype, segment_bytes, *, tag=7):
    """``counts[i][j]``: elements rank ``i`` sends rank ``j``."""
    n = len(counts)
    inputs = [rank_values(i, sum(counts[i]), dtype, "max", salt=5 * i) for i in range(n)]

    def piece(i: int, j: int) -> np.ndarray:
        start = sum(counts[i][:j])
        return inputs[i][start : start + counts[i][j]]

    def body(t):
        r = t.rank
        out_counts = [counts[j][r] for j in range(n)]
        input = to_torch(inputs[r], dtype)
        output = torch.zeros(sum(out_counts), dtype=dtype)
        fn(t, output, input, out_counts, list(counts[r]), tag=tag, deadline=deadline(), segment_bytes=segment_bytes)
        return output

    for r, out in enumerate(_run(n, body)):
        expected = np.concatenate([piece(j, r) for j in range(n)])
        assert_matches(out, expected, f"{fn.__name__} counts={counts}: rank {r}")


def check_barrier(fn, n, *, tag=7):
    """No rank leaves before the last one has entered (ranks enter staggered)."""

    def body(t):
        time.sleep(0.005 * ((t.rank * 3) % n))
        entered = time.monotonic()
        fn(t, tag=tag, deadline=deadline(), segment_bytes=0)
        return entered, time.monotonic()

    times = _run(n, body)
    last_in = max(e for e, _ in times)
    first_out = min(x for _, x in times)
    assert first_out >= last_in, f"{fn.__name__} n={n}: a rank left {last_in - first_out:.4f} s before the last entered"
