"""``zerocomm.zero.initialize``: wrap a model and its optimizer in a ZeRO stage.

    model, optimizer = zerocomm.zero.initialize(model, config={
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100, "warmup_max_lr": 1e-3}}})
    for batch in data:
        loss = loss_fn(model(batch.x), batch.y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

or with a factory instead of the config's optimizer section:
``initialize(model, lambda groups: torch.optim.AdamW(groups, lr=1e-3), config)``.

The model is returned as it came (the same module, with hooks added and its parameters turned into
views of a flat buffer); the optimizer is a ``ZeroOptimizer`` (its parts chosen by the stage), a
``torch.optim.Optimizer`` whose ``param_groups`` hold this rank's master shards, with ``step`` (True when an
update was applied), ``zero_grad``, ``save``/``load``, ``lr_scheduler``, ``model_state_bytes`` and
``synchronize``; the torch optimizer over the shards is ``optimizer.optimizer``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from torch import nn

from .. import comm as dist
from .config import ZeroConfig
from .errors import ZeroConfigError
from .optimizer import OptimizerFactory, ZeroOptimizer
from .param_source import ParamSource


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


def initialize(model: nn.Module, optimizer: Optional[OptimizerFactory] = None,
               config: Union[ZeroConfig, Mapping[str, Any], None] = None, *,
               model_parameters: Optional[Iterable] = None, group=None,
               param_source: Optional[ParamSource] = None) -> tuple[nn.Module, ZeroOptimizer]:
    """Shard ``model``'s training state across ``group`` (default: the world) with the configured stage.

    Every rank of ``group`` calls it with the same model structure; parameters and buffers are
    broadcast from the group's rank 0.  The torch optimizer over this rank's float32 master shards
    comes from ``optimizer``, a factory: ``optimizer(groups)`` receives torch-style parameter groups
    of shards (``[{"params": [shards...], **group options}, ...]``, one per group of
    ``model_parameters``) and returns a ``torch.optim.Optimizer`` over exactly them; elementwise
    optimizers (SGD, Adam, AdamW, ...) then give the same updates as on full parameters.  Without a
    factory the config's ``optimizer`` section builds it (optim_factory.py); both at once are refused.
    The config's ``scheduler`` section becomes ``optimizer.lr_scheduler``, stepped after each applied
    update (schedulers.py).

    ``model_parameters``: the parameters to train, or torch-style groups (dicts with ``"params"`` and
    hyperparameters that override the optimizer's for that group); default: every parameter that
    requires grad, in one group.  A bucket never mixes groups.

    ``param_source``: for a model whose parameters do not hold their values (built under
    ``zerocomm.deepspeed.zero.Init``), where they are (param_source.py); stage 3 then reads one unit at a
    time, so no rank holds the whole model.  Its values are used as they are (no broadcast from rank 0).

    Returns ``(model, optimizer)``: the same module, and a ``ZeroOptimizer`` (a ``torch.optim.Optimizer``).
    """
    config = as_config(config, world_size=dist.get_world_size(group), model=model)
    if not isinstance(model, nn.Module):
        raise ZeroConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if param_source is not None and not isinstance(param_source, ParamSource):
        raise ZeroConfigError(f"param_source must have a gather_into(params, outs) method, got "
                              f"{type(param_source).__name__}")
    return model, ZeroOptimizer(model, optimizer, config, group, model_parameters=model_parameters,
                                param_source=param_source)
