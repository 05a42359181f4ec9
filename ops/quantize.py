"""Block-wise symmetric quantization to int8 or int4 (ZeRO++'s weight and gradient codecs).

A 1-D tensor is cut into *blocks* of ``block`` elements (the last one zero-padded); each block keeps one
float32 *scale* = (its largest magnitude) / qmax, where qmax = 2**(bits-1) - 1 (127 for int8, 7 for int4),
and each element the integer ``round(x / scale)`` (half to even), clamped to [-qmax, qmax].  A block of
zeros has scale 0 and codes 0.  Decoding multiplies each code by its block's scale.

Codes, by ``bits``:

* 8: one ``int8`` per element;
* 4: two per ``uint8`` byte, each stored as ``code + 8`` (1..15): element 2i in the low nibble, element 2i+1
  in the high one.  ``block`` must then be even, so a block never shares a byte with the next.

The arithmetic is float32 whatever the input's dtype (bf16 and fp16 are widened first), so the codes equal
numpy's float32 computation exactly (``tests/ops/test_quantize.py``).  A block holding an infinity or a NaN
decodes to values that are not finite (never to finite ones).  ``BlockFeedback`` keeps the error feedback of
one quantized tensor: the part the codes could not represent is added to the next input.

On the CPU both directions run in C (``ops/_quantize.c``: one pass each way, the optional extension
``setup.py`` builds) when it was built, and as whole-tensor torch ops otherwise (and on CUDA); both give the
same bits.  ``dequantize_blocks(..., add=True)`` adds the decoded values into ``out`` in the same pass (the
sum of several ranks' codes without a temporary).

Nothing here communicates: zero/zeropp.py moves the codes and scales.
"""
from __future__ import annotations

from typing import Optional

import torch

BITS = (4, 8)


def _load_native():
    """The C kernels (``ops/_quantize.c``), or ``None`` where the extension was not built."""
    try:
        from . import _quantize
    except ImportError:
        return None
    return _quantize


#: The C kernels used for CPU tensors (``None``: torch ops everywhere; the tests set it to run both paths).
NATIVE = _load_native()


def _memory(t: torch.Tensor) -> tuple[int, int]:
    """A contiguous CPU tensor's (address, bytes), as the C kernels take it (numpy's buffer would fix the
    storage's size, and stage 3 resizes the storage of every unit it gathers)."""
    return t.data_ptr(), t.numel() * t.element_size()


def _qmax(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"quantize: bits must be one of {BITS}, got {bits!r}")
    return (1 << (bits - 1)) - 1


def _check_block(bits: int, block: int) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"quantize: block must be an int >= 1, got {block!r}")
    if bits == 4 and block % 2:
        raise ValueError(f"quantize: int4 packs two codes per byte, so block must be even, got {block}")


def quantized_blocks(numel: int, block: int) -> int:
    """Blocks (and scales) of a tensor of ``numel`` elements."""
    return -(-numel // block)


def code_bytes(numel: int, bits: int, block: int) -> int:
    """Bytes of the codes of ``numel`` elements (padded to whole blocks)."""
    padded = quantized_blocks(numel, block) * block
    return padded if bits == 8 else padded // 2


def quantized_nbytes(numel: int, bits: int, block: int) -> int:
    """Bytes of codes and float32 scales together: what a quantized tensor costs to send."""
    return code_bytes(numel, bits, block) + 4 * quantized_blocks(numel, block)


def quantize_blocks(x: torch.Tensor, *, bits: int, block: int,
                    out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the 1-D floating tensor ``x`` (see the module docstring for the layout).

    ``out``: a uint8 tensor of ``quantized_nbytes(x.numel(), bits, block)`` bytes to write into: the codes
    first, then the scales' bytes; the returned codes and scales are views of it (one buffer to send).
    """
    qmax = _qmax(bits)
    _check_block(bits, block)
    if x.dim() != 1 or not x.is_floating_point():
        raise ValueError(f"quantize: expected a 1-D floating tensor, got {x.dim()}-D {x.dtype}")
    numel, blocks = x.numel(), quantized_blocks(x.numel(), block)
    if NATIVE is not None and x.device.type == "cpu":
        return _quantize_native(x, bits, block, out)
    values = x.to(torch.float32)
    if blocks * block != numel:
        values = torch.nn.functional.pad(values, (0, blocks * block - numel))
    values = values.view(blocks, block)
    # Divided by a tensor, not a Python number: CUDA divides by a number as a multiply by its reciprocal, which
    # can differ from the CPU's division in the last bit (seen on an H200 for int4's 7); tensor by tensor is IEEE.
    scales = (values.abs().amax(dim=1, keepdim=True).div_(values.new_full((1, 1), float(qmax))) if blocks
              else values.new_zeros(0, 1))
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    # |x| / (max|x| / qmax) rounds to at most qmax, except where max|x| is subnormal (the scale then rounds
    # coarsely): the clamp keeps those blocks' codes in range.
    rounded = torch.round((values / safe).clamp_(-qmax, qmax)).view(-1)
    scales = scales.view(-1)
    if bits == 8:
        codes = rounded.to(torch.int8)
    else:
        nibbles = rounded.add_(8).to(torch.uint8)
        codes = nibbles[0::2] | (nibbles[1::2] << 4)
    if out is None:
        return codes, scales
    nbytes = quantized_nbytes(numel, bits, block)
    if out.dtype != torch.uint8 or out.numel() != nbytes:
        raise ValueError(f"quantize: out must be a uint8 tensor of {nbytes} bytes, got {out.numel()} x {out.dtype}")
    ncode = codes.numel()
    out[:ncode].copy_(codes.view(torch.uint8))
    out[ncode:].view(torch.float32).copy_(scales)
    return out[:ncode].view(codes.dtype), out[ncode:].view(torch.float32)


def _quantize_native(x: torch.Tensor, bits: int, block: int,
                     out: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    numel = x.numel()
    values = x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()
    ncode, blocks = code_bytes(numel, bits, block), quantized_blocks(numel, block)
    if out is None:
        codes = torch.empty(ncode, dtype=torch.int8 if bits == 8 else torch.uint8)
        scales = torch.empty(blocks, dtype=torch.float32)
    else:
        nbytes = ncode + 4 * blocks
        if out.dtype != torch.uint8 or out.numel() != nbytes or not out.is_contiguous():
            raise ValueError(f"quantize: out must be a contiguous uint8 tensor of {nbytes} bytes, got "
                             f"{out.numel()} x {out.dtype}")
        codes, scales = out[:ncode], out[ncode:].view(torch.float32)
        if bits == 8:
            codes = codes.view(torch.int8)
    NATIVE.quantize(*_memory(values), *_memory(codes), *_memory(scales), bits, block)
    return codes, scales


def split_payload(payload: torch.Tensor, numel: int, *, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) views of one buffer written by ``quantize_blocks(..., out=payload)``."""
    ncode = code_bytes(numel, bits, block)
    codes = payload[:ncode]
    return (codes.view(torch.int8) if bits == 8 else codes), payload[ncode:].view(torch.float32)


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, *, bits: int, block: int, numel: int,
                      out: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.float32,
                      add: bool = False) -> torch.Tensor:
    """The ``numel`` values that ``codes`` and ``scales`` stand for (into ``out`` if given, else a new
    tensor of ``dtype``; ``add``: added into ``out``, which must then be given).  ``numel`` may cover several
    quantized tensors laid end to end whose lengths are whole blocks (the payloads of several ranks, decoded
    at once)."""
    if add and out is None:
        raise ValueError("dequantize: add=True adds into out, which was not given")
    _qmax(bits)
    _check_block(bits, block)
    blocks = scales.numel()
    if blocks * block < numel:
        raise ValueError(f"dequantize: {blocks} scales of blocks of {block} cover {blocks * block} elements, "
                         f"fewer than numel {numel}")
    if bits == 4 and codes.numel() * 2 != blocks * block:
        raise ValueError(f"dequantize: {codes.numel()} int4 code bytes for {blocks} blocks of {block}")
    if bits == 8 and codes.numel() != blocks * block:
        raise ValueError(f"dequantize: {codes.numel()} int8 codes for {blocks} blocks of {block}")
    if out is not None and out.numel() != numel:
        raise ValueError(f"dequantize: out has {out.numel()} elements, expected {numel}")
    if NATIVE is not None and codes.device.type == "cpu":
        if codes.element_size() != 1:
            raise ValueError(f"dequantize: codes must be bytes (int8 or uint8), got {codes.dtype}")
        codes, scales = codes.contiguous(), scales.to(torch.float32).contiguous()
        if out is not None and out.dtype == torch.float32 and out.is_contiguous():
            NATIVE.dequantize(*_memory(out), *_memory(codes), *_memory(scales), bits, block, add)
            return out
        values = torch.empty(numel, dtype=torch.float32)
        NATIVE.dequantize(*_memory(values), *_memory(codes), *_memory(scales), bits, block, False)
        if out is None:
            return values if dtype == torch.float32 else values.to(dtype)
        return out.add_(values.view(out.shape)) if add else out.copy_(values.view(out.shape))
    if bits == 4:
        values = torch.empty(blocks * block, dtype=torch.float32, device=codes.device)
        pairs = values.view(-1, 2)
        pairs[:, 0] = codes & 0x0F
        pairs[:, 1] = codes >> 4
        values = values.sub_(8).view(blocks, block)
    else:
        values = codes.view(torch.int8).view(blocks, block).to(torch.float32)
    values = values.mul_(scales.view(blocks, 1)).view(-1)[:numel]
    if out is None:
        return values.to(dtype)
    if add:
        return out.add_(values.view(out.shape))
    out.copy_(values.view(out.shape))
    return out


class BlockFeedback:
    """Error feedback for one tensor quantized again and again (a gradient bucket's chunk, step after step).

    ``quantize(x)`` quantizes ``x + error`` and keeps ``error = (x + error) - decoded`` for the next call, so
    what the codes lose is sent later rather than lost; the sum of the decoded values over k calls differs
    from the sum of the inputs by the last error only.  The error is float32, created as zeros on first use,
    and a later input of another length raises ``ValueError``.  One instance per tensor, owned by the caller.
    """

    __slots__ = ("name", "bits", "block", "error")

    def __init__(self, *, bits: int, block: int, name: str = "") -> None:
        _qmax(bits)
        _check_block(bits, block)
        self.name, self.bits, self.block = name, bits, block
        self.error: Optional[torch.Tensor] = None

    def quantize(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.error is None:
            self.error = torch.zeros(x.numel(), dtype=torch.float32, device=x.device)
        elif self.error.numel() != x.numel():
            raise ValueError(f"error feedback {self.name!r}: kept for {self.error.numel()} elements, got "
                             f"{x.numel()}")
        compensated = x.to(torch.float32) + self.error
        codes, scales = quantize_blocks(compensated, bits=self.bits, block=self.block, out=out)
        decoded = dequantize_blocks(codes, scales, bits=self.bits, block=self.block, numel=x.numel())
        torch.sub(compensated, decoded, out=self.error)
        return codes, scales
