"""Rank bodies for tests/comm/test_typed_failures.py: every public call against every failure, typed.

Each kind of call (every collective and list form, point-to-point, a ZeRO-3 step) is one function
``KINDS[kind](group, odd)`` that makes the call on ``group`` on every rank and returns a check of its
result (``odd``: this rank makes the call differently, for the mismatch).  The bodies run on the forked
ranks of ``crash_world.run_world``; each gives every kind a subgroup of its own (``new_group`` of every rank),
made and used once before the failure, so that one world tests every kind: a failure makes a group unusable,
never the others.  A survivor reports, per kind, ``[outcome, seconds, error type, error module, message]``:
``outcome`` is "raised", "ok" (no error: then whether the result was right) or "other" (an untyped error).
"""
from __future__ import annotations

import datetime
import os
import signal
import time

import torch

#: Every kind of call the tests put through each failure.
COLLECTIVES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier")
P2P = ("send_recv", "isend_irecv")
KIND_NAMES = COLLECTIVES + P2P + ("zero3_step",)


def _call(kind: str, group, odd: bool = False):
    """Make one call of ``kind`` on ``group`` (every rank); a check of its result, True when right."""
    import zerocomm.comm as dist
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    numel = 5 if odd else 4
    mine = torch.full((numel,), float(rank + 1))
    total = float(n * (n + 1) // 2)
    if kind == "broadcast":
        dist.broadcast(mine, src=dist.get_global_rank(group, 0), group=group)
        return lambda: bool((mine == 1.0).all())
    if kind == "all_reduce":
        dist.all_reduce(mine, group=group)
        return lambda: bool((mine == total).all())
    if kind == "reduce":
        dist.reduce(mine, dst=dist.get_global_rank(group, 0), group=group)
        return lambda: rank != 0 or bool((mine == total).all())
    if kind == "all_gather":
        outs = [torch.empty(numel) for _ in range(n)]
        dist.all_gather(outs, mine, group=group)
        return lambda: all(bool((o == r + 1).all()) for r, o in enumerate(outs))
    if kind == "all_gather_into_tensor":
        out = torch.empty(n * numel)
        dist.all_gather_into_tensor(out, mine, group=group)
        return lambda: torch.equal(out, torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(numel))
    if kind == "gather":
        outs = [torch.empty(numel) for _ in range(n)] if rank == 0 else None
        dist.gather(mine, outs, dst=dist.get_global_rank(group, 0), group=group)
        return lambda: rank != 0 or all(bool((o == r + 1).all()) for r, o in enumerate(outs))
    if kind == "scatter":
        parts = [torch.full((numel,), float(r + 1)) for r in range(n)] if rank == 0 else None
        out = torch.empty(numel)
        dist.scatter(out, parts, src=dist.get_global_rank(group, 0), group=group)
        return lambda: bool((out == rank + 1).all())
    if kind == "reduce_scatter":
        out = torch.empty(numel)
        dist.reduce_scatter(out, [torch.full((numel,), float(rank + 1)) for _ in range(n)], group=group)
        return lambda: bool((out == total).all())
    if kind == "reduce_scatter_tensor":
        out = torch.empty(numel)
        dist.reduce_scatter_tensor(out, torch.full((n * numel,), float(rank + 1)), group=group)
        return lambda: bool((out == total).all())
    if kind == "all_to_all":
        # The list form's sizes may differ by rank (the check cannot compare them): the odd rank's dtype differs.
        dtype = torch.float64 if odd else torch.float32
        outs = [torch.empty(4, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, [torch.full((4,), float(rank + 1), dtype=dtype) for _ in range(n)], group=group)
        return lambda: all(bool((o == r + 1).all()) for r, o in enumerate(outs))
    if kind == "all_to_all_single":
        out = torch.empty(n * numel)
        dist.all_to_all_single(out, torch.full((n * numel,), float(rank + 1)), group=group)
        return lambda: torch.equal(out, torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(numel))
    if kind == "barrier":
        if odd:  # a barrier has no shape: the odd rank calls another collective in its place
            dist.all_reduce(mine, group=group)
        else:
            dist.barrier(group=group)
        return lambda: True
    if kind == "send_recv":  # group rank 0 and the last rank exchange (send first / receive first)
        peer = n - 1 if rank == 0 else 0
        got = torch.empty(numel)
        if rank == 0:
            dist.send(mine, dist.get_global_rank(group, peer), group=group)
            dist.recv(got, dist.get_global_rank(group, peer), group=group)
        elif rank == n - 1:
            dist.recv(got, dist.get_global_rank(group, peer), group=group)
            dist.send(mine, dist.get_global_rank(group, peer), group=group)
        else:
            return lambda: True
        return lambda: bool((got == peer + 1).all())
    if kind == "isend_irecv":  # a ring: every rank sends to the next and receives from the one before
        got = torch.empty(numel)
        after, before = (rank + 1) % n, (rank - 1) % n
        works = [dist.irecv(got, dist.get_global_rank(group, before), group=group),
                 dist.isend(mine, dist.get_global_rank(group, after), group=group)]
        for work in works:
            work.wait()
        return lambda: bool((got == before + 1).all())
    if kind == "zero3_step":
        return _zero_step(group)
    raise ValueError(kind)


_ZERO: dict = {}


def _zero_step(group):
    """One ZeRO-3 step of a small MLP on ``group`` (initialized on the first use, on every rank alike); its check:
    the step's loss is a number (the step's own results are compared with data parallel elsewhere)."""
    import zerocomm.comm as dist
    from zerocomm.zero import ZeroConfig, initialize
    state = _ZERO.get(id(group))
    if state is None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model, optimizer = initialize(model, lambda params: torch.optim.SGD(params, lr=0.1),
                                      ZeroConfig(stage=3, stage3_param_persistence_threshold=0), group=group)
        state = _ZERO[id(group)] = (model, optimizer)
    model, optimizer = state
    generator = torch.Generator().manual_seed(dist.get_rank(group))
    x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    value = float(loss)
    return lambda: value == value


def _outcome(kind: str, group, odd: bool = False) -> list:
    """``[outcome, seconds, error type, error module, message]`` of one call of ``kind`` (see the module notes)."""
    start = time.monotonic()
    try:
        check = _call(kind, group, odd)
    except Exception as error:  # noqa: BLE001 - judged by the test: typed or not
        import zerocomm.comm as dist
        from zerocomm.zero.errors import ZeroError
        typed = isinstance(error, (dist.CommError, ZeroError))
        return ["raised" if typed else "other", time.monotonic() - start, type(error).__name__,
                type(error).__module__, str(error)[:600]]
    return ["ok", time.monotonic() - start, "", "", "right" if check() else "WRONG"]


def _groups(kinds, timeout_s: float) -> dict:
    """One subgroup of every rank per kind, each used once (its arena, its connections, ZeRO's state made)."""
    import zerocomm.comm as dist
    groups = {}
    for kind in kinds:
        group = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=timeout_s))
        assert _call(kind, group)(), f"{kind}: wrong result before any failure"
        groups[kind] = group
    return groups


def killed_before(kinds, timeout_s: float) -> dict:
    """The last rank is SIGKILLed once every kind's group was used; then every other rank calls every kind."""
    import zerocomm.comm as dist
    groups = _groups(kinds, timeout_s)
    dist.barrier()
    if dist.get_rank() == dist.get_world_size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)  # the victim is gone before the calls (they must not depend on noticing it first)
    return {kind: _outcome(kind, groups[kind]) for kind in kinds}


def timed_out_and_left(kinds, timeout_s: float, late_s: float) -> dict:
    """Per kind: the last rank is ``late_s`` late to a call of that kind's group; the others time out and leave
    it; then the late rank makes the same call.  Every rank must raise (the late one too), in time."""
    import zerocomm.comm as dist
    groups = _groups(kinds, timeout_s)
    late = dist.get_rank() == dist.get_world_size() - 1
    seen = {}
    for kind in kinds:
        dist.barrier()  # the world is unaffected by a subgroup's failure: every kind starts together
        if late:
            time.sleep(late_s)
        seen[kind] = _outcome(kind, groups[kind])
    dist.barrier()
    return seen


def mismatched(kinds) -> dict:
    """Per kind: the last rank makes the call with another size (a barrier: an all_reduce in its place; the list
    form of all_to_all, whose sizes may differ by rank: another dtype)."""
    import zerocomm.comm as dist
    odd = dist.get_rank() == dist.get_world_size() - 1
    seen = {}
    for kind in kinds:
        group = dist.new_group(list(range(dist.get_world_size())))
        seen[kind] = _outcome(kind, group, odd)
    return seen


def left_then_other_call(timeout_s: float, late_s: float, algorithm: str) -> list:
    """The issue's case: rank 0 times out in an all_reduce (call #4) that rank 1 reaches ``late_s`` late, and
    leaves (its process exits when it answers); rank 1 then calls all_gather_into_tensor.  Every rank reports
    ``[error type, message]``."""
    import zerocomm.comm as dist
    x = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(x, algorithm=algorithm)
    try:
        if dist.get_rank() == 1:
            time.sleep(late_s)
            dist.all_gather_into_tensor(torch.empty(8), torch.ones(4), algorithm=algorithm)
        else:
            dist.all_reduce(x, algorithm=algorithm)
    except Exception as error:  # noqa: BLE001 - judged by the test
        return [type(error).__name__, type(error).__module__, str(error)]
    return ["none", "", ""]
