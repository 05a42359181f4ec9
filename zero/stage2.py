"""Stage 2: optimizer state and gradients sharded; parameters full on every rank.

Per rank, fp32: parameters 4Φ + gradient shard 4Φ/N + optimizer state 8Φ/N, plus at most
``max_inflight_buckets`` bucket buffers during backward.  Mixed precision: 2Φ + 2Φ/N + 12Φ/N.

A bucket's full-size buffer exists only from its first gradient to the end of its reduce-scatter:
the hook copies each gradient in and frees ``param.grad``; the reduce-scatter (ReduceOp.AVG)
writes this rank's chunk straight into the gradient shard, and the buffer is dropped.  Traffic
per step is 2Φ·(N−1)/N elements (reduce-scatter + all_gather), gradients are reduced only in
the boundary backward of an accumulation cycle.
"""
from __future__ import annotations

import torch

from .. import comm as dist
from .bucket import InflightBuckets
from .optimizer import tensor_bytes
from .partition import BucketLayout, shard_numel
from .stage1 import ShardedParameters


class _ThenWork:
    """A ``Work`` whose ``wait`` also runs ``then`` once (copying a shard out of an all-reduced buffer)."""

    def __init__(self, work, then):
        self._work, self._then = work, then

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self) -> bool:
        self._work.wait()
        if self._then is not None:
            self._then()
            self._then = None
        return True


class Stage2Optimizer(ShardedParameters):
    """Gradient shard only; bucket buffers live from first gradient to the end of their reduction."""

    stage = 2
    persistent_buckets = False

    def __init__(self, model, optimizer_factory, config, group=None):
        self._grad_shard = None
        self._inflight = InflightBuckets(config.max_inflight_buckets)
        super().__init__(model, optimizer_factory, config, group)
        self._grad_shard = torch.zeros(shard_numel(self.layouts), dtype=self.dtype, device=self.flat.device)

    def _acquire(self, layout: BucketLayout) -> torch.Tensor:
        # Release buckets whose reduction has finished, then respect the in-flight limit.
        self._inflight.make_room()
        return torch.empty(layout.padded_numel, dtype=self.dtype, device=self.flat.device)

    def _reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        self._inflight.add(self.buckets[layout.index])
        lo, hi = layout.shard_bounds()
        out = self._grad_shard[lo:hi]
        if self.config.reduce_scatter:
            return dist.reduce_scatter_tensor(out, buffer, op=dist.ReduceOp.AVG, group=self.group,
                                              async_op=True, algorithm=self.algorithm)
        work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                               algorithm=self.algorithm)
        chunk = slice(*layout.chunk_bounds(self.rank))
        return _ThenWork(work, lambda: out.copy_(buffer[chunk]))

    def _shard_grad(self, layout: BucketLayout) -> torch.Tensor:
        lo, hi = layout.shard_bounds()
        return self._grad_shard[lo:hi]

    def _end_step(self) -> None:
        self._inflight.clear()
        super()._end_step()

    def _grad_bytes(self) -> int:
        live = sum(tensor_bytes(bucket.buffer) for bucket in self.buckets)
        return tensor_bytes(self._grad_shard) + live
