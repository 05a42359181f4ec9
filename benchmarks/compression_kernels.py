"""The local 1-bit kernels alone: ``zerocomm-bench compression --kernels``.

One process, no communication.  Per size S (a float32 buffer of S / 4 elements, padded for n = 2 ranks)
it times, with the best of ``iters`` calls each (a quiet machine's figure; the load is printed beside):

* ``copy_``: one copy of the buffer, what moving its bytes through memory costs;
* encode: the fused worker step (``ErrorFeedback.worker_step``: add the error, sum of squares, signs
  into the message, error kept for the next call), beside the unfused per-tensor path the schedule
  used before (``ErrorFeedback.compensate_and_compress`` on the padded copy of the tensor);
* server: the fused server step (decode both ranks' rows of this rank's segment, average, error,
  signs), for the segment of S / 2;
* decode: the fused decode of every gathered row into the tensor, beside ``decompress``.

"fused" is what a compressed all_reduce runs: the C kernels when the optional extension
``zerocomm.ops._onebit`` is built, else numpy; with the extension, "fused, numpy" rows time the numpy
path beside them.

GB/s are of float32 input (S / time).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from .units import format_size

RANKS = 2
"""The world size the steps are sized for: the server step works on 1/RANKS of the buffer."""


def _best(call: Callable[[], object], iters: int) -> float:
    call()  # first use: buffers are allocated here
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _fused(tensor, out, iters: int, variant: str) -> list[tuple[str, str, float]]:
    """The three fused steps on ``tensor`` with the kernels ``ops.onebit_kernels`` picks now."""
    from zerocomm.ops import ErrorFeedback

    fused = ErrorFeedback(variant)
    codec = fused.worker_step(tensor, RANKS, 0)
    codec.recv.copy_(codec.send)  # this rank's row twice: the server step's work does not depend on the bits
    fused.server_step()
    codec.gathered.copy_(codec.send)
    return [("encode", variant, _best(lambda: fused.worker_step(tensor, RANKS, 0), iters)),
            ("server", variant, _best(fused.server_step, iters)),
            ("decode", variant, _best(lambda: codec.decode(out), iters))]


def measure(size: int, iters: int) -> list[tuple[str, str, float]]:
    """``(kernel, variant, seconds)`` for one buffer of ``size`` bytes."""
    import torch

    import zerocomm.ops.onebit_kernels as kernels
    from zerocomm.ops import ErrorFeedback, decompress, onebit_padded_numel

    numel = max(1, size // 4)
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(numel, generator=generator)
    out = torch.empty_like(tensor)
    fused = _fused(tensor, out, iters, "fused")
    native = kernels.NATIVE
    if native is not None:
        kernels.NATIVE = None
        try:
            fused += _fused(tensor, out, iters, "fused, numpy")
        finally:
            kernels.NATIVE = native
    padded = torch.zeros(onebit_padded_numel(numel, RANKS))
    unfused = ErrorFeedback("unfused")

    def encode_unfused():
        padded[:numel] = tensor  # the schedule's padded copy of the tensor
        return unfused.compensate_and_compress(padded, numel)

    packed, scale = encode_unfused()
    whole = torch.empty(padded.numel())
    rows = [
        ("copy_", "memory", _best(lambda: out.copy_(tensor), iters)),
        ("encode", "unfused (before)", _best(encode_unfused, iters)),
        ("decode", "unfused (before)", _best(lambda: decompress(packed, scale, whole.numel(), whole), iters)),
    ] + fused
    order = ("copy_", "encode", "server", "decode")
    return sorted(rows, key=lambda row: order.index(row[0]))  # stable: each kernel's variants as listed


def run_kernels(sizes: Sequence[int], iters: int, threads: int) -> str:
    """The table of every size's kernels (one torch thread unless ``threads`` says otherwise)."""
    import torch
    from tabulate import tabulate

    torch.set_num_threads(threads)
    table = []
    for size in sizes:
        timings = measure(size, iters)
        before = {kernel: seconds for kernel, variant, seconds in timings if variant.startswith("unfused")}
        for kernel, variant, seconds in timings:
            speedup = f"{before[kernel] / seconds:.1f}" if kernel in before and variant.startswith("fused") else ""
            table.append([format_size(size), kernel, variant, f"{seconds * 1e3:.2f}", f"{size / seconds / 1e9:.2f}",
                          speedup])
    headers = ["size", "kernel", "variant", "ms", "GB/s of input", "speedup"]
    import zerocomm.ops.onebit_kernels as kernels

    path = "the C kernels (zerocomm.ops._onebit)" if kernels.NATIVE is not None else "numpy (no C extension built)"
    return "\n".join([
        f"# 1-bit kernels alone, one process, {threads} torch thread(s), sized for {RANKS} ranks; best of "
        f"{iters} calls; GB/s = float32 input bytes / time; fused = {path}",
        tabulate(table, headers=headers, disable_numparse=True, stralign="right"),
    ])
