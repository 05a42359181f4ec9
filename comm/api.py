"""The eight collectives and barrier, with torch.distributed's names, parameters and defaults.

Every call takes one route (see the note in ``plan.py``): the cell's plan -- looked up by the
arguments as passed, or made by ``validate``'s full checks on the cell's first call -- makes the
call's record and runs it through its group (``Group.run``), inline for a blocking call with
nothing queued, issued to the backend or queued on the group's executor otherwise, returning
``None`` or a ``Work``.  A later call of the cell is checked only for what may differ between its
calls (tensor type, layout, device, contiguity and size; for the list forms also the dtype and length of
the lists and all_to_all_single's split sizes: ``Plan.run``'s quick test); one that fails that goes
through the full checks, which raise the typed error naming what is wrong.  A barrier has a cell too
(its group, ``async_op``, ``timeout`` and algorithm), and nothing to test.
zerocomm's own options are keyword-only after torch's parameters: ``algorithm=`` (one of
``comm.algorithms.ALGORITHM_CHOICES``: "native", "ring", "tree", "recursive_doubling", "shm",
"hierarchical", or "auto", the default) and, for all_reduce, ``compression="onebit"``.

[Note: one table]  Each public function does what one of NCCL's ``collectives.cc`` functions does:
it fills in its cell's key (its name, the arguments as passed that decide how it runs, the key
tensor's dtype: the ``key`` and ``keyed`` columns of :data:`COLLECTIVES`) and hands its tensors to the cell's
plan -- ``Plan.run``, the one fast path, which reads them by the collective's argument roles (the
``tensors`` column; ``plan.QUICK``).  Whatever is not a cache hit goes to :func:`_full`, the one
slow path: the row's full checks, then ``staging.retry`` where they refuse the tensors.  The
bodies repeat no check and make no record; the key literal stays in each because a tuple display
costs no Python call, where a builder shared through the table would cost one per collective call
(``tests/benchmarks/test_call_counts.py`` holds the count).

List arguments (``gather_list``, ``scatter_list``, ``all_gather``'s ``tensor_list``,
``reduce_scatter``'s ``input_list``, ``all_to_all``'s lists) travel packed in one flat
buffer and are copied back to the list after the collective, by whichever thread ran it,
so ``async_op=True`` stays asynchronous; their tensors may be strided (a cache hit takes
contiguous ones; strided ones take the full checks, which copy them).  A single tensor that
is not contiguous (``x.t()``, ``x[:, ::2]``) is refused by the full checks with an
``UnsupportedError`` that :func:`_full` hands to ``staging.retry``: the call runs on a
contiguous copy and the result is written back into the caller's tensor, strides kept (for
``async_op=True``, when the returned ``Work`` completes).
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional

import torch

from . import staging, validate
from .errors import UnsupportedError
from .group import WORLD
from .plan import MISS
from .reduce_op import ReduceOp
from .traffic import TrafficCounter, observing
from .validate import resolve_group  # noqa: F401  (p2p and objects resolve groups the same way)

#: Plans by the arguments as passed (see ``plan.py``): a dictionary subscript, no call.
_PLANS = WORLD.plans
#: The default op, keyed by name: hashing a ``ReduceOp`` costs a fifth of a microsecond (pybind11's hash).
_SUM = ReduceOp.SUM


class Collective(NamedTuple):
    """One row of :data:`COLLECTIVES` (NCCL's ``ncclInfo``): what the one route knows of a public collective."""

    name: str
    """The public name: the first item of its plan key, and how ``staging`` and the profiler know it."""
    public: Callable
    """The public function (``staging.retry`` calls it again on copies it can move)."""
    checks: Callable
    """``validate``'s full checks: the public arguments in order, then the plan key; they make the cell's plan
    (kept under the key) and run the call through it, or raise the typed error."""
    tensors: str
    """The arguments a cache hit hands to ``Plan.run`` for its quick test, by name: one tensor (in place), or the
    output and the input (``plan.QUICK`` says which holds ``n`` times the other, or, for a list form, how its lists
    are read), then all_to_all_single's split sizes."""
    key: tuple
    """The arguments that make up the plan key after the name (then the dtype of ``keyed``)."""
    keyed: str
    """The tensor whose dtype ends the key: the one the full checks make the plan for."""


class _Unplanned:
    """The plan of a key with none yet (or no key: not a tensor, an unhashable argument): every call misses."""

    __slots__ = ()

    def run(self, output=None, input=None, output_splits=None, input_splits=None):
        return MISS


_NO_PLAN = _Unplanned()
#: A key with no plan (``KeyError``), a tensor argument that is not one (``AttributeError``: no ``dtype``), an
#: unhashable argument or a list that is not one (``TypeError``), an empty list (``IndexError``): the full checks say
#: what.
_UNPLANNED = (KeyError, AttributeError, TypeError, IndexError)
#: What a barrier's key ends with, as every key ends with its plan's dtype: a barrier moves no tensor, and its plan
#: is made for ``uint8`` (``validate.barrier``).
_BARRIER_DTYPE = torch.uint8


def _full(name: str, key, *args, **options):
    """The full checks of collective ``name`` (:data:`COLLECTIVES`) with its public ``args`` and keyword
    ``options`` (in the signature's order), which keep the cell's plan under ``key`` and run the call; tensors they
    refuse with an ``UnsupportedError`` (CUDA tensors on a CPU backend, tensors not contiguous) go through copies
    (``staging.retry``)."""
    collective = COLLECTIVES[name]
    if key is not None:
        try:
            hash(key)
        except TypeError:  # an unhashable argument: nothing can be kept under the key
            key = None
    try:
        return collective.checks(*args, *options.values(), key)
    except UnsupportedError as error:
        group_at = staging.ROLES[name][2]  # then async_op
        return staging.retry(error, collective.public, args, options, args[group_at], args[group_at + 1])


def count_bytes():
    """Context manager counting the bytes this rank sends and receives, per op::

        with dist.count_bytes() as counter:
            dist.all_reduce(t, algorithm="ring")
        counter.per_op["all_reduce"].bytes_sent

    zerocomm's own algorithms are measured message by message; native collectives are counted as the
    bandwidth-optimal schedule's bytes and flagged ``measured=False``.
    """
    return observing(WORLD, TrafficCounter())


def broadcast(tensor: torch.Tensor, src: Optional[int] = None, group=None, async_op: bool = False,
              group_src: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Copy ``src``'s ``tensor`` into ``tensor`` on every rank of ``group``. Every member calls it."""
    key = None
    try:
        plan = _PLANS[key := ("broadcast", group, src, group_src, async_op, algorithm, tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(tensor)
    if done is MISS:
        return _full("broadcast", key, tensor, src, group, async_op, group_src, algorithm=algorithm)
    return done


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *, algorithm: Optional[str] = None,
               compression: Optional[str] = None, compression_state=None):
    """Reduce ``tensor`` across ``group`` with ``op``, in place on every rank. Every member calls it.

    ``compression="onebit"`` sends 1-bit signs with error feedback (``op`` must be AVG: it computes the
    mean) with the caller's ``compression_state`` (a ``zerocomm.ops.ErrorFeedback``, one per tensor);
    ``algorithm`` then names the algorithm of its two sub-collectives ("native", "ring" or "tree").
    """
    key = None
    try:
        plan = _PLANS[key := ("all_reduce", group, "sum" if op is _SUM else op, async_op, algorithm, compression,
                              tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(tensor)
    if done is MISS:
        return _full("all_reduce", key, tensor, op, group, async_op, algorithm=algorithm, compression=compression,
                     compression_state=compression_state)
    return done


def reduce(tensor: torch.Tensor, dst: Optional[int] = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Reduce ``tensor`` across ``group`` into ``dst``'s ``tensor``; other ranks' tensors are left unchanged."""
    key = None
    try:
        plan = _PLANS[key := ("reduce", group, dst, group_dst, "sum" if op is _SUM else op, async_op, algorithm,
                              tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(tensor)
    if done is MISS:
        return _full("reduce", key, tensor, dst, op, group, async_op, group_dst, algorithm=algorithm)
    return done


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           algorithm: Optional[str] = None):
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor`` on every rank.

    ``output_tensor`` holds ``world_size * input_tensor.numel()`` elements (shape ``(n*k, ...)`` or ``(n, k, ...)``);
    ``input_tensor`` may be this rank's chunk of it (in place).
    """
    key = None
    try:
        plan = _PLANS[key := ("all_gather_into_tensor", group, async_op, algorithm, input_tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(output_tensor, input_tensor)
    if done is MISS:
        return _full("all_gather_into_tensor", key, output_tensor, input_tensor, group, async_op, algorithm=algorithm)
    return done


def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm: Optional[str] = None):
    """``tensor_list[r]`` ← rank r's ``tensor``, on every rank. Every member calls it."""
    key = None
    try:
        plan = _PLANS[key := ("all_gather", group, async_op, algorithm, tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(tensor_list, tensor)
    if done is MISS:
        return _full("all_gather", key, tensor_list, tensor, group, async_op, algorithm=algorithm)
    return done


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: Optional[int] = None,
           group=None, async_op: bool = False, group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """``gather_list[r]`` on ``dst`` ← rank r's ``tensor``; ``gather_list`` is given on ``dst`` only."""
    key = None
    try:
        plan = _PLANS[key := ("gather", group, dst, group_dst, async_op, algorithm, tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(gather_list, tensor)
    if done is MISS:
        return _full("gather", key, tensor, gather_list, dst, group, async_op, group_dst, algorithm=algorithm)
    return done


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: Optional[int] = None,
            group=None, async_op: bool = False, group_src: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Rank r's ``tensor`` ← ``scatter_list[r]`` on ``src``; ``scatter_list`` is given on ``src`` only."""
    key = None
    try:
        plan = _PLANS[key := ("scatter", group, src, group_src, async_op, algorithm, tensor.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(tensor, scatter_list)
    if done is MISS:
        return _full("scatter", key, tensor, scatter_list, src, group, async_op, group_src, algorithm=algorithm)
    return done


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm: Optional[str] = None):
    """``output`` on rank r ← chunk r of the ``op``-reduction of every rank's ``input`` (``n * output.numel()`` elements)."""
    key = None
    try:
        plan = _PLANS[key := ("reduce_scatter_tensor", group, "sum" if op is _SUM else op, async_op, algorithm,
                              input.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(output, input)
    if done is MISS:
        return _full("reduce_scatter_tensor", key, output, input, op, group, async_op, algorithm=algorithm)
    return done


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                   algorithm: Optional[str] = None):
    """``output`` on rank r ← the ``op``-reduction over ranks of their ``input_list[r]``."""
    key = None
    try:
        plan = _PLANS[key := ("reduce_scatter", group, "sum" if op is _SUM else op, async_op, algorithm,
                              output.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(output, input_list)
    if done is MISS:
        return _full("reduce_scatter", key, output, input_list, op, group, async_op, algorithm=algorithm)
    return done


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, algorithm: Optional[str] = None):
    """Rank r sends split j of ``input`` (along dim 0) to rank j and receives rank j's split r into split j of ``output``.

    Without split sizes, dim 0 is divided evenly by the group size.
    """
    key = None
    try:  # given split sizes or not decides the plan (one row for sizes that may differ); their values, each call's
        plan = _PLANS[key := ("all_to_all_single", group, output_split_sizes is None, input_split_sizes is None,
                              async_op, algorithm, input.dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(output, input, output_split_sizes, input_split_sizes)
    if done is MISS:
        return _full("all_to_all_single", key, output, input, output_split_sizes, input_split_sizes, group,
                     async_op, algorithm=algorithm)
    return done


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False, *,
               algorithm: Optional[str] = None):
    """``output_tensor_list[j]`` on rank r ← ``input_tensor_list[r]`` of rank j (sizes may differ per pair)."""
    key = None
    try:
        plan = _PLANS[key := ("all_to_all", group, async_op, algorithm, input_tensor_list[0].dtype)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run(output_tensor_list, input_tensor_list)
    if done is MISS:
        return _full("all_to_all", key, output_tensor_list, input_tensor_list, group, async_op, algorithm=algorithm)
    return done


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None, *, algorithm: Optional[str] = None):
    """Return once every member of ``group`` has entered the barrier; ``timeout`` overrides the group's."""
    key = None
    try:
        # The timeout's type too: True, or numpy's 1, equals 1 but is refused where 1 is admitted.
        plan = _PLANS[key := ("barrier", group, async_op, timeout, type(timeout), algorithm, _BARRIER_DTYPE)]
    except _UNPLANNED:
        plan = _NO_PLAN
    done = plan.run()
    if done is MISS:
        return validate.barrier(group, async_op, timeout, algorithm, key)
    return done


def compressed_all_reduce(tensor: torch.Tensor, state, group=None, async_op: bool = False, *,
                          algorithm: Optional[str] = None):
    """Replace ``tensor`` on every rank by the **mean** over ``group``, sent with 1-bit compression.

    The same as ``all_reduce(tensor, ReduceOp.AVG, group, async_op, algorithm=algorithm,
    compression="onebit", compression_state=state)``.  ``state`` is this rank's
    ``zerocomm.ops.ErrorFeedback`` for this tensor (one per tensor or bucket; the caller owns it and
    may checkpoint it with ``state_dict()``).  The sub-collectives run with ``algorithm``: "native",
    "ring", or "tree" (tree all_gather; the all_to_all is the pairwise exchange, which has no tree
    form).  Floating dtypes only; half inputs are compressed through float32.
    """
    return all_reduce(tensor, ReduceOp.AVG, group, async_op, algorithm=algorithm, compression="onebit",
                      compression_state=state)


#: torch 2.13's new names for the tensor forms (the old ones still work, as in torch).
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


#: The collectives with tensors, one row each (see the module's note): what each public function's key holds,
#: the argument roles of its cache hit, and its full checks.
COLLECTIVES = {row.name: row for row in (
    Collective("broadcast", broadcast, validate.broadcast, "tensor",
               ("group", "src", "group_src", "async_op", "algorithm"), "tensor"),
    Collective("all_reduce", all_reduce, validate.all_reduce, "tensor",
               ("group", "op", "async_op", "algorithm", "compression"), "tensor"),
    Collective("reduce", reduce, validate.reduce, "tensor",
               ("group", "dst", "group_dst", "op", "async_op", "algorithm"), "tensor"),
    Collective("all_gather_into_tensor", all_gather_into_tensor, validate.all_gather_into_tensor,
               "output_tensor, input_tensor", ("group", "async_op", "algorithm"), "input_tensor"),
    Collective("reduce_scatter_tensor", reduce_scatter_tensor, validate.reduce_scatter_tensor, "output, input",
               ("group", "op", "async_op", "algorithm"), "input"),
    Collective("all_gather", all_gather, validate.all_gather, "tensor_list, tensor", ("group", "async_op", "algorithm"),
               "tensor"),
    Collective("gather", gather, validate.gather, "gather_list, tensor",
               ("group", "dst", "group_dst", "async_op", "algorithm"), "tensor"),
    Collective("scatter", scatter, validate.scatter, "tensor, scatter_list",
               ("group", "src", "group_src", "async_op", "algorithm"), "tensor"),
    Collective("reduce_scatter", reduce_scatter, validate.reduce_scatter, "output, input_list",
               ("group", "op", "async_op", "algorithm"), "output"),
    Collective("all_to_all_single", all_to_all_single, validate.all_to_all_single,
               "output, input, output_split_sizes, input_split_sizes",
               ("group", "output_split_sizes", "input_split_sizes", "async_op", "algorithm"), "input"),
    Collective("all_to_all", all_to_all, validate.all_to_all, "output_tensor_list, input_tensor_list",
               ("group", "async_op", "algorithm"), "input_tensor_list[0]"),
)}
