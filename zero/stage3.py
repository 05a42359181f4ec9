"""Stage 3: parameters sharded too; each unit is gathered just before it computes, released after.

Per rank between steps, fp32: parameter shard 4Φ/N + gradient shard 4Φ/N + optimizer state 8Φ/N
(the master is the parameter shard itself), plus the persistent unit's full parameters.  Mixed
precision: 2Φ/N + 2Φ/N + 12Φ/N.

Life of a unit (see units.py for what a unit is) in one step::

    forward pre-hook     all_gather its full parameters (or wait for the prefetch);
                         prefetch the next unit(s) of the recorded forward order
    forward post-hook    release (free the full buffer's storage); hook its outputs so that
    pre-backward hook    ... the gradient reaching them gathers the unit again, and prefetches
                         the unit before it in forward order
    last gradient hook   the unit's bucket is full: reduce-scatter it into the gradient shard
                         and release the unit
    step                 the optimizer updates the shard in place; the persistent unit is
                         all-gathered (the others are gathered by the next forward)

Traffic per step: 3Φ·(N−1)/N elements (all_gather in forward and in backward, reduce_scatter).

[Note: release frees the storage, not the tensors]
Parameters are views of their unit's full buffer.  Releasing resizes the buffer's storage to zero
bytes and gathering resizes it back before the all_gather writes it, so views saved by autograd
in forward (``weight.t()``) see the gathered values again in backward.  Between uses the
parameters hold no data: read them through ``optimizer.gathered_parameters()``.

[Note: ranks that take different paths]
Every rank must gather and reduce the same units in the same order, or the collectives pair up
wrongly and hang.  With ``ZeroConfig.debug`` each gather and reduction first exchanges (unit,
phase) across ranks and raises ``ZeroStateError`` naming both ranks and their units at the
first divergence.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from .. import comm as dist
from .bucket import InflightBuckets, release_storage
from .errors import ZeroStateError
from .optimizer import ZeroOptimizer, tensor_bytes
from .partition import BucketLayout, bucket_view, layout_groups, shard_numel, slot_views
from .units import plan_units

_PHASES = {"forward": 0, "backward": 1, "reduce": 2, "gather": 3}


class Stage3Optimizer(ZeroOptimizer):
    """Parameter, gradient and optimizer-state shards; units gathered around their compute."""

    stage = 3
    persistent_buckets = False

    def __init__(self, model, optimizer_factory, config, group=None):
        self._inflight = InflightBuckets(config.max_inflight_buckets)
        self._order: list[int] = []  # units in the order of the first forward
        self._order_known = False
        self._position_in_order: dict[int, int] = {}
        super().__init__(model, optimizer_factory, config, group)
        self._grad_shard = torch.zeros(shard_numel(self.layouts), dtype=self.dtype, device=self.shard.device)
        self.live_numel = 0
        """Elements of non-persistent units gathered (or being gathered) now."""
        self.peak_live_numel = 0
        self.prefetches = 0
        """Gathers started ahead of the unit that needed them."""
        self._unit_of_module = {id(plan.module): u for u, plan in enumerate(self.units) if not plan.persistent}
        root_unit = self._unit_of_module.get(id(model))
        self._root_unit = root_unit
        for u, plan in enumerate(self.units):
            if plan.persistent:
                continue
            if plan.module is not model:
                self._handles.append(plan.module.register_forward_pre_hook(self._unit_pre_forward(u)))
            self._handles.append(plan.module.register_forward_hook(self._unit_post_forward(u)))
        self._handles.append(model.register_forward_hook(self._after_root_forward))

    # -- layout and storage -----------------------------------------------------------------
    def _plan(self, named_shapes: list) -> list[BucketLayout]:
        plans = plan_units(self.model, list(zip(self.param_names, self.params)),
                           self.config.stage3_param_persistence_threshold)
        order = [i for plan in plans for i in plan.param_indices]
        self.params = [self.params[i] for i in order]
        self.param_names = [self.param_names[i] for i in order]
        self.units = plans
        groups = [[(self.param_names[k], tuple(self.params[k].shape))
                   for k in range(start, start + len(plan.param_indices))]
                  for plan, start in zip(plans, _starts(plans))]
        return layout_groups(groups, self.world_size, self.config.shard_alignment)

    def _shard_bounds(self, layout: BucketLayout) -> tuple[int, int]:
        return layout.chunk_bounds(self.rank)

    def _place_parameters(self, full32: torch.Tensor) -> None:
        self.shard = torch.empty(shard_numel(self.layouts), dtype=self.dtype, device=full32.device)
        self.full: list[torch.Tensor] = []
        self._state: list[str] = []  # per unit: "released", "gathering", "gathered"
        self._gathers: dict[int, tuple] = {}  # unit -> (Work, staging buffer or None)
        self._staged = self._collectives_pin_storage(full32.device)
        with torch.no_grad():
            for layout in self.layouts:
                lo, hi = layout.shard_bounds()
                clo, chi = layout.chunk_bounds(self.rank)
                self.shard[lo:hi].copy_(bucket_view(full32, layout)[clo:chi])
                full = bucket_view(full32, layout).to(self.dtype, copy=True)
                for slot, view in zip(layout.slots, slot_views(full, layout)):
                    self.params[slot.index].data = view
                self.full.append(full)
                self._state.append("gathered")
        for u, plan in enumerate(self.units):
            if not plan.persistent:
                self._free(u)

    def _collectives_pin_storage(self, device) -> bool:
        """Whether a collective on a tensor leaves its storage unresizable (a backend that hands its
        library ``Tensor.numpy()`` views pins the storage; zerocomm's own backends do not, so this only
        guards other backends).  Then units gather into a staging buffer and copy,
        because a pinned full buffer could never be released."""
        probe = torch.zeros(self.world_size, dtype=self.dtype, device=device)
        dist.all_gather_into_tensor(probe, probe[self.rank:self.rank + 1].clone(), group=self.group,
                                    algorithm=self.algorithm)
        return not probe.untyped_storage().resizable()

    def _param_shard(self, layout: BucketLayout) -> torch.Tensor:
        lo, hi = layout.shard_bounds()
        return self.shard[lo:hi]

    def _param_bytes(self) -> int:
        return tensor_bytes(self.shard) + sum(full.untyped_storage().nbytes() for full in self.full)

    # -- gather and release -----------------------------------------------------------------
    def _check_path(self, unit: int, phase: str) -> None:
        """Debug mode: every rank must be at the same (unit, phase); raise naming both ranks if not."""
        if not self.config.debug or self.world_size == 1:
            return
        mine = torch.tensor([unit, _PHASES[phase]], dtype=torch.int64)
        everyone = torch.empty(2 * self.world_size, dtype=torch.int64)
        dist.all_gather_into_tensor(everyone, mine, group=self.group, algorithm=self.algorithm)
        pairs = everyone.view(self.world_size, 2).tolist()
        for other, (their_unit, their_phase) in enumerate(pairs):
            if (their_unit, their_phase) != (unit, _PHASES[phase]):
                names = {v: k for k, v in _PHASES.items()}
                raise ZeroStateError(
                    f"ranks diverged: rank {self.rank} is at {phase} of unit {unit} ({self.units[unit].name!r}) "
                    f"while rank {other} is at {names[their_phase]} of unit {their_unit} "
                    f"({self.units[their_unit].name!r}); every rank must run the same units in the same order")

    def _free(self, u: int) -> None:
        self.full[u].untyped_storage().resize_(0)
        self._state[u] = "released"

    def _start_gather(self, u: int, phase: str) -> None:
        if self._state[u] != "released":
            return
        self._check_path(u, phase)
        full, layout = self.full[u], self.layouts[u]
        target = torch.empty_like(full) if self._staged else full
        if not self._staged and full.untyped_storage().nbytes() == 0:
            full.untyped_storage().resize_(full.numel() * full.element_size())
        lo, hi = layout.shard_bounds()
        work = dist.all_gather_into_tensor(target, self.shard[lo:hi], group=self.group, async_op=True,
                                           algorithm=self.algorithm)
        self._gathers[u] = (work, target if self._staged else None)
        self._state[u] = "gathering"
        if not self.units[u].persistent:
            self.live_numel += layout.padded_numel
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel)

    def _gather(self, u: int, phase: str) -> None:
        """Make unit ``u``'s full parameters present (every rank calls it for the same unit)."""
        self._start_gather(u, phase)
        self._finish_gather(u)

    def _finish_gather(self, u: int) -> None:
        if self._state[u] != "gathering":
            return
        work, staging = self._gathers.pop(u)
        work.wait()
        if staging is not None:
            full = self.full[u]
            if full.untyped_storage().nbytes() == 0:
                full.untyped_storage().resize_(full.numel() * full.element_size())
            with torch.no_grad():
                full.copy_(staging)
            release_storage(staging)
        self._state[u] = "gathered"

    def _release(self, u: int) -> None:
        if self.units[u].persistent or self._state[u] == "released":
            return
        if self._state[u] == "gathering":
            self._gathers.pop(u)[0].wait()
        self._free(u)
        self.live_numel -= self.layouts[u].padded_numel

    def _prefetch(self, after: int, direction: int, phase: str) -> None:
        """Start gathering the units that follow ``after`` in the recorded order (``direction`` -1: backward),
        up to ``stage3_prefetch_bucket_numel`` elements and while ``stage3_max_live_parameters`` allows."""
        if not self._order_known or after not in self._position_in_order:
            return
        position, budget = self._position_in_order[after] + direction, self.config.stage3_prefetch_bucket_numel
        while 0 <= position < len(self._order) and budget > 0:
            u = self._order[position]
            size = self.layouts[u].padded_numel
            if self._state[u] == "released":
                if self.live_numel > self.config.stage3_max_live_parameters:
                    return
                self._start_gather(u, phase)
                self.prefetches += 1
            budget -= size
            position += direction

    # -- hooks ------------------------------------------------------------------------------
    def _wait_for_parameters(self) -> None:
        for u, plan in enumerate(self.units):
            if plan.persistent:
                self._finish_gather(u)

    def _before_forward(self, module, args, kwargs):
        result = super()._before_forward(module, args, kwargs)
        if self._root_unit is not None:
            self._enter_unit(self._root_unit)
        return result

    def _enter_unit(self, u: int) -> None:
        if not self._order_known and u not in self._order:
            self._order.append(u)
        self._gather(u, "forward")
        self._prefetch(u, +1, "forward")

    def _unit_pre_forward(self, u: int):
        def hook(module, args):
            self._enter_unit(u)
        return hook

    def _unit_post_forward(self, u: int):
        def hook(module, args, output):
            tensors = [t for t in _tensors(output) if t.requires_grad]
            if torch.is_grad_enabled() and tensors:
                torch.autograd.graph.register_multi_grad_hook(tensors, lambda grads: self._pre_backward(u),
                                                              mode="any")
            self._release(u)
        return hook

    def _after_root_forward(self, module, args, output):
        """The forward is over: the first one fixes the prefetch order; only the persistent unit stays."""
        if not self._order_known:
            self._order_known = True
            self._position_in_order = {unit: i for i, unit in reversed(list(enumerate(self._order)))}
        for u in range(len(self.units)):
            self._release(u)

    def _pre_backward(self, u: int) -> None:
        self._gather(u, "backward")
        self._prefetch(u, -1, "backward")

    def _launch(self, bucket) -> None:
        u = bucket.layout.index
        self._check_path(u, "reduce")
        super()._launch(bucket)
        self._release(u)  # every use of the unit in this backward has produced its gradient

    def _end_backward(self) -> None:
        super()._end_backward()
        for u in range(len(self.units)):
            self._release(u)

    # -- gradients (as stage 2, one bucket per unit) ----------------------------------------
    def _acquire(self, layout: BucketLayout) -> torch.Tensor:
        self._inflight.make_room()
        return torch.empty(layout.padded_numel, dtype=self.dtype, device=self.shard.device)

    def _reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        self._inflight.add(self.buckets[layout.index])
        lo, hi = layout.shard_bounds()
        return dist.reduce_scatter_tensor(self._grad_shard[lo:hi], buffer, op=dist.ReduceOp.AVG, group=self.group,
                                          async_op=True, algorithm=self.algorithm)

    def _shard_grad(self, layout: BucketLayout) -> torch.Tensor:
        lo, hi = layout.shard_bounds()
        return self._grad_shard[lo:hi]

    def _end_step(self) -> None:
        self._inflight.clear()
        super()._end_step()

    def _after_step(self) -> None:
        self._copy_masters_back()
        for u, plan in enumerate(self.units):
            if plan.persistent:
                self._state[u] = "released"  # its storage stays allocated; the gather refreshes it
                self._start_gather(u, "gather")
        if not self.config.overlap_comm:
            self._wait_for_parameters()

    def _grad_bytes(self) -> int:
        return tensor_bytes(self._grad_shard) + sum(tensor_bytes(bucket.buffer) for bucket in self.buckets)

    # -- access outside forward -------------------------------------------------------------
    @contextlib.contextmanager
    def gathered_parameters(self, modifier_rank: Optional[int] = None) -> Iterator[None]:
        """Gather every unit for the duration of the block (every rank enters it).

        With ``modifier_rank``, that rank's parameter values at the end of the block are broadcast
        and written into every rank's shard (and float32 master), as DeepSpeed's
        ``GatheredParameters(modifier_rank=...)``; otherwise changes are discarded.
        """
        self._wait_for_parameters()
        for u in range(len(self.units)):
            self._gather(u, "gather")
        try:
            yield
        finally:
            if modifier_rank is not None:
                self._write_back(modifier_rank)
            for u in range(len(self.units)):
                self._release(u)

    def _write_back(self, modifier_rank: int) -> None:
        with torch.no_grad():
            for u, layout in enumerate(self.layouts):
                # A staged optimizer never hands its full buffers to a collective (it would pin them).
                values = self.full[u].clone() if self._staged else self.full[u]
                dist.broadcast(values, group=self.group, group_src=modifier_rank, algorithm=self.algorithm)
                clo, chi = layout.chunk_bounds(self.rank)
                self._param_shard(layout).copy_(values[clo:chi])
                if self.master[u].dtype != self.dtype:
                    self.master[u].data.copy_(self._param_shard(layout))


def _starts(plans) -> list[int]:
    starts, total = [], 0
    for plan in plans:
        starts.append(total)
        total += len(plan.param_indices)
    return starts


def _tensors(output) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
