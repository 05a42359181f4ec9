"""Parameter groups: ``initialize``'s ``model_parameters``, as torch optimizers take them, mapped onto buckets.

A user writes groups as for any torch optimizer::

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    initialize(model, config=ds_config, model_parameters=[{"params": decay, "weight_decay": 0.1},
                                                          {"params": no_decay, "weight_decay": 0.0}])

``ParamGroups`` records which group each managed parameter belongs to and each group's options (every key
but ``"params"``).  The buckets are planned so that a bucket never mixes groups (partition.py's
``plan_buckets``, and stage 3's units split per group), so each bucket's float32 master shard belongs to
exactly one group; ``shard_groups`` turns the masters back into torch-style groups for the optimizer
factory, one per user group, in the user's order.

Parameters that do not require grad are frozen: they may appear in a group (the Hugging Face recipes list
every parameter) and are left out of the optimizer; their values travel in checkpoints as the model's
other tensors do.  A trainable parameter of the model that no group lists is refused, as is one listed
twice, so no parameter is silently left untrained.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

import torch
from torch import nn

from .errors import ZeroConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class ParamGroups:
    """Which group each managed parameter belongs to, and each group's options."""

    options: tuple
    """Per group, its hyperparameters as a dict (every key of the user's group but ``"params"``)."""
    group_of: dict
    """``id(parameter)`` -> group index, for every managed (trainable) parameter."""

    @property
    def count(self) -> int:
        return len(self.options)

    def indices(self, named: Sequence[tuple[str, nn.Parameter]]) -> list[int]:
        """The group index of each ``(name, parameter)``."""
        return [self.group_of[id(param)] for _, param in named]

    def shard_groups(self, masters: Sequence[torch.Tensor], bucket_groups: Sequence[int]) -> list[dict]:
        """Torch-style groups of ``masters`` (one per bucket; ``bucket_groups[b]`` is bucket b's group): one
        dict per user group, ``{"params": [its buckets' masters], **options}``, in the user's order."""
        if len(masters) != len(bucket_groups):
            raise ZeroConfigError(f"{len(masters)} master shards for {len(bucket_groups)} buckets")
        groups = [{"params": [], **options} for options in self.options]
        for master, group in zip(masters, bucket_groups):
            groups[group]["params"].append(master)
        return groups


def param_groups_of(model: nn.Module, managed: Sequence[tuple[str, nn.Parameter]],
                    model_parameters: Optional[Iterable] = None, *, rank: int = 0) -> ParamGroups:
    """``ParamGroups`` for ``managed`` (the model's trainable parameters) from ``model_parameters``: None (one
    group of every managed parameter), an iterable of parameters (one group), or an iterable of dicts with
    ``"params"`` and hyperparameters.  Raises ``ZeroConfigError`` naming the parameter or group at fault."""
    names = {id(param): name for name, param in model.named_parameters(remove_duplicate=False)}
    managed_ids = {id(param) for _, param in managed}
    if model_parameters is None:
        return ParamGroups(options=({},), group_of={id(param): 0 for _, param in managed})
    if isinstance(model_parameters, torch.Tensor):
        raise ZeroConfigError("model_parameters must be an iterable of parameters or of dicts with 'params', "
                              "got a single tensor")
    given = list(model_parameters)
    if not given:
        raise ZeroConfigError("model_parameters is empty: pass the parameters to train (or leave it None)")
    if not all(isinstance(group, dict) for group in given):
        if any(isinstance(group, dict) for group in given):
            raise ZeroConfigError("model_parameters mixes parameters and dicts: pass either parameters or groups")
        given = [{"params": given}]
    options, group_of = [], {}
    for index, group in enumerate(given):
        if "params" not in group:
            raise ZeroConfigError(f"model_parameters group {index} has no 'params' key, got keys {sorted(group)}")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        for param in params:
            if not isinstance(param, torch.Tensor):
                raise ZeroConfigError(f"model_parameters group {index} holds a {type(param).__name__}, not a "
                                      f"parameter")
            if id(param) not in names:
                raise ZeroConfigError(f"rank {rank}: model_parameters group {index} holds a tensor of shape "
                                      f"{tuple(param.shape)} that is not a parameter of the model")
            if id(param) not in managed_ids:
                continue  # frozen (requires_grad False): not trained, kept with the model's other tensors
            if id(param) in group_of:
                raise ZeroConfigError(f"parameter {names[id(param)]!r} appears in model_parameters groups "
                                      f"{group_of[id(param)]} and {index}; list each parameter once")
            group_of[id(param)] = index
        options.append({key: value for key, value in group.items() if key != "params"})
    missing = [name for name, param in managed if id(param) not in group_of]
    if missing:
        raise ZeroConfigError(f"rank {rank}: trainable parameters {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                              f"are in no model_parameters group: add them to a group, or set requires_grad=False "
                              f"to freeze them")
    return ParamGroups(options=tuple(options), group_of=group_of)

