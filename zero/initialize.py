"""``zerocomm.zero.initialize``: wrap a model and an optimizer factory in a ZeRO stage.

    model, optimizer = zerocomm.zero.initialize(model, lambda params: torch.optim.AdamW(params, lr=1e-3),
                                                {"zero_optimization": {"stage": 2}})
    for batch in data:
        loss = loss_fn(model(batch.x), batch.y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

The model is returned as it came (the same module, with hooks added and its parameters turned into
views of a flat buffer); the optimizer is a ``ZeroOptimizer`` (its parts chosen by the stage) with ``step``,
``zero_grad``, ``model_state_bytes``, ``synchronize`` and the torch optimizer over this rank's master shards as
``optimizer.optimizer`` (build learning-rate schedulers on that one).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from torch import nn

from .. import comm as dist
from .config import ZeroConfig
from .errors import ZeroConfigError
from .optimizer import OptimizerFactory, ZeroOptimizer


def as_config(config: Union[ZeroConfig, Mapping[str, Any], None], *, world_size: Optional[int] = None,
              model: Optional[nn.Module] = None) -> ZeroConfig:
    """A ``ZeroConfig`` from a ``ZeroConfig``, a DeepSpeed config dict, or ``None`` (the defaults).

    ``world_size`` and ``model`` let a DeepSpeed dict's batch sizes be checked and its ``"auto"`` values
    resolved (see deepspeed_config.py)."""
    if config is None:
        return ZeroConfig()
    if isinstance(config, ZeroConfig):
        return config
    if isinstance(config, Mapping):
        return ZeroConfig.from_deepspeed(config, world_size=world_size, model=model)
    raise ZeroConfigError(f"config must be a ZeroConfig, a DeepSpeed-style dict or None, got {type(config).__name__}")


def initialize(model: nn.Module, optimizer_factory: OptimizerFactory,
               config: Union[ZeroConfig, Mapping[str, Any], None] = None,
               group=None) -> tuple[nn.Module, ZeroOptimizer]:
    """Shard ``model``'s training state across ``group`` (default: the world) with the configured stage.

    Every rank of ``group`` calls it with the same model structure; parameters and buffers are
    broadcast from the group's rank 0.  ``optimizer_factory(params)`` receives this rank's float32
    master shards (a list of tensors, one per bucket) and returns a ``torch.optim.Optimizer`` over
    exactly them; elementwise optimizers (SGD, Adam, AdamW, ...) then give the same updates as on
    full parameters.  Returns ``(model, optimizer)``.
    """
    config = as_config(config, world_size=dist.get_world_size(group), model=model)
    if not isinstance(model, nn.Module):
        raise ZeroConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(optimizer_factory):
        raise ZeroConfigError(f"optimizer_factory must be callable (params -> optimizer), got "
                              f"{type(optimizer_factory).__name__}")
    return model, ZeroOptimizer(model, optimizer_factory, config, group)
