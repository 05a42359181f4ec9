"""Plans: what the calls of one cell run, worked out once and cached on the group.

[Note: one path]  Every collective call takes one route::

    public function --> plan of its cell (a cache hit, or made once from the full checks)
                    --> one record (``Call``) --> Group.run: tag, check, dispatch

A *cell* is what decides how a call runs and never changes between calls: the group, the
collective, the dtype, the op, the root, the algorithm asked for, blocking or not.  Its
:class:`Plan` holds the rows of "auto"'s table for the cell (by size: the algorithm, its
function, and the mismatch checker that wraps it, ``check.py``).  The first call of a cell goes
through ``validate``'s full checks, which raise a typed error before any byte moves or return the
checked record; its plan is made from that and kept.  Later calls of the cell look the plan up
(``api.py``, keyed by the arguments as passed) and hand their tensors to :meth:`Plan.run`, which
checks only what can differ from call to call -- that the tensors are contiguous, of the plan's
dtype, on its device, with sizes that fit, read by the collective's argument roles (:data:`QUICK`:
for a list form, each list's length and items, and all_to_all_single's split sizes) -- and makes the
record, with the same fields the full checks would give it.  A call that fails those tests takes
the full checks again, which name what is wrong and hand :meth:`Plan.run` the record's fields.
Either way the record runs through ``Group.run``, which owns ordering, tags, deadlines and the
executor: the cache hit *is* the fast path, not a second implementation.

A group's plans are dropped with the configuration they were made under (``World.config``),
with the group, and when the ranks turn out unable to share a segment (``Group.forget_plans``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from ..ops.flatten import pack, unpacker
from . import check, select, torch_events
from .algorithms import ALGORITHM_CHOICES, ALGORITHMS
from .algorithms.shm import FAST_KINDS, FAST_OPS, ROUND_COPIES
from .errors import InvalidArgumentError
from .group import WORLD, Group
from .topology import HOST_ENV

_profiling = torch.autograd._profiler_enabled
#: torch's profilers set this module flag while they record (``_run_on_profiler_start``): read first, so that an
#: unprofiled call makes no call to ask.
_profilers = torch.autograd.profiler
_new = tuple.__new__
_Tensor = torch.Tensor
_strided = torch.strided
_RIDE_BYTES = check.RIDE_BYTES


class Call(NamedTuple):
    """One collective call, checked and resolved: the record ``Group.run`` executes."""

    collective: str
    """The registry's name ("all_reduce", "all_gather", ...), whatever the public form."""
    group: Group
    args: tuple
    """The algorithm's positional arguments after the transport: flat buffers, op, root, counts."""
    op: Optional[str]
    root: int
    """Group rank of the root, or -1."""
    algorithm: str
    function: Callable[..., None]
    """``function(backend, *args, tag=, deadline=, segment_bytes=, **options)``."""
    options: Optional[dict]
    """Extra keywords (the 1-bit algorithm's ``state`` and ``inner``), else ``None``."""
    async_op: bool
    timeout: Optional[float]
    """Seconds for this call's waits; ``None``: the group's timeout."""
    outputs: tuple
    """The tensors the call writes (``Work.result()``)."""
    copy_out: Optional[Callable[[], None]]
    """What copies the flat result back into a list form's output items after the run (``packing.unpacker``), or
    ``None``."""
    nbytes: int
    """S, as nccl-tests defines it for this collective."""
    numel: int
    """The element count the mismatch check compares (per rank; -1 where ranks may differ)."""
    dtype: torch.dtype
    checker: Optional[Callable[..., bool]] = None
    """The mismatch check wrapping the call (``check.py``), or ``None``: off, or nothing to differ from."""
    check: tuple = (0, ())
    """``(hash of the cell, cell)``: what the checker compares besides the tag and ``numel``."""
    ride: Optional[tuple] = None
    """``(C kind, C op, the group's segment checker, copies)`` when the call rides in its check's segment round
    (``MismatchCheck.in_segment``): an all_reduce (``copies`` ``None``), or a small data movement whose round's copies
    ``copies(arena, args)`` gives (``algorithms.shm.ROUND_COPIES``)."""
    issue: Optional[Callable[..., tuple]] = None
    """The backend's asynchronous form of ``function`` (``Backend.ISSUE``), or ``None``: an ``async_op`` call
    issued while nothing of its group is queued is posted with it directly (``Group.run``)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a plan: calls of at most ``most_bytes`` (``nbytes``) run ``function`` by ``algorithm``.

    Slots, read by name: a slot is read faster than a tuple's item (and a ``NamedTuple``'s field is slower still)."""

    most_bytes: int
    algorithm: str
    function: Callable[..., None]
    checker: Optional[Callable[..., bool]]
    """The mismatch check wrapping a call of this row (``check.py``), or ``None``."""
    check: tuple
    """``(hash of the cell, cell)``: what the checker compares besides the tag and ``numel``."""
    ride: Optional[tuple]
    """``(C kind, C op, checker, copies)`` if a call of at most ``check.RIDE_BYTES`` rides in the check's segment round
    (such a call is checked by ``checker``, the group's ``MismatchCheck.in_segment``, whatever the row's checker: an
    "shm" row's small call too, whose one round is the check's; ``copies``: as ``Call.ride``'s)."""
    issue: Optional[Callable[..., tuple]] = None
    """``Backend.ISSUE``'s form of ``function`` (a native collective the backend runs asynchronously by itself)."""


#: What :meth:`Plan.run` answers when a cache hit's tensors fail its quick test: the caller takes the full checks.
MISS = object()

def _fits(plan, tensor) -> bool:
    """Whether ``tensor`` is what the cell's full checks admitted as one of a list form's single tensors: exactly a
    ``torch.Tensor``, dense, of the plan's dtype, on its device, contiguous."""
    return type(tensor) is _Tensor and tensor.layout is _strided and tensor.dtype is plan.dtype \
        and (tensor.is_cpu if plan.on_cpu else tensor.is_cuda) and tensor.is_contiguous()


def _items_fit(plan, items, numel: int) -> bool:
    """Whether ``items`` is a list or tuple of one tensor per rank each :func:`_fits` admits, of ``numel`` elements
    each (``-1``: any, as all_to_all's may differ): list items that are strided, of another type, length or size are
    the full checks' to copy or refuse."""
    if (type(items) is not list and type(items) is not tuple) or len(items) != plan.size:
        return False
    dtype, on_cpu = plan.dtype, plan.on_cpu
    for item in items:
        if type(item) is not _Tensor or item.layout is not _strided or item.dtype is not dtype \
                or not (item.is_cpu if on_cpu else item.is_cuda) or not item.is_contiguous() \
                or (numel >= 0 and item.numel() != numel):
            return False
    return True


def _no_list(items) -> bool:
    """A non-root rank's list argument as the full checks run it: ``None`` or an empty list (else they refuse it)."""
    return items is None or (type(items) is list and not items)


# The per-call fields of a cache hit of each list form (and barrier), read off its arguments as passed -- ``(args,
# nbytes, numel, outputs, copy_out, inputs)`` exactly as ``validate``'s function of the form passes them to
# :meth:`Plan.run` -- or :data:`MISS` where anything differs from what the cell's full checks admitted.

def _all_gather_fields(plan, tensor_list, tensor, _o, _i):
    if not _fits(plan, tensor):
        return MISS
    numel = tensor.numel()
    if not _items_fit(plan, tensor_list, numel):
        return MISS
    flat = torch.empty(plan.size * numel, dtype=plan.dtype, device=tensor.device)
    copy_out = unpacker(flat, tensor_list)
    flat_in = tensor if tensor.ndim == 1 else tensor.view(-1)
    return (flat, flat_in), flat.nbytes, numel, tuple(tensor_list), copy_out, (tensor,)


def _gather_fields(plan, gather_list, tensor, _o, _i):
    if not _fits(plan, tensor):
        return MISS
    numel = tensor.numel()
    flat, copy_out, outputs = None, None, ()  # the root alone receives, and copies out into gather_list
    if plan.group.rank == plan.root:
        if not _items_fit(plan, gather_list, numel):
            return MISS
        flat = torch.empty(plan.size * numel, dtype=plan.dtype, device=tensor.device)
        copy_out = unpacker(flat, gather_list)
        outputs = tuple(gather_list)
    elif not _no_list(gather_list):
        return MISS
    flat_in = tensor if tensor.ndim == 1 else tensor.view(-1)
    return (flat, flat_in, plan.root), plan.size * tensor.nbytes, numel, outputs, copy_out, (tensor,)


def _scatter_fields(plan, tensor, scatter_list, _o, _i):
    if not _fits(plan, tensor):
        return MISS
    numel = tensor.numel()
    chunks, inputs = None, ()
    if plan.group.rank == plan.root:
        if not _items_fit(plan, scatter_list, numel):
            return MISS
        # The chunks as they lie, not joined: shared memory and gloo's own scatter read each where it is (a join
        # would copy the root's whole input once more); an algorithm that sends one buffer joins them itself.
        chunks = tuple(item if item.ndim == 1 else item.view(-1) for item in scatter_list)
        inputs = tuple(scatter_list)
    elif not _no_list(scatter_list):
        return MISS
    flat_out = tensor if tensor.ndim == 1 else tensor.view(-1)
    return (flat_out, chunks, plan.root), plan.size * tensor.nbytes, numel, (tensor,), None, inputs


def _reduce_scatter_fields(plan, output, input_list, _o, _i):
    if not _fits(plan, output):
        return MISS
    numel = output.numel()
    if not _items_fit(plan, input_list, numel):
        return MISS
    flat = pack(input_list, plan.dtype, output.device)
    flat_out = output if output.ndim == 1 else output.view(-1)
    return (flat_out, flat, plan.op), flat.nbytes, numel, (output,), None, tuple(input_list)


def _all_to_all_fields(plan, output_list, input_list, _o, _i):
    if not _items_fit(plan, input_list, -1) or not _items_fit(plan, output_list, -1):
        return MISS
    flat_in = pack(input_list, plan.dtype, input_list[0].device)
    out_counts = [item.numel() for item in output_list]
    in_counts = [item.numel() for item in input_list]
    flat_out = torch.empty(sum(out_counts), dtype=plan.dtype, device=flat_in.device)
    copy_out = unpacker(flat_out, output_list)
    return (flat_out, flat_in, out_counts, in_counts), flat_in.nbytes, -1, tuple(output_list), copy_out, \
        tuple(input_list)


def _split_counts(tensor, splits, n: int):
    """Element counts per rank from dim-0 split sizes as ``validate._split_counts`` derives them, or :data:`MISS`
    where they would not be admitted as they are (not a list or tuple of ``n`` non-negative ints summing to the rows,
    or an even split that does not divide): the full checks then convert or refuse them."""
    rows = tensor.shape[0] if tensor.ndim else 1
    row_numel = tensor.numel() // rows if rows else 0
    if splits is None:
        return MISS if rows % n else [rows // n * row_numel] * n
    if (type(splits) is not list and type(splits) is not tuple) or len(splits) != n:
        return MISS
    total = 0
    for split in splits:
        if type(split) is not int or split < 0:
            return MISS
        total += split
    if total != rows:
        return MISS
    return [split * row_numel for split in splits]


def _all_to_all_single_fields(plan, output, input, output_splits, input_splits):
    if not _fits(plan, output) or not _fits(plan, input):
        return MISS
    in_counts = _split_counts(input, input_splits, plan.size)
    out_counts = _split_counts(output, output_splits, plan.size)
    if in_counts is MISS or out_counts is MISS:
        return MISS
    # Even splits: every rank's input has as many elements, so the mismatch check compares them (uneven: -1).
    uneven = input_splits is not None or output_splits is not None
    args = (output if output.ndim == 1 else output.view(-1), input if input.ndim == 1 else input.view(-1), out_counts,
            in_counts)
    return args, input.nbytes, -1 if uneven else input.numel(), (output,), None, (input,)


#: A barrier's fields: no tensor, nothing to copy (``validate.barrier``'s).
_BARRIER = ((), 0, 0, (), None, ())


def _barrier_fields(plan, _a, _b, _o, _i):
    return _BARRIER


#: The public forms whose cache hits :meth:`Plan.run` reads off their arguments (``api.py``), by argument roles:
#: ``(tail, larger, fields)``.  For one tensor or a pair: the plan's attributes the algorithm takes after the flat
#: buffers (``algorithms``' signatures), and for a pair which one holds ``size`` times the other's bytes ("output":
#: a gather, "input": a scatter; ``None``: one tensor, in place), read inline (``fields`` ``None``).  For the list
#: forms and barrier: ``fields(plan, output, input, output_splits, input_splits)``, their quick test and per-call
#: fields (``tail`` and ``larger`` unused).
QUICK = {
    "broadcast": (("root",), None, None),
    "all_reduce": (("op",), None, None),
    "reduce": (("op", "root"), None, None),
    "all_gather_into_tensor": ((), "output", None),
    "reduce_scatter_tensor": (("op",), "input", None),
    "all_gather": ((), None, _all_gather_fields),
    "gather": ((), None, _gather_fields),
    "scatter": ((), None, _scatter_fields),
    "reduce_scatter": ((), None, _reduce_scatter_fields),
    "all_to_all": ((), None, _all_to_all_fields),
    "all_to_all_single": ((), None, _all_to_all_single_fields),
    "barrier": ((), None, _barrier_fields),
}


class Plan:
    """What every call of one cell runs (see the module's note); made by :func:`plan_for`.

    :meth:`run` is the one route of a call: it picks the row by ``nbytes`` (the same on every rank), makes the
    record and hands it to ``Group.run`` -- with torch's profiler event around it (``torch_events.py``) while
    torch's profiler records.
    """

    __slots__ = ("group", "collective", "dtype", "op", "root", "async_op", "timeout", "rows", "on_cpu", "size",
                 "itemsize", "profile_name", "tail", "extra", "gathers", "fields")

    def __init__(self, group: Group, collective: str, dtype: torch.dtype, op: Optional[str], root: int,
                 async_op: bool, timeout: Optional[float], rows: tuple, profile_name: str, any_size: bool = False,
                 form: Optional[str] = None):
        self.group = group
        self.collective = collective
        self.dtype = dtype
        self.op = op
        self.root = root
        self.async_op = async_op
        self.timeout = timeout
        #: A call whose size may differ between ranks (an all_to_all with uneven splits) runs the row that serves
        #: every size, the first unbounded one: "auto" must not depend on the size, or ranks would choose differently.
        self.rows = (next(row for row in rows if row.most_bytes >= select.UNBOUNDED),) if any_size else rows
        self.on_cpu = group.on_cpu
        self.size = group.size()
        self.itemsize = dtype.itemsize
        self.profile_name = profile_name
        # The public form whose arguments a cache hit passes: its profiler name but where two forms share that name
        # (all_to_all_single's events are "all_to_all", as torch's).
        tail, larger, fields = QUICK.get(profile_name if form is None else form, ((), None, None))
        #: What a cache hit's record passes to the algorithm after its flat buffers (``QUICK``).
        self.tail = tuple(getattr(self, name) for name in tail)
        #: The one argument after a single flat buffer (all_reduce's op, broadcast's root), else :data:`MISS`: a
        #: tuple display costs half of a concatenation.
        self.extra = self.tail[0] if len(self.tail) == 1 else MISS
        #: For a pair of tensors: ``True`` if the output holds ``size`` times the input's bytes (a gather).
        self.gathers = larger == "output"
        #: A list form's (or barrier's) quick test and per-call fields (``QUICK``), else ``None``: read inline.
        self.fields = fields

    def run(self, output=None, input=None, output_splits=None, input_splits=None, args: Optional[tuple] = None,
            nbytes: int = 0, numel: int = 0, outputs: tuple = (), copy_out=None, inputs=None,
            options: Optional[dict] = None, record: bool = False):
        """Run one call of this cell; ``None``, or its ``Work`` if the plan is ``async_op``.

        A cache hit (``api.py``) passes its tensor arguments as given, by the collective's roles (``QUICK``) --
        ``output`` alone for a collective in place, else ``output`` and ``input`` (a list form's list in either
        place; all_to_all_single's split sizes after them; nothing for a barrier) -- and they take the quick test of
        what may differ between the cell's calls (type, layout, device, contiguity, and for a pair or a list the
        dtype, list lengths, sizes and splits); on failing it the answer is :data:`MISS` and nothing ran.  The full
        checks (``validate.py``) pass the record's per-call fields instead: ``args`` (the algorithm's arguments after
        the transport), ``nbytes``, ``numel``, ``outputs``, ``copy_out``, ``inputs`` (what torch's profiler
        records, else ``outputs``) and ``options``; with ``record`` the record is returned, not run (the coalesced
        forms run several under one profiler event)."""
        if args is None:  # a cache hit: the quick test, then the record's fields read off the tensors
            if self.fields is not None:  # a list form or barrier: its own test, the same fields the full checks give
                fields = self.fields(self, output, input, output_splits, input_splits)
                if fields is MISS:
                    return MISS
                args, nbytes, numel, outputs, copy_out, inputs = fields
            else:
                if type(output) is not _Tensor or output.layout is not _strided \
                        or not (output.is_cpu if self.on_cpu else output.is_cuda) or not output.is_contiguous():
                    return MISS
                if input is None:  # in place
                    nbytes = output.nbytes
                    numel = nbytes // self.itemsize
                    flat = output if output.ndim == 1 else output.view(-1)
                    args = (flat,) + self.tail if self.extra is MISS else (flat, self.extra)
                else:
                    if type(input) is not _Tensor or output.dtype is not self.dtype or input.layout is not _strided \
                            or not (input.is_cpu if self.on_cpu else input.is_cuda) or not input.is_contiguous():
                        return MISS
                    if self.gathers:
                        nbytes, smaller = output.nbytes, input.nbytes
                    else:
                        nbytes, smaller = input.nbytes, output.nbytes
                    if nbytes != self.size * smaller:
                        return MISS
                    numel = smaller // self.itemsize
                    args = (output if output.ndim == 1 else output.view(-1),
                            input if input.ndim == 1 else input.view(-1)) + self.tail
                    inputs = (input,)
                outputs = (output,)
        rows = self.rows
        row = rows[0]
        if nbytes > row.most_bytes:  # "auto"'s rows by size, the last one unbounded
            for row in rows:
                if nbytes <= row.most_bytes:
                    break
        ride = row.ride
        if ride is not None and nbytes > _RIDE_BYTES:
            ride = None
        # The record: each item is the field of its name, in ``Call``'s order (tests/comm/test_plan_record.py reads
        # the names off these expressions and holds them to ``Call._fields``).  ``tuple.__new__``, not a keyword
        # ``Call(...)``: that is a Python call more per collective call (the limits in test_call_counts.py).
        call = _new(Call, (self.collective, self.group, args, self.op, self.root, row.algorithm, row.function, options,
                           self.async_op, self.timeout, outputs, copy_out, nbytes, numel, self.dtype,
                           row.checker if ride is None else ride[2], row.check, ride, row.issue))
        if record:
            return call
        if _profilers._is_profiler_enabled and _profiling():
            return torch_events.run(call, self.profile_name, outputs if inputs is None else inputs)
        return self.group.run(call)

    def record(self, args: tuple, nbytes: int, numel: int, outputs: tuple, copy_out=None,
               options: Optional[dict] = None) -> Call:
        """The record :meth:`run` would hand to ``Group.run``, for a caller that runs several records under one
        profiler event (the coalesced forms)."""
        return self.run(args=args, nbytes=nbytes, numel=numel, outputs=outputs, copy_out=copy_out, options=options,
                        record=True)


def plan_for(group: Group, collective: str, dtype: torch.dtype, op: Optional[str], root: int,
             requested: Optional[str], async_op: bool, timeout: Optional[float], what: str,
             profile_name: str, any_size: bool = False, form: Optional[str] = None) -> Plan:
    """The plan of a cell, from ``group.plans`` or made now: the rows of "auto"'s table for the cell (one row for
    an explicit algorithm), each with its function and checker; ``any_size``: the calls' sizes may differ between
    ranks, so one row serves them all; ``form``: the public form whose cache hits the plan serves, where its
    ``profile_name`` is another's (``Plan``).  Raises ``InvalidArgumentError`` for an unknown algorithm and
    ``UnsupportedError`` for one that cannot serve the cell, before any byte moves."""
    key = (collective, dtype, op, root, requested, async_op, timeout, profile_name, any_size, form)
    plan = group.plans.get(key)
    if plan is None:
        plan = group.plans[key] = Plan(group, collective, dtype, op, root, async_op, timeout,
                                       _rows(group, collective, dtype, op, root, requested, what, any_size),
                                       profile_name, any_size, form)
    return plan


#: Algorithms whose all_reduce of two ranks gives the bits the check's segment round gives (each rank combines its
#: own and its peer's elements once, and every op is commutative), so that a small one may ride in that round.
_SAME_BITS_AT_TWO = frozenset(("ring", "tree", "recursive_doubling"))
#: ... and at any number of ranks: "shm", whose small all_reduce is that same C round, and "native", whose order
#: of reduction is the backend's own, not zerocomm's to keep (the same on every rank, at most the last bit apart).
_SAME_BITS = frozenset(("native", "shm"))


def special_plan(group: Group, collective: str, dtype: torch.dtype, op: Optional[str], algorithm: str,
                 function: Callable[..., None], async_op: bool, profile_name: str) -> Plan:
    """A plan of one row running ``function`` under ``algorithm``'s name (sparse all_reduce: a composition of
    rings that no table lists), checked like every other call."""
    key = (collective, dtype, op, -1, ("special", function), async_op, None, profile_name)
    plan = group.plans.get(key)
    if plan is None:
        cell = check.fingerprint_cell(collective, op, dtype, -1, algorithm)
        row = Row(most_bytes=select.UNBOUNDED, algorithm=algorithm, function=function,
                  checker=check.checker_for(group, algorithm, WORLD.config), check=(hash(cell), cell), ride=None)
        plan = group.plans[key] = Plan(group, collective, dtype, op, -1, async_op, None, (row,), profile_name)
    return plan


def _rows(group: Group, collective: str, dtype: torch.dtype, op: Optional[str], root: int,
          requested: Optional[str], what: str, any_size: bool = False) -> tuple:
    config = WORLD.config
    choice = config.algorithm if requested is None else requested
    if choice not in ALGORITHM_CHOICES:
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {what}: algorithm must be one of "
                                   f"{ALGORITHM_CHOICES}, got {choice!r}")
    local = group.communicator.local
    rule = select.rule(group.backend_type, group.size(), collective, dtype, op, choice,
                       None if local.no_segment else local.one_host)
    if rule.rows is None:
        if rule.refusal is not None:
            select.raise_unsupported(collective, group, dtype, op, choice, rule.refusal)
        if local.no_segment and choice == "shm":  # known on every rank alike: refused before any byte moves
            select.raise_unsupported(collective, group, dtype, op, choice, "the ranks report one host but cannot "
                                     f"share a segment (set {HOST_ENV} per shared /dev/shm)")
        table = ((select.UNBOUNDED, choice),)
    else:
        table = tuple(rule.rows)
    rows = []
    for most_bytes, algorithm in table:
        function = (group.backend_type.NATIVE[collective] if algorithm == "native"
                    else ALGORITHMS[(collective, algorithm)])
        cell = check.fingerprint_cell(collective, op, dtype, root, algorithm)
        checker = check.checker_for(group, algorithm, config)
        if any_size and checker is not None:  # an all_to_all whose ranks' splits may differ: they must agree
            checker = group.check.with_splits(checker)
        ride = None
        if not group.check.rides_in_segment(checker) or not group.on_cpu or any_size:
            pass  # (a call whose size may differ between ranks could ride on one rank and not on another)
        elif collective == "all_reduce" and dtype in FAST_KINDS and op in FAST_OPS \
                and (algorithm in _SAME_BITS or (group.size() == 2 and algorithm in _SAME_BITS_AT_TWO)):
            ride = (FAST_KINDS[dtype], FAST_OPS[op], group.check.in_segment, None)
        elif algorithm == "shm" and collective in ROUND_COPIES \
                and (collective != "reduce" or (dtype in FAST_KINDS and op in FAST_OPS)):
            # Its small call is one round of copies (a reduce's root: the small all_reduce's round): the check's.
            ride = (FAST_KINDS.get(dtype, 4), FAST_OPS.get(op, 9), group.check.in_segment, ROUND_COPIES[collective])
        rows.append(Row(most_bytes=most_bytes, algorithm=algorithm, function=function, checker=checker,
                        check=(hash(cell), cell), ride=ride, issue=group.issuers.get(function)))
    if select.log.isEnabledFor(10):  # once per cell: its plan
        select.log.debug("%s on %s group of %d, %s %s: %s (%s)", collective, group.backend, group.size(), dtype, op,
                         ", ".join(f"{'any size' if most >= select.UNBOUNDED else f'up to {most} B'} -> {algorithm}"
                                   for most, algorithm in table),
                         "explicit" if requested is not None else "auto table" if choice == "auto" else "default")
    return tuple(rows)


