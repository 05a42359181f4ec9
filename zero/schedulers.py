"""Learning-rate schedules of a DeepSpeed config's ``scheduler`` section, with DeepSpeed's semantics.

``SchedulerConfig`` holds the section (``{"type": ..., "params": {...}}``); ``build_scheduler`` makes the
schedule over a ``ZeroOptimizer``, which steps it once after every *applied* update (an fp16 step skipped
for overflow does not advance it), as DeepSpeed's engine does.  The types are DeepSpeed's:

* ``WarmupLR``: from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps``, then constant;
* ``WarmupDecayLR``: the same warm-up, then linear decay to 0 at ``total_num_steps``;
* ``WarmupCosineLR``: a ratio of each group's configured lr, from ``warmup_min_ratio`` to 1 over the
  warm-up, then a cosine down to ``cos_min_ratio`` at ``total_num_steps``;
* ``OneCycle``: lr from ``cycle_min_lr`` up to ``cycle_max_lr`` and back over one cycle, then decay; with
  ``cycle_momentum`` (Adam-type optimizers only) the first beta cycles inversely;
* ``LRRangeTest``: lr growing from ``lr_range_test_min_lr`` by ``lr_range_test_step_rate`` per step size;

and any class of ``torch.optim.lr_scheduler`` by its name (DeepSpeed's fallback), built on the
``ZeroOptimizer`` itself.

[Note: DeepSpeed's counting]
Each schedule counts ``last_batch_iteration`` from -1.  Construction sets every group's lr to the value
at -1 (the warm-up's minimum), so the first update runs at it; each ``step()`` after an applied update
advances the count and sets the lr the next update uses.  The warm-up's factor at count c is
``log(c + 1) / log(warmup_num_steps)`` ("log", the default) or ``c / warmup_num_steps`` ("linear"), so
counts -1 and 0 give the same lr: the first two updates run at the minimum, as in DeepSpeed.
``warmup_num_steps`` below 2 counts as 2.  The state is ``{"last_batch_iteration": c}``; the lrs
themselves live in the optimizer's ``param_groups`` and come back with the optimizer's state.

Where DeepSpeed's code does something no config means, zerocomm refuses the config instead: an unknown
``warmup_type`` (DeepSpeed logs it and uses "log"), and ``WarmupCosineLR`` with ``total_num_steps`` not
above the warm-up (DeepSpeed divides by zero or counts backwards).  ``WarmupCosineLR`` before its first
step sets every group's lr to 0 (DeepSpeed's sets only the first group's).  After ``total_num_steps``
the cosine keeps turning, as DeepSpeed's does.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Optional, Sequence

import torch

from .deepspeed_config import check_params, section_of
from .errors import ZeroConfigError

log = logging.getLogger("zerocomm.zero")

WARMUP_TYPES = ("log", "linear")


class StepSchedule:
    """What DeepSpeed's schedules share: a count of applied updates from -1, lrs written into the
    optimizer's groups, ``state_dict`` / ``load_state_dict`` of the count."""

    def __init__(self, optimizer, last_batch_iteration: int = -1):
        self.optimizer = optimizer
        self.last_batch_iteration = int(last_batch_iteration)
        self._last_lr: Optional[list] = None

    def _per_group(self, value, name: str) -> list:
        """``value`` for every group: a number, or a list with one entry per group."""
        groups = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != groups:
                raise ZeroConfigError(f"scheduler parameter {name} has {len(value)} values for {groups} parameter "
                                      f"groups: give one number, or one per group")
            return [float(v) for v in value]
        return [float(value)] * groups

    def _apply(self, lrs: Sequence[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list:
        raise NotImplementedError

    def get_last_lr(self) -> list:
        """The lrs the last ``step`` (or the construction) set."""
        if self._last_lr is None:
            raise ZeroConfigError(f"{type(self).__name__}.get_last_lr() before the schedule set any lr")
        return self._last_lr

    def step(self, last_batch_iteration: Optional[int] = None) -> None:
        """Advance to ``last_batch_iteration`` (default: the next count) and set the lrs for the next update."""
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else int(last_batch_iteration)
        self._apply(self.get_lr())

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: Mapping) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_batch_iteration={self.last_batch_iteration})"


def _warmup_fraction(count: int, warmup_num_steps: int, warmup_type: str) -> float:
    if warmup_type == "log":
        return math.log(count + 1) / math.log(warmup_num_steps)
    return count / warmup_num_steps


def _check_warmup_type(warmup_type: str) -> str:
    if warmup_type not in WARMUP_TYPES:
        raise ZeroConfigError(f"scheduler warmup_type must be one of {WARMUP_TYPES}, got {warmup_type!r}")
    return warmup_type


class WarmupLR(StepSchedule):
    """lr from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps`` updates, then constant."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps: int = 1000,
                 warmup_type: str = "log", last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lrs = self._per_group(warmup_min_lr, "warmup_min_lr")
        self.max_lrs = self._per_group(warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = _check_warmup_type(warmup_type)
        if self.last_batch_iteration == -1:
            self._apply(self.get_lr())

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def get_lr(self) -> list:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [low + (high - low) * gamma for low, high in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """``WarmupLR``'s warm-up, then lr falling linearly to 0 at ``total_num_steps``."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            log.warning("WarmupDecayLR: total_num_steps %d is less than warmup_num_steps %d", self.total_num_steps,
                        self.warmup_num_steps)

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return max(0.0, (self.total_num_steps - self.last_batch_iteration)
                   / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(StepSchedule):
    """Each group's configured lr times a ratio: ``warmup_min_ratio`` -> 1 over the warm-up, then a cosine
    from 1 down to ``cos_min_ratio`` at ``total_num_steps``."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0, warmup_num_steps: int = 1000,
                 cos_min_ratio: float = 0.0001, warmup_type: str = "log", last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio, self.cos_min_ratio = float(warmup_min_ratio), float(cos_min_ratio)
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = _check_warmup_type(warmup_type)
        if self.total_num_steps <= self.warmup_num_steps:
            raise ZeroConfigError(f"WarmupCosineLR: total_num_steps ({self.total_num_steps}) must be greater than "
                                  f"warmup_num_steps ({self.warmup_num_steps}): the cosine needs steps to decay over")
        self.org_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if self.last_batch_iteration == -1:
            self._apply(self.get_lr())

    def lr_ratio(self) -> float:
        count = self.last_batch_iteration
        if count < 0:
            return 0.0
        if count < self.warmup_num_steps:
            fraction = _warmup_fraction(count, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + fraction * (1.0 - self.warmup_min_ratio)
        progress = (count - self.warmup_num_steps + 1) / (self.total_num_steps - self.warmup_num_steps)
        cosine = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> list:
        ratio = self.lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


class OneCycle(StepSchedule):
    """DeepSpeed's 1Cycle: lr rises from ``cycle_min_lr`` to ``cycle_max_lr`` over ``cycle_first_step_size``
    updates and falls back over ``cycle_second_step_size`` (default: the first), then decays as
    ``cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size)`` after k more updates (no decay while
    ``decay_step_size`` or the rate is 0).  With ``cycle_momentum`` and an optimizer with ``betas``, the first
    beta moves inversely between ``cycle_max_mom`` and ``cycle_min_mom`` and the second is set to 0.99, as in
    DeepSpeed; optimizers without ``betas`` (SGD) keep their momentum.  Stair counts are accepted and, as in
    DeepSpeed, change nothing."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: Optional[int] = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: Optional[int] = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float = 0.8,
                 cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        if first <= 0 or second <= 0:
            raise ZeroConfigError(f"OneCycle: cycle_first_step_size ({cycle_first_step_size}) and "
                                  f"cycle_second_step_size ({cycle_second_step_size}) must be > 0")
        self.total_size, self.step_ratio = first + second, first / (first + second)
        self.first_stair_count, self.second_stair_count = cycle_first_stair_count, cycle_second_stair_count
        self.decay_step_size = decay_step_size
        groups = len(optimizer.param_groups)
        self.min_lrs, self.max_lrs = [float(cycle_min_lr)] * groups, [float(cycle_max_lr)] * groups
        self.decay_lr_rate, self.decay_mom_rate = float(decay_lr_rate), float(decay_mom_rate)
        no_decay = math.isclose(decay_step_size, 0)
        self.skip_lr_decay = no_decay or math.isclose(self.decay_lr_rate, 0)
        self.skip_mom_decay = no_decay or math.isclose(self.decay_mom_rate, 0)
        self.cycle_momentum = bool(cycle_momentum) and "betas" in optimizer.defaults
        if cycle_momentum and not self.cycle_momentum:
            log.warning("OneCycle: cycle_momentum is off: optimizer %s has no betas", _inner_name(optimizer))
        self.min_moms = [(float(cycle_min_mom), 0.99)] * groups
        self.max_moms = [(float(cycle_max_mom), 0.99)] * groups
        if self.last_batch_iteration == -1:
            self._apply(self.min_lrs)
            if self.cycle_momentum:
                self._apply_momentum(self.min_moms)

    def _scale(self) -> float:
        position = (self.last_batch_iteration + 1) / self.total_size
        x = 1.0 + position - math.floor(1 + position)
        return x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)

    def get_lr(self) -> list:
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [low / (1 + self.decay_lr_rate * interval) for low in self.min_lrs]

    def get_mom(self) -> Optional[list]:
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(high[0] - (high[0] - low[0]) * scale, low[1]) for low, high in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [(beta0 * (1 + self.decay_mom_rate * interval), beta1) for beta0, beta1 in self.max_moms]

    def _apply_momentum(self, momentums: Sequence[tuple]) -> None:
        for group, betas in zip(self.optimizer.param_groups, momentums):
            group["betas"] = betas

    def step(self, last_batch_iteration: Optional[int] = None) -> None:
        super().step(last_batch_iteration)
        if self.cycle_momentum:
            self._apply_momentum(self.get_mom())


class LRRangeTest(StepSchedule):
    """lr = ``lr_range_test_min_lr`` x (1 + ``lr_range_test_step_rate`` x count / ``lr_range_test_step_size``),
    the quotient rounded down with ``lr_range_test_staircase``."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lrs = self._per_group(lr_range_test_min_lr, "lr_range_test_min_lr")
        if lr_range_test_step_size <= 0:
            raise ZeroConfigError(f"LRRangeTest: lr_range_test_step_size must be > 0, got {lr_range_test_step_size}")
        self.step_size, self.step_rate = lr_range_test_step_size, float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        if self.last_batch_iteration == -1:
            self._apply(self.min_lrs)

    def get_lr(self) -> list:
        interval = self.last_batch_iteration / self.step_size
        increase = 1 + self.step_rate * (math.floor(interval) if self.staircase else interval)
        return [low * increase for low in self.min_lrs]


SCHEDULES = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)}
"""DeepSpeed's schedules by their config name."""

_NOT_PER_STEP = ("ReduceLROnPlateau",)  # stepped with a metric, not once per update


def _inner_name(optimizer) -> str:
    inner = getattr(optimizer, "optimizer", optimizer)
    return type(inner).__name__


def _schedule_class(name: str):
    if name in SCHEDULES:
        return SCHEDULES[name]
    torch_class = getattr(torch.optim.lr_scheduler, name, None)
    if isinstance(torch_class, type) and issubclass(torch_class, torch.optim.lr_scheduler.LRScheduler) \
            and name not in _NOT_PER_STEP:
        return torch_class
    raise ZeroConfigError(f"scheduler type {name!r} is not one zerocomm builds: DeepSpeed's {sorted(SCHEDULES)} or a "
                          f"class of torch.optim.lr_scheduler stepped once per update (not {_NOT_PER_STEP[0]})")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerConfig:
    """A DeepSpeed config's ``scheduler`` section: built over the optimizer and stepped after each applied update."""

    type: str
    """DeepSpeed's name ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest") or a class of
    ``torch.optim.lr_scheduler``."""
    params: dict = dataclasses.field(default_factory=dict)
    """Its keyword arguments (DeepSpeed's names, e.g. ``warmup_num_steps``); the optimizer is passed by zerocomm."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ZeroConfigError(f"scheduler type must be a string, got {self.type!r}")
        if not isinstance(self.params, Mapping):
            raise ZeroConfigError(f"scheduler params must be a dict, got {self.params!r}")
        object.__setattr__(self, "params", dict(self.params))
        check_params(f"scheduler {self.type}", _schedule_class(self.type), self.params, skip=("optimizer",))

    @classmethod
    def from_dict(cls, section: Mapping) -> "SchedulerConfig":
        """From ``{"type": ..., "params": {...}}``, as a DeepSpeed config writes it."""
        return cls(**section_of("scheduler", section))


def build_scheduler(config: SchedulerConfig, optimizer) -> Any:
    """The schedule ``config`` names, over ``optimizer`` (a ``ZeroOptimizer``: torch's schedulers take it too)."""
    cls = _schedule_class(config.type)
    try:
        return cls(optimizer, **config.params)
    except (TypeError, ValueError) as error:
        raise ZeroConfigError(f"scheduler {config.type} with params {config.params}: {error}") from None


__all__ = ["SchedulerConfig", "build_scheduler", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
           "LRRangeTest", "SCHEDULES"]
