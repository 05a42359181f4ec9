"""Where the optimizer's state lives: float32 masters of this rank's elements, and the torch optimizer.

``DeviceOptimizerState`` keeps them on the parameters' device.  The contract the wrapper uses is the
``OptimizerState`` interface (parts.py); the offloading variants implement it too (``HostOptimizerState`` in
offload.py: host memory; ``NvmeOptimizerState`` in offload_nvme.py: files), one per ``StatePlacement`` member
(``stages.STATE_PARTS``).

[Note: masters that are the parameters]
In fp32 the master of a bucket is a view of the parameters' own storage (no copy): the optimizer
updates the parameters in place, and ``write_back`` has nothing to do.  In bf16/fp16 the masters
are float32 copies and ``write_back`` rounds them into the parameters' storage after each step.
Each master is one flat tensor (a bucket's owned elements), so the optimizer runs one kernel per
bucket instead of one per parameter.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .errors import ZeroConfigError
from .gradients import tensor_bytes
from .parts import OptimizerState

#: ``optimizer_factory(params) -> torch.optim.Optimizer``, called with this rank's float32 master shards.
OptimizerFactory = Callable[[list], torch.optim.Optimizer]


def check_optimizer(optimizer, masters: Sequence[torch.Tensor], rank: int) -> None:
    """Raise ``ZeroConfigError`` unless ``optimizer`` is a torch optimizer over exactly ``masters``."""
    if not hasattr(optimizer, "step") or not hasattr(optimizer, "param_groups"):
        raise ZeroConfigError(f"optimizer_factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    given = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if given != {id(m) for m in masters}:
        raise ZeroConfigError(f"rank {rank}: optimizer_factory must build its optimizer over exactly the "
                              f"{len(masters)} master shards it is given, got {len(given)} other tensors")


class MastersInMemory(OptimizerState):
    """What the in-memory states share: float32 master tensors ``self.masters`` whose ``.grad`` the step reads,
    and the torch optimizer over them.  Subclasses set both and say when masters and parameters differ."""

    masters: list
    optimizer: torch.optim.Optimizer

    def scale_gradients(self, coefficient: float) -> None:
        torch._foreach_mul_([master.grad for master in self.masters], coefficient)

    def step(self) -> None:
        self.optimizer.step()

    def _copy_masters(self, param_shards: Sequence[torch.Tensor], *, into_params: bool,
                      non_blocking: bool = False) -> int:
        """Copy masters -> parameter shards (``into_params``, rounded to their dtype) or back; returns the bytes
        written into the parameters."""
        shards, masters = list(param_shards), [master.detach() for master in self.masters]
        with torch.no_grad():
            if into_params:
                torch._foreach_copy_(shards, masters, non_blocking=non_blocking)  # multi-tensor kernels, casting
                return sum(tensor_bytes(shard) for shard in shards)
            torch._foreach_copy_(masters, shards)
        return 0


class DeviceOptimizerState(MastersInMemory):
    """This rank's float32 masters (one flat tensor per bucket) and the optimizer over them.

    Args:
        param_shards: per bucket, the elements this rank updates, in the parameters' storage.
        full32: per bucket, the same elements in float32 (used when the parameters are not float32;
            ``None`` otherwise).
        factory: builds the torch optimizer over the masters.
        rank: for messages.
    """

    def __init__(self, param_shards: Sequence[torch.Tensor], full32: Optional[Sequence[torch.Tensor]],
                 factory: OptimizerFactory, rank: int):
        self.rank = rank
        self.aliased = full32 is None
        if self.aliased:
            self.masters = [nn.Parameter(shard) for shard in param_shards]
        else:
            self.masters = [nn.Parameter(values.detach().clone()) for values in full32]
        self.optimizer = factory(list(self.masters))
        check_optimizer(self.optimizer, self.masters, rank)
        # The parameters' storages, so that ``placement`` leaves out masters that are the parameters as ``nbytes``
        # does (the shards are views into storages that live as long as the wrapper).
        self._param_storages = {shard.untyped_storage().data_ptr() for shard in param_shards}

    @classmethod
    def build(cls, param_shards, full32, factory, rank, config, *, device=None, param_store=None):
        """Refuses parameter shards that are not on the parameters' ``device`` (stage 3 keeping them in host memory
        beside an accelerator: the step must run there, which ``offload_optimizer: cpu`` does)."""
        device = device or param_shards[0].device
        if param_shards[0].device != device:
            raise ZeroConfigError(f"rank {rank}: offload_param 'cpu' keeps the parameter shards of a model on {device} "
                                  f"in host memory, so the optimizer steps there too: it needs offload_optimizer 'cpu' "
                                  f"(got {config.offload_optimizer!r})")
        return cls(param_shards, full32, factory, rank)

    def set_gradients(self, grads: Sequence[torch.Tensor], factor: float) -> list:
        """Give every master its gradient (``grads`` per bucket, in the parameters' dtype) times ``factor``;
        returns the masters' gradients.  A float32 gradient is used in place (it is the reduced shard)."""
        out = [grad if grad.dtype == master.dtype else grad.to(master.dtype)
               for master, grad in zip(self.masters, grads)]
        if factor != 1.0 and out:
            torch._foreach_mul_(out, factor)  # one multi-tensor kernel for every bucket
        for master, grad in zip(self.masters, out):
            master.grad = grad
        return out

    def write_back(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Mixed precision: round the masters into the parameters' storage (fp32: they are that storage)."""
        if not self.aliased:
            self._copy_masters(param_shards, into_params=True)

    def read_from(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Mixed precision: take the masters' values from the parameters (after they were set from outside)."""
        if not self.aliased:
            self._copy_masters(param_shards, into_params=False)

    def clear_gradients(self) -> None:
        if not self.aliased:
            for master in self.masters:
                master.grad = None  # the float32 gradient copy lives only during the step

    def nbytes(self, param_storages: set) -> int:
        """Bytes of masters and optimizer state, leaving out masters that are the parameters' storage."""
        seen, total = set(), 0
        candidates = list(self.masters) + [value for state in self.optimizer.state.values()
                                           for value in state.values() if isinstance(value, torch.Tensor)]
        for tensor in candidates:
            if tensor.untyped_storage().data_ptr() in param_storages or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            total += tensor_bytes(tensor)
        return total

    def placement(self, where: str) -> dict:
        """All of ``nbytes`` beside the parameters (``where``)."""
        out = {"device": 0, "host": 0, "disk": 0}
        out[where] = self.nbytes(self._param_storages)
        return out
