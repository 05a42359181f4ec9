"""Where stage 3's parameter shards live (``offload_param``): beside the model, in host memory, or in files.

``ShardedParameters`` (sharded.py) keeps this rank's shard of every unit in a *store*, chosen by
``build_param_store``:

* ``MemoryShards``: one flat tensor on the parameters' device (``none``; and ``cpu`` for a CPU model, whose
  parameters are in host memory already); ``UnitShards`` instead, one tensor per unit, for a model whose values
  arrive one unit at a time (``initialize(param_source=...)``);
* ``HostShards``: one flat tensor in (pinned) host memory beside a CUDA model (``cpu``); each gather first
  copies the unit's shard host -> device, asynchronously on the current stream, so the all_gather after it
  reads the copy in order;
* ``FileShards``: one file per unit under ``nvme_path`` (``nvme``); each gather reads the unit's shard into a
  fresh buffer, started one unit ahead of the gathers already prefetching (``read_ahead``), and the buffer
  is dropped when the gather has been waited for.  Resident memory holds only the units in flight.

[Note: who writes the parameter files]
The optimizer steps them: ``offload_param: nvme`` needs ``offload_optimizer: nvme`` (offload.py refuses other
pairs), whose step reads each parameter piece from the file, updates it and writes it back (fp32: the file is
the master; bf16/fp16: the float32 master has its own file and the rounded piece is written here).  Outside
training (checkpoints, ``gathered_parameters``) the shards are seen through ``shard(u)``: for files a fresh
shared mapping, so reads and writes reach the file and the pages leave the resident set with the mapping.
Reads started ahead are dropped after each step (``invalidate``), because the step changed the files.

A store's methods are the ``ParamStore`` interface (parts.py), ``u`` a unit (= its bucket index): ``shard(u)`` the
shard as tensors outside the gather path see it; ``fetch(u)`` the all_gather's input on the parameters' device;
``read_ahead(u)``; ``write(u, values, start)``; ``invalidate()``; ``placement(where)`` bytes by where they live.
``FileShards`` is a ``FileParamStore`` (``in_files``): ``path(u)`` names unit u's file.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import uuid
import weakref
from pathlib import Path
from typing import Optional, Sequence

import torch

from .errors import ZeroConfigError
from .gradients import tensor_bytes
from .offload_nvme import _pread, _pwrite, _remove
from .partition import BucketLayout
from .parts import FileParamStore, ParamStore

_log = logging.getLogger("zerocomm.zero")


def build_param_store(config, layouts: Sequence[BucketLayout], *, dtype: torch.dtype, device: torch.device,
                      rank: int, by_unit: bool = False) -> ParamStore:
    """The store for ``config.offload_param`` (stage 3; see the module docstring).  ``by_unit``: the shards will be
    written unit by unit from values that arrive one unit at a time (param_source.py); in memory beside the model
    they then get one tensor per unit, allocated at its first write (``UnitShards``)."""
    numels = [layout.chunk_numel for layout in layouts]
    if config.offload_param == "nvme":
        if device.type != "cpu":
            raise ZeroConfigError(f"rank {rank}: offload_param 'nvme' reads and writes host memory; parameters on "
                                  f"{device} need offload_param 'cpu' (or a CPU model)")
        return FileShards(numels, dtype=dtype, folder=Path(config.param_nvme_path or config.nvme_path), rank=rank)
    if config.offload_param == "cpu" and device.type != "cpu":
        return HostShards(numels, dtype=dtype, device=device, pin_memory=config.pin_memory)
    if config.offload_param == "cpu":
        _log.info("rank %d: offload_param 'cpu': the parameters of a CPU model are in host memory already", rank)
    if by_unit:
        return UnitShards(numels, dtype=dtype, device=device)
    return MemoryShards(numels, dtype=dtype, device=device)


def note_unsharded_param_offload(config, rank: int) -> None:
    """Stages 0-2 keep every parameter for forward: ``offload_param`` (stage 3 in DeepSpeed too) changes nothing."""
    if config.offload_param != "none":
        _log.warning("rank %d: offload_param %r applies to stage 3 only; stage %d keeps the full parameters on every "
                     "rank", rank, config.offload_param, config.stage)


class MemoryShards(ParamStore):
    """Every unit's shard in one flat tensor on ``device`` (no offload)."""

    def __init__(self, numels: Sequence[int], *, dtype: torch.dtype, device: torch.device, pin_memory: bool = False):
        self.offsets = [sum(numels[:u]) for u in range(len(numels))]
        self.numels = list(numels)
        self.flat = torch.empty(sum(numels), dtype=dtype, device=device, pin_memory=pin_memory)

    def shard(self, u: int) -> torch.Tensor:
        return self.flat[self.offsets[u]:self.offsets[u] + self.numels[u]]

    def fetch(self, u: int) -> torch.Tensor:
        return self.shard(u)

    def read_ahead(self, u: int) -> None:
        pass  # nothing to read: the shard is where the gather runs

    def write(self, u: int, values: torch.Tensor, start: int) -> None:
        with torch.no_grad():
            self.shard(u)[start:start + values.numel()].copy_(values)

    def invalidate(self) -> None:
        pass

    def placement(self, where: str) -> dict:
        out = {"device": 0, "host": 0, "disk": 0}
        out[where] = tensor_bytes(self.flat)
        return out


class UnitShards(MemoryShards):
    """Every unit's shard in a tensor of its own on ``device``, allocated when the unit is first written or read.

    For a model whose values arrive one unit at a time (param_source.py): while the values come in, their
    source frees what it held for each unit as the unit's shard is written, so the two together stay near one
    shard, where one flat tensor reserved at once would sit beside the whole source.  Reading, writing and the
    rest are :class:`MemoryShards`'; only where a shard lives differs."""

    def __init__(self, numels: Sequence[int], *, dtype: torch.dtype, device: torch.device):
        self.numels, self.dtype, self.device = list(numels), dtype, device
        self.units: list = [None] * len(self.numels)

    def shard(self, u: int) -> torch.Tensor:
        if self.units[u] is None:
            self.units[u] = torch.empty(self.numels[u], dtype=self.dtype, device=self.device)
        return self.units[u]

    def placement(self, where: str) -> dict:
        out = {"device": 0, "host": 0, "disk": 0}
        out[where] = sum(tensor_bytes(unit) for unit in self.units if unit is not None)
        return out


class HostShards(MemoryShards):
    """The flat shard in host memory (page-locked with ``pin_memory``) beside a model on ``device``: each gather's
    input is an asynchronous host -> device copy of the unit's shard."""

    def __init__(self, numels: Sequence[int], *, dtype: torch.dtype, device: torch.device, pin_memory: bool):
        super().__init__(numels, dtype=dtype, device=torch.device("cpu"), pin_memory=pin_memory)
        self.device, self.pinned = device, pin_memory
        self.to_device_bytes = 0
        """Bytes copied host -> device for gathers since construction."""

    def fetch(self, u: int) -> torch.Tensor:
        shard = self.shard(u)
        self.to_device_bytes += tensor_bytes(shard)
        return shard.to(self.device, non_blocking=self.pinned)

    def placement(self, where: str) -> dict:
        return {"device": 0, "host": tensor_bytes(self.flat), "disk": 0}


class FileShards(FileParamStore):
    """One file of ``numels[u]`` elements of ``dtype`` per unit under ``folder/zerocomm-params-<pid>-rank<r>-<id>/``,
    removed when this object dies; reads ahead on one I/O thread."""

    def __init__(self, numels: Sequence[int], *, dtype: torch.dtype, folder: Path, rank: int):
        self.numels, self.dtype = list(numels), dtype
        self.item = torch.empty(0, dtype=dtype).element_size()
        self.folder = folder / f"zerocomm-params-{os.getpid()}-rank{rank}-{uuid.uuid4().hex[:8]}"
        self.folder.mkdir(parents=True, exist_ok=False)
        self._fds: dict = {}
        self._finalizer = weakref.finalize(self, _remove, self.folder, self._fds)
        for u, numel in enumerate(self.numels):
            fd = os.open(self.path(u), os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, numel * self.item)
            self._fds[u] = fd
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"zerocomm-params-{rank}")
        weakref.finalize(self, self._io.shutdown, wait=False)
        self._ahead: dict = {}  # unit -> Future of its shard, read ahead
        self.read_bytes = 0
        """Bytes read from the files for gathers since construction."""
        self.written_bytes = 0
        """Bytes written to the files since construction."""

    def path(self, u: int) -> Path:
        return self.folder / f"unit{u:04d}.param"

    def shard(self, u: int) -> torch.Tensor:
        """The whole file as a tensor (a fresh shared mapping: writes reach the file)."""
        return torch.from_file(str(self.path(u)), shared=True, size=self.numels[u], dtype=self.dtype)

    def _read(self, u: int) -> torch.Tensor:
        out = torch.empty(self.numels[u], dtype=self.dtype)
        _pread(self._fds[u], out, 0)
        return out

    def read_ahead(self, u: int) -> None:
        if u not in self._ahead:
            self._ahead[u] = self._io.submit(self._read, u)
            self.read_bytes += self.numels[u] * self.item

    def fetch(self, u: int) -> torch.Tensor:
        """Unit ``u``'s shard in a buffer of its own (the read started ahead, or one now)."""
        future: Optional[concurrent.futures.Future] = self._ahead.pop(u, None)
        if future is None:
            self.read_bytes += self.numels[u] * self.item
            return self._read(u)
        return future.result()

    def write(self, u: int, values: torch.Tensor, start: int) -> None:
        """Elements ``start:start + len(values)`` of unit ``u``'s shard (rounded to the store's dtype)."""
        values = values.detach().to(self.dtype).contiguous()
        _pwrite(self._fds[u], values, start * self.item)
        self.written_bytes += values.numel() * self.item

    def invalidate(self) -> None:
        """Drop reads started before the files changed (the step, a modifier's write)."""
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()

    def placement(self, where: str) -> dict:
        return {"device": 0, "host": 0, "disk": sum(self.numels) * self.item}

    def close(self) -> None:
        self._finalizer()


__all__ = ["build_param_store", "note_unsharded_param_offload", "MemoryShards", "UnitShards", "HostShards",
           "FileShards"]
