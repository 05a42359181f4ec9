"""``ZeroOptimizer``: one wrapper for every ZeRO stage, composed of parts the stage chooses.

The stage's row in ``STAGES`` (stages.py) names the classes of three parts, whose interfaces parts.py
declares; the wrapper owns the hooks, the gradient-accumulation boundary and the step, and calls the parts
in a fixed order:

* ``gradients`` (gradients.py, ``FullGradients`` or ``ShardedGradients``): where a bucket's gradients
  are copied, which collective reduces them, where the reduced elements this rank updates are;
* ``parameters`` (replicated.py ``ReplicatedParameters`` or sharded.py ``ShardedParameters``): where
  the parameters live, which elements this rank updates, what is gathered before use and after
  the step;
* ``optimizer_state`` (optimizer_state.py ``DeviceOptimizerState``; offload.py ``HostOptimizerState``,
  offload_nvme.py ``NvmeOptimizerState``): the float32 masters of those elements and the torch optimizer
  over them, beside the parameters, in host memory or in files.

One boundary step, in order::

    backward   hook per parameter -> bucket.add -> (bucket complete) parameters.before_reduce,
               bucket.launch (gradients.reduce), parameters.after_reduce_launch
    end        autograd's final callback: launch buckets still waiting for unused parameters,
               parameters.after_backward
    step       wait every bucket; optimizer_state.set_gradients(gradients.reduced(...));
               norm / overflow / clipping; optimizer_state.step; write_back; parameters.after_step

[Note: the gradient-accumulation boundary]
The optimizer counts backward passes: with ``gradient_accumulation_steps = k`` the k-th backward
after a step is the *boundary*.  Before it, the hooks do nothing and autograd accumulates into
``param.grad`` locally, so non-boundary micro-steps communicate nothing.  In the boundary backward
each hook copies the (accumulated) gradient into its bucket and frees ``param.grad``; a full
bucket launches its reduction at once.  ``step()`` and ``zero_grad()`` are no-ops before the
boundary, so the usual loop — ``loss.backward(); optimizer.step(); optimizer.zero_grad()`` on every
micro-batch — works unchanged, as does calling ``step()`` only every k micro-batches.  Gradients are
averaged over ranks (ReduceOp.AVG) and divided by k, so the user does not scale the loss.

[Note: why end-of-backward uses the autograd engine's callback]
The first hook of each backward queues a callback that runs when the whole backward has finished.
It counts the backward, and in a boundary backward it fills in parameters that received no gradient
(zeros, or what earlier micro-steps accumulated) and launches the buckets that are still waiting
for them, so a model with unused parameters cannot hang the other ranks.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import math
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
from torch import nn

from .. import comm as dist
from .checkpoint import load_checkpoint, save_checkpoint
from .config import ZeroConfig
from .errors import ZeroConfigError, ZeroStateError
from .gradients import BucketState, GradientBucket, tensor_bytes
from .optim_factory import build_optimizer
from .optimizer_state import OptimizerFactory
from .param_groups import param_groups_of
from .param_source import ParamSource, materialize
from .partition import flatten_params
from .precision import (LossScaler, cast_inputs, cast_module, clip_coefficient, compute_dtype,
                        global_sum_of_squares, scale_outputs)
from .schedulers import build_scheduler
from .stages import build_optimizer_state, plan_for
from .torch_state import load_rank_state, rank_state

log = logging.getLogger("zerocomm.zero")

__all__ = ["ZeroOptimizer", "BackwardTimeline", "OptimizerFactory", "managed_parameters", "tensor_bytes"]


@dataclasses.dataclass
class BackwardTimeline:
    """``time.perf_counter()`` stamps of the last boundary backward (for overlap checks)."""

    first_grad_s: Optional[float] = None
    """When the first gradient hook of the backward ran."""
    last_grad_s: Optional[float] = None
    """When the last gradient hook that completed a bucket ran (backward was still computing before it): the
    last hook of a backward in which every parameter got a gradient."""
    backward_end_s: Optional[float] = None
    """When the autograd engine finished the backward."""
    launches: list = dataclasses.field(default_factory=list)
    """(bucket index, launch time) in launch order."""


def step_algorithm(config: ZeroConfig, group, world_size: int, device: torch.device) -> Optional[str]:
    """The ``algorithm=`` of the collectives one training step runs.

    [Note: shared memory when every rank is local]
    On one host, gloo moves a bucket through loopback TCP (a copy into the kernel and one out, per
    step of the ring) and MPI through its own queues; zerocomm's "shm" algorithm reads the peers'
    buffers through one shared segment instead, at about twice the speed for ZeRO's bucket sizes
    (measured: docs/bench/zero.md), and skips the default cross-rank check, which costs a backend
    round trip per call.  So when the user left the choice open (``algorithm`` None or "auto", and no
    other process default), the group moves CPU tensors and every rank is on this host, the step's
    collectives use "shm"; otherwise the configured algorithm stands.
    """
    if config.algorithm not in (None, "auto") or not config.shared_memory or world_size == 1 or device.type != "cpu":
        return config.algorithm
    if config.algorithm is None and dist.get_default_algorithm() != "auto":
        return None  # the process default the user chose
    try:  # refused (UnsupportedError) when the ranks are on several hosts or the backend moves no CPU tensors
        dist.which_algorithm("reduce_scatter", torch.empty(world_size, device=device), dist.ReduceOp.AVG, group,
                             algorithm="shm")
    except dist.UnsupportedError:
        return config.algorithm
    return "shm"


def managed_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Parameters that require grad, each once (tied ones under their first name), in gradient-ready
    order: the reverse of registration order, which approximates the order backward produces them."""
    seen, named = set(), []
    for name, param in model.named_parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            named.append((name, param))
    return named[::-1]


def resolve_factory(optimizer_factory: Optional[OptimizerFactory], config: ZeroConfig) -> OptimizerFactory:
    """The factory to build the torch optimizer with: the one passed, or the config's ``optimizer`` section."""
    if optimizer_factory is not None and config.optimizer is not None:
        name = getattr(optimizer_factory, "__name__", optimizer_factory)
        raise ZeroConfigError(f"both an optimizer factory ({name!r}) "
                              f"and the config's optimizer section ({config.optimizer.type} {config.optimizer.params}) "
                              f"were given: remove one of them")
    if optimizer_factory is None:
        if config.optimizer is None:
            raise ZeroConfigError("no optimizer: pass an optimizer factory (param groups -> torch.optim.Optimizer) or "
                                  "give the config an optimizer section")
        return functools.partial(build_optimizer, config.optimizer)
    if not callable(optimizer_factory):
        raise ZeroConfigError(f"the optimizer factory must be callable (param groups -> optimizer), got "
                              f"{type(optimizer_factory).__name__}")
    return optimizer_factory


class ZeroOptimizer(torch.optim.Optimizer):
    """The ZeRO optimizer of every stage; built by ``zerocomm.zero.initialize``.

    Every rank of ``group`` constructs it (the initial parameters and buffers are broadcast from
    the group's rank 0), and every rank calls ``step`` the same number of times.  The parts are
    ``self.gradients``, ``self.parameters`` and ``self.optimizer_state``; ``self.plan`` is the row
    of the stage table they were chosen from.

    It is a ``torch.optim.Optimizer``: ``param_groups`` (one per parameter group, holding this rank's
    float32 master shards of that group and its hyperparameters), ``state``, ``defaults``,
    ``state_dict``/``load_state_dict`` and step hooks are those of the torch optimizer over the shards
    (``self.optimizer``), so changing a group's ``lr`` changes the next update and torch's
    learning-rate schedulers take this object.

    ``param_source`` (param_source.py): where the managed parameters' initial values are when the parameters
    do not hold them (a model built under ``zerocomm.deepspeed.zero.Init``); its values are taken as they are,
    and stage 3 reads them one unit at a time.
    """

    def __init__(self, model: nn.Module, optimizer_factory: Optional[OptimizerFactory], config: ZeroConfig,
                 group=None, *, model_parameters: Optional[Iterable] = None,
                 param_source: Optional[ParamSource] = None):
        self.model, self.config, self.group = model, config, group
        self.plan = plan_for(config)
        self.stage = int(self.plan.stage)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.dtype = compute_dtype(config)
        self.algorithm = config.algorithm
        """The algorithm of collectives outside the step (initial broadcast, checkpoints): the configured one."""
        named = managed_parameters(model)
        if not named:
            raise ZeroConfigError(f"rank {self.rank}: the model has no parameters that require grad")
        factory = resolve_factory(optimizer_factory, config)
        self.groups = param_groups_of(model, named, model_parameters, rank=self.rank)
        """The parameter groups: each managed parameter's group and each group's options (param_groups.py)."""
        self.step_algorithm = step_algorithm(config, group, self.world_size, named[0][1].device)
        """The algorithm of the step's collectives: "shm" when every rank shares this host (see ``step_algorithm``)."""
        if self.step_algorithm != config.algorithm:
            config = dataclasses.replace(config, algorithm=self.step_algorithm)  # what the parts read
        parameters_part = self.plan.parameters
        named, self.layouts, units = parameters_part.plan(model, named, config, self.world_size,
                                                          param_groups=self.groups.indices(named))
        self.param_names = [name for name, _ in named]
        self.params = [param for _, param in named]
        streamed = parameters_part.reads_source_by_unit and param_source is not None  # read one unit at a time
        if param_source is not None and not streamed:
            materialize(param_source, self.params)  # a part that holds every parameter holds them anyway
        if self.dtype != torch.float32:  # the rest of the module in the compute dtype, as DeepSpeed casts it
            cast_module(model, self.dtype, self.params)
        full32 = None if streamed else flatten_params(self.params, self.layouts, torch.float32)
        self._broadcast_initial_state(full32)
        self.parameters = parameters_part.build(self.params, self.layouts, units, full32, plan=self.plan,
                                                config=config, dtype=self.dtype, rank=self.rank, group=group,
                                                source=param_source if streamed else None)
        self._param_shards = [self.parameters.shard(layout) for layout in self.layouts]
        copies = None if self.dtype == torch.float32 else self.parameters.initial_masters(full32)
        bucket_groups = [layout.group for layout in self.layouts]
        grouped = lambda masters: factory(self.groups.shard_groups(masters, bucket_groups))  # noqa: E731
        self.optimizer_state = build_optimizer_state(self.plan.optimizer_state, self._param_shards, copies,
                                                     grouped, self.rank, config,
                                                     device=self.parameters.device,
                                                     param_store=self.parameters.store)
        del full32, copies
        # an offloading state starts copying (or writing) each bucket's reduced elements as soon as they are final
        on_reduced = self._on_reduced if self.optimizer_state.takes_reduced_buckets else None
        self.gradients = self.plan.gradients.build(self.layouts, plan=self.plan, config=config,
                                                   parameters=self.parameters, state=self.optimizer_state,
                                                   dtype=self.dtype, rank=self.rank, world_size=self.world_size,
                                                   group=group, on_reduced=on_reduced)
        self.buckets = self.gradients.buckets
        self.scaler = LossScaler(config) if config.precision == "fp16" else None
        self._position = {id(self.params[slot.index]): (layout.index, position)
                          for layout in self.layouts for position, slot in enumerate(layout.slots)}
        self._backwards = 0  # completed backward passes since the last boundary
        self._in_backward = False
        self._boundary = False
        self._reduced = False  # a boundary backward finished; step() has gradients to apply
        self.step_count = 0
        """Optimizer steps applied (skipped fp16 overflow steps not included)."""
        self.skipped_steps = 0
        """Steps skipped because fp16 gradients overflowed on some rank."""
        self.global_steps = 0
        """Steps at the accumulation boundary, applied or skipped (DeepSpeed's ``global_steps``)."""
        self.last_grad_norm: Optional[float] = None
        """Global L2 norm of the last step's gradients, when clipping or fp16 computed it."""
        self.timeline = BackwardTimeline()
        # One hook per parameter that knows its bucket and position: the hook's work is O(1) bytecodes and one copy.
        self._handles = [p.register_post_accumulate_grad_hook(functools.partial(self._grad_ready,
                                                                                *self._position[id(p)]))
                         for p in self.params]
        self._unmanaged = [p for p in model.parameters() if id(p) not in self._position]
        """Parameters outside ZeRO's care (frozen ones): what ``zero_grad`` clears."""
        if self.dtype != torch.float32:
            self._handles.append(model.register_forward_pre_hook(self._cast_inputs, with_kwargs=True))
        self._handles += self.parameters.install(model)
        if self.scaler is not None:
            self._handles.append(model.register_forward_hook(self._scale_outputs))
        self._become_torch_optimizer()
        self.lr_scheduler = build_scheduler(config.scheduler, self) if config.scheduler is not None else None
        """The learning-rate schedule ``step()`` advances after each applied update (the config's ``scheduler``;
        assign any object with ``step``/``state_dict``/``load_state_dict`` to have it stepped and checkpointed)."""

    def _become_torch_optimizer(self) -> None:
        """What ``torch.optim.Optimizer``'s own methods read: its hook tables and the step wrapper that runs
        them.  ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's (properties below), so
        nothing is copied and a torch scheduler's lr reaches the update.  torch's ``__init__`` is not called:
        it would make groups of its own."""
        for table in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                      "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, table, collections.OrderedDict())
        self._warned_capturable_if_run_uncaptured = True
        self._patch_step_function()

    # -- the parts' views -----------------------------------------------------------------------
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer over this rank's float32 master shards (one group per parameter group)."""
        return self.optimizer_state.optimizer

    @property
    def param_groups(self) -> list:
        """One dict per parameter group: ``"params"`` (this rank's master shards of the group) and its
        hyperparameters; the inner optimizer's own list, so a changed ``lr`` is the next update's."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        """The optimizer's state per master shard (Adam's moments of this rank's elements)."""
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict) -> None:
        raise ZeroConfigError("a ZeroOptimizer's parameter groups are fixed when it is built: pass every group in "
                              "initialize(model_parameters=[...])")

    def get_lr(self) -> list:
        """Each group's learning rate (DeepSpeed's ``get_lr``)."""
        return [group["lr"] for group in self.param_groups]

    def get_mom(self) -> list:
        """Each group's ``betas``, or its ``momentum`` for optimizers without betas (DeepSpeed's ``get_mom``)."""
        return [group.get("betas", group.get("momentum", 0.0)) for group in self.param_groups]

    @property
    def master(self) -> list:
        """This rank's float32 masters, one flat tensor per bucket."""
        return self.optimizer_state.masters

    @property
    def device(self) -> torch.device:
        """The parameters' device: where ZeRO's collectives run (offloaded masters and parameter shards may live
        elsewhere)."""
        return self.parameters.device

    def shard_bounds(self, layout) -> tuple[int, int]:
        """The bucket-relative element range of ``layout`` this rank's master holds."""
        return self.parameters.owned(layout)

    # -- construction -----------------------------------------------------------------------------
    def _broadcast_initial_state(self, full32: Optional[torch.Tensor]) -> None:
        """Every rank starts from rank 0's parameters and buffers, as torch DDP does (``full32`` None: the managed
        parameters came from a parameter source, equal on every rank already; buffers and the others still
        travel)."""
        if self.world_size == 1:
            return
        if full32 is not None:
            dist.broadcast(full32, group=self.group, group_src=0, algorithm=self.algorithm)
        managed = {id(p) for p in self.params}
        others = [p for p in self.model.parameters() if id(p) not in managed] + list(self.model.buffers())
        with torch.no_grad():
            for tensor in others:
                dist.broadcast(tensor.data, group=self.group, group_src=0, algorithm=self.algorithm)

    # -- forward hooks (mixed precision) --------------------------------------------------------
    def _cast_inputs(self, module, args, kwargs):
        return cast_inputs(args, self.dtype), cast_inputs(kwargs, self.dtype)

    def _scale_outputs(self, module, args, output):
        if torch.is_grad_enabled():
            return scale_outputs(output, self.scaler.scale)
        return None

    # -- backward hooks ---------------------------------------------------------------------------
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        self._grad_ready(*self._position[id(param)], param)

    def _grad_ready(self, bucket_index: int, position: int, param: torch.Tensor) -> None:
        """The post-accumulate-grad hook of the parameter at ``position`` of bucket ``bucket_index``."""
        if not self._in_backward:
            self._begin_backward()
        if not self._boundary:
            return  # a micro-step inside an accumulation cycle: autograd accumulates into param.grad
        bucket = self.buckets[bucket_index]
        complete = bucket.add(position, param.grad)
        param.grad = None  # the bucket holds it now
        if complete:
            # The last gradient of a backward completes its bucket: the time is taken once per bucket.
            self.timeline.last_grad_s = time.perf_counter()
            if self.config.overlap_comm:
                self._launch(bucket)

    def _begin_backward(self) -> None:
        boundary = self._backwards + 1 >= self.config.gradient_accumulation_steps
        if boundary:
            if self._reduced:
                raise ZeroStateError(
                    f"rank {self.rank}: backward() ran again after the gradient-accumulation boundary and before "
                    f"optimizer.step(); call step() after every {self.config.gradient_accumulation_steps} "
                    f"backward pass(es)")
            self.timeline = BackwardTimeline(first_grad_s=time.perf_counter())
            for bucket in self.buckets:
                bucket.begin()
        self._in_backward, self._boundary = True, boundary
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        self._in_backward = False
        if not self._boundary:
            self._backwards += 1
            return
        for bucket in self.buckets:  # parameters that got no gradient in this backward
            if bucket.state is not BucketState.EXPECTING:
                continue
            for position in sorted(bucket.pending):
                param = self.params[bucket.layout.slots[position].index]
                bucket.add(position, param.grad)
                param.grad = None
            self._launch(bucket)
        self.parameters.after_backward()
        self._backwards = 0
        self._reduced = True
        self.timeline.backward_end_s = time.perf_counter()

    def _on_reduced(self, layout) -> None:
        """A bucket's reduction was waited for: hand its reduced elements to an offloading optimizer state."""
        self.optimizer_state.gradient_ready(layout.index, self.gradients.reduced(layout), self._gradient_factor())

    def _gradient_factor(self) -> float:
        """What the reduced gradients are multiplied by before the step: 1 / micro-steps (and 1 / loss scale)."""
        factor = 1.0 / self.config.gradient_accumulation_steps
        return factor / self.scaler.scale if self.scaler is not None else factor

    def _launch(self, bucket: GradientBucket) -> None:
        index = bucket.layout.index
        self.parameters.before_reduce(index)
        bucket.launch()
        self.timeline.launches.append((index, bucket.launched_s))
        self.parameters.after_reduce_launch(index)

    # -- the step ---------------------------------------------------------------------------------
    @property
    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the last backward ended a cycle and ``step()`` will apply it."""
        return self._reduced

    def step(self, closure=None) -> bool:
        """Apply the reduced gradients; returns True when the update was applied, False when there was none: a
        call before the accumulation boundary (a no-op), or an fp16 step skipped for overflow.

        Every rank calls it.  fp16: a step whose gradients overflowed on any rank is skipped on
        every rank (``skipped_steps``) and the loss scale falls.  After an applied update the
        ``lr_scheduler`` advances; every boundary step counts toward ``steps_per_print``.
        """
        if closure is not None:
            raise ZeroConfigError("ZeRO optimizers do not take a closure: run forward and backward before step()")
        if not self._reduced:
            return False
        for bucket in self.buckets:
            bucket.wait()
        self.parameters.wait_all()  # a gather still in flight reads the chunk the optimizer is about to write
        grads = self.optimizer_state.set_gradients([self.gradients.reduced(layout) for layout in self.layouts],
                                                   self._gradient_factor())
        if self.config.gradient_clipping > 0 or self.scaler is not None:
            sumsq = global_sum_of_squares(grads, self.group, sharded=self.plan.shard_optimizer_state,
                                          algorithm=self.step_algorithm, device=self.device,
                                          world_size=self.world_size,
                                          partial=self.optimizer_state.streamed_sum_of_squares)
            if self.scaler is not None and not math.isfinite(sumsq):
                self.scaler.update(overflow=True)
                self.skipped_steps += 1
                self._end_step()
                self._after_boundary(applied=False)
                return False
            self.last_grad_norm = math.sqrt(sumsq)
            if self.config.gradient_clipping > 0:
                coefficient = clip_coefficient(self.last_grad_norm, self.config.gradient_clipping)
                if coefficient < 1.0:
                    self.optimizer_state.scale_gradients(coefficient)
        self.optimizer_state.step()
        if self.scaler is not None:
            self.scaler.update(overflow=False)
        self.optimizer_state.write_back(self._param_shards)
        self.parameters.after_step()
        self.step_count += 1
        self._end_step()
        self._after_boundary(applied=True)
        return True

    def _after_boundary(self, applied: bool) -> None:
        """DeepSpeed's order after a boundary step: the schedule advances after an applied update only; the
        progress line counts every boundary step."""
        if applied and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.global_steps += 1
        every = self.config.steps_per_print
        if every and self.global_steps % every == 0 and self.rank == 0:
            log.info("[Rank %d] step=%d, skipped=%d, lr=%s, mom=%s", dist.get_rank(), self.global_steps,
                     self.skipped_steps, self.get_lr(), self.get_mom())

    def _end_step(self) -> None:
        for bucket in self.buckets:
            bucket.reset()
        self.gradients.end_step()
        self.optimizer_state.clear_gradients()
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``param.grad`` of parameters outside ZeRO's care; a no-op for managed parameters
        (their gradients live in buckets and shards), and inside an accumulation cycle."""
        if self._backwards:
            return
        for param in self._unmanaged:
            if param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.zero_()

    # -- access outside forward -------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered_parameters(self, modifier_rank: Optional[int] = None, params: Optional[Iterable] = None
                            ) -> Iterator[None]:
        """The model's full parameters are readable inside the block (every rank enters it; stage 3
        gathers them, stages 1-2 wait for the post-step all_gather).  With ``modifier_rank``, that
        rank's values at the end of the block are broadcast and become everyone's parameters and
        float32 masters (DeepSpeed's ``GatheredParameters(modifier_rank=...)``); without it, stage 3
        discards changes.  ``params``: stage 3 gathers only the units holding these parameters (every
        rank passes the same ones); other stages hold every parameter and ignore it."""
        units = None if params is None else [self._position[id(p)][0] for p in params if id(p) in self._position]
        with self.parameters.gathered(modifier_rank, self.optimizer_state, units):
            yield

    @property
    def at_step_boundary(self) -> bool:
        """True between ``step()`` and the next backward: no gradients are accumulated or pending."""
        return not self._backwards and not self._reduced

    def refresh_parameters(self) -> None:
        """Write the float32 masters into the model's parameters and wait until every rank's are in
        place (after the masters were changed outside ``step``, e.g. by loading a checkpoint)."""
        self.parameters.wait_all()
        self.optimizer_state.write_back(self._param_shards)
        self.parameters.after_step()
        self.parameters.wait_all()

    def synchronize(self) -> None:
        """Wait for the post-step parameter all_gather, so the model's parameters are current."""
        self.parameters.wait_all()

    def save(self, path, client_state: Optional[dict] = None) -> Path:
        """Write a sharded checkpoint under ``path`` (every rank calls it; see checkpoint.py): parameters,
        optimizer state, counters, loss scale, the ``lr_scheduler``'s state, the model's buffers and frozen
        parameters, and ``client_state`` (anything ``torch.save`` takes; rank 0's is kept).  Returns its folder."""
        return save_checkpoint(self, path, client_state=client_state)

    def load(self, path) -> tuple[Path, Optional[dict]]:
        """Restore a checkpoint written at any world size (every rank calls it; see checkpoint.py), buffers,
        frozen parameters and the ``lr_scheduler``'s state included.  Returns ``(folder, client_state)``, as
        DeepSpeed's ``load_checkpoint`` does."""
        return load_checkpoint(self, path)

    def state_dict(self) -> dict:
        """This rank's state: torch's ``"state"`` and ``"param_groups"`` over its master shards, and ``"zero"``
        (its float32 masters, counters, loss scaler and ``lr_scheduler`` state).  Tensors are the live ones, as
        in torch (``copy.deepcopy`` or ``torch.save`` to keep a snapshot); ``load_state_dict`` takes it back
        on the same rank of a group of the same size (``save``/``load`` reshard)."""
        return rank_state(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what ``state_dict`` returned on this rank; every rank calls it (the parameters are written
        back from the masters and gathered)."""
        load_rank_state(self, state_dict)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    # -- inspection -------------------------------------------------------------------------------
    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of model state this rank holds now: ``params`` (the parameters' storage and parameters
        outside ZeRO), ``grads`` (gradient buffers and shards, plus any ``param.grad`` an accumulation
        cycle holds), ``optimizer_state`` (float32 master copies and the optimizer's state tensors),
        ``buffers`` (the model's buffers)."""
        self.parameters.wait_all()
        params = self.parameters.nbytes() + self._unmanaged_param_bytes()
        grads = self.gradients.nbytes(self.buckets) + sum(tensor_bytes(p.grad) for p in self.params)
        # fp32 masters are views of the parameters' storage: counted under params, not twice.
        storages = {shard.untyped_storage().data_ptr() for shard in self._param_shards}
        buffers = sum(tensor_bytes(b) for b in self.model.buffers())
        return {"params": params, "grads": grads, "optimizer_state": self.optimizer_state.nbytes(storages),
                "buffers": buffers}

    def memory_report(self) -> dict[str, dict[str, int]]:
        """Where each byte of model state lives: ``{part: {"device": b, "host": b, "disk": b}}`` for ``params``,
        ``grads``, ``optimizer_state`` (masters that are not the parameters' storage, the optimizer's state,
        offload buffers) and ``buffers``.  "device" is the parameters' device when it is an accelerator;
        for CPU models parameters, gradients and in-memory state count as "host"."""
        states = self.model_state_bytes()
        where = "host" if self.device.type == "cpu" else "device"
        report = {part: {"device": 0, "host": 0, "disk": 0} for part in states}
        for part in ("grads", "buffers"):
            report[part][where] = states[part]
        report["params"] = self.parameters.placement(where)  # offloaded parameter shards: host memory, files
        report["params"][where] += self._unmanaged_param_bytes()
        streamed = self.optimizer_state.gradient_placement()  # gradients a state streamed to files
        report["grads"] = {key: report["grads"][key] + streamed[key] for key in streamed}
        report["optimizer_state"] = self.optimizer_state.placement(where)
        return report

    def _unmanaged_param_bytes(self) -> int:
        """Bytes of the model's parameters outside ZeRO's care (frozen ones: every rank keeps them whole)."""
        return sum(tensor_bytes(p) for p in self.model.parameters() if id(p) not in self._position)

    def remove_hooks(self) -> None:
        """Detach every hook from the model (the parameters stay views of ZeRO's buffers)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __repr__(self) -> str:
        return (f"ZeroOptimizer(stage {self.stage}, rank {self.rank} of {self.world_size}, {len(self.layouts)} "
                f"buckets, {sum(layout.numel for layout in self.layouts)} parameters, {self.config.precision})")
