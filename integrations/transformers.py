"""``ZeroTrainer``: Hugging Face's ``transformers.Trainer`` with zerocomm's ZeRO as its optimizer.

    import zerocomm.comm as dist
    from zerocomm.integrations.transformers import ZeroTrainer

    dist.init_process_group()        # under torchrun; torch's default group becomes zerocomm's world
    trainer = ZeroTrainer(model=model, args=TrainingArguments(...), train_dataset=data,
                          zero_config="ds_config.json")   # the DeepSpeed config you gave Trainer(deepspeed=...)
    trainer.train()                   # or train(resume_from_checkpoint=True), at any world size
    trainer.save_model("final")       # a consolidated model: GPT2LMHeadModel.from_pretrained("final")

Every ``Trainer`` argument is taken; ``zero_config`` is a DeepSpeed config dict or the path of its JSON file.
Its ``"auto"`` values are filled from the ``TrainingArguments`` as Hugging Face's DeepSpeed integration fills
them (``fill_auto_values``), its other keys are read by ``zerocomm.zero`` (see docs/deepspeed-config-keys.md).
Importing this module imports transformers; nothing else in zerocomm does.

[Note: which seams of Trainer are overridden]
The training loop is Trainer's own; ZeroTrainer replaces only what ZeRO changes:

* ``create_optimizer``: ``zerocomm.zero.initialize`` builds the optimizer, from the config's ``optimizer``
  section or else from the Trainer's own choice (``args.optim`` or ``optimizer_cls_and_kwargs``, with the
  Trainer's grouping of parameters with and without weight decay); the config's ``scheduler`` section rides
  along.  The model stays the same module: ZeRO's hooks reduce its gradients.
* ``_wrap_model``: for training the model goes through ``accelerator.prepare_model(model,
  device_placement=False, evaluation_mode=True)`` (``torch.compile`` if asked, no DistributedDataParallel);
  accelerate then takes it as prepared and wraps only the optimizer.  This is the least invasive seam:
  overriding ``_prepare_for_training`` would copy a hundred lines of Trainer, and an ``Accelerator`` subclass
  would replace accelerate's state handling.
* ``create_scheduler``: the Trainer's scheduler (when the config has none) is built over the ZeroOptimizer and
  handed to it, so every schedule is stepped by ``ZeroOptimizer.step`` after an applied update (an fp16 step
  skipped for overflow does not advance it) and saved in ZeRO's checkpoint; the Trainer holds a view of it
  whose ``step()`` does nothing.
* ``_build_accelerator_args``: accelerate's mixed precision is off; the config's ``bf16``/``fp16`` (filled
  from ``--bf16``/``--fp16``) casts the model and keeps float32 masters instead.
* ``_clip_grad_norm`` / ``_get_grad_norm``: clipping is ZeRO's (``gradient_clipping``, filled from
  ``max_grad_norm``; a float64 norm over the shards); the logged ``grad_norm`` is the norm ZeRO computed in
  that step (absent when neither clipping nor fp16 asks ZeRO to compute one).
* ``set_initial_training_values``: refuses an epoch whose last accumulation cycle would be partial (see
  [Note: gradient accumulation]).
* ``_save_optimizer_and_scheduler`` / ``_load_optimizer_and_scheduler`` / ``_load_best_model``: ZeRO's sharded
  checkpoint in ``checkpoint-N/zero/`` (``ZeroOptimizer.save``/``load``: loads at any world size), instead of
  ``optimizer.pt`` and ``scheduler.pt``; ``_load_from_checkpoint`` loads the weights file into the gathered
  parameters when ZeRO already holds them.
* ``save_model``: writes the full model (stage 3 gathers its shards) with ``save_pretrained``, so
  ``from_pretrained`` loads it.

[Note: gradient accumulation]
With ``gradient_accumulation_steps = k`` the Trainer divides each micro-batch's loss by k (or normalizes it by the
tokens of the whole accumulated batch) and sums the gradients; ZeRO also averages over its k micro-steps.  A
forward hook on the model passes its outputs through an identity whose gradient is multiplied by k, so the
two divisions do not compound: the update is the one DDP would make, whatever ``compute_loss`` does with the
outputs.  ZeRO ends a cycle after k backward passes; an epoch of n micro-batches with n % k != 0 would end on a
partial cycle, which ZeRO cannot close early, so that is refused before training starts.
"""
from __future__ import annotations

import copy
import math
import os
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from .. import comm as dist
from .. import zero

__all__ = ["ZeroTrainer", "ZERO_CHECKPOINT", "load_zero_config", "fill_auto_values", "finalize_auto_values"]

ZERO_CHECKPOINT = "zero"
"""The folder of a Trainer checkpoint (``checkpoint-N/``) that holds ZeRO's sharded checkpoint."""

_ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop")
"""torch.optim classes whose update of each element reads only that element's gradient and state, so they
update ZeRO's flat shards as they would the whole parameters."""
_LAUNCHER_VARIABLES = ("WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "PMI_FD",
                       "PMI_PORT")
"""Set by torchrun or an MPI launcher: ``init_process_group()`` then finds the job's ranks."""
_NOT_PER_UPDATE = ("reduce_lr_on_plateau", "greedy")
"""Trainer schedules stepped with an evaluation metric rather than once per update."""


def load_zero_config(zero_config: Union[Mapping[str, Any], str, os.PathLike]) -> dict:
    """A private copy of ``zero_config``: a DeepSpeed config dict, or the path of its JSON file."""
    return zero.read_deepspeed_config(zero_config, "zero_config")


class _AutoFiller:
    """Hugging Face's ``HfTrainerDeepSpeedConfig.fill_match``: replace an ``"auto"`` value with the Trainer's, or
    note a mismatch between a written value and the Trainer's (reported all at once by ``raise_mismatches``)."""

    def __init__(self, config: dict):
        self.config = config
        self.mismatches: list[str] = []

    def _node(self, path: str) -> tuple[Optional[dict], str]:
        *parents, key = path.split(".")
        node = self.config
        for parent in parents:
            node = node.get(parent)
            if not isinstance(node, dict):
                return None, key  # the section is absent: nothing to fill or check, as in Hugging Face's
        return node, key

    def fill_match(self, path: str, value: Any, trainer_key: str, must_match: bool = True) -> None:
        node, key = self._node(path)
        if node is None:
            return
        if node.get(key) == "auto":
            node[key] = value
            return
        written = node.get(key)
        if must_match and written is not None and _comparable(written) != _comparable(value):
            self.mismatches.append(f"- ds {path}={written} vs hf {trainer_key}={value}")

    def fill_only(self, path: str, value: Any) -> None:
        self.fill_match(path, value, "", must_match=False)

    def raise_mismatches(self) -> None:
        if self.mismatches:
            listed = "\n".join(self.mismatches)
            raise zero.ZeroConfigError(
                f"the zero_config values below mismatch the TrainingArguments:\n{listed}\nSet them to \"auto\" to "
                f"take the Trainer's, or change the TrainingArguments.")


def _comparable(value: Any) -> Any:
    return [_comparable(v) for v in value] if isinstance(value, (list, tuple)) else value


def fill_auto_values(config: dict, args: TrainingArguments, world_size: int) -> list[str]:
    """Fill ``config``'s ``"auto"`` values known when the Trainer is built, in place, key for key as Hugging
    Face's ``HfTrainerDeepSpeedConfig.trainer_config_process``; returns the mismatches found (lines of text).

    ``world_size``: the data-parallel ranks (``train_batch_size`` = micro-batch x accumulation x ranks).  A
    ``--bf16``/``--fp16`` run whose config has no such section gets ``{"enabled": true}``, as accelerate's
    DeepSpeed plugin adds it."""
    filler = _AutoFiller(config)
    filler.fill_match("train_micro_batch_size_per_gpu", args.per_device_train_batch_size,
                      "per_device_train_batch_size")
    filler.fill_match("gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps")
    filler.fill_match("train_batch_size", world_size * args.per_device_train_batch_size *
                      args.gradient_accumulation_steps, "train_batch_size (calculated)")
    filler.fill_match("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    filler.fill_match("optimizer.params.lr", args.learning_rate, "learning_rate")
    filler.fill_match("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
    filler.fill_match("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    filler.fill_match("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    filler.fill_only("scheduler.params.warmup_min_lr", 0)  # not a Trainer argument
    filler.fill_match("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    for section, enabled in (("fp16", bool(args.fp16 or args.fp16_full_eval)),
                             ("bf16", bool(args.bf16 or args.bf16_full_eval))):
        if enabled and section not in config and (section != "bf16" or "bfloat16" not in config):
            config[section] = {"enabled": True}
        filler.fill_match(f"{section}.enabled", enabled, f"{section}|{section}_full_eval")
    return filler.mismatches


def finalize_auto_values(config: dict, args: TrainingArguments, num_training_steps: int,
                         mismatches: Optional[list] = None) -> None:
    """Fill the values known once training starts (``trainer_config_finalize``: the schedule's
    ``total_num_steps`` and ``warmup_num_steps``), in place, and raise one ``ZeroConfigError`` listing every
    mismatch, ``mismatches`` (from ``fill_auto_values``) included.  The hidden-size bucket keys are
    resolved by ``zerocomm.zero`` from the model's ``config.hidden_size``."""
    filler = _AutoFiller(config)
    filler.mismatches = list(mismatches or [])
    filler.fill_match("scheduler.params.total_num_steps", num_training_steps, "num_training_steps (calculated)")
    filler.fill_match("scheduler.params.warmup_num_steps", max(1, args.get_warmup_steps(num_training_steps)),
                      "warmup_steps")
    filler.raise_mismatches()


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (see [Note: gradient accumulation])."""

    @staticmethod
    def forward(ctx, tensor, factor):
        ctx.factor = factor
        return tensor.clone()  # a view could be modified in place (compute_loss scales the loss with *=)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _scale_gradients(output, factor: float):
    """``output`` with each floating tensor that requires grad passed through ``_ScaleGradient``; dict-like
    outputs (a ``ModelOutput``) are updated in place, so their type and fields stay."""
    if isinstance(output, torch.Tensor):
        return _ScaleGradient.apply(output, factor) if output.requires_grad and output.is_floating_point() \
            else output
    if isinstance(output, Mapping) and hasattr(output, "__setitem__"):
        for key in list(output.keys()):
            output[key] = _scale_gradients(output[key], factor)
        return output
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return type(output)(*(_scale_gradients(item, factor) for item in output))
    if isinstance(output, (tuple, list)):
        return type(output)(_scale_gradients(item, factor) for item in output)
    return output


class _ScheduleView:
    """What the Trainer holds as ``lr_scheduler`` while the ZeroOptimizer steps the real one.

    ``step()`` does nothing (``ZeroOptimizer.step`` already advanced the schedule after an applied update);
    ``get_last_lr()`` gives the learning rates the last update ran with, as a plain Trainer logs them;
    ``state_dict``/``load_state_dict`` are the schedule's (ZeRO's checkpoint saves them too)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._lrs = [group["lr"] for group in optimizer.param_groups]
        self._hook = optimizer.register_step_pre_hook(self._note_lrs)

    def _note_lrs(self, optimizer, args, kwargs) -> None:
        self._lrs = [group["lr"] for group in optimizer.param_groups]

    @property
    def schedule(self):
        return self.optimizer.lr_scheduler

    def step(self, *args, **kwargs) -> None:
        pass

    def get_last_lr(self) -> list:
        return list(self._lrs)

    def state_dict(self) -> dict:
        return self.schedule.state_dict() if self.schedule is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.schedule is not None:
            self.schedule.load_state_dict(state)

    def remove(self) -> None:
        self._hook.remove()


class ZeroTrainer(Trainer):
    """A ``transformers.Trainer`` whose model is trained with zerocomm's ZeRO (stages 0-3).

    Takes every ``Trainer`` argument plus ``zero_config``: a DeepSpeed config dict or the path of its JSON
    file (what ``TrainingArguments(deepspeed=...)`` took).  Every rank of the job builds it and calls the same
    methods (``train``, ``save_model``, ``evaluate``), as with any distributed Trainer.  When
    ``zerocomm.comm`` has no process group yet, it makes one: under a launcher (torchrun, mpiexec) with
    ``init_process_group()``, otherwise a world of one.

    Refused, with ``zerocomm.zero.ZeroConfigError`` (a ``ValueError``) naming the argument: ``args.deepspeed``
    or ``args.fsdp`` (another sharding engine), ``optimizers=`` with built objects (ZeRO builds the optimizer
    over its shards: use ``optimizer_cls_and_kwargs`` or the config's optimizer section), an optimizer whose
    update is not elementwise, ``auto_find_batch_size``, ``fp16_full_eval``/``bf16_full_eval``, schedules
    stepped with a metric (``reduce_lr_on_plateau``, ``greedy``), and config keys zerocomm does not implement
    (named by ``zerocomm.zero``).

    ``zero_optimizer``: the ``ZeroOptimizer`` once training has started (None before).
    """

    def __init__(self, *args, zero_config: Union[Mapping[str, Any], str, os.PathLike, None] = None, **kwargs):
        if zero_config is None:
            raise TypeError("ZeroTrainer needs zero_config: a DeepSpeed config dict or the path of its JSON file")
        self._zero_source = load_zero_config(zero_config)
        optimizers = kwargs.get("optimizers", (None, None))
        if optimizers is not None and any(item is not None for item in optimizers):
            raise zero.ZeroConfigError(
                "ZeroTrainer builds the optimizer over ZeRO's shards itself: pass optimizer_cls_and_kwargs=(cls, "
                "kwargs), or give zero_config an optimizer (and scheduler) section, instead of optimizers=")
        _ensure_world()
        self.zero_optimizer: Optional[zero.ZeroOptimizer] = None
        self._grad_norm: Optional[torch.Tensor] = None
        self._hooks: list = []
        self._schedule_view: Optional[_ScheduleView] = None
        self._owns_schedule = False
        super().__init__(*args, **kwargs)
        _refuse_unsupported_arguments(self.args)
        if self.args.world_size != dist.get_world_size():
            raise zero.ZeroConfigError(
                f"the Trainer's data-parallel world has {self.args.world_size} rank(s) and zerocomm's "
                f"{dist.get_world_size()}: on a machine without GPUs the Trainer runs several processes only with "
                f"TrainingArguments(use_cpu=True); and both must come from one launch (call "
                f"zerocomm.comm.init_process_group() before building the TrainingArguments)")
        self._mismatches = fill_auto_values(self._zero_source, self.args, self.args.world_size)
        self.zero_config_dict = copy.deepcopy(self._zero_source)
        """The DeepSpeed config in use: every ``"auto"`` filled once training has started (before, the schedule's
        step counts may still be ``"auto"``)."""

    # -- the accelerator: no mixed precision of its own, no DDP ---------------------------------------------
    def _build_accelerator_args(self, **kwargs) -> dict:
        built = super()._build_accelerator_args(**kwargs)
        built["mixed_precision"] = "no"  # the config's bf16/fp16 casts the model; autocast or a GradScaler would
        return built                     # run on top of it

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader=None) -> nn.Module:
        if not training or model is not self.model:
            return super()._wrap_model(model, training, dataloader)
        # ZeRO's hooks reduce the gradients: no DDP.  Marking the model prepared here makes accelerate's
        # prepare(model, optimizer) that follows keep it as it is and wrap only the optimizer.  No device
        # placement: the Trainer placed the model before ZeRO made its parameters views of ZeRO's buffers, and
        # a .to("cpu:0") of CPU parameters would copy them out of those buffers.
        return self.accelerator.prepare_model(model, device_placement=False, evaluation_mode=True)

    # -- optimizer and schedule ------------------------------------------------------------------------------
    def zero_config_for(self, num_training_steps: int) -> zero.ZeroConfig:
        """The ``ZeroConfig`` training runs with for ``num_training_steps`` optimizer steps (every ``"auto"``
        filled; one ``ZeroConfigError`` listing every mismatch with the TrainingArguments)."""
        config = copy.deepcopy(self._zero_source)
        finalize_auto_values(config, self.args, num_training_steps, self._mismatches)
        self.zero_config_dict = config
        return zero.as_config(config, world_size=dist.get_world_size(), model=self.model)

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """Build the ``ZeroOptimizer`` (once; again after ``model_init`` replaced the model)."""
        if self.optimizer is not None:
            return self.optimizer
        model = self.model if model is None else model
        config = self.zero_config_for(max(int(self.state.max_steps), 1))
        factory = parameters = None
        if config.optimizer is None:  # the Trainer's choice, with its weight-decay groups
            cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, model)
            _check_elementwise(cls, kwargs, self.args)

            def factory(groups, cls=cls, kwargs=dict(kwargs)):
                return cls(groups, **kwargs)

            decay = set(self.get_decay_parameter_names(model))
            named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
            parameters = [group for group in (
                {"params": [p for name, p in named if name in decay], "weight_decay": self.args.weight_decay},
                {"params": [p for name, p in named if name not in decay], "weight_decay": 0.0}) if group["params"]]
        self._remove_hooks()
        self._owns_schedule = False
        _, optimizer = zero.initialize(model, factory, config, model_parameters=parameters)
        self.zero_optimizer = self.optimizer = optimizer
        self._hooks.append(optimizer.register_step_post_hook(self._note_grad_norm))
        if config.gradient_accumulation_steps > 1:
            factor = float(config.gradient_accumulation_steps)
            self._hooks.append(model.register_forward_hook(
                lambda module, args, output: _scale_gradients(output, factor) if torch.is_grad_enabled() else None))
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The config's schedule, or else the Trainer's (``args.lr_scheduler_type``) built over the
        ZeroOptimizer; either is stepped by ``ZeroOptimizer.step`` and the Trainer holds a ``_ScheduleView``."""
        if self.lr_scheduler is not None:
            return self.lr_scheduler
        zopt = self.zero_optimizer
        if zopt is None:
            raise zero.ZeroStateError("ZeroTrainer.create_scheduler() before create_optimizer()")
        if zopt.lr_scheduler is None or self._owns_schedule:
            zopt.lr_scheduler = None
            schedule = super().create_scheduler(num_training_steps, optimizer=zopt)
            zopt.lr_scheduler, self._owns_schedule = schedule, True
        if self._schedule_view is not None:
            self._schedule_view.remove()
        self.lr_scheduler = self._schedule_view = _ScheduleView(zopt)
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def set_initial_training_values(self, args, dataloader):
        values = super().set_initial_training_values(args, dataloader)
        _, updates_per_epoch, _, _, _, micro_batches, max_steps = values
        k = args.gradient_accumulation_steps
        if micro_batches % k and max_steps >= updates_per_epoch:
            raise zero.ZeroConfigError(
                f"an epoch has {micro_batches} micro-batches per rank, not a multiple of gradient_accumulation_steps "
                f"({k}): its last accumulation cycle would have {micro_batches % k}, and ZeRO closes a cycle after "
                f"{k} backward passes only; choose the dataset size, per_device_train_batch_size or "
                f"gradient_accumulation_steps so that they divide, or stop within the first epoch (max_steps < "
                f"{updates_per_epoch})")
        return values

    def _note_grad_norm(self, optimizer, args, kwargs) -> None:
        if self._grad_norm is not None and optimizer.last_grad_norm is not None:
            self._grad_norm.fill_(optimizer.last_grad_norm)

    def _clip_grad_norm(self, model):
        return None  # ZeroOptimizer.step clips to the config's gradient_clipping (filled from max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        config = self.zero_optimizer.config if self.zero_optimizer is not None else None
        if config is None or not (config.gradient_clipping > 0 or config.precision == "fp16"):
            self._grad_norm = None
            return None  # ZeRO computes no norm in this step
        # Called before optimizer.step(), logged after it: the step's post-hook fills this tensor in.
        self._grad_norm = torch.full((), math.nan, dtype=torch.float64)
        return self._grad_norm

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Every rank writes its shard of ZeRO's checkpoint (optimizer state, float32 masters, schedule) under
        ``output_dir/zero``."""
        self.zero_optimizer.save(os.path.join(output_dir, ZERO_CHECKPOINT))

    def _load_optimizer_and_scheduler(self, checkpoint: Optional[str]) -> None:
        """Restore ZeRO's checkpoint from ``checkpoint/zero``, written at any world size (every rank calls it)."""
        if checkpoint is None:
            return
        folder = os.path.join(checkpoint, ZERO_CHECKPOINT)
        if not os.path.isdir(folder):
            raise zero.CheckpointNotFoundError(
                f"rank {dist.get_rank()}: {checkpoint} has no ZeRO checkpoint ({ZERO_CHECKPOINT}/): it was not "
                f"written by ZeroTrainer; load its weights with from_pretrained and train from there",
                rank=dist.get_rank(), file=folder)
        self.zero_optimizer.load(folder)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Optional[nn.Module] = None) -> None:
        if self.zero_optimizer is None:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        # ZeRO holds the parameters (stage 3: only shards): load the weights into the gathered parameters on
        # rank 0, which ZeRO then broadcasts into every rank's shards and masters.
        with self.zero_optimizer.gathered_parameters(modifier_rank=0):
            if dist.get_rank() == 0:
                super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        if self.zero_optimizer is None:
            return super()._load_best_model()
        self._load_optimizer_and_scheduler(self.state.best_model_checkpoint)

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False) -> None:
        """Write the full model with ``save_pretrained`` (loadable with ``from_pretrained``); every rank calls it
        (stage 3 gathers the parameters from every rank's shard), the writing rank writes."""
        if self.zero_optimizer is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = self.args.output_dir if output_dir is None else output_dir
        with self.zero_optimizer.gathered_parameters():
            self._save(output_dir, state_dict=self.model.state_dict() if self.args.should_save else None)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)


def _ensure_world() -> None:
    """zerocomm's default group: the caller's, or one made here (the launcher's ranks, else a world of one)."""
    if dist.is_initialized():
        return
    if any(name in os.environ for name in _LAUNCHER_VARIABLES):
        dist.init_process_group()
    else:
        dist.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)


def _refuse_unsupported_arguments(args: TrainingArguments) -> None:
    refused = {
        "deepspeed": (args.deepspeed, "ZeroTrainer is the ZeRO engine: pass the DeepSpeed config as zero_config"),
        "fsdp": (args.fsdp, "FSDP shards the model another way: use zero_config's stage 3"),
        "auto_find_batch_size": (args.auto_find_batch_size, "ZeRO's buckets are built for one batch size"),
        "fp16_full_eval": (args.fp16_full_eval, "it casts the model ZeRO manages; the config's fp16 covers eval"),
        "bf16_full_eval": (args.bf16_full_eval, "it casts the model ZeRO manages; the config's bf16 covers eval"),
    }
    for name, (value, why) in refused.items():
        if value:
            raise zero.ZeroConfigError(f"ZeroTrainer does not take TrainingArguments.{name}={value!r}: {why}")
    if str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)) in _NOT_PER_UPDATE:
        raise zero.ZeroConfigError(
            f"ZeroTrainer does not take lr_scheduler_type={args.lr_scheduler_type!r}: ZeRO steps the schedule once "
            f"per applied update, and this one is stepped with an evaluation metric")
    if args.n_gpu > 1:
        raise zero.ZeroConfigError(f"ZeroTrainer needs one device per process (n_gpu is {args.n_gpu}): start one "
                                   f"process per GPU with torchrun")


def _check_elementwise(cls, kwargs: Mapping, args: TrainingArguments) -> None:
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls.__module__.startswith("torch.optim")
            and cls.__name__ in _ELEMENTWISE) or {"params", "model", "optimizer_dict"} & set(kwargs):
        raise zero.ZeroConfigError(
            f"ZeroTrainer cannot shard the optimizer {getattr(cls, '__name__', cls)!r} (optim={args.optim!r}): ZeRO "
            f"updates flat shards of parameters, which gives the same result only for the elementwise torch.optim "
            f"classes {list(_ELEMENTWISE)}; choose one (optim='adamw_torch', 'sgd', ...) or give zero_config an "
            f"optimizer section")
