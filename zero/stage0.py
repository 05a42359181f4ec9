"""Stage 0: plain data parallel in the ZeRO framework (the baseline the other stages are measured by).

Every rank keeps full parameters, full gradients and full optimizer state (fp32: 4Φ + 4Φ + 8Φ
bytes; mixed precision: 2Φ + 2Φ + 12Φ).  Each gradient bucket is all-reduced (ReduceOp.AVG) in
place the moment it fills, 2Φ·(N−1)/N elements per step on a ring, and every rank applies the same
update to its full parameters, so nothing is gathered afterwards.
"""
from __future__ import annotations

import torch

from .. import comm as dist
from .optimizer import ZeroOptimizer, tensor_bytes
from .partition import BucketLayout, bucket_view, flat_numel


class Stage0Optimizer(ZeroOptimizer):
    """Data parallel: full gradient buffer, all_reduce per bucket, full optimizer on every rank."""

    stage = 0
    persistent_buckets = True

    def __init__(self, model, optimizer_factory, config, group=None):
        self._grads = None
        super().__init__(model, optimizer_factory, config, group)

    def _shard_bounds(self, layout: BucketLayout) -> tuple[int, int]:
        return 0, layout.padded_numel

    def _acquire(self, layout: BucketLayout) -> torch.Tensor:
        if self._grads is None:
            self._grads = torch.zeros(flat_numel(self.layouts), dtype=self.dtype, device=self.flat.device)
        return bucket_view(self._grads, layout)

    def _reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        return dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                               algorithm=self.algorithm)

    def _shard_grad(self, layout: BucketLayout) -> torch.Tensor:
        return bucket_view(self._grads, layout)

    def _after_step(self) -> None:
        self._copy_masters_back()  # every rank applied the same update to full parameters: nothing to gather

    def _grad_bytes(self) -> int:
        return tensor_bytes(self._grads)
