"""What every ZeRO stage shares: flat parameters, backward hooks, accumulation, the step.

A stage subclass says only where gradients go and how they are reduced (``_acquire``,
``_reduce``, ``_shard_grad``, ``_shard_bounds``), what happens after the optimizer's step
(``_after_step``) and what it holds (``_grad_bytes``).  See stage0.py, stage1.py, stage2.py.

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

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from .. import comm as dist
from .bucket import GradientBucket
from .checkpoint import load_checkpoint, save_checkpoint
from .config import ZeroConfig
from .errors import ZeroConfigError, ZeroStateError
from .partition import BucketLayout, bind_params, bucket_view, flatten_params, plan_buckets
from .precision import (LossScaler, cast_inputs, clip_coefficient, compute_dtype, global_sum_of_squares,
                        scale_outputs)

#: ``optimizer_factory(params) -> torch.optim.Optimizer``, called with this rank's float32 master shards.
OptimizerFactory = Callable[[list], torch.optim.Optimizer]


@dataclasses.dataclass
class BackwardTimeline:
    """``time.perf_counter()`` stamps of the last boundary backward (for overlap checks)."""

    first_grad_s: Optional[float] = None
    """When the first gradient hook of the backward ran."""
    last_grad_s: Optional[float] = None
    """When the last gradient hook of the backward ran (backward was still computing before it)."""
    backward_end_s: Optional[float] = None
    """When the autograd engine finished the backward."""
    launches: list = dataclasses.field(default_factory=list)
    """(bucket index, launch time) in launch order."""


def tensor_bytes(tensor: Optional[torch.Tensor]) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def managed_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Parameters that require grad, each once (tied ones under their first name), in gradient-ready
    order: the reverse of registration order, which approximates the order backward produces them."""
    seen, named = set(), []
    for name, param in model.named_parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            named.append((name, param))
    return named[::-1]


class ZeroOptimizer:
    """Base of the ZeRO stages; built by ``zerocomm.zero.initialize``.

    Every rank of ``group`` constructs it (the initial parameters and buffers are broadcast from
    the group's rank 0), and every rank calls ``step`` the same number of times.
    """

    stage: int = -1
    persistent_buckets: bool = True
    """Whether gradient buckets keep their buffer between steps (views of a full gradient buffer)."""

    def __init__(self, model: nn.Module, optimizer_factory: OptimizerFactory, config: ZeroConfig, group=None):
        self.model = model
        self.config = config
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.dtype = compute_dtype(config)
        self.algorithm = config.algorithm
        named = managed_parameters(model)
        if not named:
            raise ZeroConfigError(f"rank {self.rank}: the model has no parameters that require grad")
        self.param_names = [name for name, _ in named]
        self.params = [param for _, param in named]
        self.layouts: list[BucketLayout] = self._plan([(name, tuple(p.shape)) for name, p in named])
        full32 = flatten_params(self.params, self.layouts, torch.float32)
        self._broadcast_initial_state(full32)
        self._place_parameters(full32)
        self.master = [self._make_master(layout, full32) for layout in self.layouts]
        del full32
        self.optimizer = self._build_optimizer(optimizer_factory)
        self.scaler = LossScaler(config) if config.precision == "fp16" else None
        self.buckets = [GradientBucket(layout, acquire=self._acquire, reduce=self._reduce,
                                       persistent=self.persistent_buckets, rank=self.rank)
                        for layout in self.layouts]
        self._position = {id(self.params[slot.index]): (layout.index, position)
                          for layout in self.layouts for position, slot in enumerate(layout.slots)}
        self._backwards = 0  # completed backward passes since the last boundary
        self._in_backward = False
        self._boundary = False
        self._reduced = False  # a boundary backward finished; step() has gradients to apply
        self.step_count = 0
        """Optimizer steps applied (skipped fp16 overflow steps not included)."""
        self.skipped_steps = 0
        self.last_grad_norm: Optional[float] = None
        """Global L2 norm of the last step's gradients, when clipping or fp16 computed it."""
        self.timeline = BackwardTimeline()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.params]
        self._handles.append(model.register_forward_pre_hook(self._before_forward, with_kwargs=True))
        if self.scaler is not None:
            self._handles.append(model.register_forward_hook(self._after_forward))

    # -- what a stage provides --------------------------------------------------------------
    def _plan(self, named_shapes: list) -> list[BucketLayout]:
        return plan_buckets(named_shapes, self.config.reduce_bucket_numel, self.world_size,
                            self.config.shard_alignment)

    def _shard_bounds(self, layout: BucketLayout) -> tuple[int, int]:
        """The bucket-relative range this rank's optimizer updates."""
        raise NotImplementedError

    def _place_parameters(self, full32: torch.Tensor) -> None:
        """Give the parameters their storage: here one flat buffer of the compute dtype, every
        parameter a view of it (stage 3 keeps only a shard between uses)."""
        self.flat = full32 if self.dtype == torch.float32 else full32.to(self.dtype)
        bind_params(self.params, self.layouts, self.flat)

    def _param_shard(self, layout: BucketLayout) -> torch.Tensor:
        """The parameter elements of ``_shard_bounds(layout)``, in the parameters' own storage."""
        lo, hi = self._shard_bounds(layout)
        return bucket_view(self.flat, layout)[lo:hi]

    def _param_bytes(self) -> int:
        """Bytes of the managed parameters' storage on this rank now."""
        return tensor_bytes(self.flat)

    def _acquire(self, layout: BucketLayout) -> torch.Tensor:
        raise NotImplementedError

    def _reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        raise NotImplementedError

    def _shard_grad(self, layout: BucketLayout) -> torch.Tensor:
        """The reduced gradient of ``_shard_bounds(layout)`` (valid once the bucket's reduction is done)."""
        raise NotImplementedError

    def _after_step(self) -> None:
        """Bring the updated master values back into the model's parameters."""
        raise NotImplementedError

    def _grad_bytes(self) -> int:
        raise NotImplementedError

    def _copy_masters_back(self) -> None:
        """Mixed precision: round the updated float32 masters into the parameters' storage (fp32
        masters are that storage already)."""
        if self.dtype != torch.float32:
            with torch.no_grad():
                for layout, master in zip(self.layouts, self.master):
                    self._param_shard(layout).copy_(master.detach())

    # -- construction -----------------------------------------------------------------------
    def _broadcast_initial_state(self, full32: torch.Tensor) -> None:
        """Every rank starts from rank 0's parameters and buffers, as torch DDP does."""
        if self.world_size == 1:
            return
        dist.broadcast(full32, group=self.group, group_src=0, algorithm=self.algorithm)
        managed = {id(p) for p in self.params}
        others = [p for p in self.model.parameters() if id(p) not in managed] + list(self.model.buffers())
        with torch.no_grad():
            for tensor in others:
                dist.broadcast(tensor.data, group=self.group, group_src=0, algorithm=self.algorithm)

    def _make_master(self, layout: BucketLayout, full32: torch.Tensor) -> nn.Parameter:
        """This rank's float32 master of ``layout``: a view of the parameters themselves in fp32 (no
        copy), a float32 copy otherwise."""
        if self.dtype == torch.float32:
            return nn.Parameter(self._param_shard(layout))
        lo, hi = self._shard_bounds(layout)
        return nn.Parameter(bucket_view(full32, layout)[lo:hi].clone())

    def _build_optimizer(self, factory: OptimizerFactory) -> torch.optim.Optimizer:
        optimizer = factory(list(self.master))
        if not hasattr(optimizer, "step") or not hasattr(optimizer, "param_groups"):
            raise ZeroConfigError(f"optimizer_factory must return a torch.optim.Optimizer, got "
                                  f"{type(optimizer).__name__}")
        given = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if given != {id(m) for m in self.master}:
            raise ZeroConfigError(f"rank {self.rank}: optimizer_factory must build its optimizer over exactly the "
                                  f"{len(self.master)} master shards it is given, got {len(given)} other tensors")
        return optimizer

    # -- model hooks ------------------------------------------------------------------------
    def _before_forward(self, module, args, kwargs):
        self._wait_for_parameters()
        if self.dtype != torch.float32:
            return cast_inputs(args, self.dtype), cast_inputs(kwargs, self.dtype)
        return None

    def _after_forward(self, module, args, output):
        if torch.is_grad_enabled():
            return scale_outputs(output, self.scaler.scale)
        return None

    def _wait_for_parameters(self) -> None:
        """Stages that gather parameters after the step wait here (stage 0 has nothing to wait for)."""

    # -- backward hooks ---------------------------------------------------------------------
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._in_backward:
            self._begin_backward()
        if not self._boundary:
            return
        now = time.perf_counter()
        if self.timeline.first_grad_s is None:
            self.timeline.first_grad_s = now
        self.timeline.last_grad_s = now
        bucket_index, position = self._position[id(param)]
        bucket = self.buckets[bucket_index]
        complete = bucket.add(position, param.grad)
        param.grad = None  # stage 2 keeps no full-size gradient; stages 0-1 hold it in their buffer
        if complete and self.config.overlap_comm:
            self._launch(bucket)

    def _begin_backward(self) -> None:
        boundary = self._backwards + 1 >= self.config.gradient_accumulation_steps
        if boundary:
            if self._reduced:
                raise ZeroStateError(
                    f"rank {self.rank}: backward() ran again after the gradient-accumulation boundary and before "
                    f"optimizer.step(); call step() after every {self.config.gradient_accumulation_steps} "
                    f"backward pass(es)")
            self.timeline = BackwardTimeline()
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
            if bucket.state != "filling":
                continue
            for position in sorted(bucket.pending):
                param = self.params[bucket.layout.slots[position].index]
                bucket.add(position, param.grad)
                param.grad = None
            self._launch(bucket)
        self._backwards = 0
        self._reduced = True
        self.timeline.backward_end_s = time.perf_counter()

    def _launch(self, bucket: GradientBucket) -> None:
        bucket.launch()
        self.timeline.launches.append((bucket.layout.index, bucket.launched_s))

    # -- the step ---------------------------------------------------------------------------
    @property
    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the last backward ended a cycle and ``step()`` will apply it."""
        return self._reduced

    def step(self, closure=None) -> None:
        """Apply the reduced gradients; a no-op before the accumulation boundary.

        Every rank calls it.  fp16: a step whose gradients overflowed on any rank is skipped on
        every rank (``skipped_steps``) and the loss scale falls.
        """
        if closure is not None:
            raise ZeroConfigError("ZeRO optimizers do not take a closure: run forward and backward before step()")
        if not self._reduced:
            return None
        for bucket in self.buckets:
            if bucket.state == "launched":
                bucket.wait()
        factor = 1.0 / self.config.gradient_accumulation_steps
        if self.scaler is not None:
            factor /= self.scaler.scale
        for layout, master in zip(self.layouts, self.master):
            grad = self._shard_grad(layout)
            if grad.dtype == master.dtype:
                if factor != 1.0:
                    grad.mul_(factor)
                master.grad = grad
            else:
                master.grad = grad.to(master.dtype).mul_(factor)
        if self.config.gradient_clipping > 0 or self.scaler is not None:
            sumsq = global_sum_of_squares([m.grad for m in self.master], self.group, sharded=self.stage > 0,
                                          algorithm=self.algorithm)
            if self.scaler is not None and not math.isfinite(sumsq):
                self.scaler.update(overflow=True)
                self.skipped_steps += 1
                self._end_step()
                return None
            self.last_grad_norm = math.sqrt(sumsq)
            if self.config.gradient_clipping > 0:
                coefficient = clip_coefficient(self.last_grad_norm, self.config.gradient_clipping)
                if coefficient < 1.0:
                    for master in self.master:
                        master.grad.mul_(coefficient)
        self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update(overflow=False)
        self._after_step()
        self.step_count += 1
        self._end_step()
        return None

    def _end_step(self) -> None:
        for bucket in self.buckets:
            bucket.reset()
        if self.dtype != torch.float32:
            for master in self.master:
                master.grad = None  # the float32 gradient copy lives only during the step
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``param.grad`` of parameters outside ZeRO's care; a no-op for managed parameters
        (their gradients live in buckets and shards), and inside an accumulation cycle."""
        if self._backwards:
            return
        for param in self.model.parameters():
            if id(param) not in self._position and param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.zero_()

    @contextlib.contextmanager
    def gathered_parameters(self, modifier_rank: Optional[int] = None) -> Iterator[None]:
        """The model's full parameters are readable inside the block (every rank enters it; stage 3
        gathers them, stages 0-2 wait for the post-step all_gather).  With ``modifier_rank``, that
        rank's values at the end of the block are broadcast and become everyone's parameters and
        float32 masters (DeepSpeed's ``GatheredParameters(modifier_rank=...)``)."""
        self._wait_for_parameters()
        yield
        if modifier_rank is not None:
            dist.broadcast(self.flat, group=self.group, group_src=modifier_rank, algorithm=self.algorithm)
            with torch.no_grad():
                for layout, master in zip(self.layouts, self.master):
                    if master.dtype != self.dtype:
                        master.copy_(self._param_shard(layout))

    @property
    def at_step_boundary(self) -> bool:
        """True between ``step()`` and the next backward: no gradients are accumulated or pending."""
        return not self._backwards and not self._reduced

    def shard_bounds(self, layout: BucketLayout) -> tuple[int, int]:
        """The bucket-relative element range of ``layout`` this rank's master holds."""
        return self._shard_bounds(layout)

    def refresh_parameters(self) -> None:
        """Write the float32 masters into the model's parameters and wait until every rank's are in
        place (after the masters were changed outside ``step``, e.g. by loading a checkpoint)."""
        self._after_step()
        self._wait_for_parameters()

    def save(self, path) -> Path:
        """Write a sharded checkpoint under ``path`` (every rank calls it; see checkpoint.py)."""
        return save_checkpoint(self, path)

    def load(self, path) -> Path:
        """Restore a checkpoint written at any world size (every rank calls it; see checkpoint.py)."""
        return load_checkpoint(self, path)

    def synchronize(self) -> None:
        """Wait for the post-step parameter all_gather, so the model's parameters are current."""
        self._wait_for_parameters()

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups

    # -- inspection -------------------------------------------------------------------------
    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of model state this rank holds now: ``params`` (the flat parameter buffer and
        parameters outside ZeRO), ``grads`` (gradient buffers and shards, plus any ``param.grad`` an
        accumulation cycle holds), ``optimizer_state`` (float32 master copies and the optimizer's
        state tensors), ``buffers`` (the model's buffers)."""
        self._wait_for_parameters()
        managed = set(self._position)
        params = self._param_bytes() + sum(tensor_bytes(p) for p in self.model.parameters()
                                               if id(p) not in managed)
        grads = self._grad_bytes() + sum(tensor_bytes(p.grad) for p in self.params)
        # fp32 masters are views of the parameters' storage: counted under params, not twice.
        aliased = {self._param_shard(layout).untyped_storage().data_ptr() for layout in self.layouts}
        seen, optimizer_state = set(), 0
        candidates = list(self.master) + [value for state in self.optimizer.state.values()
                                          for value in state.values() if isinstance(value, torch.Tensor)]
        for tensor in candidates:
            if tensor.untyped_storage().data_ptr() in aliased or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            optimizer_state += tensor_bytes(tensor)
        buffers = sum(tensor_bytes(b) for b in self.model.buffers())
        return {"params": params, "grads": grads, "optimizer_state": optimizer_state, "buffers": buffers}

    def remove_hooks(self) -> None:
        """Detach every hook from the model (the parameters stay views of the flat buffer)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank {self.rank} of {self.world_size}, {len(self.layouts)} buckets, "
                f"{sum(layout.numel for layout in self.layouts)} parameters, {self.config.precision})")

