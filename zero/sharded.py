"""Sharded parameters: a rank keeps only its shard; each unit is gathered around its use (stage 3).

A *unit* (units.py) is a module whose parameters form one bucket.  Life of a unit in one step::

    forward pre-hook     all_gather its full parameters (or wait for the prefetch); prefetch
                         the next units of the recorded forward order
    forward post-hook    release (free the full buffer's storage); hook its outputs so that
    pre-backward hook    ... the gradient reaching them gathers the unit again, and prefetches
                         the units before it in forward order
    reduction launched   every use of the unit in this backward produced its gradient: release
    step                 the optimizer updates the shard in place; the persistent unit is
                         all-gathered (the others are gathered by the next forward)

Prefetching looks ``stage3_prefetch_depth`` units ahead (and at most
``stage3_prefetch_bucket_numel`` elements), and stops while more than
``stage3_max_live_parameters`` gathered elements are live.

The shard itself lives in a *store* (offload_param.py): beside the model, in host memory beside a CUDA
model, or in files (``offload_param``).  Each gather takes its input from ``store.fetch(unit)``, and the
unit after the prefetched ones is read ahead, so a store in files is read while earlier units compute.

[Note: release frees the storage, not the tensors]
Parameters are views of their unit's full buffer.  Releasing resizes the buffer's storage to zero
bytes and gathering resizes it back before the all_gather writes it, so views saved by autograd
in forward (``weight.t()``) see the gathered values again in backward.  Between uses the
parameters hold no data: read them through ``optimizer.gathered_parameters()``.

[Note: the root unit]
The model's own unit (its parameters outside every ``ModuleList``/``Sequential`` child: embeddings, the
final norm, the head) runs first in forward and first in backward, which ends by reducing its gradients
last.  So when a backward follows the forward (grad enabled), it is not released after the forward and
not gathered again in backward: one all_gather of the root fewer per step, and the first backward
prefetch (from the root to the last unit of forward) starts at once.  Traffic per step is therefore
3Φ·(N−1)/N minus the root unit's share of one gather.  A grad-enabled forward that is never followed by
a backward keeps the root gathered until the next backward ends.

[Note: ranks that take different paths]
Every rank must gather and reduce the same units in the same order, or the collectives pair up
wrongly and hang.  With ``ZeroConfig.debug`` each gather and reduction first exchanges (unit,
phase) across ranks and raises ``ZeroStateError`` naming both ranks and their units at the
first divergence.
"""
from __future__ import annotations

import contextlib
import enum
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from .. import comm as dist
from .config import ZeroConfig
from .errors import ZeroStateError
from .gradients import release_storage, tensor_bytes
from .offload_param import build_param_store
from .partition import BucketLayout, layout_groups, slot_views
from .parts import ParametersPart, ParamStore
from .units import plan_units, split_units_by_group
from .zeropp import build_unit_gathers

_PHASES = {"forward": 0, "backward": 1, "reduce": 2, "gather": 3}


class UnitState(enum.Enum):
    RELEASED = "released"
    GATHERING = "gathering"
    GATHERED = "gathered"


class ShardedParameters(ParametersPart):
    """This rank's parameter shard (one chunk of every unit); units gathered just before they compute.

    Args:
        params: the managed parameters, in layout order (see ``plan``).
        layouts: one bucket per unit.
        units: the ``UnitPlan`` of each bucket.
        full32: the flat float32 values, equal on every rank (only this rank's chunks are kept); None when
            ``source`` gives them.
        dtype: the compute dtype.
        source: a ``ParamSource`` (param_source.py) read one unit at a time instead of ``full32``, so that
            set-up holds this rank's shard and one unit, never the model; the float32 values of this rank's
            chunks are then kept in ``initial_float32`` (per unit) when ``dtype`` is not float32, for the masters.
    """

    sharded_updates = True
    reads_source_by_unit = True

    def __init__(self, params: Sequence[nn.Parameter], layouts: Sequence[BucketLayout], units: list,
                 full32: Optional[torch.Tensor], *, dtype: torch.dtype, rank: int, config: ZeroConfig, group=None,
                 source=None):
        self.layouts, self.units, self.params = list(layouts), units, list(params)
        self.rank, self.world_size = rank, dist.get_world_size(group)
        self.group, self.algorithm, self.config = group, config.algorithm, config
        self.dtype = dtype
        self.device = device = full32.device if full32 is not None else self.params[0].device
        by_unit = {"by_unit": True} if source is not None else {}  # filled unit by unit: no whole shard reserved
        self.store: ParamStore = build_param_store(config, self.layouts, dtype=dtype, device=device, rank=rank,
                                                   **by_unit)
        """Where this rank's shard lives (offload_param.py)."""
        self.full: list[torch.Tensor] = []
        self._state: list[UnitState] = []
        self._gathers: dict[int, tuple] = {}  # unit -> (Work, staging buffer or None, the gather's input)
        self._staged = self._collectives_pin_storage(device)
        self.gathers = build_unit_gathers(config, self.layouts, rank=rank, world_size=self.world_size, group=group,
                                          dtype=dtype, device=device)
        """How a unit is gathered: plain, int8 blocks (qwZ), from the host's secondary partition (hpZ); zeropp.py."""
        self.initial_float32: Optional[list] = [] if source is not None and dtype != torch.float32 else None
        with torch.no_grad():
            for u, layout in enumerate(self.layouts):
                clo, chi = layout.chunk_bounds(rank)
                if source is None:
                    bucket32 = full32[layout.offset:layout.offset + layout.padded_numel]
                else:  # a fresh buffer: in float32 it becomes the unit's full buffer without a copy
                    bucket32 = torch.zeros(layout.padded_numel, dtype=torch.float32, device=device)
                    source.gather_into([self.params[slot.index] for slot in layout.slots],
                                       slot_views(bucket32, layout))
                    if self.initial_float32 is not None:
                        self.initial_float32.append(bucket32[clo:chi].clone())
                self.store.write(u, bucket32[clo:chi], 0)
                fresh = source is not None and dtype == torch.float32
                full = bucket32 if fresh else bucket32.to(dtype, copy=True)
                del bucket32
                for slot, view in zip(layout.slots, slot_views(full, layout)):
                    self.params[slot.index].data = view
                self.full.append(full)
                self._state.append(UnitState.GATHERED)
                if not self.units[u].persistent:
                    self._free(u)  # at once: set-up never holds more than one unit besides the persistent one
        self._order: list[int] = []  # units in the order of the first forward
        self._order_known = False
        self._position_in_order: dict[int, int] = {}
        self.live_numel = 0
        """Elements of non-persistent units gathered (or being gathered) now."""
        self.peak_live_numel = 0
        self.prefetches = 0
        """Gathers started ahead of the unit that needed them."""
        self._root_units: set = set()  # the units of the model itself (one per parameter group), if it owns any

    @staticmethod
    def plan(model: nn.Module, named: list, config: ZeroConfig, world_size: int,
             param_groups: Optional[Sequence[int]] = None) -> tuple[list, list, list]:
        """(named parameters in layout order, one bucket per unit, the units); a unit whose parameters belong
        to several groups (``param_groups``: each parameter's group) becomes one unit per group, gathered
        together around the same module."""
        units = split_units_by_group(plan_units(model, named, config.stage3_param_persistence_threshold),
                                     param_groups)
        named = [named[i] for unit in units for i in unit.param_indices]
        groups, start = [], 0
        for unit in units:
            groups.append([(name, tuple(p.shape)) for name, p in named[start:start + len(unit.param_indices)]])
            start += len(unit.param_indices)
        return named, layout_groups(groups, world_size, config.shard_alignment,
                                    param_groups=[unit.group for unit in units]), units

    @classmethod
    def build(cls, params, layouts, units, full32, *, plan, config, dtype, rank, group, source=None):
        return cls(params, layouts, units, full32, dtype=dtype, rank=rank, config=config, group=group, source=source)

    def _collectives_pin_storage(self, device) -> bool:
        """Whether a collective on a tensor leaves its storage unresizable (a backend that hands its
        library numpy views pins the storage; zerocomm's own backends do not, so this only guards other
        backends).  Then units gather into a staging buffer and copy, because a pinned full buffer could
        never be released."""
        probe = torch.zeros(self.world_size, dtype=self.dtype, device=device)
        dist.all_gather_into_tensor(probe, probe[self.rank:self.rank + 1].clone(), group=self.group,
                                    algorithm=self.algorithm)
        return not probe.untyped_storage().resizable()

    # -- what the optimizer updates --------------------------------------------------------------
    def owned(self, layout: BucketLayout) -> tuple[int, int]:
        return layout.chunk_bounds(self.rank)

    def shard(self, layout: BucketLayout) -> torch.Tensor:
        """This rank's elements of ``layout``'s unit (offloaded to files: a mapping of its file)."""
        return self.store.shard(layout.index)

    def initial_masters(self, full32: Optional[torch.Tensor]) -> list:
        """Per unit, this rank's chunk in float32: kept from the source (read unit by unit: handed over once and
        forgotten), else views of ``full32``."""
        if self.initial_float32 is not None:
            kept, self.initial_float32 = self.initial_float32, None
            return kept
        out = []
        for layout in self.layouts:
            lo, hi = layout.chunk_bounds(self.rank)
            out.append(full32[layout.offset + lo:layout.offset + hi])
        return out

    def nbytes(self) -> int:
        """Bytes in memory: the shard where it is in memory (device or host), and the gathered units."""
        where = self.placement("host" if self.device.type == "cpu" else "device")
        return where["device"] + where["host"]

    def placement(self, where: str) -> dict:
        """{"device", "host", "disk"} bytes of the shard and the gathered units (``where``: the name of the
        parameters' device, "host" for CPU models)."""
        out = self.store.placement(where)
        out[where] += sum(full.untyped_storage().nbytes() for full in self.full) + self.gathers.secondary_bytes()
        return out

    # -- gather and release ------------------------------------------------------------------------
    def _check_path(self, unit: int, phase: str) -> None:
        """Debug mode: every rank must be at the same (unit, phase); raise naming both ranks if not."""
        if not self.config.debug or self.world_size == 1:
            return
        device = self.device  # NCCL moves CUDA tensors only
        mine = torch.tensor([unit, _PHASES[phase]], dtype=torch.int64, device=device)
        everyone = torch.empty(2 * self.world_size, dtype=torch.int64, device=device)
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
        self._state[u] = UnitState.RELEASED

    def _start_gather(self, u: int, phase: str) -> None:
        if self._state[u] is not UnitState.RELEASED:
            return
        self._check_path(u, phase)
        full, layout = self.full[u], self.layouts[u]
        target = torch.empty_like(full) if self._staged else full
        if not self._staged and full.untyped_storage().nbytes() == 0:
            full.untyped_storage().resize_(full.numel() * full.element_size())
        source = self.store.fetch(u)
        work = self.gathers.start(u, target, source, phase)
        self._gathers[u] = (work, target if self._staged else None, source, phase)
        self._state[u] = UnitState.GATHERING
        if not self.units[u].persistent:
            self.live_numel += layout.padded_numel
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel)

    def _finish_gather(self, u: int) -> None:
        if self._state[u] is not UnitState.GATHERING:
            return
        work, staging, _, phase = self._gathers.pop(u)  # the input (a fetched copy, for offloaded shards) is dropped
        work.wait()
        if staging is not None:
            full = self.full[u]
            if full.untyped_storage().nbytes() == 0:
                full.untyped_storage().resize_(full.numel() * full.element_size())
            with torch.no_grad():
                full.copy_(staging)
            release_storage(staging)
        self.gathers.finished(u, self.full[u], phase, self.units[u].persistent)
        self._state[u] = UnitState.GATHERED

    def _gather(self, u: int, phase: str) -> None:
        """Make unit ``u``'s full parameters present (every rank calls it for the same unit)."""
        self._start_gather(u, phase)
        self._finish_gather(u)

    def _release(self, u: int) -> None:
        if self.units[u].persistent or self._state[u] is UnitState.RELEASED:
            return
        if self._state[u] is UnitState.GATHERING:
            self._gathers.pop(u)[0].wait()
        self._free(u)
        self.live_numel -= self.layouts[u].padded_numel

    def _prefetch(self, after: int, direction: int, phase: str) -> None:
        """Start gathering up to ``stage3_prefetch_depth`` units that follow ``after`` in the recorded order
        (``direction`` -1: backward), within ``stage3_prefetch_bucket_numel`` elements and while
        ``stage3_max_live_parameters`` allows."""
        if not self._order_known or after not in self._position_in_order:
            return
        position = self._position_in_order[after] + direction
        if position < 0 and after in self._root_units:
            position = len(self._order) - 1  # backward leaves the root's head for the last unit of forward
        budget, depth = self.config.stage3_prefetch_bucket_numel, self.config.stage3_prefetch_depth
        while 0 <= position < len(self._order) and budget > 0 and depth > 0:
            u = self._order[position]
            if self._state[u] is UnitState.RELEASED:
                if self.live_numel > self.config.stage3_max_live_parameters:
                    return
                self._start_gather(u, phase)
                self.prefetches += 1
            budget -= self.layouts[u].padded_numel
            depth -= 1
            position += direction
        if 0 <= position < len(self._order) and self._state[self._order[position]] is UnitState.RELEASED:
            self.store.read_ahead(self._order[position])  # offloaded shards: read while the units before compute

    # -- hooks ------------------------------------------------------------------------------------
    def install(self, model: nn.Module) -> list:
        # First of the model's forward pre-hooks: the persistent unit's post-step gather (started by ``after_step``,
        # not waited for under ``overlap_comm``) must be complete before any module reads its parameters.
        handles = [model.register_forward_pre_hook(lambda module, args: self.wait_all())]
        for u, plan in enumerate(self.units):
            if plan.persistent:
                continue
            if plan.module is model:
                self._root_units.add(u)
            else:
                handles.append(plan.module.register_forward_pre_hook(self._unit_pre_forward(u)))
            handles.append(plan.module.register_forward_hook(self._unit_post_forward(u)))
        for u in sorted(self._root_units):
            handles.append(model.register_forward_pre_hook(self._unit_pre_forward(u)))
        handles.append(model.register_forward_hook(self._after_root_forward))
        return handles

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
            backward_follows = torch.is_grad_enabled() and bool(tensors)
            if backward_follows:
                torch.autograd.graph.register_multi_grad_hook(tensors, lambda grads: self._pre_backward(u),
                                                              mode="any")
            if not (backward_follows and u in self._root_units):
                self._release(u)
        return hook

    def _after_root_forward(self, module, args, output):
        """The forward is over: the first one fixes the prefetch order; the persistent unit stays, and so
        does the root unit when a backward follows (see the note on the root unit)."""
        if not self._order_known:
            self._order_known = True
            self._position_in_order = {unit: i for i, unit in reversed(list(enumerate(self._order)))}
        for u in range(len(self.units)):
            if u not in self._root_units or self._state[u] is not UnitState.GATHERED or not torch.is_grad_enabled():
                self._release(u)

    def _pre_backward(self, u: int) -> None:
        if u in self._root_units and self._state[u] is UnitState.GATHERED:
            self._check_path(u, "backward")  # kept from forward: no gather, but the ranks still compare paths
        self._gather(u, "backward")
        self._prefetch(u, -1, "backward")

    def before_reduce(self, bucket_index: int) -> None:
        self._check_path(bucket_index, "reduce")

    def after_reduce_launch(self, bucket_index: int) -> None:
        self._release(bucket_index)  # every use of the unit in this backward has produced its gradient

    def after_backward(self) -> None:
        for u in range(len(self.units)):
            self._release(u)

    def after_step(self) -> None:
        self.store.invalidate()  # the step changed the shards: reads started before it are stale
        self.gathers.invalidate()
        for u, plan in enumerate(self.units):
            if plan.persistent:
                self._state[u] = UnitState.RELEASED  # its storage stays allocated; the gather refreshes it
                self._start_gather(u, "gather")
        if not self.config.overlap_comm:
            self.wait_all()

    def wait_all(self) -> None:
        """Wait for the persistent unit's post-step gather (the others are gathered on use)."""
        for u, plan in enumerate(self.units):
            if plan.persistent:
                self._finish_gather(u)

    # -- access outside forward ---------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self, modifier_rank: Optional[int], optimizer_state,
                 units: Optional[Sequence[int]] = None) -> Iterator[None]:
        """Gather ``units`` (default: every unit) for the duration of the block; with ``modifier_rank``, that
        rank's values at the end are broadcast and written into every rank's shard (and masters)."""
        units = range(len(self.units)) if units is None else sorted(set(units))
        self.wait_all()
        for u in units:
            self._gather(u, "gather")
        try:
            yield
        finally:
            if modifier_rank is not None:
                self._write_back(modifier_rank, units)
                optimizer_state.read_from([self.shard(layout) for layout in self.layouts])
            for u in units:
                self._release(u)

    def _write_back(self, modifier_rank: int, units: Sequence[int]) -> None:
        with torch.no_grad():
            for u in units:
                layout = self.layouts[u]
                # A staged optimizer never hands its full buffers to a collective (it would pin them).
                values = self.full[u].clone() if self._staged else self.full[u]
                dist.broadcast(values, group=self.group, group_src=modifier_rank, algorithm=self.algorithm)
                clo, chi = layout.chunk_bounds(self.rank)
                self.store.write(u, values[clo:chi], 0)
        self.store.invalidate()


def _tensors(output) -> list:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
