"""The eight collectives and barrier, with torch.distributed's names, parameters and defaults.

Every call takes one route (see the note in ``plan.py``): the cell's plan -- looked up by the
arguments as passed, or made by ``validate``'s full checks on the cell's first call -- makes the
call's record and runs it through its group (``Group.run``), inline for a blocking call with
nothing queued, issued to the backend or queued on the group's executor otherwise, returning
``None`` or a ``Work``.  A later call of the cell checks here only what may differ between its
calls (tensor type, layout, device, contiguity and size); one that fails that goes through the
full checks, which raise the typed error naming what is wrong.  zerocomm's own options are
keyword-only after torch's parameters: ``algorithm=`` (one of
``comm.algorithms.ALGORITHM_CHOICES``: "native", "ring", "tree", "recursive_doubling", "shm",
"hierarchical", or "auto",
the default) and, for all_reduce, ``compression="onebit"``.

List arguments (``gather_list``, ``scatter_list``, ``all_gather``'s ``tensor_list``,
``reduce_scatter``'s ``input_list``, ``all_to_all``'s lists) travel packed in one flat
buffer and are copied back to the list after the collective, by whichever thread ran it,
so ``async_op=True`` stays asynchronous; their tensors may be strided.  A single tensor that
is not contiguous (``x.t()``, ``x[:, ::2]``) is refused by the full checks with an
``UnsupportedError`` that the ``except`` below hands to ``staging.retry``: the call runs on a
contiguous copy and the result is written back into the caller's tensor, strides kept (for
``async_op=True``, when the returned ``Work`` completes).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from . import staging, validate
from .errors import UnsupportedError
from .group import WORLD
from .reduce_op import ReduceOp
from .traffic import TrafficCounter, observing
from .validate import resolve_group  # noqa: F401  (p2p and objects resolve groups the same way)

#: Plans by the arguments as passed (see ``plan.py``): a dictionary subscript, no call.
_PLANS = WORLD.plans
_Tensor = torch.Tensor
_strided = torch.strided
#: The default op, keyed by name: hashing a ``ReduceOp`` costs a fifth of a microsecond (pybind11's hash).
_SUM = ReduceOp.SUM


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
    try:
        key = ("broadcast", group, src, group_src, async_op, algorithm, tensor.dtype)
        plan = _PLANS[key]
    except KeyError:
        plan = None
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: the full checks say what
        key = plan = None
    if plan is not None and type(tensor) is _Tensor and tensor.layout is _strided \
            and (tensor.is_cpu if plan.on_cpu else tensor.is_cuda) and tensor.is_contiguous():
        nbytes = tensor.nbytes
        return plan.run((tensor if tensor.ndim == 1 else tensor.view(-1), plan.root), nbytes, nbytes // plan.itemsize,
                        (tensor,))
    try:
        return validate.broadcast(tensor, src, group, async_op, group_src, algorithm, key)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, broadcast, (tensor, src, group, async_op, group_src),
                             {"algorithm": algorithm}, group, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, *, algorithm: Optional[str] = None,
               compression: Optional[str] = None, compression_state=None):
    """Reduce ``tensor`` across ``group`` with ``op``, in place on every rank. Every member calls it.

    ``compression="onebit"`` sends 1-bit signs with error feedback (``op`` must be AVG: it computes the
    mean) with the caller's ``compression_state`` (a ``zerocomm.ops.ErrorFeedback``, one per tensor);
    ``algorithm`` then names the algorithm of its two sub-collectives ("native", "ring" or "tree").
    """
    try:
        key = ("all_reduce", group, "sum" if op is _SUM else op, async_op, algorithm, compression, tensor.dtype)
        plan = _PLANS[key]
    except KeyError:
        plan = None
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: the full checks say what
        key = plan = None
    if plan is not None and type(tensor) is _Tensor and tensor.layout is _strided \
            and (tensor.is_cpu if plan.on_cpu else tensor.is_cuda) and tensor.is_contiguous():
        nbytes = tensor.nbytes
        return plan.run((tensor if tensor.ndim == 1 else tensor.view(-1), plan.op), nbytes, nbytes // plan.itemsize,
                        (tensor,))
    try:
        return validate.all_reduce(tensor, op, group, async_op, algorithm, compression, compression_state, key)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, all_reduce, (tensor, op, group, async_op),
                             {"algorithm": algorithm, "compression": compression,
                              "compression_state": compression_state}, group, async_op)


def reduce(tensor: torch.Tensor, dst: Optional[int] = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Reduce ``tensor`` across ``group`` into ``dst``'s ``tensor``; other ranks' tensors are left unchanged."""
    try:
        key = ("reduce", group, dst, group_dst, "sum" if op is _SUM else op, async_op, algorithm, tensor.dtype)
        plan = _PLANS[key]
    except KeyError:
        plan = None
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: the full checks say what
        key = plan = None
    if plan is not None and type(tensor) is _Tensor and tensor.layout is _strided \
            and (tensor.is_cpu if plan.on_cpu else tensor.is_cuda) and tensor.is_contiguous():
        nbytes = tensor.nbytes
        return plan.run((tensor if tensor.ndim == 1 else tensor.view(-1), plan.op, plan.root), nbytes,
                        nbytes // plan.itemsize, (tensor,))
    try:
        return validate.reduce(tensor, dst, op, group, async_op, group_dst, algorithm, key)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, reduce, (tensor, dst, op, group, async_op, group_dst),
                             {"algorithm": algorithm}, group, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           algorithm: Optional[str] = None):
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor`` on every rank.

    ``output_tensor`` holds ``world_size * input_tensor.numel()`` elements (shape ``(n*k, ...)`` or ``(n, k, ...)``);
    ``input_tensor`` may be this rank's chunk of it (in place).
    """
    try:
        key = ("all_gather_into_tensor", group, async_op, algorithm, input_tensor.dtype)
        plan = _PLANS[key]
    except KeyError:
        plan = None
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: the full checks say what
        key = plan = None
    if plan is not None and type(output_tensor) is _Tensor and type(input_tensor) is _Tensor \
            and output_tensor.dtype is plan.dtype and output_tensor.layout is _strided \
            and input_tensor.layout is _strided and output_tensor.nbytes == plan.size * input_tensor.nbytes \
            and (input_tensor.is_cpu and output_tensor.is_cpu if plan.on_cpu
                 else input_tensor.is_cuda and output_tensor.is_cuda) \
            and input_tensor.is_contiguous() and output_tensor.is_contiguous():
        return plan.run((output_tensor if output_tensor.ndim == 1 else output_tensor.view(-1),
                         input_tensor if input_tensor.ndim == 1 else input_tensor.view(-1)), output_tensor.nbytes,
                        input_tensor.nbytes // plan.itemsize, (output_tensor,), (), (input_tensor,))
    try:
        return validate.all_gather_into_tensor(output_tensor, input_tensor, group, async_op, algorithm, key)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, all_gather_into_tensor, (output_tensor, input_tensor, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm: Optional[str] = None):
    """``tensor_list[r]`` ← rank r's ``tensor``, on every rank. Every member calls it."""
    try:
        return validate.all_gather(tensor_list, tensor, group, async_op, algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, all_gather, (tensor_list, tensor, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: Optional[int] = None,
           group=None, async_op: bool = False, group_dst: Optional[int] = None, *, algorithm: Optional[str] = None):
    """``gather_list[r]`` on ``dst`` ← rank r's ``tensor``; ``gather_list`` is given on ``dst`` only."""
    try:
        return validate.gather(tensor, gather_list, dst, group, async_op, group_dst, algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, gather, (tensor, gather_list, dst, group, async_op, group_dst),
                             {"algorithm": algorithm}, group, async_op)


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: Optional[int] = None,
            group=None, async_op: bool = False, group_src: Optional[int] = None, *, algorithm: Optional[str] = None):
    """Rank r's ``tensor`` ← ``scatter_list[r]`` on ``src``; ``scatter_list`` is given on ``src`` only."""
    try:
        return validate.scatter(tensor, scatter_list, src, group, async_op, group_src, algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, scatter, (tensor, scatter_list, src, group, async_op, group_src),
                             {"algorithm": algorithm}, group, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm: Optional[str] = None):
    """``output`` on rank r ← chunk r of the ``op``-reduction of every rank's ``input`` (``n * output.numel()`` elements)."""
    try:
        key = ("reduce_scatter_tensor", group, "sum" if op is _SUM else op, async_op, algorithm, input.dtype)
        plan = _PLANS[key]
    except KeyError:
        plan = None
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: the full checks say what
        key = plan = None
    if plan is not None and type(output) is _Tensor and type(input) is _Tensor and output.dtype is plan.dtype \
            and output.layout is _strided and input.layout is _strided and input.nbytes == plan.size * output.nbytes \
            and (input.is_cpu and output.is_cpu if plan.on_cpu else input.is_cuda and output.is_cuda) \
            and input.is_contiguous() and output.is_contiguous():
        return plan.run((output if output.ndim == 1 else output.view(-1), input if input.ndim == 1 else input.view(-1),
                         plan.op), input.nbytes, output.nbytes // plan.itemsize, (output,), (), (input,))
    try:
        return validate.reduce_scatter_tensor(output, input, op, group, async_op, algorithm, key)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, reduce_scatter_tensor, (output, input, op, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False, *,
                   algorithm: Optional[str] = None):
    """``output`` on rank r ← the ``op``-reduction over ranks of their ``input_list[r]``."""
    try:
        return validate.reduce_scatter(output, input_list, op, group, async_op, algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, reduce_scatter, (output, input_list, op, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, *, algorithm: Optional[str] = None):
    """Rank r sends split j of ``input`` (along dim 0) to rank j and receives rank j's split r into split j of ``output``.

    Without split sizes, dim 0 is divided evenly by the group size.
    """
    try:
        return validate.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op,
                                          algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, all_to_all_single,
                             (output, input, output_split_sizes, input_split_sizes, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False, *,
               algorithm: Optional[str] = None):
    """``output_tensor_list[j]`` on rank r ← ``input_tensor_list[r]`` of rank j (sizes may differ per pair)."""
    try:
        return validate.all_to_all(output_tensor_list, input_tensor_list, group, async_op, algorithm)
    except UnsupportedError as error:  # CUDA tensors on a CPU backend, tensors not contiguous: copies (staging.py)
        return staging.retry(error, all_to_all, (output_tensor_list, input_tensor_list, group, async_op),
                             {"algorithm": algorithm}, group, async_op)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None, *, algorithm: Optional[str] = None):
    """Return once every member of ``group`` has entered the barrier; ``timeout`` overrides the group's."""
    return validate.barrier(group, async_op, timeout, algorithm)


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
