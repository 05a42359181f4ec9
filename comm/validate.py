"""The full checks of a call, before any byte moves; the first call of a cell ends by making its plan.

Each function below takes one public collective's arguments (``api.py`` passes them on
unchanged, with the key it looks plans up by), checks what this rank can check alone -- group,
tensors, dtypes, sizes, roots, op, and whether the chosen algorithm serves the cell -- and runs
the call through its cell's plan (``plan.py``): the flat buffers the algorithm takes, and what to
copy back to list outputs afterwards.  A wrong argument raises a typed error naming this rank,
the call and the value; nothing is sent.  The plan is kept under ``key``, so that the cell's
next calls skip these checks but for the few that may differ between calls (``api.py``).

What one rank cannot check alone -- that every rank called the same collective with the same
sizes -- is ``check.py``'s, wrapping every call's plan.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as _td

from ..ops.flatten import pack, unpacker
from ..ops.onebit import ErrorFeedback
from . import select
from .algorithms import ALGORITHM_NAMES, COMPRESSED, sub_algorithm
from .algorithms.compressed import SUB_COLLECTIVES
from .errors import InvalidArgumentError, UnsupportedError
from .group import NON_GROUP_MEMBER, WORLD, Group
from .plan import Call, Plan, plan_for, special_plan  # noqa: F401  (Call: the record, re-exported)
from .reduce_op import OP_NAMES, SUPPORTED_DTYPES, ReduceOp, for_dtype, op_name
from .sparse import all_reduce_sparse
from .work import timeout_seconds

_DTYPES = frozenset(SUPPORTED_DTYPES)


# -- groups and single checks --------------------------------------------------------------------

def resolve_group(group, what: str) -> Group:
    """The ``Group`` a call runs on: ``None`` means the default group; a torch ``ProcessGroup`` of zerocomm's
    (what ``new_group`` returns, or a group torch made on backend "zerocomm") gives its ``zerocomm_group``."""
    if group is None:
        g = WORLD.default
        if g is None:
            WORLD.require(what)  # raises NotInitializedError
        return g
    g = group if type(group) is Group else getattr(group, "zerocomm_group", group)
    if isinstance(g, Group):
        if g.communicator is None:
            raise InvalidArgumentError(f"{what}: {g.describe()} was destroyed")
        return g
    if group is NON_GROUP_MEMBER:
        world = WORLD.require(what)
        raise InvalidArgumentError(f"rank {world.my_global_rank}: {what}: this process is not a member of the "
                                   "group it passed (new_group returned NON_GROUP_MEMBER here)")
    raise InvalidArgumentError(f"{what}: group must be a zerocomm group or None, got {type(group).__name__}")


def check_tensor(tensor, what: str, collective: str, group: Group, packed: bool = False,
                 any_dtype: bool = False) -> None:
    """``tensor`` is a tensor of a supported dtype (any dtype with ``any_dtype``: point-to-point moves bytes) on the
    backend's device, whose elements do not overlap in memory; contiguous too, unless ``packed`` (a list item the
    call copies into or out of a flat buffer of its own).

    A single tensor that is not contiguous raises ``UnsupportedError``: the public function then runs the call on a
    contiguous copy and writes the result back (``staging.retry``); the user sees that error only where that cannot
    help.  Overlapping elements (a stride of 0, as ``expand`` makes) raise ``InvalidArgumentError``: a result cannot
    be written back into them, and torch's gloo reads past their storage."""
    if (type(tensor) is torch.Tensor or isinstance(tensor, torch.Tensor)) and (tensor.dtype in _DTYPES or any_dtype) \
            and tensor.is_contiguous() and (tensor.is_cpu if group.on_cpu else tensor.device.type == group.device_type):
        return
    rank = group.my_global_rank
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"rank {rank}: {collective}: {what} must be a torch.Tensor, got "
                                   f"{type(tensor).__name__}")
    contiguous = tensor.is_contiguous()
    if not contiguous:
        check_writable(tensor, what, collective, group)
    if not contiguous and not packed:
        raise UnsupportedError(f"rank {rank}: {collective}: {what} is not contiguous (shape {tuple(tensor.shape)}, "
                               f"strides {tensor.stride()}); the collective runs on a contiguous copy")
    if tensor.dtype not in _DTYPES and not any_dtype:
        raise UnsupportedError(f"rank {rank}: {collective}: {what} has dtype {tensor.dtype}, which backend "
                               f"{group.backend!r} does not move; use one of {[str(d) for d in SUPPORTED_DTYPES]}")
    if tensor.is_cpu if group.on_cpu else tensor.device.type == group.device_type:
        return  # a packed list item that is not contiguous
    device = group.device_type
    other = "nccl" if tensor.device.type == "cuda" else "gloo or mpi"
    raise UnsupportedError(f"rank {rank}: {collective}: {what} is on {tensor.device} but backend "
                           f"{group.backend!r} moves {device} tensors; move it to {device} or use backend {other!r}")


def check_writable(tensor: torch.Tensor, what: str, collective: str, group: Group) -> None:
    """No two elements of ``tensor`` share memory (tested where it is not contiguous), so a result can be copied into
    it: a list item the call copies its result into, or any tensor a contiguous copy stands in for."""
    if not tensor.is_contiguous() and overlaps(tensor):
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: {what}'s elements overlap in memory "
                                   f"(shape {tuple(tensor.shape)}, strides {tensor.stride()}: a stride of 0, as "
                                   ".expand() makes); pass .clone() or .contiguous()")


def overlaps(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` may share memory: its dims of more than one element, by increasing
    stride, must each step past every offset the smaller ones reach (a sufficient test of no overlap; contiguous
    tensors and every view that slicing, transposing or permuting makes pass it)."""
    reach = 0
    for stride, size in sorted((stride, size) for stride, size in zip(tensor.stride(), tensor.shape)
                               if size > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def check_same_dtype(tensors: Sequence[torch.Tensor], dtype: torch.dtype, collective: str, group: Group) -> None:
    for index, tensor in enumerate(tensors):
        if tensor.dtype != dtype:
            raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: expects uniform dtype {dtype} "
                                       f"but tensor {index} has {tensor.dtype}")


def check_numel(tensor: torch.Tensor, expected: int, what: str, collective: str, group: Group) -> None:
    if tensor.numel() != expected:
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: {what} has {tensor.numel()} elements, "
                                   f"expected {expected} (shape {tuple(tensor.shape)})")


def check_list_length(items, expected: int, what: str, collective: str, group: Group) -> None:
    if items is None or len(items) != expected:
        got = "None" if items is None else f"{len(items)} items"
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: {what} must hold one tensor per rank: "
                                   f"expecting {expected} items, got {got}")


def group_rank_of(group: Group, global_rank: Optional[int], group_rank: Optional[int], role: str,
                  collective: str) -> int:
    """Canonicalize torch's (``src``/``dst`` global rank, ``group_src``/``group_dst``) pair to a group rank."""
    rank = group.my_global_rank
    if group_rank is not None:
        if global_rank is not None:
            raise InvalidArgumentError(f"rank {rank}: {collective}: pass either {role} or group_{role}, not both")
        if not 0 <= group_rank < group.size():
            raise InvalidArgumentError(f"rank {rank}: {collective}: group_{role} {group_rank} is outside the group "
                                       f"(size {group.size()})")
        return group_rank
    if global_rank is None:
        raise InvalidArgumentError(f"rank {rank}: {collective}: {role} must be given")
    if global_rank not in group.ranks:
        raise InvalidArgumentError(f"rank {rank}: {collective}: {role} {global_rank} is not a member of "
                                   f"{group.describe()}")
    return group.ranks.index(global_rank)


def _tensor_pair(output, input, out_name: str, in_name: str, what: str, group: Group, op=None) -> tuple:
    """The checks of a tensor-form collective's (output, input) pair; complex tensors come back as real views."""
    output, input = as_real(output, what, group, op), as_real(input, what, group, op)
    check_tensor(input, in_name, what, group)
    check_tensor(output, out_name, what, group)
    check_same_dtype([output], input.dtype, what, group)
    return output, input


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The 1-D view algorithms take (a contiguous 1-D tensor is its own: views cost a microsecond)."""
    return tensor if tensor.dim() == 1 else tensor.view(-1)


# -- complex and sparse tensors --------------------------------------------------------------------

def as_real(tensor, collective: str, group: Group, op=None):
    """A complex tensor as its real view (``torch.view_as_real``: shape ``(..., 2)``, the same storage), as
    torch moves it; every other tensor unchanged.  A reduction that does not admit complex numbers
    (``torch.distributed.supports_complex``: MIN, MAX, PRODUCT, bitwise) raises torch's error; a sparse
    tensor raises ``UnsupportedError`` (all_reduce's SUM of a sparse tensor is served before, by ``sparse.py``)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.layout is not torch.strided:
        raise UnsupportedError(f"rank {group.my_global_rank}: {collective}: tensor has layout {tensor.layout}; "
                               "zerocomm moves dense (strided) tensors only: send .to_dense(), or the sparse "
                               "tensor's .indices() and .values() as two dense tensors")
    if not tensor.is_complex():
        return tensor
    if op is not None and not _td.supports_complex(op):
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective} does not support {op} on complex "
                                   "tensors")
    return torch.view_as_real(tensor)


def _reals(items, collective: str, group: Group):
    return items if items is None else [as_real(item, collective, group) for item in items]


_SUM = ReduceOp.SUM
_BOOL = torch.bool


def _op(op, dtype: torch.dtype, collective: str, group: Group) -> str:
    """The op's lower-case name, as the kernels name it for ``dtype`` (bool's SUM is "bor", its PRODUCT "band":
    ``reduce_op.for_dtype``); whether ``dtype`` admits it is part of the cell ``choose_algorithm`` checks."""
    if op is _SUM:  # the default, by identity: hashing a ReduceOp costs more than the rest of this function
        return "sum" if dtype is not _BOOL else "bor"
    name = OP_NAMES.get(op)
    if name is None:
        name = op_name(op, collective=collective, rank=group.my_global_rank)
    return name if dtype is not _BOOL else for_dtype(name, dtype)


def choose_algorithm(collective: str, group: Group, dtype: torch.dtype, op: Optional[str], nbytes: Optional[int],
                     requested: Optional[str], what: str) -> tuple:
    """``(algorithm, function)`` a call of ``nbytes`` would run (``None``: the unbounded row, for sizes that may
    differ between ranks), read from the cell's plan; raises as the call itself would."""
    plan = plan_for(group, collective, dtype, op, -1, requested, False, None, what, collective)
    size = select.UNBOUNDED if nbytes is None else nbytes
    for row in plan.rows:
        if size <= row.most_bytes:
            return row.algorithm, row.function
    return plan.rows[-1].algorithm, plan.rows[-1].function


#: ``key`` asking a function below for the call's record instead of running it (the coalesced forms of
#: ``compat.py`` run several records under one profiler event).
RECORD = object()


def _run(plan: Plan, key, args: tuple, nbytes: int, numel: int, outputs: tuple, copy_out=None, inputs=None,
         options: Optional[dict] = None):
    """Run the call through ``plan`` (or return its record, for ``key`` :data:`RECORD`); keep ``plan`` under the
    public function's ``key`` when the call is one its quick test admits as it is (not a complex tensor, which
    travels as its real view; not a compressed one, whose state is the call's own)."""
    if key is RECORD:
        return plan.record(args, nbytes, numel, outputs, copy_out, options)
    if key is not None and key[-1] is plan.dtype and options is None:
        WORLD.plans[key] = plan
    return plan.run(args=args, nbytes=nbytes, numel=numel, outputs=outputs, copy_out=copy_out, inputs=inputs,
                    options=options)


def _timeout(timeout, what: str) -> Optional[float]:
    """A call's own ``timeout`` in seconds (``None``: the group's); negative or not a number raises."""
    return timeout_seconds(timeout, f"{what}: timeout")


# -- one function per public form ------------------------------------------------------------------

def broadcast(tensor, src, group, async_op, group_src, algorithm, key=None):
    g = resolve_group(group, "broadcast")
    tensor = as_real(tensor, "broadcast", g)
    src = 0 if src is None and group_src is None else src
    root = group_rank_of(g, src, group_src, "src", "broadcast")
    check_tensor(tensor, "tensor", "broadcast", g)
    plan = plan_for(g, "broadcast", tensor.dtype, None, root, algorithm, async_op, None, "broadcast",
                               "broadcast")
    return _run(plan, key, (_flat(tensor), root), tensor.nbytes, tensor.numel(), (tensor,))


def all_reduce(tensor, op, group, async_op, algorithm, compression, state, key=None):
    g = resolve_group(group, "all_reduce")
    if isinstance(tensor, torch.Tensor) and tensor.is_sparse:
        return _sparse_all_reduce(tensor, op, g, async_op, key if key is RECORD else None)
    tensor = as_real(tensor, "all_reduce", g, op)
    check_tensor(tensor, "tensor", "all_reduce", g)
    name = _op(op, tensor.dtype, "all_reduce", g)
    if compression is None and algorithm != "onebit":
        plan = plan_for(g, "all_reduce", tensor.dtype, name, -1, algorithm, async_op, None, "all_reduce",
                                   "all_reduce")
        return _run(plan, key, (_flat(tensor), name), tensor.nbytes, tensor.numel(), (tensor,))
    return _onebit(tensor, name, g, async_op, algorithm, compression, state, key)


def _sparse_all_reduce(tensor, op, g: Group, async_op, key=None):
    """A sparse COO tensor's SUM (see ``sparse.py``); other ops raise, as in torch's gloo."""
    if op != _SUM:
        raise UnsupportedError(f"rank {g.my_global_rank}: all_reduce: sparse tensors support ReduceOp.SUM only, got "
                               f"{op}; reduce .to_dense() for other ops")
    if tensor.device.type != "cpu":
        raise UnsupportedError(f"rank {g.my_global_rank}: all_reduce: sparse tensors are reduced on the CPU only, got "
                               f"one on {tensor.device}")
    # Named "ring" (its three all_gathers are rings), so that the mismatch check's fingerprint knows it.
    plan = special_plan(g, "all_reduce", tensor.dtype, "sum", "ring", all_reduce_sparse, async_op, "all_reduce")
    return _run(plan, key, (tensor,), tensor._nnz() * tensor.element_size(), tensor.numel(), (tensor,))


def _onebit(tensor, op: str, g: Group, async_op, algorithm, compression, state, key=None):
    """The 1-bit compressed mean: ``algorithm="onebit"``, its sub-collectives on ``algorithm`` (the inner one)."""
    rank = g.my_global_rank
    if compression not in ("onebit", None) or algorithm == "onebit":
        raise InvalidArgumentError(f"rank {rank}: all_reduce: compression must be None or 'onebit' (with "
                                   f"compression_state), got compression={compression!r}, algorithm={algorithm!r}")
    reason = select.refusal("all_reduce", g.backend_type, tensor.dtype, op, "onebit")
    if reason is not None:
        select.raise_unsupported("all_reduce", g, tensor.dtype, op, "onebit", reason)
    if not isinstance(state, ErrorFeedback):
        raise InvalidArgumentError(f"rank {rank}: all_reduce: compression='onebit' needs compression_state, a "
                                   f"zerocomm.ops.ErrorFeedback (one per tensor), got {type(state).__name__}")
    inner = WORLD.config.algorithm if algorithm is None else algorithm
    inner = "native" if inner == "auto" else inner
    if inner not in ALGORITHM_NAMES or inner in COMPRESSED:
        raise UnsupportedError(f"rank {rank}: all_reduce with compression='onebit' on backend {g.backend!r} cannot "
                               f"run over algorithm={inner!r}; use one of "
                               f"{[a for a in ALGORITHM_NAMES if a not in COMPRESSED]}")
    options = {"state": state, "inner": inner}
    for step in SUB_COLLECTIVES:  # each step's function, refused here where the inner algorithm cannot run it
        options[step] = choose_algorithm(step, g, torch.uint8, None, tensor.numel() // 8, sub_algorithm(step, inner),
                                         "all_reduce")[1]
    plan = plan_for(g, "all_reduce", tensor.dtype, op, -1, "onebit", async_op, None, "all_reduce", "all_reduce")
    return _run(plan, key, (_flat(tensor), op), tensor.nbytes, tensor.numel(), (tensor,), options=options)


def reduce(tensor, dst, op, group, async_op, group_dst, algorithm, key=None):
    g = resolve_group(group, "reduce")
    tensor = as_real(tensor, "reduce", g, op)
    dst = 0 if dst is None and group_dst is None else dst
    root = group_rank_of(g, dst, group_dst, "dst", "reduce")
    check_tensor(tensor, "tensor", "reduce", g)
    name = _op(op, tensor.dtype, "reduce", g)
    plan = plan_for(g, "reduce", tensor.dtype, name, root, algorithm, async_op, None, "reduce", "reduce")
    return _run(plan, key, (_flat(tensor), name, root), tensor.nbytes, tensor.numel(), (tensor,))


def all_gather_into_tensor(output_tensor, input_tensor, group, async_op, algorithm, key=None):
    what = "all_gather_into_tensor"
    g = resolve_group(group, what)
    output_tensor, input_tensor = _tensor_pair(output_tensor, input_tensor, "output_tensor", "input_tensor", what, g)
    check_numel(output_tensor, g.size() * input_tensor.numel(), "output_tensor", what, g)
    plan = plan_for(g, "all_gather", input_tensor.dtype, None, -1, algorithm, async_op, None, what,
                               "all_gather_into_tensor")
    return _run(plan, key, (_flat(output_tensor), _flat(input_tensor)), output_tensor.nbytes, input_tensor.numel(),
                    (output_tensor,), None, (input_tensor,))


def all_gather(tensor_list, tensor, group, async_op, algorithm, key=None):
    g = resolve_group(group, "all_gather")
    tensor, tensor_list = as_real(tensor, "all_gather", g), _reals(tensor_list, "all_gather", g)
    check_tensor(tensor, "tensor", "all_gather", g)
    check_list_length(tensor_list, g.size(), "tensor_list", "all_gather", g)
    check_same_dtype(tensor_list, tensor.dtype, "all_gather", g)
    for index, item in enumerate(tensor_list):
        check_numel(item, tensor.numel(), f"tensor_list[{index}]", "all_gather", g)
        check_writable(item, f"tensor_list[{index}]", "all_gather", g)
    flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    copy_out = unpacker(flat, tensor_list)
    plan = plan_for(g, "all_gather", tensor.dtype, None, -1, algorithm, async_op, None, "all_gather", "all_gather")
    return _run(plan, key, (flat, _flat(tensor)), flat.nbytes, tensor.numel(), tuple(tensor_list), copy_out, (tensor,))


def gather(tensor, gather_list, dst, group, async_op, group_dst, algorithm, key=None):
    g = resolve_group(group, "gather")
    tensor, gather_list = as_real(tensor, "gather", g), _reals(gather_list, "gather", g)
    dst = 0 if dst is None and group_dst is None else dst
    root = group_rank_of(g, dst, group_dst, "dst", "gather")
    check_tensor(tensor, "tensor", "gather", g)
    flat, copy_out = None, None  # the root alone receives, and copies out into gather_list
    if g.rank == root:
        check_list_length(gather_list, g.size(), "gather_list", "gather", g)
        check_same_dtype(gather_list, tensor.dtype, "gather", g)
        for index, item in enumerate(gather_list):
            check_numel(item, tensor.numel(), f"gather_list[{index}]", "gather", g)
            check_writable(item, f"gather_list[{index}]", "gather", g)
        flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        copy_out = unpacker(flat, gather_list)
    elif gather_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: gather: gather_list must be given only on the "
                                   f"destination rank {g.ranks[root]}")
    plan = plan_for(g, "gather", tensor.dtype, None, root, algorithm, async_op, None, "gather", "gather")
    return _run(plan, key, (flat, _flat(tensor), root), g.size() * tensor.nbytes, tensor.numel(), tuple(gather_list or ()),
                    copy_out, (tensor,))


def scatter(tensor, scatter_list, src, group, async_op, group_src, algorithm, key=None):
    g = resolve_group(group, "scatter")
    tensor, scatter_list = as_real(tensor, "scatter", g), _reals(scatter_list, "scatter", g)
    src = 0 if src is None and group_src is None else src
    root = group_rank_of(g, src, group_src, "src", "scatter")
    check_tensor(tensor, "tensor", "scatter", g)
    chunks = None
    if g.rank == root:
        check_list_length(scatter_list, g.size(), "scatter_list", "scatter", g)
        check_same_dtype(scatter_list, tensor.dtype, "scatter", g)
        for index, item in enumerate(scatter_list):
            check_numel(item, tensor.numel(), f"scatter_list[{index}]", "scatter", g)
        # Each chunk contiguous (a strided item is copied, as joining them did), not joined: see plan._scatter_fields.
        chunks = tuple(item.contiguous().reshape(-1) for item in scatter_list)
    elif scatter_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: scatter: scatter_list must be given only on the "
                                   f"source rank {g.ranks[root]}")
    plan = plan_for(g, "scatter", tensor.dtype, None, root, algorithm, async_op, None, "scatter", "scatter")
    return _run(plan, key, (_flat(tensor), chunks, root), g.size() * tensor.nbytes, tensor.numel(), (tensor,), None,
                    tuple(scatter_list or ()))


def reduce_scatter_tensor(output, input, op, group, async_op, algorithm, key=None):
    what = "reduce_scatter_tensor"
    g = resolve_group(group, what)
    output, input = _tensor_pair(output, input, "output", "input", what, g, op)
    name = _op(op, input.dtype, what, g)
    check_numel(input, g.size() * output.numel(), "input", what, g)
    plan = plan_for(g, "reduce_scatter", input.dtype, name, -1, algorithm, async_op, None, what,
                               "reduce_scatter_tensor")
    return _run(plan, key, (_flat(output), _flat(input), name), input.nbytes, output.numel(), (output,), None, (input,))


def reduce_scatter(output, input_list, op, group, async_op, algorithm, key=None):
    g = resolve_group(group, "reduce_scatter")
    output, input_list = as_real(output, "reduce_scatter", g, op), _reals(input_list, "reduce_scatter", g)
    check_tensor(output, "output", "reduce_scatter", g)
    name = _op(op, output.dtype, "reduce_scatter", g)
    check_list_length(input_list, g.size(), "input_list", "reduce_scatter", g)
    check_same_dtype(input_list, output.dtype, "reduce_scatter", g)
    for index, item in enumerate(input_list):
        check_numel(item, output.numel(), f"input_list[{index}]", "reduce_scatter", g)
    flat = pack(input_list, output.dtype, output.device)
    plan = plan_for(g, "reduce_scatter", output.dtype, name, -1, algorithm, async_op, None, "reduce_scatter",
                    "reduce_scatter")
    return _run(plan, key, (_flat(output), flat, name), flat.nbytes, output.numel(), (output,), None, tuple(input_list))


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


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op, algorithm, key=None):
    what = "all_to_all_single"
    g = resolve_group(group, what)
    output, input = _tensor_pair(output, input, "output", "input", what, g)
    in_counts = _split_counts(input, input_split_sizes, "input", g)
    out_counts = _split_counts(output, output_split_sizes, "output", g)
    # Even splits: every rank sends as many bytes, and "auto" may choose by size.
    uneven = input_split_sizes is not None or output_split_sizes is not None
    plan = plan_for(g, "all_to_all", input.dtype, None, -1, algorithm, async_op, None, what, "all_to_all", uneven,
                    what)
    # Even splits: every rank's input has as many elements, so the mismatch check compares them (uneven: -1, per rank).
    return _run(plan, key, (_flat(output), _flat(input), out_counts, in_counts), input.nbytes,
                -1 if uneven else input.numel(), (output,), None, (input,))


def all_to_all(output_tensor_list, input_tensor_list, group, async_op, algorithm, key=None):
    g = resolve_group(group, "all_to_all")
    output_tensor_list = _reals(output_tensor_list, "all_to_all", g)
    input_tensor_list = _reals(input_tensor_list, "all_to_all", g)
    check_list_length(input_tensor_list, g.size(), "input_tensor_list", "all_to_all", g)
    check_list_length(output_tensor_list, g.size(), "output_tensor_list", "all_to_all", g)
    for index, item in enumerate(list(input_tensor_list) + list(output_tensor_list)):
        check_tensor(item, f"tensor {index}", "all_to_all", g, packed=True)
    dtype = input_tensor_list[0].dtype
    check_same_dtype(list(input_tensor_list) + list(output_tensor_list), dtype, "all_to_all", g)
    flat_in = pack(input_tensor_list, dtype, input_tensor_list[0].device)
    out_counts = [item.numel() for item in output_tensor_list]
    in_counts = [item.numel() for item in input_tensor_list]
    flat_out = torch.empty(sum(out_counts), dtype=dtype, device=flat_in.device)
    copy_out = unpacker(flat_out, output_tensor_list)
    plan = plan_for(g, "all_to_all", dtype, None, -1, algorithm, async_op, None, "all_to_all", "all_to_all", True)
    return _run(plan, key, (flat_out, flat_in, out_counts, in_counts), flat_in.nbytes, -1, tuple(output_tensor_list), copy_out,
                    tuple(input_tensor_list))


def barrier(group, async_op, timeout, algorithm, key=None):
    g = resolve_group(group, "barrier")
    plan = plan_for(g, "barrier", torch.uint8, None, -1, algorithm, async_op, _timeout(timeout, "barrier"), "barrier",
                    "barrier")
    return _run(plan, key, (), 0, 0, (), None, ())
