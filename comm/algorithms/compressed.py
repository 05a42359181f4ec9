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

The two collectives run with the ``inner`` algorithm, any name of the registry: "native"
is the backend's own, another name is looked up in ``ALGORITHMS`` for each sub-collective,
and where that algorithm has no such cell (a tree has no all_to_all) the ring serves it
(``sub_algorithm``).  It is registered as ``("all_reduce", "onebit")``; the call's
``compression_state`` and ``algorithm`` arrive as ``state`` and ``inner``.

The local steps are one fused pass each (``ops/onebit_kernels.py``), and every buffer they and
the messages use belongs to ``state`` and is reused by the next call on the same bucket.  On a
slow link the two messages are the only wait: each is about 1/32 of the float32 data and goes
out as soon as its step has produced it.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...ops.onebit import ErrorFeedback, onebit_padded_numel

#: The sub-collectives of the schedule, in order.
SUB_COLLECTIVES = ("all_to_all", "all_gather")


def onebit_message_bytes(numel: int, n: int, dtype: torch.dtype) -> int:
    """Bytes of one compressed row (a segment's signs and its scale): what each of the two steps sends
    per peer.  A rank sends ``2 (n-1)`` of them per call."""
    return onebit_padded_numel(numel, n) // n // 8 + (8 if dtype == torch.float64 else 4)


def all_reduce_onebit(t, tensor: torch.Tensor, op: str, *, tag: int, deadline, segment_bytes: int,
                      state: ErrorFeedback, all_to_all: Callable[..., None], all_gather: Callable[..., None],
                      inner: str = "native") -> None:
    """Replace the flat floating ``tensor`` on every rank by the 1-bit-compressed mean over the ranks.

    ``op`` is "avg" (validated).  ``state`` is this rank's error feedback for this tensor (one per
    tensor or bucket, owned by the caller).  ``all_to_all`` and ``all_gather`` run the two steps (the
    functions of ``inner``'s algorithm for them: the registry's ``sub_algorithm``); ``inner`` names it, for
    byte counts.  Every rank of ``t`` calls it with tensors of the same numel and dtype, and the same steps.
    """
    n = t.size
    if n == 1 or tensor.numel() == 0:
        return  # the mean of one rank's tensor is the tensor: nothing to compress
    codec = state.worker_step(tensor, n, t.rank)  # 1. signs of every segment, and the scale, in codec.send
    rows = [codec.row] * n
    all_to_all(t, codec.recv.view(-1), codec.send.view(-1), rows, rows, tag=tag, deadline=deadline,
               segment_bytes=segment_bytes)  # 2. row j to rank j, the server of segment j
    state.server_step()  # 3. this rank's segment: mean of the n versions, compressed again, in codec.mine
    all_gather(t, codec.gathered.view(-1), codec.mine, tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    codec.decode(tensor)  # 4. every server's segment, decompressed into the tensor
