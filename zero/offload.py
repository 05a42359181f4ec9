"""Optimizer state in host memory (ZeRO-Offload).

``stages.STATE_PARTS`` names the part of each ``StatePlacement`` (the ``OptimizerState`` interface, parts.py):

* ``DEVICE``: ``DeviceOptimizerState`` (optimizer_state.py), masters and state beside the parameters;
* ``HOST``: ``HostOptimizerState`` below for parameters on an accelerator; for parameters already in
  host memory (CPU models) the device *is* the host, so ``HostOptimizerState.build`` gives a
  ``DeviceOptimizerState``, which serves unchanged;
* ``DISK``: ``NvmeOptimizerState`` (offload_nvme.py), state and the reduced gradient shard in files, stepped
  piece by piece.

[Note: the data movement of ZeRO-Offload]
For a CUDA model, per bucket and per step: when the bucket's reduction has been waited for (during
backward for every bucket but the last ``max_inflight_buckets`` under stages 2-3, at the step otherwise),
``gradient_ready`` copies this rank's reduced gradient elements device -> host on a side stream (one
event per bucket), so the copies overlap the rest of backward: float32 gradients straight into the pinned
float32 buffer the master's gradient is, bf16/fp16 ones in their own dtype into a pinned staging buffer,
widened to float32 on the host in ``set_gradients`` (as ZeRO-Offload moves fp16 gradients: half the bytes
of a float32 copy; torch's ``copy_(non_blocking=True)`` from a bf16 CUDA tensor into a float32 host one
would widen on the device and move float32).  ``step`` waits for each bucket's event, runs the torch
optimizer on the host masters (CPU Adam/AdamW over one flat tensor per bucket), and ``write_back`` copies
each updated master host -> device into the parameters' storage, after which the parameters part
all-gathers as usual.  Bytes crossing the bus per step: Φ/N gradient elements to the host and Φ/N
parameter elements back, both in the compute dtype.
The counters ``to_host_bytes`` / ``to_device_bytes`` record them, so a test on a CPU-only machine can
check the movement with the class forced onto CPU tensors.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from .gradients import tensor_bytes
from .optimizer_state import DeviceOptimizerState, MastersInMemory, OptimizerFactory, check_optimizer
from .parts import BucketTakingState


class HostOptimizerState(MastersInMemory, BucketTakingState):
    """Float32 masters, gradients and the optimizer's state in host memory; the step on the CPU.

    Args:
        param_shards: per bucket, the elements this rank updates, in the parameters' storage (any device).
        full32: per bucket, the same elements in float32 (``None`` when the parameters are float32).
        factory: builds the torch optimizer over the host masters.
        rank: for messages.
        pin_memory: page-lock the host buffers (CUDA only: asynchronous copies).
        device: where gradients arrive from (default: the shards' device; stage 3 with ``offload_param: cpu``
            passes the model's device, its shards being in host memory already).
    """

    def __init__(self, param_shards: Sequence[torch.Tensor], full32: Optional[Sequence[torch.Tensor]],
                 factory: OptimizerFactory, rank: int, *, pin_memory: bool = True,
                 device: Optional[torch.device] = None):
        self.rank = rank
        self.device = device or param_shards[0].device  # the gradients' device (the shards may be on the host)
        self.aliased = False  # the masters are never the parameters' storage
        cuda = self.device.type == "cuda"
        pin = pin_memory and cuda
        source = full32 if full32 is not None else param_shards
        self.masters = [nn.Parameter(_host_float32(values, pin)) for values in source]
        self.grads = [torch.empty(m.shape, dtype=torch.float32, pin_memory=pin) for m in self.masters]
        self._pin = pin
        #: Per bucket: a pinned buffer of a bf16/fp16 gradient's own dtype that its copy lands in (CUDA only).
        narrow = cuda and param_shards[0].dtype != torch.float32
        self._staged: list = [torch.empty(m.shape, dtype=param_shards[0].dtype, pin_memory=pin) if narrow else None
                              for m in self.masters]
        self._widen: list = [None] * len(self.masters)  # per bucket: the staged buffer this step's copy went to
        self.optimizer = factory(list(self.masters))
        check_optimizer(self.optimizer, self.masters, rank)
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._ready: list = [None] * len(self.masters)  # per bucket: None, or the copy's event (True on CPU)
        self.to_host_bytes = 0
        """Bytes copied device -> host (gradients) since construction."""
        self.to_device_bytes = 0
        """Bytes copied host -> device (updated parameters) since construction."""

    @classmethod
    def build(cls, param_shards, full32, factory, rank, config, *, device=None, param_store=None):
        """``offload_optimizer: cpu``: this class for parameters on an accelerator; a ``DeviceOptimizerState`` for
        parameters in host memory already (a CPU model: the device is the host)."""
        device = device or param_shards[0].device
        if device.type != "cpu":
            return cls(param_shards, full32, factory, rank, pin_memory=config.pin_memory, device=device)
        return DeviceOptimizerState.build(param_shards, full32, factory, rank, config, device=device)

    def gradient_ready(self, index: int, grad: torch.Tensor, factor: float = 1.0) -> None:
        """Bucket ``index``'s reduced elements ``grad`` (on the device) are final: start their copy to the host.
        ``factor`` is applied by ``set_gradients`` on the host copy (the copy may still be in flight here)."""
        host = self.grads[index]
        if self._stream is not None:
            if grad.dtype != host.dtype:  # move the compute dtype; widen on the host (set_gradients)
                staged = self._staged[index]
                if staged is None or staged.dtype != grad.dtype:
                    staged = self._staged[index] = torch.empty(host.shape, dtype=grad.dtype, pin_memory=self._pin)
                host = self._widen[index] = staged
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                host.copy_(grad, non_blocking=True)
                grad.record_stream(self._stream)
                event = torch.cuda.Event()
                event.record(self._stream)
            self._ready[index] = event
        else:
            host.copy_(grad)
            self._ready[index] = True
        self.to_host_bytes += tensor_bytes(grad)

    def set_gradients(self, grads: Sequence[torch.Tensor], factor: float) -> list:
        """Give every host master its gradient times ``factor`` (copying the buckets not copied yet)."""
        out = []
        for index, (master, grad) in enumerate(zip(self.masters, grads)):
            if self._ready[index] is None:
                self.gradient_ready(index, grad)
            if self._ready[index] is not True:
                self._ready[index].synchronize()
            host = self.grads[index]
            if self._widen[index] is not None:
                host.copy_(self._widen[index])  # bf16/fp16 -> float32 on the host
            if factor != 1.0:
                host.mul_(factor)
            master.grad = host
            out.append(host)
        return out

    def write_back(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Copy the updated masters into the parameters' storage (host -> device, rounded to their dtype)."""
        self.to_device_bytes += self._copy_masters(param_shards, into_params=True,
                                                   non_blocking=self._stream is not None)
        if self._stream is not None:
            torch.cuda.current_stream(self.device).synchronize()  # the all_gather that follows reads them

    def read_from(self, param_shards: Sequence[torch.Tensor]) -> None:
        self._copy_masters(param_shards, into_params=False)

    def clear_gradients(self) -> None:
        for master in self.masters:
            master.grad = None
        self._ready = [None] * len(self.masters)
        self._widen = [None] * len(self.masters)

    def nbytes(self, param_storages: set) -> int:
        """Host bytes of masters, gradient buffers and optimizer state."""
        total = sum(tensor_bytes(t) for t in self.masters) + sum(tensor_bytes(g) for g in self.grads)
        total += sum(tensor_bytes(s) for s in self._staged if s is not None)
        return total + sum(tensor_bytes(v) for state in self.optimizer.state.values() for v in state.values()
                           if isinstance(v, torch.Tensor))

    def placement(self, where: str) -> dict:
        """Bytes of masters, gradient copies and optimizer state by where they live: all in host memory."""
        return {"device": 0, "host": self.nbytes(set()), "disk": 0}


def _host_float32(values: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(values.shape, dtype=torch.float32, pin_memory=pin)
    out.copy_(values.detach())
    return out


__all__ = ["HostOptimizerState"]
