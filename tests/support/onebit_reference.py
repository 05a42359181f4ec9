"""A single-process numpy model of the 1-bit compressed all_reduce (the published scheme's 4 steps).

It holds every rank's error-feedback state and says what every rank should end up with, so a
test compares each rank's result *and* its ``ErrorFeedback`` tensors after several calls.
Nothing here calls zerocomm: the padding rule, the scale and the sign convention are written out
again from the published description (Tang et al. 2021) on purpose.

Conventions it pins down (the ones a second implementation could get wrong):

* the tensor is padded with zeros to ``P``, the smallest multiple of ``8 n`` >= ``numel``, but
  the padding carries nothing: scales are taken over the real elements only
  (``scale = ||x[:valid]||_2 / sqrt(valid)``, 0 when ``valid`` is 0) and the errors stay 0 in
  padded slots (unlike DeepSpeed, whose padding accumulates error and shrinks the scale);
* ``sign(0) = +1``;
* segment ``j`` (``L = P / n`` elements, ``valid_j = clamp(numel - j L, 0, L)`` real ones) is
  served by rank ``j``: it averages the ``n`` decompressed versions in rank order, zeroes the
  padding, adds its server error and compresses again;
* half-precision inputs are computed in float32 and rounded to their dtype once, at the end;
  float64 stays float64;
* one rank, or an empty tensor: nothing is compressed and the state is not touched.
"""
from __future__ import annotations

import numpy as np


def padded_numel(numel: int, world_size: int) -> int:
    unit = 8 * world_size
    return -(-numel // unit) * unit


def _compress(x: np.ndarray, valid: int) -> np.ndarray:
    """``scale * sign(x)`` in ``x``'s dtype, the scale taken over ``x[:valid]`` and rounded to that dtype."""
    head = x[:valid].astype(np.float64)
    scale = x.dtype.type(np.sqrt(np.dot(head, head) / valid) if valid else 0.0)
    return np.where(x >= 0, scale, -scale).astype(x.dtype)


def _feedback(x: np.ndarray, valid: int) -> tuple[np.ndarray, np.ndarray]:
    """(what is sent, the new error): the error keeps ``x - sent`` on the real elements, 0 on padding."""
    sent = _compress(x, valid)
    error = x - sent
    error[valid:] = 0
    return sent, error


class OneBitModel:
    """Every rank's error feedback for one tensor of ``numel`` elements on ``world_size`` ranks.

    ``work_dtype`` is ``np.float64`` for float64 inputs and ``np.float32`` otherwise.
    ``worker[r]`` has ``P`` elements, ``server[r]`` has ``P / n``; both ``None`` until used.
    """

    def __init__(self, world_size: int, numel: int, work_dtype=np.float32):
        self.n = world_size
        self.numel = numel
        self.dtype = np.dtype(work_dtype)
        self.padded = padded_numel(numel, world_size)
        self.worker: list[np.ndarray | None] = [None] * world_size
        self.server: list[np.ndarray | None] = [None] * world_size

    def call(self, inputs: list[np.ndarray]) -> np.ndarray:
        """One compressed_all_reduce of ``inputs[r]`` (rank r's values); the result every rank gets,
        in the work dtype, ``numel`` elements.  Updates the states."""
        n, P = self.n, self.padded
        if len(inputs) != n:
            raise ValueError(f"expected {n} inputs, got {len(inputs)}")
        if n == 1 or self.numel == 0:
            return np.asarray(inputs[0], dtype=self.dtype).copy()
        L = P // n
        messages = []
        for r in range(n):  # step 1, on every rank
            x = np.zeros(P, dtype=self.dtype)
            x[: self.numel] = inputs[r]
            if self.worker[r] is not None:
                x += self.worker[r]
            sent, self.worker[r] = _feedback(x, self.numel)
            messages.append(sent)
        out = np.empty(P, dtype=self.dtype)
        for j in range(n):  # steps 2-3: rank j serves segment j
            mean = np.zeros(L, dtype=self.dtype)
            for r in range(n):
                mean += messages[r][j * L:(j + 1) * L]
            mean /= self.dtype.type(n)
            valid = min(max(self.numel - j * L, 0), L)
            mean[valid:] = 0
            if self.server[j] is not None:
                mean += self.server[j]
            out[j * L:(j + 1) * L], self.server[j] = _feedback(mean, valid)  # step 4 decompresses every segment
        return out[: self.numel]
