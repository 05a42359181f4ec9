"""The eight collectives and barrier, with torch.distributed's names, parameters and defaults.

Each function: resolve the group → check this rank's arguments → choose the
algorithm → bring the tensors to the flat form every algorithm takes → run on the
group's executor → ``None`` or a ``Work``.  zerocomm's own options are keyword-only
after torch's parameters: ``algorithm=`` ("native", "ring", "tree",
"recursive_doubling" for all_reduce, or "auto").

Flat forms (what the algorithms and native methods see): 1-D contiguous views; list
arguments (``gather_list``, ``scatter_list``, ``all_gather``'s ``tensor_list``,
``reduce_scatter``'s ``input_list``, ``all_to_all``'s lists) are packed into one
buffer, and results are copied back to the list after the collective, on the
executor, so ``async_op=True`` stays asynchronous.
"""
from __future__ import annotations

import datetime
from typing import Callable, List, Optional, Sequence

import torch

from . import validate
from .algorithms import ALGORITHMS as _REGISTRY
from .errors import InvalidArgumentError, UnsupportedError
from .group import NON_GROUP_MEMBER, WORLD, Group
from .reduce_op import ReduceOp, op_name
from .select import check_compression, select_algorithm
from .traffic import CountingTransport, TrafficCounter, estimate_native, now, observing, start_record
from .work import Work, timeout_seconds


def resolve_group(group, collective: str) -> Group:
    """The ``Group`` a call runs on: ``None`` means the default group."""
    if group is None:
        return WORLD.require(collective)
    if isinstance(group, Group):
        if group.transport is None:
            raise InvalidArgumentError(f"{collective}: {group.describe()} was destroyed")
        return group
    if group is NON_GROUP_MEMBER:
        world = WORLD.require(collective)
        raise InvalidArgumentError(f"rank {world.my_global_rank}: {collective}: this process is not a member of the "
                                   "group it passed (new_group returned NON_GROUP_MEMBER here)")
    raise InvalidArgumentError(f"{collective}: group must be a zerocomm group or None, got {type(group).__name__}")


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(-1)


def _launch(collective: str, group: Group, args: tuple, *, dtype: torch.dtype, op: Optional[str], nbytes: int,
            algorithm: Optional[str], async_op: bool, outputs: Sequence[torch.Tensor], numel: int, root: int = -1,
            after: Optional[Callable[[], None]] = None, timeout=None) -> Optional[Work]:
    """Select the algorithm and run it on the group's executor."""
    config = WORLD.config
    # Every rank must choose the same algorithm, so only a size all ranks share may steer "auto": an
    # all_to_all's send size differs between ranks (uneven splits), so it is chosen by world size alone.
    shared_nbytes = None if collective == "all_to_all" else nbytes
    chosen = select_algorithm(collective, group, dtype, op, shared_nbytes, algorithm, config.algorithm)
    observers = list(WORLD.observers)
    record = start_record(observers, collective, group, chosen, nbytes)
    transport = group.transport if record is None else CountingTransport(group.transport, record)
    segment_bytes = config.segment_bytes
    if chosen == "native":
        def run(tag, deadline):
            getattr(transport, f"native_{collective}")(*args, tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    else:
        function = _REGISTRY[(collective, chosen)]

        def run(tag, deadline):
            function(transport, *args, tag=tag, deadline=deadline, segment_bytes=segment_bytes)

    debug = config.debug

    def body(tag: int, deadline: Optional[float]) -> None:
        if debug:
            validate.cross_check(group, validate.fingerprint(tag, collective, numel, dtype, root, chosen), deadline)
        if record is None:
            run(tag, deadline)
        else:
            record.start_s = now()
            for observer in observers:
                observer.on_start(record)
            run(tag, deadline)
            record.end_s = now()
            if chosen == "native":
                estimate_native(record, group.transport)
            for observer in observers:
                observer.on_end(record)
        if after is not None:
            after()

    return group.run(collective, body, async_op, outputs=list(outputs), timeout=timeout)


def count_bytes():
    """Context manager counting the bytes this rank sends and receives, per op::

        with dist.count_bytes() as counter:
            dist.all_reduce(t, algorithm="ring")
        counter.per_op["all_reduce"].bytes_sent

    zerocomm's own algorithms are measured message by message; native collectives are counted as the
    bandwidth-optimal schedule's bytes and flagged ``measured=False``.
    """
    return observing(WORLD, TrafficCounter())


def _op(op, collective: str, group: Group) -> str:
    return op_name(op, collective=collective, rank=group.my_global_rank)


def broadcast(tensor: torch.Tensor, src: Optional[int] = None, group=None, async_op: bool = False,
              group_src: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Copy ``src``'s ``tensor`` into ``tensor`` on every rank of ``group``. Every member calls it."""
    g = resolve_group(group, "broadcast")
    src = 0 if src is None and group_src is None else src
    root = validate.group_rank_of(g, src, group_src, "src", "broadcast")
    validate.check_tensor(tensor, "tensor", "broadcast", g)
    return _launch("broadcast", g, (_flat(tensor), root), dtype=tensor.dtype, op=None,
                   nbytes=tensor.numel() * tensor.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[tensor], numel=tensor.numel(), root=root)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *, algorithm: Optional[str] = None,
               compression: Optional[str] = None, compression_state=None):
    """Reduce ``tensor`` across ``group`` with ``op``, in place on every rank. Every member calls it.

    ``compression="onebit"`` runs :func:`compressed_all_reduce` (``op`` must be AVG: it computes the mean)
    with the caller's ``compression_state`` (a ``zerocomm.ops.ErrorFeedback``).
    """
    if compression is not None:
        g = resolve_group(group, "all_reduce")
        if compression != "onebit":
            raise InvalidArgumentError(f"rank {g.my_global_rank}: all_reduce: compression must be None or "
                                       f"'onebit', got {compression!r}")
        validate.check_tensor(tensor, "tensor", "all_reduce", g)
        check_compression("all_reduce", g, tensor.dtype, _op(op, "all_reduce", g))
        return compressed_all_reduce(tensor, compression_state, group=g, async_op=async_op, algorithm=algorithm)
    g = resolve_group(group, "all_reduce")
    name = _op(op, "all_reduce", g)
    validate.check_tensor(tensor, "tensor", "all_reduce", g)
    return _launch("all_reduce", g, (_flat(tensor), name), dtype=tensor.dtype, op=name,
                   nbytes=tensor.numel() * tensor.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[tensor], numel=tensor.numel())


def reduce(tensor: torch.Tensor, dst: Optional[int] = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Reduce ``tensor`` across ``group`` into ``dst``'s ``tensor``; other ranks' tensors are left unchanged."""
    g = resolve_group(group, "reduce")
    dst = 0 if dst is None and group_dst is None else dst
    root = validate.group_rank_of(g, dst, group_dst, "dst", "reduce")
    name = _op(op, "reduce", g)
    validate.check_tensor(tensor, "tensor", "reduce", g)
    return _launch("reduce", g, (_flat(tensor), name, root), dtype=tensor.dtype, op=name,
                   nbytes=tensor.numel() * tensor.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[tensor], numel=tensor.numel(), root=root)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           algorithm: Optional[str] = None):
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor`` on every rank.

    ``output_tensor`` holds ``world_size * input_tensor.numel()`` elements (shape ``(n*k, ...)`` or ``(n, k, ...)``);
    ``input_tensor`` may be this rank's chunk of it (in place).
    """
    g = resolve_group(group, "all_gather_into_tensor")
    validate.check_tensor(input_tensor, "input_tensor", "all_gather_into_tensor", g)
    validate.check_tensor(output_tensor, "output_tensor", "all_gather_into_tensor", g)
    validate.check_same_dtype([output_tensor], input_tensor.dtype, "all_gather_into_tensor", g)
    validate.check_numel(output_tensor, g.size() * input_tensor.numel(), "output_tensor", "all_gather_into_tensor", g)
    return _launch("all_gather", g, (_flat(output_tensor), _flat(input_tensor)), dtype=input_tensor.dtype, op=None,
                   nbytes=output_tensor.numel() * output_tensor.element_size(), algorithm=algorithm,
                   async_op=async_op, outputs=[output_tensor], numel=input_tensor.numel())


def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm: Optional[str] = None):
    """``tensor_list[r]`` ← rank r's ``tensor``, on every rank. Every member calls it."""
    g = resolve_group(group, "all_gather")
    validate.check_tensor(tensor, "tensor", "all_gather", g)
    validate.check_list_length(tensor_list, g.size(), "tensor_list", "all_gather", g)
    validate.check_same_dtype(tensor_list, tensor.dtype, "all_gather", g)
    for index, item in enumerate(tensor_list):
        validate.check_numel(item, tensor.numel(), f"tensor_list[{index}]", "all_gather", g)
    flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)

    def unpack() -> None:
        for item, chunk in zip(tensor_list, flat.view(g.size(), -1) if tensor.numel() else [flat] * g.size()):
            item.copy_(chunk.view(item.shape))

    return _launch("all_gather", g, (flat, _flat(tensor.contiguous())), dtype=tensor.dtype, op=None,
                   nbytes=flat.numel() * flat.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=list(tensor_list), numel=tensor.numel(), after=unpack)


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: Optional[int] = None,
           group=None, async_op: bool = False, group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """``gather_list[r]`` on ``dst`` ← rank r's ``tensor``; ``gather_list`` is given on ``dst`` only."""
    g = resolve_group(group, "gather")
    dst = 0 if dst is None and group_dst is None else dst
    root = validate.group_rank_of(g, dst, group_dst, "dst", "gather")
    validate.check_tensor(tensor, "tensor", "gather", g)
    flat, unpack = None, None  # the root alone receives, and unpacks into gather_list
    if g.rank == root:
        validate.check_list_length(gather_list, g.size(), "gather_list", "gather", g)
        validate.check_same_dtype(gather_list, tensor.dtype, "gather", g)
        for index, item in enumerate(gather_list):
            validate.check_numel(item, tensor.numel(), f"gather_list[{index}]", "gather", g)
        flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)

        def unpack() -> None:
            if tensor.numel():
                for item, chunk in zip(gather_list, flat.view(g.size(), -1)):
                    item.copy_(chunk.view(item.shape))
    elif gather_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: gather: gather_list must be given only on the "
                                   f"destination rank {g.ranks[root]}")
    return _launch("gather", g, (flat, _flat(tensor), root), dtype=tensor.dtype, op=None,
                   nbytes=g.size() * tensor.numel() * tensor.element_size(), algorithm=algorithm,
                   async_op=async_op, outputs=list(gather_list or []), numel=tensor.numel(), root=root, after=unpack)


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: Optional[int] = None,
            group=None, async_op: bool = False, group_src: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Rank r's ``tensor`` ← ``scatter_list[r]`` on ``src``; ``scatter_list`` is given on ``src`` only."""
    g = resolve_group(group, "scatter")
    src = 0 if src is None and group_src is None else src
    root = validate.group_rank_of(g, src, group_src, "src", "scatter")
    validate.check_tensor(tensor, "tensor", "scatter", g)
    flat = None
    if g.rank == root:
        validate.check_list_length(scatter_list, g.size(), "scatter_list", "scatter", g)
        validate.check_same_dtype(scatter_list, tensor.dtype, "scatter", g)
        for index, item in enumerate(scatter_list):
            validate.check_numel(item, tensor.numel(), f"scatter_list[{index}]", "scatter", g)
        flat = (torch.cat([item.reshape(-1) for item in scatter_list]) if tensor.numel()
                else torch.empty(0, dtype=tensor.dtype, device=tensor.device))
    elif scatter_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: scatter: scatter_list must be given only on the "
                                   f"source rank {g.ranks[root]}")
    return _launch("scatter", g, (_flat(tensor), flat, root), dtype=tensor.dtype, op=None,
                   nbytes=g.size() * tensor.numel() * tensor.element_size(), algorithm=algorithm,
                   async_op=async_op, outputs=[tensor], numel=tensor.numel(), root=root)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm: Optional[str] = None):
    """``output`` on rank r ← chunk r of the ``op``-reduction of every rank's ``input`` (``n * output.numel()`` elements)."""
    g = resolve_group(group, "reduce_scatter_tensor")
    name = _op(op, "reduce_scatter_tensor", g)
    validate.check_tensor(input, "input", "reduce_scatter_tensor", g)
    validate.check_tensor(output, "output", "reduce_scatter_tensor", g)
    validate.check_same_dtype([output], input.dtype, "reduce_scatter_tensor", g)
    validate.check_numel(input, g.size() * output.numel(), "input", "reduce_scatter_tensor", g)
    return _launch("reduce_scatter", g, (_flat(output), _flat(input), name), dtype=input.dtype, op=name,
                   nbytes=input.numel() * input.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[output], numel=output.numel())


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                   algorithm: Optional[str] = None):
    """``output`` on rank r ← the ``op``-reduction over ranks of their ``input_list[r]``."""
    g = resolve_group(group, "reduce_scatter")
    name = _op(op, "reduce_scatter", g)
    validate.check_tensor(output, "output", "reduce_scatter", g)
    validate.check_list_length(input_list, g.size(), "input_list", "reduce_scatter", g)
    validate.check_same_dtype(input_list, output.dtype, "reduce_scatter", g)
    for index, item in enumerate(input_list):
        validate.check_numel(item, output.numel(), f"input_list[{index}]", "reduce_scatter", g)
    flat = (torch.cat([item.reshape(-1) for item in input_list]) if output.numel()
            else torch.empty(0, dtype=output.dtype, device=output.device))
    return _launch("reduce_scatter", g, (_flat(output), flat, name), dtype=output.dtype, op=name,
                   nbytes=flat.numel() * flat.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[output], numel=output.numel())


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, algorithm: Optional[str] = None):
    """Rank r sends split j of ``input`` (along dim 0) to rank j and receives rank j's split r into split j of ``output``.

    Without split sizes, dim 0 is divided evenly by the group size.
    """
    g = resolve_group(group, "all_to_all_single")
    validate.check_tensor(input, "input", "all_to_all_single", g)
    validate.check_tensor(output, "output", "all_to_all_single", g)
    validate.check_same_dtype([output], input.dtype, "all_to_all_single", g)
    in_counts = _split_counts(input, input_split_sizes, "input", g)
    out_counts = _split_counts(output, output_split_sizes, "output", g)
    return _launch("all_to_all", g, (_flat(output), _flat(input), out_counts, in_counts), dtype=input.dtype, op=None,
                   nbytes=input.numel() * input.element_size(), algorithm=algorithm, async_op=async_op,
                   outputs=[output], numel=-1)



def _split_counts(tensor: torch.Tensor, splits, what: str, g: Group) -> List[int]:
    """Element counts per rank from dim-0 split sizes (or an even split)."""
    n = g.size()
    rows = tensor.shape[0] if tensor.dim() else 1
    row_numel = tensor.numel() // rows if rows else 0
    if splits is None or len(splits) == 0:
        if rows % n:
            raise InvalidArgumentError(f"rank {g.my_global_rank}: all_to_all_single: {what} has {rows} rows, not "
                                       f"divisible by the group size {n}; pass {what}_split_sizes")
        return [rows // n * row_numel] * n
    splits = [int(s) for s in splits]
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: all_to_all_single: {what}_split_sizes {splits} must "
                                   f"have {n} non-negative entries summing to {what}.shape[0] = {rows}")
    return [s * row_numel for s in splits]


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False, *,
               algorithm: Optional[str] = None):
    """``output_tensor_list[j]`` on rank r ← ``input_tensor_list[r]`` of rank j (sizes may differ per pair)."""
    g = resolve_group(group, "all_to_all")
    validate.check_list_length(input_tensor_list, g.size(), "input_tensor_list", "all_to_all", g)
    validate.check_list_length(output_tensor_list, g.size(), "output_tensor_list", "all_to_all", g)
    for index, item in enumerate(list(input_tensor_list) + list(output_tensor_list)):
        validate.check_tensor(item, f"tensor {index}", "all_to_all", g)
    dtype = input_tensor_list[0].dtype
    validate.check_same_dtype(list(input_tensor_list) + list(output_tensor_list), dtype, "all_to_all", g)
    device = input_tensor_list[0].device
    flat_in = torch.cat([item.reshape(-1) for item in input_tensor_list])
    out_counts = [item.numel() for item in output_tensor_list]
    flat_out = torch.empty(sum(out_counts), dtype=dtype, device=device)

    def unpack() -> None:
        for item, chunk in zip(output_tensor_list, flat_out.split(out_counts)):
            item.copy_(chunk.view(item.shape))

    in_counts = [t.numel() for t in input_tensor_list]
    return _launch("all_to_all", g, (flat_out, flat_in, out_counts, in_counts),
                   dtype=dtype, op=None, nbytes=flat_in.numel() * flat_in.element_size(), algorithm=algorithm,
                   async_op=async_op, outputs=list(output_tensor_list), numel=-1, after=unpack)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None, *, algorithm: Optional[str] = None):
    """Return once every member of ``group`` has entered the barrier; ``timeout`` overrides the group's."""
    g = resolve_group(group, "barrier")
    limit = None if timeout_seconds(timeout) is None else datetime.timedelta(seconds=timeout_seconds(timeout))
    return _launch("barrier", g, (), dtype=torch.uint8, op=None, nbytes=0, algorithm=algorithm,
                   async_op=async_op, outputs=[], numel=0, timeout=limit)


def compressed_all_reduce(tensor: torch.Tensor, state, group=None, async_op: bool = False, *,
                          algorithm: Optional[str] = None):
    """Replace ``tensor`` on every rank by the **mean** over ``group``, sent with 1-bit compression.

    ``state`` is this rank's ``zerocomm.ops.ErrorFeedback`` for this tensor (one per tensor or bucket; the
    caller owns it and may checkpoint it with ``state_dict()``).  The sub-collectives run with ``algorithm``:
    "native", "ring", or "tree" (tree all_gather; the all_to_all is the pairwise exchange, which has no tree
    form).  Floating dtypes only; half inputs are compressed through float32.
    """
    from ..ops.onebit import ErrorFeedback
    from .algorithms.compressed import all_reduce_onebit
    g = resolve_group(group, "compressed_all_reduce")
    validate.check_tensor(tensor, "tensor", "compressed_all_reduce", g)
    check_compression("compressed_all_reduce", g, tensor.dtype, "avg")
    if not isinstance(state, ErrorFeedback):
        raise InvalidArgumentError(f"rank {g.my_global_rank}: compressed_all_reduce: state must be a "
                                   f"zerocomm.ops.ErrorFeedback (one per tensor), got {type(state).__name__}")
    inner = algorithm if algorithm is not None else WORLD.config.algorithm
    inner = "native" if inner == "auto" else inner
    if inner not in ("native", "ring", "tree"):
        raise UnsupportedError(f"rank {g.my_global_rank}: compressed_all_reduce on backend {g.backend!r} cannot run "
                               f"over algorithm={inner!r}; use 'native', 'ring' or 'tree'")
    config = WORLD.config
    steps = {}
    for step, wanted in (("all_to_all", "ring" if inner == "tree" else inner), ("all_gather", inner)):
        select_algorithm(step, g, torch.uint8, None, tensor.numel() // 8, wanted, config.algorithm)
        steps[step] = wanted
    nbytes = tensor.numel() * tensor.element_size()
    observers = list(WORLD.observers)
    record = start_record(observers, "compressed_all_reduce", g, inner, nbytes)
    transport = g.transport if record is None else CountingTransport(g.transport, record)

    def bind(step: str):
        if steps[step] == "native":
            return getattr(transport, f"native_{step}")
        function = _REGISTRY[(step, steps[step])]
        return lambda *args, **kw: function(transport, *args, **kw)

    flat = _flat(tensor)

    def body(tag: int, deadline: Optional[float]) -> None:
        if config.debug:
            validate.cross_check(g, validate.fingerprint(tag, "compressed_all_reduce", tensor.numel(), tensor.dtype,
                                                         -1, inner), deadline)
        if record is not None:
            record.start_s = now()
        all_reduce_onebit(transport, flat, state, all_to_all=bind("all_to_all"), all_gather=bind("all_gather"),
                          tag=tag, deadline=deadline, segment_bytes=config.segment_bytes)
        if record is not None:
            record.end_s = now()
            if inner == "native":  # the backend's bytes are invisible: the schedule's two collectives
                from ..ops.onebit import onebit_padded_numel
                row = onebit_padded_numel(tensor.numel(), g.size()) // g.size() // 8 + (
                    8 if tensor.dtype == torch.float64 else 4)
                record.bytes_sent = record.bytes_received = 2 * (g.size() - 1) * row
                record.measured = False
            for observer in observers:
                observer.on_end(record)

    return g.run("compressed_all_reduce", body, async_op, outputs=[tensor])


#: torch 2.13's new names for the tensor forms (the old ones still work, as in torch).
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
