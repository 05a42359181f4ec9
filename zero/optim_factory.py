"""The optimizer of a DeepSpeed config's ``optimizer`` section, built as DeepSpeed builds it.

``OptimizerConfig`` holds the section (``{"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}``);
``build_optimizer(config, groups)`` makes the torch optimizer over the torch-style groups of master shards
that ``ZeroOptimizer`` hands its factory, so a config section and a factory end in the same place.

What each type becomes (DeepSpeed matches its own names in any case, torch's class names exactly):

* ``Adam`` / ``AdamW``: DeepSpeed's FusedAdam with ``adam_w_mode`` (default true: decoupled weight decay even
  for "Adam"; ``"adam_w_mode": false`` adds the decay to the gradient instead) and FusedAdam's defaults, among
  them ``weight_decay`` 0.  zerocomm runs ``torch.optim.AdamW`` or ``torch.optim.Adam`` with those settings:
  the same update.  With ``"torch_adam": true`` DeepSpeed calls torch's class with the params as written, so
  torch's defaults apply (AdamW's ``weight_decay`` 0.01).  ``bias_correction: false`` is refused (torch's Adam
  always corrects), and ``amsgrad`` needs ``torch_adam`` as in DeepSpeed (FusedAdam refuses it).
* ``Adagrad``: ``torch.optim.Adagrad``, as DeepSpeed does.
* any elementwise class of ``torch.optim`` by its exact name (``SGD``, ``RMSprop``, ``NAdam``, ...): DeepSpeed's
  fallback.  Optimizers whose update of an element depends on other elements (LBFGS, Adafactor, LAMB's trust
  ratio, Muon) would update a flat shard differently from the whole parameter, so they are refused.
* ``OneBitAdam``, ``ZeroOneAdam``, ``OneBitLamb``: DeepSpeed refuses them under ZeRO, and so does zerocomm
  (``zerocomm.zero.OneBitAdam`` runs without ``initialize``).
* ``Lamb``, ``Lion``, ``MuAdam``, ``MuAdamW``, ``MuSGD``: not implemented.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from .deepspeed_config import check_params, section_of
from .errors import ZeroConfigError

ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop")
"""torch.optim classes whose update of each element reads only that element's gradient and state."""

_ZERO_INCOMPATIBLE = ("onebitadam", "zerooneadam", "onebitlamb")
_NOT_IMPLEMENTED = ("lamb", "lion", "muadam", "muadamw", "musgd")
_FUSED_ADAM = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
"""DeepSpeed FusedAdam's defaults (torch's AdamW differs in weight_decay: 0.01)."""
_FUSED_ONLY = ("adam_w_mode", "torch_adam", "bias_correction", "set_grad_none")


def _resolve(type_name: str, params: Mapping) -> tuple[type, dict]:
    """(torch class, keyword arguments) for a config section, or ``ZeroConfigError`` saying why not."""
    what = f"optimizer {type_name}"
    if "max_grad_norm" in params:
        raise ZeroConfigError(f"{what}: 'max_grad_norm' is not an optimizer parameter; set the config's "
                              f"gradient_clipping instead (as DeepSpeed requires)")
    lower = type_name.lower()
    if lower in ("adam", "adamw"):
        kwargs = dict(params)
        torch_adam = bool(kwargs.pop("torch_adam", False))
        adam_w_mode = bool(kwargs.pop("adam_w_mode", True))
        decoupled = lower == "adamw" or adam_w_mode
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        if not torch_adam:
            if kwargs.pop("bias_correction", True) is not True:
                raise ZeroConfigError(f"{what}: bias_correction {params['bias_correction']!r} is not supported "
                                      f"(torch's Adam always corrects); remove it or set it to true")
            if kwargs.get("amsgrad"):
                raise ZeroConfigError(f"{what}: amsgrad needs \"torch_adam\": true (DeepSpeed's FusedAdam refuses "
                                      f"it too)")
            kwargs.pop("set_grad_none", None)
            kwargs = {**_FUSED_ADAM, **kwargs}
        check_params(what, cls, kwargs)
        return cls, kwargs
    if lower in _ZERO_INCOMPATIBLE:
        raise ZeroConfigError(f"{what} is not compatible with ZeRO (DeepSpeed refuses it too): it averages "
                              f"compressed momenta itself; use zerocomm.zero.OneBitAdam without initialize")
    if lower in _NOT_IMPLEMENTED:
        raise ZeroConfigError(f"{what} is not implemented in zerocomm; use Adam, AdamW, Adagrad or an elementwise "
                              f"torch.optim class {list(ELEMENTWISE)}, or pass an optimizer factory")
    name = "Adagrad" if lower == "adagrad" else type_name
    if name in ELEMENTWISE:
        cls = getattr(torch.optim, name)
        check_params(what, cls, params)
        return cls, dict(params)
    if isinstance(getattr(torch.optim, name, None), type):
        raise ZeroConfigError(f"{what}: its update of an element depends on other elements, so it would update a "
                              f"flat shard differently from the whole parameter; zerocomm builds {list(ELEMENTWISE)}")
    raise ZeroConfigError(f"unknown optimizer type {type_name!r}: zerocomm builds DeepSpeed's Adam, AdamW, Adagrad and "
                          f"the torch.optim classes {list(ELEMENTWISE)}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerConfig:
    """A DeepSpeed config's ``optimizer`` section: the optimizer ``initialize`` builds when given no factory."""

    type: str
    """DeepSpeed's name ("Adam", "AdamW", "Adagrad", any case) or an elementwise ``torch.optim`` class name."""
    params: dict = dataclasses.field(default_factory=dict)
    """Its keyword arguments (``lr``, ``betas``, ``eps``, ``weight_decay``, DeepSpeed's ``adam_w_mode`` and
    ``torch_adam``, ...); a parameter group's own values override them for that group."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ZeroConfigError(f"optimizer type must be a string, got {self.type!r}")
        if not isinstance(self.params, Mapping):
            raise ZeroConfigError(f"optimizer params must be a dict, got {self.params!r}")
        params = {key: tuple(value) if key == "betas" and isinstance(value, list) else value
                  for key, value in self.params.items()}
        object.__setattr__(self, "params", params)
        _resolve(self.type, self.params)

    @classmethod
    def from_dict(cls, section: Mapping) -> "OptimizerConfig":
        """From ``{"type": ..., "params": {...}}``, as a DeepSpeed config writes it."""
        return cls(**section_of("optimizer", section))

    @property
    def torch_class(self) -> type:
        """The torch optimizer class it builds."""
        return _resolve(self.type, self.params)[0]


def build_optimizer(config: OptimizerConfig, groups: list) -> torch.optim.Optimizer:
    """The optimizer ``config`` describes over ``groups`` (torch-style groups of master shards): an
    ``OptimizerFactory`` once ``config`` is bound (``functools.partial(build_optimizer, config)``)."""
    cls, kwargs = _resolve(config.type, config.params)
    try:
        return cls(groups, **kwargs)
    except (TypeError, ValueError) as error:
        raise ZeroConfigError(f"optimizer {config.type} with params {config.params}: {error}") from None


__all__ = ["OptimizerConfig", "build_optimizer", "ELEMENTWISE"]
