"""Replicated parameters: every rank holds the full parameters (stages 0, 1 and 2).

The parameters live in one flat buffer of the compute dtype (buckets one after another, see
partition.py), each parameter a view of it.  When the optimizer state is sharded (stages 1, 2) each
rank updates only its chunk of every bucket in place, and the chunks are all-gathered after the
step: consecutive buckets are grouped up to ``allgather_bucket_numel`` elements, one
``all_gather_into_tensor`` per group, launched asynchronously in forward order (a group of one
bucket gathers in place; a group of several goes through a staging buffer, because their chunks
are not adjacent in the flat buffer).  Stage 0 updates whole buckets and gathers nothing.

[Note: waiting per module]
Each module that owns managed parameters gets a forward pre-hook that waits for the gather groups
holding *its own* parameters, so the gather of the later buckets runs while the first modules of
the next forward compute.  This relies on a module's parameters being read inside that module's
forward (or a later one), as with FSDP.  A model that reads another module's parameter before that
module has run (``self.head.weight`` in the root's forward before ``self.head`` is called) must
call ``optimizer.synchronize()`` first or set ``ZeroConfig.wait_per_module = False``, which waits
for every gather in the root's pre-hook instead.  Everything that reads parameters outside forward
(``gathered_parameters``, ``model_state_bytes``, checkpoints, the next ``step``) waits for all.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from .. import comm as dist
from .config import ZeroConfig
from .gradients import tensor_bytes
from .offload_param import note_unsharded_param_offload
from .partition import BucketLayout, bind_params, group_consecutive, plan_buckets
from .parts import ParametersPart


class ReplicatedParameters(ParametersPart):
    """The full parameters in one flat buffer; each rank's updated chunks all-gathered after the step.

    Args:
        params: the managed parameters, in layout order.
        layouts: their buckets.
        full32: the flat float32 values (every bucket, padded), already equal on every rank.
        dtype: the compute dtype (the flat buffer's).
        sharded_updates: whether each rank updates only its chunk (then the chunks are gathered).
    """

    def __init__(self, params: Sequence[nn.Parameter], layouts: Sequence[BucketLayout], full32: torch.Tensor, *,
                 dtype: torch.dtype, sharded_updates: bool, rank: int, config: ZeroConfig, group=None):
        self.layouts = list(layouts)
        self.rank, self.group, self.algorithm = rank, group, config.algorithm
        self.sharded_updates = sharded_updates
        #: Whether chunks are gathered after the step: not in a group of one rank, whose chunk is the bucket.
        self.gathers = sharded_updates and bool(layouts) and layouts[0].world_size > 1
        self.overlap = config.overlap_comm
        self.flat = full32 if dtype == torch.float32 else full32.to(dtype)
        bind_params(params, self.layouts, self.flat)
        self.params = list(params)
        self.groups = group_consecutive(list(reversed(self.layouts)), config.allgather_bucket_numel)
        self._group_of_bucket = {layout.index: g for g, layouts in enumerate(self.groups) for layout in layouts}
        self._pending: list = [None] * len(self.groups)  # per group: (Work, finish or None) while in flight
        self._in_flight = False
        self.wait_per_module = config.wait_per_module
        self._bucket_of_param = {id(params[slot.index]): layout.index for layout in self.layouts
                                 for slot in layout.slots}
        # Index arithmetic done once, so that the step's path does not leave this file for it.
        self._chunk = [layout.chunk_bounds(rank) for layout in self.layouts]
        self._owned = self._chunk if sharded_updates else [(0, layout.padded_numel) for layout in self.layouts]

    @staticmethod
    def plan(model: nn.Module, named: list, config: ZeroConfig, world_size: int,
             param_groups: Optional[Sequence[int]] = None) -> tuple[list, list, None]:
        """(named parameters in layout order, buckets, no units): greedy buckets in gradient-ready order, each
        holding parameters of one group (``param_groups``: each parameter's group)."""
        layouts = plan_buckets([(name, tuple(p.shape)) for name, p in named], config.reduce_bucket_numel,
                               world_size, config.shard_alignment, param_groups=param_groups)
        by_name = dict(named)
        return [(slot.name, by_name[slot.name]) for layout in layouts for slot in layout.slots], layouts, None

    @classmethod
    def build(cls, params, layouts, units, full32, *, plan, config, dtype, rank, group, source=None):
        """Updates sharded as ``plan.shard_optimizer_state`` says; ``offload_param`` is noted and ignored (every
        rank keeps every parameter for forward)."""
        note_unsharded_param_offload(config, rank)
        return cls(params, layouts, full32, dtype=dtype, sharded_updates=plan.shard_optimizer_state, rank=rank,
                   config=config, group=group)

    # -- what the optimizer updates --------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the parameters live (and ZeRO's collectives run)."""
        return self.flat.device

    def owned(self, layout: BucketLayout) -> tuple[int, int]:
        """The bucket-relative range this rank's optimizer updates."""
        return self._owned[layout.index]

    def shard(self, layout: BucketLayout) -> torch.Tensor:
        """The elements of ``owned(layout)``, in the parameters' own storage."""
        lo, hi = self.owned(layout)
        return self.flat[layout.offset + lo:layout.offset + hi]

    def initial_masters(self, full32: Optional[torch.Tensor]) -> list:
        """Views of ``full32``: per bucket, its ``owned`` elements."""
        out = []
        for layout in self.layouts:
            lo, hi = self.owned(layout)
            out.append(full32[layout.offset + lo:layout.offset + hi])
        return out

    def nbytes(self) -> int:
        return tensor_bytes(self.flat)

    def placement(self, where: str) -> dict:
        out = {"device": 0, "host": 0, "disk": 0}
        out[where] = self.nbytes()
        return out

    # -- hooks ------------------------------------------------------------------------------------
    def install(self, model: nn.Module) -> list:
        """Forward pre-hooks that wait for the post-step gather (per module, or once at the root), and
        ``state_dict`` pre-hooks that wait for all of it (see [Note: reading parameters after the step])."""
        if not self.gathers:
            return []
        # [Note: reading parameters after the step]  step() leaves the parameter all_gather in flight, so a
        # ``model.state_dict()`` taken right after it (a user's checkpoint of the final model) read other ranks'
        # chunks of the step before: the elastic-restart test saw one Adam step (0.0096) in 1 of 8 loaded runs.
        # Every module's state_dict waits (a submodule's own state_dict too); code that reads parameter
        # tensors directly before the next forward calls ``optimizer.synchronize()`` (docs/zero.md).
        handles = [module.register_state_dict_pre_hook(lambda module, prefix, keep_vars: self.wait_all())
                   for module in model.modules()]
        if not self.wait_per_module:
            return handles + [model.register_forward_pre_hook(lambda module, args: self.wait_all())]
        for module in model.modules():
            groups = sorted({self._group_of_bucket[self._bucket_of_param[id(p)]]
                             for p in module.parameters(recurse=False) if id(p) in self._bucket_of_param})
            if groups:
                handles.append(module.register_forward_pre_hook(self._waiter(tuple(groups))))
        return handles

    def _waiter(self, groups: tuple):
        def hook(module, args):
            if self._in_flight:
                for g in groups:
                    self._wait_group(g)
        return hook

    def before_reduce(self, bucket_index: int) -> None:
        pass

    def after_reduce_launch(self, bucket_index: int) -> None:
        pass

    def after_backward(self) -> None:
        pass

    # -- the post-step gather ------------------------------------------------------------------------
    def after_step(self) -> None:
        """Start every group's all_gather (async); every rank of the group calls it."""
        if not self.gathers:
            return
        self.wait_all()
        for g, layouts in enumerate(self.groups):
            self._pending[g] = self._launch_one(layouts[0]) if len(layouts) == 1 else self._launch_staged(layouts)
        self._in_flight = True
        if not self.overlap:
            self.wait_all()

    def _launch_one(self, layout: BucketLayout):
        bucket = self.flat[layout.offset:layout.offset + layout.padded_numel]
        lo, hi = self._chunk[layout.index]
        return dist.all_gather_into_tensor(bucket, bucket[lo:hi], group=self.group, async_op=True,
                                           algorithm=self.algorithm), None

    def _launch_staged(self, layouts: list):
        own = torch.cat([self.shard(layout) for layout in layouts])
        world = layouts[0].world_size
        staging = torch.empty(world * own.numel(), dtype=own.dtype, device=own.device)
        work = dist.all_gather_into_tensor(staging, own, group=self.group, async_op=True, algorithm=self.algorithm)

        def finish() -> None:
            # staging = [rank 0: its chunks of every bucket | rank 1: ... ]; copy back per bucket.
            rows = staging.view(world, own.numel())
            column = 0
            for layout in layouts:
                width = layout.chunk_numel
                self.flat[layout.offset:layout.offset + layout.padded_numel].view(world, width).copy_(
                    rows[:, column:column + width])
                column += width

        return work, finish

    def _wait_group(self, g: int) -> None:
        pending = self._pending[g]
        if pending is None:
            return
        self._pending[g] = None
        work, finish = pending
        work.wait()
        if finish is not None:
            finish()

    def wait_all(self) -> None:
        """Wait for every launched all_gather (a no-op when none is in flight)."""
        if self._in_flight:
            for g in range(len(self.groups)):
                self._wait_group(g)
            self._in_flight = False

    # -- access outside forward ---------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self, modifier_rank: Optional[int], optimizer_state,
                 units: Optional[Sequence[int]] = None) -> Iterator[None]:
        """Every parameter is here: wait for the post-step gather (``units`` makes no difference)."""
        self.wait_all()
        yield
        if modifier_rank is not None:
            dist.broadcast(self.flat, group=self.group, group_src=modifier_rank, algorithm=self.algorithm)
            optimizer_state.read_from([self.shard(layout) for layout in self.layouts])
