"""The post-step all_gather of updated parameter chunks (stages 1 and 2).

After ``step`` each rank has updated its chunk of every bucket of the flat parameter buffer in
place; one ``all_gather_into_tensor`` per group of consecutive buckets (at most
``allgather_bucket_numel`` elements) brings every other rank's chunks in.  A group of one bucket
gathers in place (the input is this rank's chunk of the output); a group of several goes through
a staging buffer, because their chunks are not adjacent in the flat buffer.

Groups are launched in forward order (the reverse of gradient-ready order), asynchronously, and
waited for in a forward pre-hook of the root module, so the gather overlaps whatever runs between
``step()`` and the next forward (zeroing gradients, loading data).

[Note: why not wait per module]
Waiting in each module's own pre-hook would also overlap the forward itself, but a model that
reads a parameter outside the forward of the module that owns it (``self.tok.weight`` used by the
head, ``self.pos.weight[:T]``) would then read a stale value silently.  Waiting once at the root
is always correct.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import comm as dist
from .partition import BucketLayout, bucket_view, group_consecutive


class ParameterGatherer:
    """Bucketed, asynchronous all_gather of every rank's chunks of a flat parameter buffer.

    Args:
        flat: the flat parameter buffer (all buckets, padded).
        layouts: its buckets.
        rank: this process's rank in ``group``.
        max_numel: elements per all_gather (``ZeroConfig.allgather_bucket_numel``).
        group, algorithm: where and how to communicate.
    """

    def __init__(self, flat: torch.Tensor, layouts: Sequence[BucketLayout], rank: int, max_numel: int,
                 group=None, algorithm: Optional[str] = None):
        self.flat = flat
        self.rank = rank
        self.group = group
        self.algorithm = algorithm
        self.groups = group_consecutive(list(reversed(layouts)), max_numel)
        self._pending: list = []  # (Work, finish) in launch order

    @property
    def in_flight(self) -> bool:
        return bool(self._pending)

    def launch(self) -> None:
        """Start every group's all_gather (async); every rank of ``group`` calls it."""
        self.wait()
        for layouts in self.groups:
            if len(layouts) == 1:
                self._pending.append((self._launch_one(layouts[0]), None))
            else:
                self._pending.append(self._launch_staged(layouts))

    def _launch_one(self, layout: BucketLayout):
        bucket = bucket_view(self.flat, layout)
        lo, hi = layout.chunk_bounds(self.rank)
        return dist.all_gather_into_tensor(bucket, bucket[lo:hi], group=self.group, async_op=True,
                                           algorithm=self.algorithm)

    def _launch_staged(self, layouts: list):
        own = torch.cat([bucket_view(self.flat, layout)[slice(*layout.chunk_bounds(self.rank))]
                         for layout in layouts])
        world = layouts[0].world_size
        staging = torch.empty(world * own.numel(), dtype=own.dtype, device=own.device)
        work = dist.all_gather_into_tensor(staging, own, group=self.group, async_op=True, algorithm=self.algorithm)

        def finish() -> None:
            # staging = [rank 0: its chunks of every bucket | rank 1: ... ]; scatter back per bucket.
            rows = staging.view(world, own.numel())
            column = 0
            for layout in layouts:
                width = layout.chunk_numel
                bucket_view(self.flat, layout).view(world, width).copy_(rows[:, column:column + width])
                column += width

        return work, finish

    def wait(self) -> None:
        """Wait for every launched all_gather and place staged results (no-op when none is pending)."""
        pending, self._pending = self._pending, []
        for work, finish in pending:
            work.wait()
            if finish is not None:
                finish()
