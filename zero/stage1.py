"""Stage 1: optimizer state sharded; gradients and parameters full on every rank.

Per rank, fp32: parameters 4Φ + gradients 4Φ + optimizer state 8Φ/N (Adam's two moments of this
rank's shard; the fp32 master is the parameter buffer itself).  Mixed precision: 2Φ + 2Φ + 12Φ/N
(float32 master shard 4Φ/N + moments 8Φ/N).

Each bucket is reduce-scattered in place (ReduceOp.AVG): the input is the bucket of the full
gradient buffer, the output this rank's chunk of it, so a rank receives only the reduced
gradients it updates — Φ·(N−1)/N elements — and the post-step all_gather another Φ·(N−1)/N:
2Φ·(N−1)/N per step, the same as data parallel.  (All-reducing, as DeepSpeed does, costs 3Φ.)
"""
from __future__ import annotations

import torch

from .. import comm as dist
from .gather import ParameterGatherer
from .optimizer import ZeroOptimizer, tensor_bytes
from .partition import BucketLayout, bucket_view, flat_numel


class ShardedParameters(ZeroOptimizer):
    """Stages 1 and 2: each rank updates its chunk of every bucket, then the chunks are all-gathered."""

    def __init__(self, model, optimizer_factory, config, group=None):
        super().__init__(model, optimizer_factory, config, group)
        self.gatherer = ParameterGatherer(self.flat, self.layouts, self.rank, config.allgather_bucket_numel,
                                          group=self.group, algorithm=self.algorithm)

    def _shard_bounds(self, layout: BucketLayout) -> tuple[int, int]:
        return layout.chunk_bounds(self.rank)

    def _after_step(self) -> None:
        self._copy_masters_back()
        self.gatherer.launch()
        if not self.config.overlap_comm:
            self.gatherer.wait()

    def _wait_for_parameters(self) -> None:
        self.gatherer.wait()


class Stage1Optimizer(ShardedParameters):
    """Full gradient buffer; each bucket reduce-scattered in place into this rank's chunk."""

    stage = 1
    persistent_buckets = True

    def __init__(self, model, optimizer_factory, config, group=None):
        self._grads = None
        super().__init__(model, optimizer_factory, config, group)

    def _acquire(self, layout: BucketLayout) -> torch.Tensor:
        if self._grads is None:
            self._grads = torch.zeros(flat_numel(self.layouts), dtype=self.dtype, device=self.flat.device)
        return bucket_view(self._grads, layout)

    def _reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        if not self.config.reduce_scatter:
            return dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                                   algorithm=self.algorithm)
        lo, hi = layout.chunk_bounds(self.rank)
        return dist.reduce_scatter_tensor(buffer[lo:hi], buffer, op=dist.ReduceOp.AVG, group=self.group,
                                          async_op=True, algorithm=self.algorithm)

    def _shard_grad(self, layout: BucketLayout) -> torch.Tensor:
        lo, hi = layout.chunk_bounds(self.rank)
        return bucket_view(self._grads, layout)[lo:hi]

    def _grad_bytes(self) -> int:
        return tensor_bytes(self._grads)
