"""The rest of ``torch.distributed``'s public names, so ``import zerocomm.comm as dist`` finds them.

Three kinds of names live here:

* torch's own objects, re-exported unchanged because they hold no process group: the stores,
  the option structs, the exception classes, ``Backend``, ``DebugLevel`` and the debug-level
  functions (which read ``TORCH_DISTRIBUTED_DEBUG`` exactly as torch does), rendezvous;
* queries answered from zerocomm's groups: ``get_process_group_ranks``, ``get_pg_count``,
  ``get_backend_config``, ``is_*_available``;
* calls built from zerocomm's public collectives (each collective still goes through its plan
  and ``Group.run``; nothing here moves a byte itself): the coalesced collectives,
  ``monitored_barrier``, ``send_object_list``/``recv_object_list``.

Names of torch.distributed that zerocomm does not provide are listed, with the reason, in
docs/migrating-from-torch-distributed.md; ``tests/comm/test_api_walk.py`` keeps that true.
"""
from __future__ import annotations

import concurrent.futures
import os
import pickle
import time
import warnings
from datetime import timedelta  # noqa: F401  (torch.distributed exports it)
from typing import Any, List, Optional

import torch
import torch.distributed as _td
from torch.distributed import (  # noqa: F401  (re-exported unchanged: none holds a process group)
    AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions, Backend, BackendConfig, BarrierOptions,
    BroadcastOptions, DebugLevel, DistBackendError, DistError, DistNetworkError, DistStoreError, FileStore,
    GatherOptions, HashStore, PrefixStore, QueueEmptyError, ReduceOptions, ReduceScatterOptions, ScatterOptions,
    Store, TCPStore, get_debug_level, get_default_backend_for_device, is_torchelastic_launched,
    register_rendezvous_handler, rendezvous, set_debug_level, set_debug_level_from_env, supports_complex)
from torch.distributed import GroupName, RankType, default_pg_timeout  # noqa: F401
# The types a DDP communication hook is written against (DDP itself runs on init_process_group("zerocomm")).
from torch.distributed import BuiltinCommHookType, GradBucket  # noqa: F401

from . import p2p, torch_events, validate
from .errors import CommError, CommTimeoutError, InvalidArgumentError
from .group import NON_GROUP_MEMBER, WORLD, Group
from .reduce_op import ReduceOp
from .validate import resolve_group
from .work import Work

#: The user tag ``monitored_barrier`` uses (the top of the user's tag range; see ``p2p``).
_MONITOR_TAG = p2p.USER_TAG_LIMIT - 1
#: The user tag of ``send_object_list``'s messages.
_OBJECT_TAG = p2p.USER_TAG_LIMIT - 2


# -- availability -------------------------------------------------------------------------------

def is_gloo_available() -> bool:
    """True: torch's gloo is zerocomm's CPU backend."""
    return _td.is_gloo_available()


def is_mpi_available() -> bool:
    """True when mpi4py and an MPI library can be loaded (zerocomm's ``mpi`` backend; not torch's)."""
    from .backends.mpi import mpi_available
    return mpi_available() is None


def is_nccl_available() -> bool:
    """True when torch was built with NCCL and a CUDA device is visible."""
    from .backends.nccl import nccl_available
    return nccl_available() is None


def is_ucc_available() -> bool:
    """False: zerocomm has no UCC backend."""
    return False


def is_xccl_available() -> bool:
    """False: zerocomm has no XCCL backend."""
    return False


def is_backend_available(backend: str) -> bool:
    """Whether ``init_process_group(backend)`` can work here ("gloo", "mpi", "nccl")."""
    checks = {"gloo": is_gloo_available, "mpi": is_mpi_available, "nccl": is_nccl_available}
    check = checks.get(str(backend).lower())
    return bool(check and check())


# -- queries ---------------------------------------------------------------------------------------

def get_process_group_ranks(group: Optional[Group]) -> List[int]:
    """The global ranks of ``group``'s members, in group-rank order (the default group's if None)."""
    return list(resolve_group(group, "get_process_group_ranks").ranks)


def get_pg_count() -> int:
    """How many process groups exist (the default group counted)."""
    return len(WORLD.groups)


def get_backend_config(group: Optional[Group] = None) -> str:
    """``"<device>:<backend>"`` of ``group``, as torch writes a backend config (e.g. ``"cpu:gloo"``)."""
    g = resolve_group(group, "get_backend_config")
    return g.backend_string if ":" in g.backend_string else f"{g.device_type}:{g.backend}"


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (or an MPI launcher's local rank), else ``fallback_rank``."""
    for key in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow "
                       "`get_node_local_rank` to work, assuming you are not running in a multi-device context "
                       "and want the code to run locally instead.")


def _rank_not_in_group(group) -> bool:
    """torch's private test helper, used by code written against torch: True for ``NON_GROUP_MEMBER``."""
    return group is NON_GROUP_MEMBER


# -- coalesced collectives -----------------------------------------------------------------------------

def _then(works: List[Work], finish, description: str, outputs) -> Work:
    """A ``Work`` that completes after every one of ``works`` (one group's, so they finish in order: the
    last one's completion means all are done) and ``finish()`` (the copy back into the caller's tensors)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def _settle(done: concurrent.futures.Future) -> None:
        error = next((w.exception() for w in works if w.exception() is not None), None)
        if error is None:
            try:
                finish()
            except BaseException as failure:  # noqa: BLE001  (the waiter sees it)
                error = failure
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    works[-1].add_done_callback(_settle)
    return Work(description, future, outputs)


def _issue(calls, title: str, inputs) -> List[Work]:
    """Run checked async ``calls`` of one group in order; under torch's profiler as one event, as torch's
    gloo records a coalesced call (see torch_events.py)."""
    if torch.autograd._profiler_enabled():
        return torch_events.run_all(calls, title, inputs)
    return [call.group.run(call) for call in calls]


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """All-reduce every tensor of ``tensors`` in place: one flat all_reduce per dtype among them."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    g = resolve_group(group, "all_reduce_coalesced")
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: all_reduce_coalesced: tensors must be a non-empty "
                                   "list of tensors")
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    flats = [(torch.cat([t.reshape(-1) for t in same]), same) for same in by_dtype.values()]

    def finish() -> None:
        for flat, same in flats:
            offset = 0
            for t in same:
                t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()

    calls = [validate.all_reduce(flat, op, g, True, None, None, None, validate.RECORD) for flat, _ in flats]
    works = _issue(calls, "all_reduce", tensors)
    if async_op:
        return _then(works, finish, "all_reduce_coalesced", list(tensors))
    for work in works:
        work.wait()
    finish()
    return None


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op: bool = False):
    """``output_tensor_lists[r][i]`` ← rank r's ``input_tensor_list[i]``: one all-gather of the inputs packed flat.

    The inputs must share one dtype (as torch's gloo requires).
    """
    g = resolve_group(group, "all_gather_coalesced")
    collective = "all_gather_coalesced"
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: {collective}: input_tensor_list must be a non-empty "
                                   "list of tensors")
    dtypes = {t.dtype for t in input_tensor_list}
    if len(dtypes) != 1:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: {collective}: input_tensor_list must share one dtype, "
                                   f"got {sorted(str(d) for d in dtypes)}")
    if len(output_tensor_lists) != g.size():
        raise InvalidArgumentError(f"rank {g.my_global_rank}: {collective}: output_tensor_lists must hold one list "
                                   f"per rank: expecting {g.size()} items, got {len(output_tensor_lists)}")
    for r, outputs in enumerate(output_tensor_lists):
        if len(outputs) != len(input_tensor_list):
            raise InvalidArgumentError(f"rank {g.my_global_rank}: {collective}: output_tensor_lists[{r}] must hold "
                                       f"one tensor per input: expecting {len(input_tensor_list)} items, got "
                                       f"{len(outputs)}")
    flat = torch.cat([t.reshape(-1) for t in input_tensor_list])
    gathered = torch.empty(g.size() * flat.numel(), dtype=flat.dtype)

    def finish() -> None:
        for r, outputs in enumerate(output_tensor_lists):
            offset = r * flat.numel()
            for t, out in zip(input_tensor_list, outputs):
                out.copy_(gathered[offset:offset + t.numel()].view(out.shape))
                offset += t.numel()

    work, = _issue([validate.all_gather_into_tensor(gathered, flat, g, True, None, validate.RECORD)], "all_gather",
                   input_tensor_list)
    if async_op:
        return _then([work], finish, collective, [t for ts in output_tensor_lists for t in ts])
    work.wait()
    finish()
    return None


# -- monitored barrier ------------------------------------------------------------------------------------

def monitored_barrier(group: Optional[Group] = None, timeout=None, wait_all_ranks: bool = False):
    """A barrier whose group rank 0 names the ranks that did not arrive within ``timeout``.

    Every other rank sends rank 0 a token and waits for its release; rank 0 waits for each
    token in turn and raises ``CommTimeoutError`` (a ``DistBackendError``) naming the first
    missing rank, or every missing rank when ``wait_all_ranks``.  A process outside ``group`` (``new_group``
    returned ``NON_GROUP_MEMBER``) returns at once with torch's warning.
    """
    if group is NON_GROUP_MEMBER:
        # As torch: a non-member returns at once, with torch's warning.  Unlike a collective that would leave
        # its outputs unwritten, a monitored barrier has nothing for a non-member to check or to receive.
        world = WORLD.require("monitored_barrier")
        warnings.warn(f"Running monitored_barrier on global rank {world.my_global_rank} which does not belong to "
                      "the given group.", stacklevel=2)
        return None
    g = resolve_group(group, "monitored_barrier")
    # None: the group's timeout; zero (or less) is a real, already spent, limit (as torch's gloo).
    seconds = g.timeout.total_seconds() if timeout is None else max(
        timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout), 0.0)
    token = torch.zeros(1, dtype=torch.uint8)
    if g.size() == 1:
        return None
    if g.rank == 0 and seconds == 0:
        raise CommTimeoutError(f"rank {g.my_global_rank}: monitored_barrier on {g.describe()}: Rank "
                               f"{g.my_global_rank} timed out in monitoredBarrier after 0 ms")
    if g.rank != 0:
        # The release is awaited within the same timeout as rank 0's wait (as torch's gloo does): a rank 0 that
        # failed, or that found a missing rank, sends none.
        try:
            p2p.send(token, group=g, group_dst=0, tag=_MONITOR_TAG)
            p2p.irecv(token, group=g, group_src=0, tag=_MONITOR_TAG).wait(timedelta(seconds=max(seconds, 1e-3)))
        except CommError as error:
            raise type(error)(f"rank {g.my_global_rank}: monitored_barrier on {g.describe()}: Rank {g.my_global_rank} "
                              f"successfully reached monitoredBarrier, but received errors while waiting for "
                              f"send/recv from rank {g.ranks[0]}. Please check rank {g.ranks[0]} logs for faulty "
                              f"rank ({error})") from None
        return None
    deadline = time.monotonic() + seconds
    pending = {r: p2p.irecv(torch.zeros(1, dtype=torch.uint8), group=g, group_src=r, tag=_MONITOR_TAG)
               for r in range(1, g.size())}
    missing = []
    for r, work in pending.items():
        try:
            work.wait(timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))
        except CommTimeoutError:
            missing.append(g.ranks[r])
            if not wait_all_ranks:
                break
    if missing:
        raise CommTimeoutError(f"rank {g.my_global_rank}: monitored_barrier on {g.describe()}: "
                               + (f"Rank {missing[0]} failed to pass monitoredBarrier in {seconds * 1000:.0f} ms"
                                  if not wait_all_ranks else
                                  f"Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in "
                                  f"{seconds * 1000:.0f} ms"))
    for r in range(1, g.size()):
        p2p.send(token, group=g, group_dst=r, tag=_MONITOR_TAG)
    return None


# -- objects, point to point ---------------------------------------------------------------------------------

def send_object_list(object_list: List[Any], dst: Optional[int] = None, group=None, device=None,
                     group_dst: Optional[int] = None, use_batch: bool = False) -> None:
    """Send the picklable objects of ``object_list`` to ``dst`` (sizes first, then the bytes)."""
    g = resolve_group(group, "send_object_list")
    payloads = [pickle.dumps(obj) for obj in object_list]
    sizes = torch.tensor([len(p) for p in payloads], dtype=torch.int64)
    data = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8) if sizes.sum() else \
        torch.empty(0, dtype=torch.uint8)
    p2p.send(sizes, dst, g, _OBJECT_TAG, group_dst=group_dst)
    p2p.send(data, dst, g, _OBJECT_TAG, group_dst=group_dst)


def recv_object_list(object_list: List[Any], src: Optional[int] = None, group=None, device=None,
                     group_src: Optional[int] = None, use_batch: bool = False) -> int:
    """Fill ``object_list`` with the objects ``src`` sent (any rank if both are None); return the sender."""
    g = resolve_group(group, "recv_object_list")
    sizes = torch.empty(len(object_list), dtype=torch.int64)
    sender = p2p.recv(sizes, src, g, _OBJECT_TAG, group_src=group_src)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    p2p.recv(data, sender, g, _OBJECT_TAG)
    raw = data.numpy().tobytes()
    offset = 0
    for i, size in enumerate(sizes.tolist()):
        object_list[i] = pickle.loads(raw[offset:offset + size])
        offset += size
    return sender


__all__ = [
    "AllreduceCoalescedOptions", "AllreduceOptions", "AllToAllOptions", "Backend", "BackendConfig",
    "BarrierOptions", "BroadcastOptions", "DebugLevel", "DistBackendError", "DistError", "DistNetworkError",
    "DistStoreError", "FileStore", "GatherOptions", "HashStore", "PrefixStore", "QueueEmptyError", "ReduceOptions",
    "ReduceScatterOptions", "ScatterOptions", "Store", "TCPStore", "get_debug_level", "get_default_backend_for_device",
    "is_torchelastic_launched", "register_rendezvous_handler", "rendezvous", "set_debug_level",
    "set_debug_level_from_env", "supports_complex", "GroupName", "RankType", "default_pg_timeout", "timedelta",
    "BuiltinCommHookType", "GradBucket",
    "is_gloo_available", "is_mpi_available", "is_nccl_available", "is_ucc_available", "is_xccl_available",
    "is_backend_available", "get_process_group_ranks", "get_pg_count", "get_backend_config", "get_node_local_rank",
    "all_reduce_coalesced", "all_gather_coalesced",
    "monitored_barrier", "send_object_list", "recv_object_list", "NON_GROUP_MEMBER",
]
