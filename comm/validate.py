"""A public call becomes one checked record, here, before any byte moves.

Each function below takes one public collective's arguments (``api.py`` passes them on
unchanged), checks what this rank can check alone — group, tensors, dtypes, sizes, roots,
op, and whether the chosen algorithm serves the cell — and returns a :class:`Call`: the
flat buffers the algorithm takes, the algorithm and its function, and what to copy back
to list outputs afterwards.  A wrong argument raises a typed error naming this rank, the
call and the value; nothing is sent.  ``Group.run`` then runs the record, once.

What one rank cannot check alone — that every rank called the same collective with the
same sizes — is :func:`cross_check`'s job, on by default (``ZEROCOMM_CHECK=0`` turns it off):
each call first all-reduces a hash of a small fingerprint (sequence number, collective, op,
element count, dtype, root, algorithm; ``ZEROCOMM_DEBUG=1`` all-gathers the fingerprint
itself) and every rank raises ``CollectiveMismatchError`` naming the first two ranks that
disagree, instead of the garbage, hang or abort a mismatch gives on the wire.
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Sequence

import torch
import torch.distributed as _td

from . import select, short_path
from .algorithms import ALGORITHM_CHOICES, ALGORITHM_NAMES, ALGORITHMS, COLLECTIVES, COMPRESSED
from .algorithms.compressed import SUB_COLLECTIVES, sub_algorithm
from .errors import CollectiveMismatchError, InvalidArgumentError, UnsupportedError
from .group import NON_GROUP_MEMBER, WORLD, Group, digest
from .transport import AGREE_AND_REDUCED, USER_TAG_LIMIT
from .reduce_op import OP_NAMES, SUPPORTED_DTYPES, ReduceOp, op_name
from .sparse import all_reduce_sparse
from .topology import HOST_ENV

_DTYPES = frozenset(SUPPORTED_DTYPES)
_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


class Call(NamedTuple):
    """One collective call, checked and resolved: what ``Group.run`` executes."""

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
    copy_out: tuple
    """``(flat source, destination)`` pairs copied after the run (list outputs)."""
    nbytes: int
    """S, as nccl-tests defines it for this collective."""
    numel: int
    dtype: torch.dtype


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


def check_tensor(tensor, what: str, collective: str, group: Group) -> None:
    """``tensor`` is a contiguous tensor of a supported dtype on the backend's device."""
    if (type(tensor) is torch.Tensor or isinstance(tensor, torch.Tensor)) and tensor.dtype in _DTYPES \
            and tensor.is_contiguous() and (tensor.is_cpu if group.on_cpu else tensor.device.type == group.device_type):
        return
    rank = group.my_global_rank
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"rank {rank}: {collective}: {what} must be a torch.Tensor, got "
                                   f"{type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"rank {rank}: {collective}: {what} must be contiguous (shape {tuple(tensor.shape)}, "
                                   f"strides {tensor.stride()}); call .contiguous() first")
    if tensor.dtype not in _DTYPES:
        raise UnsupportedError(f"rank {rank}: {collective}: {what} has dtype {tensor.dtype}, which backend "
                               f"{group.backend!r} does not move; use one of {[str(d) for d in SUPPORTED_DTYPES]}")
    device = group.device_type
    other = "nccl" if tensor.device.type == "cuda" else "gloo or mpi"
    raise UnsupportedError(f"rank {rank}: {collective}: {what} is on {tensor.device} but backend "
                           f"{group.backend!r} moves {device} tensors; move it to {device} or use backend {other!r}")


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
    output, input = _real(output, what, group, op), _real(input, what, group, op)
    check_tensor(input, in_name, what, group)
    check_tensor(output, out_name, what, group)
    check_same_dtype([output], input.dtype, what, group)
    return output, input


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The 1-D view algorithms take (a contiguous 1-D tensor is its own: views cost a microsecond)."""
    return tensor if tensor.dim() == 1 else tensor.view(-1)


# -- complex and sparse tensors --------------------------------------------------------------------

def _real(tensor, collective: str, group: Group, op=None):
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
    return torch.view_as_real(tensor) if tensor.is_contiguous() else tensor


def _reals(items, collective: str, group: Group):
    return items if items is None else [_real(item, collective, group) for item in items]


_SUM = ReduceOp.SUM


def _op(op, dtype: torch.dtype, collective: str, group: Group) -> str:
    """The op's lower-case name; whether ``dtype`` admits it is part of the cell ``choose_algorithm`` checks."""
    if op is _SUM:  # the default, by identity: hashing a ReduceOp costs more than the rest of this function
        return "sum"
    name = OP_NAMES.get(op)
    return name if name is not None else op_name(op, collective=collective, rank=group.my_global_rank)


def choose_algorithm(collective: str, group: Group, dtype: torch.dtype, op: Optional[str], nbytes: Optional[int],
            requested: Optional[str], what: str) -> tuple:
    """``(algorithm, function)`` for the call: explicit ``algorithm=``, else the process default, else
    "auto".  ``nbytes`` must be the same on every rank (ranks that chose differently would deadlock);
    ``None`` when it cannot be (uneven all_to_all): the table's unbounded row decides."""
    choice = WORLD.config.algorithm if requested is None else requested
    key = (collective, dtype, op, choice)
    fixed = group.choices.get(key)
    if fixed is not None and not _selection_logged():
        return fixed
    if choice not in ALGORITHM_CHOICES:
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {what}: algorithm must be one of "
                                   f"{ALGORITHM_CHOICES}, got {choice!r}")
    # topology.shares_memory(communicator), read in place: no further file on the call path.
    communicator = group.communicator
    no_segment = communicator.__dict__.get("_zerocomm_no_segment")
    one_host = None if no_segment else getattr(communicator, "_zerocomm_one_host", None)
    rule = select.rule(group.backend_type, group.size(), collective, dtype, op, choice, one_host)
    if rule.rows is None:
        if rule.refusal is not None:
            select.raise_unsupported(collective, group, dtype, op, choice, rule.refusal)
        if no_segment and choice == "shm":  # known on every rank alike: refused before any byte moves
            select.raise_unsupported(collective, group, dtype, op, choice, "the ranks report one host but cannot "
                                     f"share a segment (set {HOST_ENV} per shared /dev/shm)")
        algorithm = choice
    else:
        size = select.UNBOUNDED if nbytes is None else nbytes
        for max_bytes, algorithm in rule.rows:
            if size <= max_bytes:
                break
    if _selection_logged():
        select.log.debug("%s: %s B %s on %s group of %d -> %s (%s)", collective, nbytes, dtype, group.backend,
                         group.size(), algorithm, "explicit" if requested is not None else
                         "auto table" if choice == "auto" else "default")
    chosen = (algorithm, group.backend_type.NATIVE[collective] if algorithm == "native"
              else ALGORITHMS[(collective, algorithm)])
    if rule.rows is None:  # the same for every size: remembered by the group (a size-steered "auto" is not)
        group.choices[key] = chosen
    return chosen


def _selection_logged() -> bool:
    return select.log.isEnabledFor(10)


def _timeout(timeout, what: str) -> Optional[float]:
    """A call's own ``timeout`` in seconds (``None``: the group's); negative or not a number raises."""
    from .work import timeout_seconds
    return timeout_seconds(timeout, f"{what}: timeout")


# -- one function per public form ------------------------------------------------------------------

def broadcast(tensor, src, group, async_op, group_src, algorithm) -> Call:
    g = resolve_group(group, "broadcast")
    tensor = _real(tensor, "broadcast", g)
    src = 0 if src is None and group_src is None else src
    root = group_rank_of(g, src, group_src, "src", "broadcast")
    check_tensor(tensor, "tensor", "broadcast", g)
    nbytes = tensor.numel() * tensor.element_size()
    name, fn = choose_algorithm("broadcast", g, tensor.dtype, None, nbytes, algorithm, "broadcast")
    return Call("broadcast", g, (_flat(tensor), root), None, root, name, fn, None, async_op, None, (tensor,), (),
                nbytes, tensor.numel(), tensor.dtype)


def all_reduce(tensor, op, group, async_op, algorithm, compression, state) -> Call:
    g = resolve_group(group, "all_reduce")
    if isinstance(tensor, torch.Tensor) and tensor.is_sparse:
        return _sparse_all_reduce(tensor, op, g, async_op)
    tensor = _real(tensor, "all_reduce", g, op)
    check_tensor(tensor, "tensor", "all_reduce", g)
    name = _op(op, tensor.dtype, "all_reduce", g)
    nbytes = tensor.numel() * tensor.element_size()
    if compression is None and algorithm != "onebit":
        algo, fn = choose_algorithm("all_reduce", g, tensor.dtype, name, nbytes, algorithm, "all_reduce")
        if op is _SUM and g.on_cpu and (algorithm, tensor.dtype) not in g.short:  # short_path: CPU groups only
            short_path.remember(g, algorithm, tensor.dtype)
        return Call("all_reduce", g, (_flat(tensor), name), name, -1, algo, fn, None, async_op, None, (tensor,), (),
                    nbytes, tensor.numel(), tensor.dtype)
    return _onebit(tensor, name, g, async_op, algorithm, compression, state, nbytes)


def _sparse_all_reduce(tensor, op, g: Group, async_op) -> Call:
    """A sparse COO tensor's SUM (see ``sparse.py``); other ops raise, as in torch's gloo."""
    if op != _SUM:
        raise UnsupportedError(f"rank {g.my_global_rank}: all_reduce: sparse tensors support ReduceOp.SUM only, got "
                               f"{op}; reduce .to_dense() for other ops")
    if tensor.device.type != "cpu":
        raise UnsupportedError(f"rank {g.my_global_rank}: all_reduce: sparse tensors are reduced on the CPU only, got "
                               f"one on {tensor.device}")
    # Named "ring" (its three all_gathers are rings), so that debug mode's fingerprint knows it.
    return Call("all_reduce", g, (tensor,), "sum", -1, "ring", all_reduce_sparse, None, async_op, None, (tensor,), (),
                tensor._nnz() * tensor.element_size(), tensor.numel(), tensor.dtype)


def _onebit(tensor, op: str, g: Group, async_op, algorithm, compression, state, nbytes: int) -> Call:
    """The 1-bit compressed mean: ``algorithm="onebit"``, its sub-collectives on ``algorithm`` (the inner one)."""
    from ..ops.onebit import ErrorFeedback
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
    for step in SUB_COLLECTIVES:
        choose_algorithm(step, g, torch.uint8, None, tensor.numel() // 8, sub_algorithm(step, inner), "all_reduce")
    return Call("all_reduce", g, (_flat(tensor), op), op, -1, "onebit", ALGORITHMS[("all_reduce", "onebit")],
                {"state": state, "inner": inner}, async_op, None, (tensor,), (), nbytes, tensor.numel(), tensor.dtype)


def reduce(tensor, dst, op, group, async_op, group_dst, algorithm) -> Call:
    g = resolve_group(group, "reduce")
    tensor = _real(tensor, "reduce", g, op)
    dst = 0 if dst is None and group_dst is None else dst
    root = group_rank_of(g, dst, group_dst, "dst", "reduce")
    check_tensor(tensor, "tensor", "reduce", g)
    name = _op(op, tensor.dtype, "reduce", g)
    nbytes = tensor.numel() * tensor.element_size()
    algo, fn = choose_algorithm("reduce", g, tensor.dtype, name, nbytes, algorithm, "reduce")
    return Call("reduce", g, (_flat(tensor), name, root), name, root, algo, fn, None, async_op, None, (tensor,), (),
                nbytes, tensor.numel(), tensor.dtype)


def all_gather_into_tensor(output_tensor, input_tensor, group, async_op, algorithm) -> Call:
    what = "all_gather_into_tensor"
    g = resolve_group(group, what)
    output_tensor, input_tensor = _tensor_pair(output_tensor, input_tensor, "output_tensor", "input_tensor", what, g)
    check_numel(output_tensor, g.size() * input_tensor.numel(), "output_tensor", what, g)
    nbytes = output_tensor.numel() * output_tensor.element_size()
    algo, fn = choose_algorithm("all_gather", g, input_tensor.dtype, None, nbytes, algorithm, what)
    return Call("all_gather", g, (_flat(output_tensor), _flat(input_tensor)), None, -1, algo, fn, None, async_op,
                None, (output_tensor,), (), nbytes, input_tensor.numel(), input_tensor.dtype)


def all_gather(tensor_list, tensor, group, async_op, algorithm) -> Call:
    g = resolve_group(group, "all_gather")
    tensor, tensor_list = _real(tensor, "all_gather", g), _reals(tensor_list, "all_gather", g)
    check_tensor(tensor, "tensor", "all_gather", g)
    check_list_length(tensor_list, g.size(), "tensor_list", "all_gather", g)
    check_same_dtype(tensor_list, tensor.dtype, "all_gather", g)
    for index, item in enumerate(tensor_list):
        check_numel(item, tensor.numel(), f"tensor_list[{index}]", "all_gather", g)
    flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    nbytes = flat.numel() * flat.element_size()
    algo, fn = choose_algorithm("all_gather", g, tensor.dtype, None, nbytes, algorithm, "all_gather")
    copy_out = tuple(zip(flat.view(g.size(), -1), tensor_list)) if tensor.numel() else ()
    return Call("all_gather", g, (flat, _flat(tensor)), None, -1, algo, fn, None, async_op, None,
                tuple(tensor_list), copy_out, nbytes, tensor.numel(), tensor.dtype)


def gather(tensor, gather_list, dst, group, async_op, group_dst, algorithm) -> Call:
    g = resolve_group(group, "gather")
    tensor, gather_list = _real(tensor, "gather", g), _reals(gather_list, "gather", g)
    dst = 0 if dst is None and group_dst is None else dst
    root = group_rank_of(g, dst, group_dst, "dst", "gather")
    check_tensor(tensor, "tensor", "gather", g)
    flat, copy_out = None, ()  # the root alone receives, and copies out into gather_list
    if g.rank == root:
        check_list_length(gather_list, g.size(), "gather_list", "gather", g)
        check_same_dtype(gather_list, tensor.dtype, "gather", g)
        for index, item in enumerate(gather_list):
            check_numel(item, tensor.numel(), f"gather_list[{index}]", "gather", g)
        flat = torch.empty(g.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        if tensor.numel():
            copy_out = tuple(zip(flat.view(g.size(), -1), gather_list))
    elif gather_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: gather: gather_list must be given only on the "
                                   f"destination rank {g.ranks[root]}")
    nbytes = g.size() * tensor.numel() * tensor.element_size()
    algo, fn = choose_algorithm("gather", g, tensor.dtype, None, nbytes, algorithm, "gather")
    return Call("gather", g, (flat, _flat(tensor), root), None, root, algo, fn, None, async_op, None,
                tuple(gather_list or ()), copy_out, nbytes, tensor.numel(), tensor.dtype)


def scatter(tensor, scatter_list, src, group, async_op, group_src, algorithm) -> Call:
    g = resolve_group(group, "scatter")
    tensor, scatter_list = _real(tensor, "scatter", g), _reals(scatter_list, "scatter", g)
    src = 0 if src is None and group_src is None else src
    root = group_rank_of(g, src, group_src, "src", "scatter")
    check_tensor(tensor, "tensor", "scatter", g)
    flat = None
    if g.rank == root:
        check_list_length(scatter_list, g.size(), "scatter_list", "scatter", g)
        check_same_dtype(scatter_list, tensor.dtype, "scatter", g)
        for index, item in enumerate(scatter_list):
            check_numel(item, tensor.numel(), f"scatter_list[{index}]", "scatter", g)
        flat = (torch.cat([item.reshape(-1) for item in scatter_list]) if tensor.numel()
                else torch.empty(0, dtype=tensor.dtype, device=tensor.device))
    elif scatter_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: scatter: scatter_list must be given only on the "
                                   f"source rank {g.ranks[root]}")
    nbytes = g.size() * tensor.numel() * tensor.element_size()
    algo, fn = choose_algorithm("scatter", g, tensor.dtype, None, nbytes, algorithm, "scatter")
    return Call("scatter", g, (_flat(tensor), flat, root), None, root, algo, fn, None, async_op, None, (tensor,), (),
                nbytes, tensor.numel(), tensor.dtype)


def reduce_scatter_tensor(output, input, op, group, async_op, algorithm) -> Call:
    what = "reduce_scatter_tensor"
    g = resolve_group(group, what)
    output, input = _tensor_pair(output, input, "output", "input", what, g, op)
    name = _op(op, input.dtype, what, g)
    check_numel(input, g.size() * output.numel(), "input", what, g)
    nbytes = input.numel() * input.element_size()
    algo, fn = choose_algorithm("reduce_scatter", g, input.dtype, name, nbytes, algorithm, what)
    return Call("reduce_scatter", g, (_flat(output), _flat(input), name), name, -1, algo, fn, None, async_op,
                None, (output,), (), nbytes, output.numel(), input.dtype)


def reduce_scatter(output, input_list, op, group, async_op, algorithm) -> Call:
    g = resolve_group(group, "reduce_scatter")
    output, input_list = _real(output, "reduce_scatter", g, op), _reals(input_list, "reduce_scatter", g)
    check_tensor(output, "output", "reduce_scatter", g)
    name = _op(op, output.dtype, "reduce_scatter", g)
    check_list_length(input_list, g.size(), "input_list", "reduce_scatter", g)
    check_same_dtype(input_list, output.dtype, "reduce_scatter", g)
    for index, item in enumerate(input_list):
        check_numel(item, output.numel(), f"input_list[{index}]", "reduce_scatter", g)
    flat = (torch.cat([item.reshape(-1) for item in input_list]) if output.numel()
            else torch.empty(0, dtype=output.dtype, device=output.device))
    nbytes = flat.numel() * flat.element_size()
    algo, fn = choose_algorithm("reduce_scatter", g, output.dtype, name, nbytes, algorithm, "reduce_scatter")
    return Call("reduce_scatter", g, (_flat(output), flat, name), name, -1, algo, fn, None, async_op, None,
                (output,), (), nbytes, output.numel(), output.dtype)


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


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op, algorithm) -> Call:
    what = "all_to_all_single"
    g = resolve_group(group, what)
    output, input = _tensor_pair(output, input, "output", "input", what, g)
    in_counts = _split_counts(input, input_split_sizes, "input", g)
    out_counts = _split_counts(output, output_split_sizes, "output", g)
    # An all_to_all's send size differs between ranks (uneven splits): "auto" must not depend on it.
    algo, fn = choose_algorithm("all_to_all", g, input.dtype, None, None, algorithm, what)
    return Call("all_to_all", g, (_flat(output), _flat(input), out_counts, in_counts), None, -1, algo, fn, None,
                async_op, None, (output,), (), input.numel() * input.element_size(), -1, input.dtype)


def all_to_all(output_tensor_list, input_tensor_list, group, async_op, algorithm) -> Call:
    g = resolve_group(group, "all_to_all")
    output_tensor_list = _reals(output_tensor_list, "all_to_all", g)
    input_tensor_list = _reals(input_tensor_list, "all_to_all", g)
    check_list_length(input_tensor_list, g.size(), "input_tensor_list", "all_to_all", g)
    check_list_length(output_tensor_list, g.size(), "output_tensor_list", "all_to_all", g)
    for index, item in enumerate(list(input_tensor_list) + list(output_tensor_list)):
        check_tensor(item, f"tensor {index}", "all_to_all", g)
    dtype = input_tensor_list[0].dtype
    check_same_dtype(list(input_tensor_list) + list(output_tensor_list), dtype, "all_to_all", g)
    flat_in = torch.cat([item.reshape(-1) for item in input_tensor_list])
    out_counts = [item.numel() for item in output_tensor_list]
    in_counts = [item.numel() for item in input_tensor_list]
    flat_out = torch.empty(sum(out_counts), dtype=dtype, device=flat_in.device)
    algo, fn = choose_algorithm("all_to_all", g, dtype, None, None, algorithm, "all_to_all")
    copy_out = tuple(zip(flat_out.split(out_counts), output_tensor_list))
    return Call("all_to_all", g, (flat_out, flat_in, out_counts, in_counts), None, -1, algo, fn, None, async_op, None,
                tuple(output_tensor_list), copy_out, flat_in.numel() * flat_in.element_size(), -1, dtype)


def barrier(group, async_op, timeout, algorithm) -> Call:
    g = resolve_group(group, "barrier")
    algo, fn = choose_algorithm("barrier", g, torch.uint8, None, 0, algorithm, "barrier")
    return Call("barrier", g, (), None, -1, algo, fn, None, async_op, _timeout(timeout, "barrier"), (), (), 0, 0,
                torch.uint8)


# -- the cross-rank fingerprint -------------------------------------------------------------------------

def fingerprint_cell(collective: str, op: Optional[str], dtype: torch.dtype, root: int, algorithm: str) -> tuple:
    """(collective, op, dtype, root, algorithm) as small ints: a call's fingerprint is ``(tag, numel, *cell)``."""
    dtype_id = SUPPORTED_DTYPES.index(dtype) if dtype in _DTYPES else -1
    return (COLLECTIVES.index(collective), _OPS.index(op) if op else -1, dtype_id, root,
            ALGORITHM_NAMES.index(algorithm))


def _describe(row) -> str:
    tag, numel, coll, op, dtype_id, root, alg = (int(v) for v in row)
    dtype = SUPPORTED_DTYPES[dtype_id] if 0 <= dtype_id < len(SUPPORTED_DTYPES) else "?"
    return (f"call #{tag - USER_TAG_LIMIT} {COLLECTIVES[coll]}{'' if op < 0 else f' {_OPS[op].upper()}'} of "
            f"{'per-rank' if numel < 0 else numel} elements of {dtype}{'' if root < 0 else f' with root {root}'} "
            f"(algorithm {ALGORITHM_NAMES[alg]})")


def cross_check(call: Call, tag: int, deadline: Optional[float], full: bool = False) -> bool:
    """Check that every rank of ``call``'s group is making the same call; raise on every rank if not.

    Runs before the call moves any byte, on the group's own communicator (its native collectives are
    matched by order, like the call itself).  The default form is ``Backend.agree``: one 16-byte MAX
    all_reduce of ``[digest, -digest]`` (``group.digest`` of the fingerprint), in a buffer the backend
    made once; the ranks agree exactly when the largest digest is the smallest.  When they do not, every
    rank sees it, and all of them all-gather the whole fingerprints to name the first two ranks that
    differ (:func:`name_mismatch`).  ``full`` (debug mode) always all-gathers them.  A native all_reduce's
    tensor goes with the check, which may reduce it too: True then (the caller skips the call's function); so
    does the tensor of an algorithm the backend runs inside its check (``Backend.ALGORITHMS_IN_CHECK``).
    """
    group = call.group
    if group.communicator.size == 1:
        return False
    cell = fingerprint_cell(call.collective, call.op, call.dtype, call.root, call.algorithm)
    if not full:
        rides = (call.collective == "all_reduce" and call.options is None and
                 (call.algorithm == "native" or call.algorithm in group.communicator.ALGORITHMS_IN_CHECK))
        try:
            code = digest(tag, call.numel, hash(cell))
            if call.algorithm == "shm" and getattr(group.communicator, "_zerocomm_one_host", False):  # topology
                # armed: checked in the first sync through the shared segment, no round trip of its own (an
                # shm call syncs before it reads a peer's byte; ``Group.execute`` settles it if it never
                # synced).  Across hosts shm calls refuse or, as shared_empty, fall back: the backend checks.
                from . import shm
                try:
                    shm.expect(group.communicator, code, (tag, call.numel, *cell), tag=tag, deadline=deadline)
                except UnsupportedError:  # no segment after all (every rank alike): "auto" re-chooses from now on
                    group.short.clear()
                    raise
                return False
            if check_in_segment(group, tag, deadline):  # a sync of the segment now, before any byte moves
                from . import shm
                shm.expect(group.communicator, code, (tag, call.numel, *cell), tag=tag, deadline=deadline)
                shm.settle(group.communicator, deadline)
                return False
            else:
                agreed = group.communicator.agree(code, deadline, call.args[0] if rides else None, call.op, tag=tag,
                                                  algorithm=call.algorithm)
            if agreed:
                return agreed == AGREE_AND_REDUCED
        except TimeoutError as error:
            raise TimeoutError(f"every rank to reach the mismatch check of "
                               f"{_describe((tag, call.numel, *cell))} ({error}); a rank that never arrives is "
                               "alive but stuck, or called something else first") from None
    name_mismatch(group, (tag, call.numel, *cell), deadline)
    return False


def segment_checks(backend) -> bool:
    """Whether ``backend``'s calls other than "shm" ones are checked through its shm arena: every rank is on
    one host and no segment failed to be made.  Read by :func:`check_in_segment` and by
    ``short_path.remember``, so both paths check the same way.

    [Note: one place per group]  Where "shm" calls can run (one host, a shared segment), every call of the
    group checks in the segment, whatever its algorithm and whatever the backend's own round trip costs:
    "shm" calls check there (in their first sync), so a call checked anywhere else could not meet a peer
    that made an "shm" call in its place, and both would wait out the deadline.  (Before, MPI's native
    calls checked through ``Backend.agree``: ranks whose "auto" picked shm and native for sizes a row
    apart waited 300 s.)  Across hosts no call runs as "shm", and every call checks through ``agree``."""
    return (getattr(backend, "_zerocomm_one_host", False)  # topology.one_host
            and not backend.__dict__.get("_zerocomm_no_segment"))


def check_in_segment(group: Group, tag: int, deadline: Optional[float]) -> bool:
    """Whether ``group``'s mismatch checks run through its shared-memory arena (one sync of step words)
    rather than ``Backend.agree``: where the backend says its own round trip costs far more
    (``CHECK_IN_SHARED_MEMORY``) and every rank is on one host.  Makes the arena on first use (every rank
    together, with the call's ``tag``); if the ranks cannot share a segment after all (``UnsupportedError``,
    raised on every rank at once), the communicator remembers it and the backend checks from then on."""
    backend = group.communicator
    if not segment_checks(backend):
        return False
    from . import shm
    try:
        shm.arena(backend, tag=tag, deadline=deadline)
    except UnsupportedError:  # shm.arena marked the communicator: no segment from now on
        group.short.clear()  # its rows check through the segment: the next call makes them again
        return False
    return True


def name_mismatch(group: Group, mine: tuple, deadline: Optional[float]) -> None:
    """All-gather every rank's fingerprint ``mine`` (``(tag, numel, *cell)``); raise ``CollectiveMismatchError``
    naming the first two ranks that differ.  Every rank of the group calls it (after a failed check)."""
    backend = group.communicator
    row = torch.tensor(mine, dtype=torch.int64, device=group.device_type)
    everyone = torch.empty(backend.size * row.numel(), dtype=row.dtype, device=row.device)
    backend.NATIVE["all_gather"](backend, everyone, row, tag=0, deadline=deadline, segment_bytes=0)
    rows = everyone.view(backend.size, -1).tolist()
    for other in range(1, backend.size):
        if rows[0] != rows[other]:
            raise CollectiveMismatchError(
                f"rank {group.my_global_rank}: mismatched collectives on {group.describe()}: rank {group.ranks[0]} "
                f"called {_describe(rows[0])}, but rank {group.ranks[other]} called {_describe(rows[other])}")
