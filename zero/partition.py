"""Where every parameter lives: buckets of a flat buffer, and each rank's chunk of every bucket.

[Note: the layout]
Parameters are laid out one after another in *buckets* (gradient-ready order for stages 0-2,
one bucket per unit in stage 3).  A bucket is zero-padded to a multiple of ``world_size *
alignment`` elements and split into ``world_size`` equal *chunks*; rank r owns chunk r of every
bucket.  Rank r's *shard* is the concatenation of its chunks, bucket after bucket::

    flat   = [ bucket 0: chunk0 chunk1 ... chunkN-1 | bucket 1: chunk0 ... | ... ]
    shard r = [ bucket 0 chunk r | bucket 1 chunk r | ... ]      (contiguous, shard_offset)

so one bucket's gradients reduce-scatter in one call straight into a contiguous slice of every
rank's shard, and the same slice all-gathers back into the bucket.  A parameter may straddle
chunk boundaries; it never straddles buckets.

Everything here is pure index arithmetic over shapes, except the two functions at the end that
copy tensors into a flat buffer and rebind parameters to views of it.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

import torch

from ..ops import padded_numel, partition_bounds, views_into


@dataclasses.dataclass(frozen=True, slots=True)
class ParamSlot:
    """One parameter's place in its bucket."""

    index: int
    """Position in the optimizer's list of managed parameters."""
    name: str
    shape: tuple
    offset: int
    """First element, counted from the start of the bucket."""
    numel: int


@dataclasses.dataclass(frozen=True, slots=True)
class BucketLayout:
    """A bucket: its parameters, its place in the flat buffer and in every rank's shard."""

    index: int
    slots: tuple
    """The bucket's ``ParamSlot``\\ s, in layout order."""
    numel: int
    """Elements of real parameters (no padding)."""
    padded_numel: int
    """A multiple of ``world_size * alignment``; the tail after ``numel`` is zeros."""
    world_size: int
    offset: int
    """First element of the bucket in the flat buffer."""
    shard_offset: int
    """First element of this bucket's chunk in every rank's shard."""
    group: int = 0
    """The parameter group (``initialize``'s ``model_parameters``) every parameter of the bucket belongs to."""

    @property
    def chunk_numel(self) -> int:
        return self.padded_numel // self.world_size

    def chunk_bounds(self, rank: int) -> tuple[int, int]:
        """Rank ``rank``'s chunk as half-open element bounds relative to the bucket's start."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"bucket {self.index}: rank must be in [0, {self.world_size}), got {rank}")
        return partition_bounds(self.padded_numel, self.world_size)[rank]

    def flat_bounds(self) -> tuple[int, int]:
        return self.offset, self.offset + self.padded_numel

    def shard_bounds(self) -> tuple[int, int]:
        return self.shard_offset, self.shard_offset + self.chunk_numel


def layout_groups(groups: Sequence[Sequence[tuple[str, tuple]]], world_size: int,
                  alignment: int = 1, param_groups: Optional[Sequence[int]] = None) -> list[BucketLayout]:
    """One ``BucketLayout`` per group of ``(name, shape)`` pairs, in order; ``param_groups[b]`` is
    bucket b's parameter group (default: 0 for every bucket).

    Parameter indices run over all groups in order.  Raises ``ValueError`` for an empty group,
    a world size or alignment below 1.
    """
    if world_size < 1:
        raise ValueError(f"layout_groups: world_size must be at least 1, got {world_size}")
    if alignment < 1:
        raise ValueError(f"layout_groups: alignment must be at least 1, got {alignment}")
    layouts, index, offset, shard_offset = [], 0, 0, 0
    for bucket_index, group in enumerate(groups):
        if not group:
            raise ValueError(f"layout_groups: group {bucket_index} is empty")
        slots, inner = [], 0
        for name, shape in group:
            shape = tuple(int(d) for d in shape)
            numel = 1
            for d in shape:
                numel *= d
            slots.append(ParamSlot(index=index, name=name, shape=shape, offset=inner, numel=numel))
            index += 1
            inner += numel
        padded = max(padded_numel(inner, world_size * alignment), world_size * alignment)
        layouts.append(BucketLayout(index=bucket_index, slots=tuple(slots), numel=inner, padded_numel=padded,
                                    world_size=world_size, offset=offset, shard_offset=shard_offset,
                                    group=param_groups[bucket_index] if param_groups is not None else 0))
        offset += padded
        shard_offset += padded // world_size
    return layouts


def plan_buckets(named_shapes: Iterable[tuple[str, tuple]], bucket_numel: int, world_size: int,
                 alignment: int = 1, param_groups: Optional[Sequence[int]] = None) -> list[BucketLayout]:
    """Greedy buckets of at most ``bucket_numel`` elements in the given order.

    A parameter larger than ``bucket_numel`` gets a bucket of its own; parameters keep their
    order, so the first bucket holds the first gradients to become ready.  With ``param_groups``
    (one group index per parameter) a bucket holds parameters of one group only: each group fills
    its own open bucket, and buckets are laid out in the order they fill up (the order their last
    gradients become ready), so interleaved groups (weights and biases) still make full buckets.
    Slot indices then follow the layout order, not the given one.
    """
    if bucket_numel < 1:
        raise ValueError(f"plan_buckets: bucket_numel must be at least 1, got {bucket_numel}")
    named_shapes = list(named_shapes)
    if param_groups is not None and len(param_groups) != len(named_shapes):
        raise ValueError(f"plan_buckets: {len(named_shapes)} parameters but {len(param_groups)} group indices")
    closed: list[tuple[int, list[tuple[str, tuple]]]] = []
    open_buckets: dict[int, tuple[list[tuple[str, tuple]], int]] = {}  # group -> (its open bucket, elements)
    for position, (name, shape) in enumerate(named_shapes):
        group = param_groups[position] if param_groups is not None else 0
        numel = 1
        for d in shape:
            numel *= int(d)
        current, filled = open_buckets.get(group, ([], 0))
        if current and filled + numel > bucket_numel:
            closed.append((group, current))
            current, filled = [], 0
        current.append((name, tuple(shape)))
        open_buckets[group] = (current, filled + numel)
    closed += [(group, current) for group, (current, _) in open_buckets.items() if current]
    return layout_groups([bucket for _, bucket in closed], world_size, alignment,
                         param_groups=[group for group, _ in closed])


def flat_numel(layouts: Sequence[BucketLayout]) -> int:
    """Elements of the whole flat buffer (every bucket, padding included)."""
    return sum(layout.padded_numel for layout in layouts)


def shard_numel(layouts: Sequence[BucketLayout]) -> int:
    """Elements of one rank's shard (one chunk of every bucket)."""
    return sum(layout.chunk_numel for layout in layouts)


def group_consecutive(layouts: Sequence[BucketLayout], max_numel: int) -> list[list[BucketLayout]]:
    """Consecutive buckets grouped while their padded sizes sum to at most ``max_numel`` (at least one each)."""
    groups: list[list[BucketLayout]] = []
    filled = 0
    for layout in layouts:
        if groups and filled + layout.padded_numel <= max_numel:
            groups[-1].append(layout)
            filled += layout.padded_numel
        else:
            groups.append([layout])
            filled = layout.padded_numel
    return groups


def bucket_view(flat: torch.Tensor, layout: BucketLayout) -> torch.Tensor:
    """The bucket's slice of a flat buffer (1-D, padded size)."""
    lo, hi = layout.flat_bounds()
    return flat[lo:hi]


def slot_views(bucket: torch.Tensor, layout: BucketLayout) -> list[torch.Tensor]:
    """Views of the bucket's parameters inside a bucket-sized buffer, shaped like the parameters."""
    return views_into(bucket, [slot.shape for slot in layout.slots])


def flatten_params(params: Sequence[torch.Tensor], layouts: Sequence[BucketLayout], dtype: torch.dtype,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """A new flat buffer of ``dtype`` holding ``params`` (indexed by ``ParamSlot.index``) in layout order,
    on ``device`` (default: the first parameter's)."""
    if device is None:
        device = params[0].device if len(params) else "cpu"
    flat = torch.zeros(flat_numel(layouts), dtype=dtype, device=device)
    with torch.no_grad():
        for layout in layouts:
            for slot, view in zip(layout.slots, slot_views(bucket_view(flat, layout), layout)):
                view.copy_(params[slot.index].detach())
    return flat

def bind_params(params: Sequence[torch.nn.Parameter], layouts: Sequence[BucketLayout], flat: torch.Tensor) -> None:
    """Point every parameter's data at its view of ``flat`` (the parameter objects stay the same)."""
    for layout in layouts:
        for slot, view in zip(layout.slots, slot_views(bucket_view(flat, layout), layout)):
            params[slot.index].data = view
