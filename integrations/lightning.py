"""``ZeroStrategy``: PyTorch Lightning's ``Trainer`` on zerocomm's ZeRO.

    from zerocomm.integrations.lightning import ZeroStrategy
    trainer = Trainer(accelerator="cpu", devices=2, strategy=ZeroStrategy(stage=3))
    trainer.fit(model, data)                # model: any LightningModule; its configure_optimizers is used

What the strategy changes, against Lightning's ``DDPStrategy`` (of which it is a subclass, for the process
layout, the sampler, the launcher and the collectives Lightning itself calls), and nothing else:

* **process group**: ``zerocomm.comm.init_process_group`` (gloo, MPI or NCCL, picked as zerocomm picks
  them); torch's default group then stands for zerocomm's world, so Lightning's ``barrier``, ``broadcast``
  and ``reduce`` (``self.log(..., sync_dist=True)``) run through zerocomm (``process_group_backend`` is
  ``"zerocomm"``); ``reduce`` takes the mean of an integer tensor (Lightning's batch counts) as a sum divided
  by the world size, as Lightning does on gloo, since zerocomm refuses an integer AVG;
* **setup**: no DDP wrapper; ``zerocomm.zero.initialize`` shards the module and builds the ``ZeroOptimizer``
  that Lightning steps, from the LightningModule's ``configure_optimizers`` or, when the config has an
  ``optimizer`` section, from the config (``configure_optimizers`` is then not called, as with DeepSpeed);
* **the optimizer step**: through a precision plugin (Lightning's "32-true" with ZeRO's step, as Lightning's
  DeepSpeed plugin does it): backward first, then ``ZeroOptimizer.step()`` (ZeRO takes no closure); ZeRO clips
  (the Trainer's ``gradient_clip_val``) and averages accumulated micro-batches (``accumulate_grad_batches``);
* **checkpoints**: ``trainer.save_checkpoint(path)``, ``ModelCheckpoint`` and ``fit(ckpt_path=path)`` write
  and read ZeRO's sharded checkpoint folder at ``path`` (``optimizer.save`` / ``optimizer.load``: any world
  size, checksummed, atomic), with Lightning's own state (loops, callbacks, schedulers) as its client state.

[Note: the optimizer Lightning built is the one ZeRO steps]
``configure_optimizers`` returns a torch optimizer over the module's parameters and, maybe, schedulers
bound to it.  ZeRO needs an optimizer over this rank's float32 master shards; its factory hands that
same optimizer object the shards (each of its groups' ``"params"`` becomes the group's shards, every
hyperparameter stays where the user set it).  So the schedulers Lightning steps keep acting on the
optimizer they were built for, whose ``param_groups`` are the ZeroOptimizer's: no scheduler is rebuilt.

[Note: the module ZeRO wraps]
Lightning calls ``training_step``, not ``forward``, and a ``training_step`` may call a submodule directly.
ZeRO's hooks at the root of its model (stage 3 gathers the root's parameters there; bf16 casts inputs;
fp16 scales outputs) must surround the whole step, once.  So ZeRO is given a one-child wrapper whose
forward calls the LightningModule, and Lightning's forward redirection (the same one it uses for DDP)
runs each ``*_step`` inside that forward.  Parameter names in ZeRO's checkpoints therefore start with
``module.``, as a DDP module's do.

Refused with ``zerocomm.zero.ZeroConfigError`` (a ``ValueError``), before any process group is made:
precision plugins other than ``"32-true"`` (ZeRO's own ``bf16``/``fp16`` config sections give mixed
precision), ``gradient_clip_algorithm="value"``, a ``gradient_accumulation_steps`` key in the config (it
comes from ``accumulate_grad_batches``), a gradient clipping value that differs between the Trainer and
the config, a ``stage`` that differs from the config's, more than one optimizer, and ``validate`` /
``test`` / ``predict`` outside ``fit``.
"""
from __future__ import annotations

import copy
import datetime
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import nn

import lightning.pytorch as pl
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from .. import comm as dist
from .. import zero

__all__ = ["ZeroStrategy"]

_STEP_FOLDER = re.compile(r"step-\d{8}")
"""A complete checkpoint folder of ZeRO's layout (docs/zero.md, "Checkpoints")."""


class _LightningStep(nn.Module):
    """What ZeRO wraps (see the note on the module ZeRO wraps): its forward calls the LightningModule, whose
    ``forward`` Lightning's redirection has pointed at ``training_step`` (or ``validation_step``) for the call."""

    def __init__(self, module: "pl.LightningModule"):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class _ZeroPrecision(Precision):
    """Lightning's float32 precision ("32-true") with ZeRO taking the step, as Lightning's DeepSpeed plugin does:
    ``optimizer_step`` runs the closure (forward, backward), Lightning's pre-step hooks, then
    ``ZeroOptimizer.step()``, which takes no closure; ``clip_gradients`` does nothing, as ZeRO clips by the
    global norm inside ``step`` (the Trainer's ``gradient_clip_val`` is in its config); Lightning's clipping
    would scale each rank's gradient shard by its own local norm."""

    def __init__(self, accumulation: int = 1):
        super().__init__()
        self.accumulation = accumulation

    def pre_backward(self, tensor: torch.Tensor, module: "pl.LightningModule") -> torch.Tensor:
        # Lightning divides each micro-batch's loss by accumulate_grad_batches; ZeRO averages the micro-steps of a
        # cycle itself (gradient_accumulation_steps), so the division is undone here rather than made twice.
        tensor = super().pre_backward(tensor, module)
        return tensor * self.accumulation if self.accumulation > 1 else tensor

    def optimizer_step(self, optimizer, model: "pl.LightningModule", closure: Callable[[], Any], **kwargs: Any) -> Any:
        rank = optimizer.rank
        if kwargs:
            raise TypeError(f"rank {rank}: ZeroStrategy: optimizer.step() takes no keyword arguments under ZeRO, got "
                            f"{sorted(kwargs)}")
        result = closure()
        self._after_closure(model, optimizer)
        if not optimizer.is_gradient_accumulation_boundary:
            # Lightning steps at the last batch of an epoch even mid-cycle, and after a training_step that returned
            # None (no backward); ZeRO would apply nothing and keep the gradients for the next cycle.
            steps = optimizer.config.gradient_accumulation_steps
            raise zero.ZeroStateError(
                f"rank {rank}: ZeroStrategy: Lightning stepped the optimizer before ZeRO's gradient-accumulation "
                f"boundary ({steps} backward pass(es) per step): an epoch whose batch count is not a multiple of "
                f"accumulate_grad_batches ({steps}), or a training_step that returned None; every rank must run a "
                f"backward on every batch")
        optimizer.step()
        return result

    def clip_gradients(self, optimizer, clip_val: Union[int, float] = 0.0, gradient_clip_algorithm=None) -> None:
        """Nothing: ZeRO clips in ``step``."""


def _read_config(config: Union[Mapping[str, Any], str, os.PathLike, None]) -> dict:
    return {} if config is None else zero.read_deepspeed_config(config, "ZeroStrategy: config")


class ZeroStrategy(DDPStrategy):
    """Lightning strategy that trains with ``zerocomm.zero`` (stages 0-3) on zerocomm's process group.

    Args:
        stage: the ZeRO stage, 0-3; None: the config's ``zero_optimization.stage``, else 2.
        config: a DeepSpeed-style config (dict, or the path of a JSON file): ``zero_optimization``, ``bf16`` /
            ``fp16``, ``optimizer`` and ``scheduler`` sections, ``gradient_clipping``, ...; every key means what
            ``zerocomm.zero.initialize`` makes of it (docs/deepspeed-config-keys.md).  ``gradient_accumulation_steps``
            is taken from the Trainer's ``accumulate_grad_batches`` and must not be set here.
        backend: zerocomm's backend ("gloo", "mpi", "nccl"); None: zerocomm's choice (see
            ``zerocomm.comm.init_process_group``).
        timeout: the process group's deadline (``datetime.timedelta`` or seconds); None: zerocomm's
            (``ZEROCOMM_TIMEOUT``, else 300 s).
        accelerator, parallel_devices, cluster_environment, precision_plugin: as for ``DDPStrategy`` (the Trainer
            fills them in).

    ``self.zero_optimizer`` is the ``ZeroOptimizer`` once ``fit`` has set up (``gathered_parameters()`` reads a
    stage 3 model's full parameters after training).  Every process of the job runs the Trainer.
    """

    strategy_name = "zerocomm"

    def __init__(self, stage: Optional[int] = None, config: Union[Mapping[str, Any], str, os.PathLike, None] = None,
                 *, backend: Optional[str] = None, timeout: Union[datetime.timedelta, float, None] = None,
                 accelerator: Optional["pl.accelerators.Accelerator"] = None,
                 parallel_devices: Optional[list] = None, cluster_environment=None,
                 precision_plugin: Optional[Precision] = None) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, precision_plugin=precision_plugin,
                         process_group_backend="zerocomm", timeout=None)
        config = _read_config(config)
        section = config.get("zero_optimization")
        if section is not None and not isinstance(section, Mapping):
            raise zero.ZeroConfigError(f"ZeroStrategy: zero_optimization must be a dict, got {section!r}")
        if stage is not None:
            if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
                raise zero.ZeroConfigError(f"ZeroStrategy: stage must be 0, 1, 2 or 3, got {stage!r}")
            given = (section or {}).get("stage", stage)
            if given != stage:
                raise zero.ZeroConfigError(f"ZeroStrategy: stage={stage} but the config's zero_optimization.stage is "
                                           f"{given!r}: give one of them")
            config["zero_optimization"] = {**(section or {}), "stage": stage}
        if "gradient_accumulation_steps" in config:
            raise zero.ZeroConfigError(
                f"ZeroStrategy: the config sets gradient_accumulation_steps ({config['gradient_accumulation_steps']!r}); "
                f"set Trainer(accumulate_grad_batches=...) instead, which the strategy passes to ZeRO")
        zero.as_config(config)  # every key checked now, before any process starts talking
        self._zero_config = config
        self._backend = backend
        self._zero_timeout = timeout
        self.zero_optimizer: Optional[zero.ZeroOptimizer] = None
        """The ``ZeroOptimizer`` Lightning steps, once ``fit`` has set up."""

    @property
    def process_group_backend(self) -> str:
        return "zerocomm"

    def reduce(self, tensor, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean"):
        """As ``DDPStrategy.reduce`` (``self.log(..., sync_dist=True)`` calls it), except that the mean of an integer
        tensor is a sum divided by the world size and truncated, as Lightning computes it on gloo: Lightning
        averages its integer batch counts, and zerocomm refuses an integer AVG (a mean that would truncate)."""
        mean = (reduce_op.lower() in ("mean", "avg") if isinstance(reduce_op, str)
                else reduce_op == torch.distributed.ReduceOp.AVG)
        if isinstance(tensor, torch.Tensor) and mean and not (tensor.is_floating_point() or tensor.is_complex()):
            total = super().reduce(tensor, group, reduce_op="sum")
            return total.copy_(total / torch.distributed.get_world_size(group))
        return super().reduce(tensor, group, reduce_op)

    # -- the process group ----------------------------------------------------------------------------
    def setup_environment(self) -> None:
        self._check_supported()
        super().setup_environment()  # the device, then setup_distributed

    def setup_distributed(self) -> None:
        """zerocomm's world (unless this process made it already); torch's default group then stands for it."""
        reset_seed()
        self.set_world_ranks()
        if dist.is_initialized():
            return
        assert self.cluster_environment is not None
        # As Lightning's own _init_dist_connection: its launcher and cluster environments publish the rendezvous
        # address through these variables (under torchrun they already hold the same values).
        os.environ["MASTER_ADDR"] = self.cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(self.cluster_environment.main_port)
        dist.init_process_group(self._backend, timeout=self._zero_timeout, rank=self.global_rank,
                                world_size=self.world_size)

    def _check_supported(self) -> None:
        """Refuse, naming it, what ZeroStrategy cannot honour; complete the config from the Trainer."""
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        plugin = self.precision_plugin
        if type(plugin) not in (Precision, _ZeroPrecision):
            raise zero.ZeroConfigError(
                f"ZeroStrategy: Trainer(precision={getattr(plugin, 'precision', '?')!r}) "
                f"({type(plugin).__name__}) is not supported: keep precision='32-true' and give ZeRO's config a "
                f"'bf16': {{'enabled': True}} or 'fp16' section (ZeRO keeps float32 masters and casts the inputs)")
        if trainer is None:
            return
        if trainer.state.fn != TrainerFn.FITTING:
            raise zero.ZeroConfigError(
                f"ZeroStrategy: Trainer.{trainer.state.fn.value}() is not supported, only fit(); for evaluation, "
                f"consolidate a checkpoint (zerocomm.zero.consolidate) and use another strategy")
        config = copy.deepcopy(self._zero_config)
        config["gradient_accumulation_steps"] = int(trainer.accumulate_grad_batches)
        clip = trainer.gradient_clip_val
        if clip:
            if trainer.gradient_clip_algorithm == "value":
                raise zero.ZeroConfigError("ZeroStrategy: Trainer(gradient_clip_algorithm='value') is not supported: "
                                           "ZeRO clips by the global L2 norm ('norm')")
            if config.get("gradient_clipping", clip) != clip:
                raise zero.ZeroConfigError(f"ZeroStrategy: Trainer(gradient_clip_val={clip}) but the config's "
                                           f"gradient_clipping is {config['gradient_clipping']}: give one of them")
            config["gradient_clipping"] = float(clip)
        zero.as_config(config)
        self._fit_config = config
        self.precision_plugin = _ZeroPrecision(config["gradient_accumulation_steps"])

    # -- setup: no DDP wrapper; ZeRO's optimizer ------------------------------------------------------
    def setup(self, trainer: "pl.Trainer") -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        if self._layer_sync:
            self.model = self._layer_sync.apply(self.model)
        self.model_to_device()
        module = self.lightning_module
        wrapper = _LightningStep(module)
        config = self._fit_config
        if (config.get("optimizer") or None) is not None:
            model_parameters, factory, self.lr_scheduler_configs = None, None, []
        else:
            model_parameters, factory, self.lr_scheduler_configs = self._optimizer_from_module(module)
        _, self.zero_optimizer = zero.initialize(wrapper, factory, config, model_parameters=model_parameters)
        self.model = wrapper
        self.optimizers = [self.zero_optimizer]
        self.setup_precision_plugin()

    def _optimizer_from_module(self, module: "pl.LightningModule"):
        """``configure_optimizers``'s optimizer handed to ZeRO (see the note on the optimizer Lightning built)."""
        optimizers, scheduler_configs = _init_optimizers_and_lr_schedulers(module)
        rank = self.global_rank
        if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer) or \
                type(optimizers[0]).__name__ == "_MockOptimizer":
            raise zero.ZeroConfigError(
                f"rank {rank}: ZeroStrategy: configure_optimizers must return one torch optimizer, got "
                f"{[type(o).__name__ for o in optimizers]}; or give the config an 'optimizer' section")
        optimizer = optimizers[0]
        if optimizer.state:
            raise zero.ZeroConfigError(f"rank {rank}: ZeroStrategy: the optimizer from configure_optimizers already "
                                       f"holds state for {len(optimizer.state)} parameters; return a fresh one")
        model_parameters = [{"params": list(group["params"])} for group in optimizer.param_groups]

        def factory(shard_groups: list) -> torch.optim.Optimizer:
            if len(shard_groups) != len(optimizer.param_groups):
                raise zero.ZeroConfigError(f"rank {rank}: ZeroStrategy: ZeRO made {len(shard_groups)} parameter "
                                           f"groups for the optimizer's {len(optimizer.param_groups)}")
            for group, shards in zip(optimizer.param_groups, shard_groups):
                group["params"] = shards["params"]
            return optimizer

        return model_parameters, factory, scheduler_configs

    def setup_optimizers(self, trainer: "pl.Trainer") -> None:
        """Nothing: ``setup`` builds the one optimizer, through ZeRO."""

    # -- checkpoints: ZeRO's sharded folder ------------------------------------------------------------
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the ZeroOptimizer must exist to load into

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # ZeRO's load restores the optimizer's shards

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Optional[Any] = None) -> None:
        """ZeRO's checkpoint folder at ``filepath`` (every rank calls it): each rank's shard, rank 0's manifest,
        and Lightning's ``checkpoint`` without its ``state_dict`` and ``optimizer_states`` (ZeRO holds them)."""
        if storage_options is not None:
            raise TypeError("ZeroStrategy: save_checkpoint(storage_options=...) is not supported: ZeRO writes its "
                            "own folder")
        filepath = self.broadcast(str(filepath))
        client_state = {key: value for key, value in checkpoint.items()
                        if key not in ("state_dict", "optimizer_states")}
        written = self.zero_optimizer.save(filepath, client_state=client_state)
        if self.is_global_zero:
            # Lightning overwrites a checkpoint path (ModelCheckpoint's last.ckpt): earlier steps saved at this
            # path are superseded once `latest` names the new one.
            for entry in Path(filepath).iterdir():
                if entry.is_dir() and _STEP_FOLDER.fullmatch(entry.name) and entry.name != written.name:
                    shutil.rmtree(entry, ignore_errors=True)

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict:
        """Load ZeRO's checkpoint folder (written at any world size) and return Lightning's state saved with it."""
        checkpoint_path = self.broadcast(str(checkpoint_path))
        if os.path.isfile(checkpoint_path):
            raise zero.CheckpointNotFoundError.at(
                checkpoint_path, "is a file, not a ZeroStrategy checkpoint folder; to start from another "
                "strategy's weights load them into the module before fit()", rank=self.global_rank)
        _, client_state = self.zero_optimizer.load(checkpoint_path)
        if not client_state:
            raise zero.CheckpointIncompatibleError.at(
                checkpoint_path, "holds no Lightning state: it was not written by ZeroStrategy (trainer.save_checkpoint)",
                rank=self.global_rank)
        return client_state

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Nothing: ZeRO's load restored the parameters and buffers."""

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Nothing: ZeRO's load restored the optimizer state."""

    def teardown(self) -> None:
        if isinstance(self.model, _LightningStep):
            self.model = self.lightning_module
        super().teardown()
