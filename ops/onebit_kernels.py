"""Fused kernels of the 1-bit compressed all_reduce: one pass over the data per step.

The schedule (``comm/algorithms/compressed.py``) has three local steps; each is one kernel here:

``worker``  x ← (x − sent) + tensor on the real elements, 0 on the padding; the sum of squares of x;
            its signs packed into the rows of the all_to_all message, the scale behind each row.
``server``  the mean of the n received versions of this rank's segment (decoded, summed in rank
            order, divided by n), plus the server error; sum of squares, signs, scale into one row.
``decode``  every gathered row, ``±scale`` per element, into the caller's tensor.

[Note: lazy error feedback]  The published update keeps ``e = x − scale·sign(x)`` after each
call, which takes a second pass over x once the scale (a norm over all of x) is known.  We keep
``x`` and the scale instead (``pending``) and subtract ``copysign(scale, x)`` at the start of the
next call, in the same pass that adds the new tensor, so each step reads and writes its state
once.  ``copysign(s, x)`` is exactly the sent value ``s if x >= 0 else -s`` for every x except
-0.0, which never occurs: the state starts at +0.0, ``x − copysign(s, x)`` rounds to +0.0 when it
cancels, and ``+0.0 + t`` is +0.0 for ``t = -0.0`` (loaded states are cleared of -0.0 on load).
NaN stays NaN either way.  ``settle`` turns x back into e when someone reads the state.

On CPU the three steps run in C when the optional extension ``zerocomm.ops._onebit`` was built
(``NATIVE``; the README's install command builds it): per block, one C call does what the ufuncs
below do (update, signs; for the server step the row mean too) in one pass with the GIL released,
reading and writing float32, bfloat16 and float16 tensors directly, and numpy's ``dot`` then sums the
block's squares while it is still in cache, as the numpy path does.  Without it (no compiler at
install time, float64 work, or ``NATIVE = None``) numpy runs the same arithmetic in the same order:
both paths give the same bits.

The numpy kernels work on blocks of ``BLOCK`` elements with ufuncs writing into preallocated
scratch (no temporaries): a block's several passes stay in the core's L2 cache, so main memory
sees one read of the state and the input and one write of the state per call.  numpy rather than
torch for the element passes: its comparison writes a bool mask ~5x faster than ``torch.ge``, and
its ufunc calls cost ~1 µs against torch's ~5 µs per block.  Signs are packed with
``np.packbits`` (little-end bit order, see ``ops/onebit.py``) and unpacked with a 256-row table:
row b holds the 8 values ``±scale`` that byte b encodes, copied with one ``np.take`` per block
(the rows are viewed as one 32-byte item, so each byte costs one fixed-size copy).

Other devices run the same arithmetic with whole-tensor torch ops (``_TorchCodec``), or, on CUDA
with cupy installed (``zerocomm[cuda]``), with fused CUDA kernels (``ops/onebit_cuda.py``).  A
``Codec`` holds one bucket's message buffers and runs the three steps; ``ErrorFeedback`` owns it
and sized it, so nothing here checks arguments.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

#: Elements per CPU block: the block of x, its scratch and its mask (~0.6 MiB in float32) stay in
#: L2 while the block's ufuncs run; larger blocks spill, smaller ones pay more per-call overhead.
BLOCK = 1 << 18

def _load_native():
    """The C kernels (``ops/_onebit.c``), or ``None`` where the extension was not built."""
    try:
        from . import _onebit
    except ImportError:
        return None
    return _onebit


#: The C kernels, or ``None``: the numpy path then runs.  Read when a codec is made (tests set it).
NATIVE = _load_native()

#: Tensor dtypes the C kernels read and write directly, and their source kind code.
_NATIVE_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: Packing multiplier of the torch path: eight 0/1 bytes of a little-endian uint64 times this put
#: byte i's bit at bit 56 + i (the products never overlap, so there are no carries).
_PACK_MAGIC = 0x0102040810204080

_SIGN_BIT = {np.dtype(np.float32): np.int32(-2**31), np.dtype(np.float64): np.int64(-2**63)}
_INT_OF = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _sign_rows(dtype) -> np.ndarray:
    """(256, 8) of ±1: row b holds the signs byte b encodes (bit i → element i, 1 → +1)."""
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return (bits * 2 - 1).astype(dtype)


def scale_of(sum_of_squares: float, valid: int, dtype) -> float:
    """``sqrt(sum / valid)`` rounded once to ``dtype`` (0 for no element): the L2-preserving scale."""
    return float(np.dtype(dtype).type(math.sqrt(sum_of_squares / valid) if valid else 0.0))


def _clamp(value: int, high: int) -> int:
    return min(max(value, 0), high)


def _signed_bytes(scale: float, dtype: torch.dtype) -> tuple[bytes, bytes]:
    """``+scale`` and ``-scale`` (a float32 value) rounded once to ``dtype``, as raw bytes: what the numpy
    path's final ``copy_`` into a tensor of that dtype writes (numpy rounds as torch does, to nearest even)."""
    if dtype == torch.bfloat16:  # numpy has no bfloat16
        signed = torch.tensor([scale, -scale], dtype=torch.float32).to(dtype).view(torch.uint8).numpy()
    else:
        signed = np.array([scale, -scale], np.float32).astype(np.float16 if dtype == torch.float16 else np.float32)
    pos, neg = signed.view(np.uint8).reshape(2, -1)
    return pos.tobytes(), neg.tobytes()


def _raw(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory: float32 as is, 16-bit floats as int16 (numpy has no bfloat16)."""
    return tensor.numpy() if tensor.dtype == torch.float32 else tensor.view(torch.int16).numpy()



class Codec:
    """Sizes and message buffers of one bucket's compressed all_reduce; the steps are a subclass's.

    ``numel`` real elements are padded to ``padded`` (``P``, a multiple of ``8 n``) and cut into n
    segments of ``seg`` elements; rank r serves segment r, of which ``valid`` elements are real.  A
    *row* is one compressed segment: ``seg_bytes = seg / 8`` bytes of signs, then the scale's
    ``scale_bytes`` bytes (native byte order).  Buffers, uint8 on ``device``, reused every call:

    - ``send`` (n, row): row j = segment j's signs of this rank's x and this rank's scale;
    - ``recv`` (n, row): row r = rank r's row for this rank's segment (the all_to_all's output);
    - ``mine`` (row,): this rank's server message;  ``gathered`` (n, row): server j's message.
    """

    def __init__(self, numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
        self.key = (numel, n, rank, dtype, device)
        self.numel, self.n, self.rank, self.dtype, self.device = numel, n, rank, dtype, device
        self.padded = -(-numel // (8 * n)) * 8 * n
        self.seg = self.padded // n
        self.seg_bytes = self.seg // 8
        self.scale_bytes = torch.empty((), dtype=dtype).element_size()
        self.row = self.seg_bytes + self.scale_bytes
        self.valid = _clamp(numel - rank * self.seg, self.seg)
        self.send = torch.empty((n, self.row), dtype=torch.uint8, device=device)
        self.recv = torch.empty_like(self.send)
        self.mine = torch.empty(self.row, dtype=torch.uint8, device=device)
        self.gathered = torch.empty_like(self.send)

    def segment_valid(self, j: int) -> int:
        """Real elements of segment j."""
        return _clamp(self.numel - j * self.seg, self.seg)


class _CpuCodec(Codec):
    """numpy kernels over ``BLOCK``-element blocks; pending scales are Python floats."""

    def __init__(self, numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
        super().__init__(numel, n, rank, dtype, device)
        self.np_dtype = np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
        self.int_type = _INT_OF[self.np_dtype]
        self.sign_bit = _SIGN_BIT[self.np_dtype]
        self.item = np.dtype((np.void, 8 * self.np_dtype.itemsize))  # one table row: 8 values
        self.rows = _sign_rows(self.np_dtype)
        #: The C kernels for float32 work (``None``: numpy).
        self.native = NATIVE if dtype == torch.float32 else None
        self.tmp = np.empty(BLOCK, self.np_dtype)
        self.acc = np.empty(BLOCK, self.np_dtype)
        self.mask = np.empty(BLOCK, np.bool_)
        self.index = np.empty(BLOCK // 8, np.intp)
        self.send_np, self.recv_np = self.send.numpy(), self.recv.numpy()
        self.mine_np, self.gathered_np = self.mine.numpy(), self.gathered.numpy()

    # -- the three steps ----------------------------------------------------------------------------

    def worker(self, tensor: torch.Tensor, x: torch.Tensor, pending: Optional[float]) -> float:
        """Step 1: x ← (x − sent) + tensor, signs into ``send``; the new scale (also in every row)."""
        x, seg, native = x.numpy(), self.seg, self.native
        total = 0.0
        if native is not None and tensor.dtype in _NATIVE_KINDS:
            t, kind = _raw(tensor.detach()), _NATIVE_KINDS[tensor.dtype]
            for j in range(self.n):
                base = j * seg

                def block(a: int, b: int, hi: int, xb: np.ndarray, bits: np.ndarray) -> None:
                    native.encode(xb, hi - a, pending, bits, t[base + a:base + hi], kind)

                total += self.encode_blocks(x[base:base + seg], self.segment_valid(j), self.send_np[j, :self.seg_bytes],
                                            block)
        else:
            src = tensor.detach() if tensor.dtype == self.dtype else tensor.detach().to(self.dtype)
            t = src.numpy()
            for j in range(self.n):
                base = j * seg
                total += self.encode(x[base:base + seg], lambda a, b: t[base + a:base + b], self.segment_valid(j),
                                     pending, self.send_np[j, :self.seg_bytes])
        scale = scale_of(total, self.numel, self.np_dtype)
        self.send_np[:, self.seg_bytes:] = self._scale_as_bytes(scale)
        return scale

    def server(self, x: torch.Tensor, pending: Optional[float]) -> float:
        """Step 3: x ← (x − sent) + mean of ``recv``'s rows, signs and scale into ``mine``; the scale."""
        values, divisor = self.mean_terms(self._scales(self.recv_np))
        native = self.native
        if native is not None:
            def block(a: int, b: int, hi: int, xb: np.ndarray, bits: np.ndarray) -> None:
                native.encode_mean(xb, hi - a, pending, bits, self.recv_np, self.row, a // 8, values, divisor or 0.0)

            total = self.encode_blocks(x.numpy(), self.valid, self.mine_np[:self.seg_bytes], block)
        else:
            src = self.mean_source(self.recv_np[:, :self.seg_bytes], values, divisor)
            total = self.encode(x.numpy(), src, self.valid, pending, self.mine_np[:self.seg_bytes])
        scale = scale_of(total, self.valid, self.np_dtype)
        self.mine_np[self.seg_bytes:] = self._scale_as_bytes(scale)
        return scale

    def decode(self, tensor: torch.Tensor) -> None:
        """Step 4: ``tensor`` (``numel`` elements) ← every gathered row's ``±scale`` values."""
        if self.native is not None and tensor.dtype in _NATIVE_KINDS:
            out = _raw(tensor.detach())
            for j, scale in enumerate(self._scales(self.gathered_np)):
                pos, neg = _signed_bytes(scale, tensor.dtype)
                base, count = j * self.seg, self.segment_valid(j)
                self.native.decode(out[base:base + count], self.gathered_np[j], count, pos, neg)
            return
        direct = tensor.dtype == self.dtype
        out = tensor.detach().numpy() if direct else np.empty(self.numel, self.np_dtype)
        tail = self.tmp[:8]
        for j, scale in enumerate(self._scales(self.gathered_np)):
            table, base, count = self.table(scale), j * self.seg, self.segment_valid(j)
            whole = count // 8
            self.decode_into(table, self.gathered_np[j, :whole], out[base:base + 8 * whole])
            if count > 8 * whole:  # the last real byte holds a few padding bits too
                self.decode_into(table, self.gathered_np[j, whole:whole + 1], tail)
                out[base + 8 * whole:base + count] = tail[:count - 8 * whole]
        if not direct:
            tensor.copy_(torch.from_numpy(out))

    def settle(self, x: torch.Tensor, pending: float, valid: int) -> None:
        """x ← x − copysign(pending, x) on [0, valid), 0 after: the error the lazy state stands for."""
        head = x.numpy()[:valid]
        np.subtract(head, np.copysign(self.np_dtype.type(pending), head), out=head)
        x[valid:] = 0

    # -- kernels ------------------------------------------------------------------------------------

    def encode(self, x: np.ndarray, src: Callable[[int, int], np.ndarray], valid: int,
               pending: Optional[float], bits: np.ndarray) -> float:
        """x[:valid] ← (x − copysign(pending, x)) + src, x[valid:] ← 0; ``bits`` ← the packed signs of x.

        ``x``: 1-D, a multiple of 8 elements; ``src(a, b)`` returns the source of elements [a, b);
        ``bits``: ``len(x) / 8`` bytes.  Returns the sum of squares of the new ``x[:valid]``.
        """
        total = 0.0
        as_int = self.int_type
        scale_bits = None if pending is None else self.np_dtype.type(pending).view(as_int)
        for a in range(0, x.size, BLOCK):
            b = min(a + BLOCK, x.size)
            hi = min(b, max(valid, a))
            xb = x[a:b]
            if hi > a:
                head = xb[:hi - a]
                if scale_bits is not None:  # sent = copysign(pending, x) on the bits: see the note
                    sent = self.tmp[:hi - a]
                    np.bitwise_and(head.view(as_int), self.sign_bit, out=sent.view(as_int))
                    np.bitwise_or(sent.view(as_int), scale_bits, out=sent.view(as_int))
                    np.subtract(head, sent, out=head)
                np.add(head, src(a, hi), out=head)
                total += float(np.dot(head, head))
            if hi < b:
                xb[hi - a:] = 0
            mask = self.mask[:b - a]
            np.greater_equal(xb, 0, out=mask)
            bits[a // 8:b // 8] = np.packbits(mask, bitorder="little")
        return total

    @staticmethod
    def encode_blocks(x: np.ndarray, valid: int, bits: np.ndarray,
                      block: Callable[[int, int, int, np.ndarray, np.ndarray], None]) -> float:
        """``encode`` through a C kernel: ``block(a, b, hi, x[a:b], bits[a/8:b/8])`` does a block's work
        (elements [a, hi) real); the sums of squares are the numpy path's, block by block."""
        total = 0.0
        for a in range(0, x.size, BLOCK):
            b = min(a + BLOCK, x.size)
            hi = min(b, max(valid, a))
            block(a, b, hi, x[a:b], bits[a // 8:b // 8])
            if hi > a:
                head = x[a:hi]
                total += float(np.dot(head, head))
        return total

    def table(self, scale: float) -> np.ndarray:
        """The 256 rows ``±scale``, each one 8-value item (for ``np.take``)."""
        return (self.rows * self.np_dtype.type(scale)).view(self.item).reshape(256)

    def decode_into(self, table: np.ndarray, packed: np.ndarray, out: np.ndarray) -> None:
        """``out`` (8 values per packed byte) ← the table rows of the bytes, a block at a time.

        The bytes are first widened into a reused intp index: ``np.take`` then skips its own
        conversion, and ``mode="clip"`` its bounds check (a byte is always a row): 4x faster than a
        take indexed by the uint8 bytes."""
        items = out.view(self.item).reshape(-1)
        step = BLOCK // 8
        for a in range(0, packed.size, step):
            index = self.index[:min(step, packed.size - a)]
            np.copyto(index, packed[a:a + step])
            np.take(table, index, out=items[a:a + step], mode="clip")

    def mean_terms(self, scales: list[float]) -> tuple[list[float], Optional[float]]:
        """The mean of rows with ``scales``: (each row's ``±value``, rounded to the work dtype; the divisor
        of their sum, or ``None``)."""
        n = len(scales)
        # For n a power of two, dividing by n scales exactly, so it can go into the tables: one pass
        # fewer, the same values (barring subnormal scales).
        folded = n & (n - 1) == 0
        values = [float(self.np_dtype.type(s / n if folded else s)) for s in scales]
        return values, None if folded else float(n)

    def mean_source(self, packed_rows: np.ndarray, values: list[float],
                    divisor: Optional[float]) -> Callable[[int, int], np.ndarray]:
        """``src(a, b)``: the mean over the rows of their decoded elements [a, b), summed in row order
        (``mean_terms``' values and divisor)."""
        tables = [self.table(v) for v in values]
        divisor = None if divisor is None else self.np_dtype.type(divisor)

        def src(a: int, b: int) -> np.ndarray:
            lo, hi = a // 8, -(-b // 8)
            acc, tmp = self.acc[:(hi - lo) * 8], self.tmp[:(hi - lo) * 8]
            self.decode_into(tables[0], packed_rows[0, lo:hi], acc)
            for table, row in zip(tables[1:], packed_rows[1:]):
                self.decode_into(table, row[lo:hi], tmp)
                np.add(acc, tmp, out=acc)
            if divisor is not None:
                np.divide(acc, divisor, out=acc)
            return acc[:b - a]

        return src

    def _scale_as_bytes(self, scale: float) -> np.ndarray:
        return np.array([scale], self.np_dtype).view(np.uint8)

    def _scales(self, rows: np.ndarray) -> list[float]:
        return rows[:, self.seg_bytes:].copy().view(self.np_dtype).reshape(-1).tolist()


# --- other devices: whole-tensor torch ops -----------------------------------------------------------

def pack_signs_torch(x: torch.Tensor) -> torch.Tensor:
    """The ``len(x) / 8`` little-end packed bytes of ``x >= 0``, any device, pure torch (len(x) % 8 == 0)."""
    words = (x >= 0).view(torch.uint8).view(torch.int64)  # 8 flags per little-endian word
    return (words * _PACK_MAGIC).view(torch.uint8).view(-1, 8)[:, 7]


class _TorchCodec(Codec):
    """Whole-tensor torch ops (CUDA without cupy, other devices); pending scales are 0-d tensors."""

    def __init__(self, numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
        super().__init__(numel, n, rank, dtype, device)
        self.rows = torch.from_numpy(_sign_rows(np.float64)).to(device=device, dtype=dtype)
        self.offsets = 256 * torch.arange(n, device=device).view(n, 1)

    def worker(self, tensor: torch.Tensor, x: torch.Tensor, pending) -> torch.Tensor:
        scale = self.encode(x, tensor.detach(), self.numel, pending, self.send[:, :self.seg_bytes])
        self.send[:, self.seg_bytes:] = scale.reshape(1).view(torch.uint8)
        return scale

    def server(self, x: torch.Tensor, pending) -> torch.Tensor:
        versions = self.decode_rows(self.recv)
        mean = versions[0].clone()
        for version in versions[1:]:  # in rank order, as the published scheme sums
            mean.add_(version)
        mean.div_(self.n)
        scale = self.encode(x, mean, self.valid, pending, self.mine[:self.seg_bytes].view(1, -1))
        self.mine[self.seg_bytes:] = scale.reshape(1).view(torch.uint8)
        return scale

    def decode(self, tensor: torch.Tensor) -> None:
        tensor.copy_(self.decode_rows(self.gathered).view(-1)[:self.numel])

    def settle(self, x: torch.Tensor, pending, valid: int) -> None:
        head = x[:valid]
        head.sub_(torch.copysign(torch.as_tensor(pending, device=x.device).to(x.dtype), head))
        x[valid:] = 0

    def encode(self, x: torch.Tensor, src: torch.Tensor, valid: int, pending, bits: torch.Tensor) -> torch.Tensor:
        """As ``_CpuCodec.encode`` on whole tensors; ``bits`` is (rows, bytes), filled row-major.  The scale."""
        head = x[:valid]
        if pending is not None:
            head.sub_(torch.copysign(pending.to(self.dtype), head))
        head.add_(src[:valid])
        x[valid:] = 0
        bits.copy_(pack_signs_torch(x).view(bits.shape))
        if valid == 0:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        return torch.sqrt(torch.dot(head, head).double() / valid).to(self.dtype)

    def decode_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, row) messages → (n, seg) values ``±scale`` of their row."""
        scales = rows[:, self.seg_bytes:].clone().view(self.dtype).view(self.n, 1, 1)
        tables = (self.rows.view(1, 256, 8) * scales).view(self.n * 256, 8)
        index = rows[:, :self.seg_bytes].long() + self.offsets
        return tables.index_select(0, index.view(-1)).view(self.n, self.seg)
