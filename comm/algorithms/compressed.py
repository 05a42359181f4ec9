"""1-bit compressed all_reduce with error feedback (1-bit Adam, Tang et al. 2021).

Terms: the tensor (``numel`` elements) is padded to ``P``, a multiple of ``8n``, and
cut into n *segments* of ``L = P / n`` elements; rank r is the "server" of segment
r.  A compressed segment is ``L / 8`` bytes of signs plus one scale.

Schedule, on every rank:
  1. worker step: x ← tensor + worker error; signs + scale of x; the worker error
     keeps what the signs fail to carry.
  2. all_to_all: rank r sends segment j's signs, with its scale, to rank j.
  3. server step: decompress the n received versions of this rank's segment,
     average them, add the server error, compress again (server error updated).
  4. all_gather of the compressed segments; every rank decompresses the whole.
The result is the **mean** over ranks (not the sum).  Scales are computed over the real
elements only (the zero padding would shrink them), and the error stays 0 on padding.  Each message carries its scale
in its last bytes, so the scheme costs two collectives, not four.  Bytes sent per
rank ≈ 2·(n-1)·(P/(8n) + scale bytes), about 1/32 of a float32 ring all_reduce's
2·(n-1)/n·4·numel.

The two collectives run with the ``inner`` algorithm ("native", "ring" or "tree"; a
tree has no all_to_all, so tree runs the pairwise ring exchange there), looked up in
the same registry as every other algorithm, so the schedule serves every backend.
It is registered as ``("all_reduce", "onebit")``; the call's ``compression_state``
and ``algorithm`` arrive as ``state`` and ``inner``.
"""
from __future__ import annotations

import torch

from ...ops.onebit import ErrorFeedback, onebit_padded_numel, unpack_signs


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision inputs compress and keep their error in float32: the error feedback
    # would lose the residual in float16's 11-bit mantissa.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pack_message(signs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.cat([signs, scale.reshape(1).view(torch.uint8)])


def onebit_message_bytes(numel: int, n: int, dtype: torch.dtype) -> int:
    """Bytes of one compressed row (a segment's signs and its scale): what each of the two steps sends
    per peer.  A rank sends ``2 (n-1)`` of them per call."""
    return onebit_padded_numel(numel, n) // n // 8 + (8 if dtype == torch.float64 else 4)


def all_reduce_onebit(t, tensor: torch.Tensor, op: str, *, tag: int, deadline, segment_bytes: int,
                      state: ErrorFeedback, inner: str = "native") -> None:
    """Replace the flat floating ``tensor`` on every rank by the 1-bit-compressed mean over the ranks.

    ``op`` is "avg" (validated).  ``state`` is this rank's error feedback for this tensor (one per
    tensor or bucket, owned by the caller).  Every rank of ``t`` calls it with tensors of the same
    numel and dtype, and the same ``inner``.
    """
    from . import function_for  # the registry imports this module
    all_to_all = function_for("all_to_all", "ring" if inner == "tree" else inner, t)
    all_gather = function_for("all_gather", inner, t)
    n = t.size
    if n == 1 or tensor.numel() == 0:
        return  # the mean of one rank's tensor is the tensor: nothing to compress
    dtype = _work_dtype(tensor.dtype)
    padded = onebit_padded_numel(tensor.numel(), n)
    seg = padded // n
    seg_bytes = seg // 8
    x = torch.zeros(padded, dtype=dtype, device=tensor.device)
    x[:tensor.numel()] = tensor
    signs, scale = state.compensate_and_compress(x, tensor.numel())
    scale_bytes = scale.element_size()
    row = seg_bytes + scale_bytes

    # 2. every chunk of signs goes to its segment's server, with this rank's scale behind it
    send = torch.empty((n, row), dtype=torch.uint8, device=tensor.device)
    send[:, :seg_bytes] = signs.view(n, seg_bytes)
    send[:, seg_bytes:] = scale.reshape(1).view(torch.uint8)
    received = torch.empty_like(send)
    all_to_all(t, received.view(-1), send.view(-1), [row] * n, [row] * n, tag=tag, deadline=deadline,
               segment_bytes=segment_bytes)

    # 3. the server's average of its segment: all n versions unpacked at once, weighted by their scales
    signs_in = unpack_signs(received[:, :seg_bytes].reshape(-1), n * seg, dtype=dtype).view(n, seg)
    scales_in = received[:, seg_bytes:].clone().view(dtype).view(n)  # clone: the scales sit unaligned
    mean = (scales_in.view(1, n) @ signs_in).view(seg).div_(n)
    # Padding decompresses to ±scale; it must not enter this segment's scale or error.
    valid = min(max(tensor.numel() - t.rank * seg, 0), seg)
    mean[valid:] = 0
    server_signs, server_scale = state.server_compensate_and_compress(mean, valid)

    # 4. everyone gathers every server's compressed segment and decompresses the whole
    gathered = torch.empty((n, row), dtype=torch.uint8, device=tensor.device)
    all_gather(t, gathered.view(-1), _pack_message(server_signs, server_scale), tag=tag, deadline=deadline,
               segment_bytes=segment_bytes)
    result = unpack_signs(gathered[:, :seg_bytes].reshape(-1), padded, dtype=dtype).view(n, seg)
    result.mul_(gathered[:, seg_bytes:].clone().view(dtype).view(n, 1))
    tensor.copy_(result.view(-1)[:tensor.numel()])
