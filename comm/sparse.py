"""SUM all_reduce of sparse COO tensors, as torch's gloo backend offers it.

Schedule: every rank all-gathers every rank's number of nonzeros, then every rank's indices and
values (padded to the largest count), over zerocomm's ring all_gather; each rank then sums the
gathered entries (``coalesce``) and copies the result into its tensor.  Every rank ends with the
same coalesced sum.  Only SUM (torch's gloo refuses other ops on sparse tensors too); every rank
passes a tensor of the same size, sparse dimensions and dtype.
"""
from __future__ import annotations

from typing import Optional

import torch

from .algorithms.ring import all_gather_ring


def all_reduce_sparse(t, tensor: torch.Tensor, *, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    """``tensor`` (sparse COO, this rank's addend) ← the sum over the group, in place."""
    n = t.size
    mine = tensor.coalesce()
    indices, values = mine.indices(), mine.values()  # (sparse_dim, nnz), (nnz, *dense_shape)
    counts = torch.empty(n, dtype=torch.int64)
    gather = dict(tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    all_gather_ring(t, counts, torch.tensor([values.shape[0]], dtype=torch.int64), **gather)
    counts = counts.tolist()
    longest = max(counts)
    padded_indices = indices.new_zeros((indices.shape[0], longest))
    padded_indices[:, :indices.shape[1]] = indices
    padded_values = values.new_zeros((longest,) + tuple(values.shape[1:]))
    padded_values[:values.shape[0]] = values
    all_indices = indices.new_empty((n,) + tuple(padded_indices.shape))
    all_values = values.new_empty((n,) + tuple(padded_values.shape))
    # Messages of one tag between two ranks arrive in the order sent, so the three gathers may share it.
    all_gather_ring(t, all_indices.view(-1), padded_indices.view(-1), **gather)
    all_gather_ring(t, all_values.view(-1), padded_values.reshape(-1), **gather)
    total = torch.sparse_coo_tensor(
        torch.cat([all_indices[r, :, :counts[r]] for r in range(n)], dim=1),
        torch.cat([all_values[r, :counts[r]] for r in range(n)]), tensor.shape).coalesce()
    tensor.copy_(total)
