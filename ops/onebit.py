"""1-bit sign compression with error feedback: the local kernels of a 1-bit all_reduce.

Bit layout
    ``pack_signs`` stores 8 signs a byte in little-end bit order: bit ``i``
    (value ``1 << i``) of byte ``k`` holds element ``8k + i``.  A bit is 1 when
    the element is ``>= 0`` (zero and -0.0 count as positive, NaN as negative)
    and 0 otherwise.  ``n`` elements take ``ceil(n / 8)`` bytes; the unused high
    bits of the last byte are 0.  This is ``np.packbits(x >= 0,
    bitorder="little")`` byte for byte, so the torch and numpy paths interoperate.

Scale
    ``compress`` sends one scale per tensor, ``||x||_2 / sqrt(numel)`` (0 for an
    empty tensor), computed in float32, or float64 for float64 input.  It is the
    value that keeps ``scale * sign(x)`` at the same L2 norm as ``x``.

Padding rule
    The compressed all_reduce splits the packed signs into ``world_size`` chunks
    that travel with all_to_all, so every chunk must be a whole number of bytes.
    A bucket of ``numel`` elements is therefore padded with zeros to
    ``onebit_padded_numel(numel, world_size)``, the smallest multiple of
    ``8 * world_size`` that is ``>= numel``; rank ``r``'s segment is elements
    ``[r * L, (r + 1) * L)`` with ``L = padded / world_size``, i.e. bytes
    ``[r * L / 8, (r + 1) * L / 8)`` of the packed signs.  The padding is
    excluded from scales (``compress(x, valid)``) and its error is kept at 0,
    so padding neither shrinks a scale nor accumulates error.

Error feedback (1-bit Adam, Tang et al. 2021)
    ``ErrorFeedback`` holds, for one bucket, the worker error (step 1, the
    padded bucket's size) and the server error (step 3, this rank's segment's
    size).  The communication between the steps belongs to ``zerocomm.comm``.

Kernels
    The functions here work on one tensor at a time (plain torch, any device).  The
    compressed all_reduce runs its three local steps through ``ErrorFeedback.worker_step``,
    ``server_step`` and the codec's ``decode``, each one fused pass over the data
    (``ops/onebit_kernels.py``: the optional C kernels of ``ops/_onebit.c`` or numpy blocks on CPU,
    torch or cupy on CUDA).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "pack_signs",
    "unpack_signs",
    "pack_signs_numpy",
    "unpack_signs_numpy",
    "compress",
    "decompress",
    "onebit_padded_numel",
    "ErrorFeedback",
]


def _shifts(device: torch.device) -> torch.Tensor:
    # Bit i of a byte holds element 8k + i: shifting column i left by i places
    # it there.  Eight bytes, so rebuilding it per call costs nothing.
    return torch.arange(8, dtype=torch.uint8, device=device)


def _packed_bytes(numel: int) -> int:
    return -(-numel // 8)


def _check_numel(numel: object, op: str) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"{op}: numel must be an int >= 0, got {numel!r}")
    return numel


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Pack the signs of ``x`` (any shape, read in row-major order) into a 1-D uint8 tensor.

    Returns ``ceil(x.numel() / 8)`` bytes on ``x``'s device; see the module
    docstring for the bit layout.  Works for any dtype that compares with 0
    (float16, bfloat16, float32, float64 and the integer types).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pack_signs: expected a torch.Tensor, got {type(x).__name__}")
    flat = x.reshape(-1)
    n = flat.numel()
    nbytes = _packed_bytes(n)
    if flat.device.type == "cpu":
        # numpy's packbits is one C loop, about 2.5x the torch expression below on one core.
        return torch.from_numpy(np.packbits((flat >= 0).numpy(), bitorder="little"))
    # Padding bits stay 0 so the packed form of a tensor is unique.
    bits = torch.zeros(nbytes * 8, dtype=torch.uint8, device=x.device)
    bits[:n] = flat >= 0
    # Each row's shifted bits are distinct powers of two, so their sum is their OR
    # and never exceeds 255.
    return (bits.view(nbytes, 8) << _shifts(x.device)).sum(dim=1, dtype=torch.uint8)


def _check_packed(packed: object, numel: int, op: str) -> torch.Tensor:
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{op}: packed must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8:
        raise ValueError(f"{op}: packed must be uint8, got {packed.dtype}")
    need = _packed_bytes(numel)
    if packed.numel() < need:
        raise ValueError(
            f"{op}: {numel} elements need {need} packed bytes, but packed has {packed.numel()}"
        )
    return packed


def unpack_signs(packed: torch.Tensor, numel: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of ``pack_signs``: a 1-D tensor of ``numel`` values +1 / -1 of ``dtype`` on ``packed``'s device.

    ``packed`` must hold at least ``ceil(numel / 8)`` bytes; only the first
    ``numel`` bits are read, so a padded buffer can be unpacked to its unpadded
    length.  ``dtype`` must be a floating or signed integer type.
    """
    numel = _check_numel(numel, "unpack_signs")
    packed = _check_packed(packed, numel, "unpack_signs")
    if dtype == torch.bool or dtype == torch.uint8 or dtype.is_complex:
        raise ValueError(f"unpack_signs: dtype must hold -1 (a float or signed int type), got {dtype}")
    nbytes = _packed_bytes(numel)
    body = packed.reshape(-1)[:nbytes]
    # One gather from a 256 x 8 table of ±1 rows (row b = the signs byte b encodes): about 3x the
    # shift-and-mask expression, and the same code on every device.
    return torch.index_select(_sign_table(dtype, packed.device), 0, body.int()).view(-1)[:numel]


def _sign_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Row b: the 8 values ±1 that byte b encodes (bit i → element i); built per call, it is 2 KiB."""
    bits = (torch.arange(256, device=device).view(256, 1) >> _shifts(device).long()) & 1
    # 2*b - 1 maps {0, 1} to {-1, +1} exactly in every allowed dtype.
    return bits.to(dtype).mul_(2).sub_(1)


def pack_signs_numpy(x: np.ndarray) -> np.ndarray:
    """NumPy twin of ``pack_signs``: ``ceil(x.size / 8)`` uint8 bytes, byte-identical to the torch path."""
    flat = np.asarray(x).reshape(-1)
    return np.packbits(flat >= 0, bitorder="little")


def unpack_signs_numpy(packed: np.ndarray, numel: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """NumPy twin of ``unpack_signs``: a 1-D array of ``numel`` values +1 / -1 of ``dtype``."""
    numel = _check_numel(numel, "unpack_signs_numpy")
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"unpack_signs_numpy: packed must be uint8, got {packed.dtype}")
    need = _packed_bytes(numel)
    if packed.size < need:
        raise ValueError(
            f"unpack_signs_numpy: {numel} elements need {need} packed bytes, but packed has {packed.size}"
        )
    bits = np.unpackbits(packed.reshape(-1), count=numel, bitorder="little")
    return bits.astype(dtype) * 2 - 1


def _scale_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def compress(x: torch.Tensor, valid: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Compress ``x`` to ``(packed signs, scale)``.

    ``packed`` is ``pack_signs(x)`` (``ceil(numel / 8)`` uint8 bytes); ``scale``
    is a 0-d tensor on ``x``'s device, ``||x[:valid]||_2 / sqrt(valid)`` in float32
    (float64 for float64 input), 0 when ``valid`` is 0.  ``valid`` (default: all of
    ``x``) excludes a zero padding tail from the scale, so padding does not shrink it.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"compress: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"compress: x must be a floating tensor, got {x.dtype}")
    sdtype = _scale_dtype(x.dtype)
    n = x.numel() if valid is None else valid
    if not 0 <= n <= x.numel():
        raise ValueError(f"compress: valid must be in [0, {x.numel()}], got {valid}")
    if n == 0:
        scale = torch.zeros((), dtype=sdtype, device=x.device)
    else:
        # dtype= makes the norm accumulate in float32 for half inputs.
        scale = torch.linalg.vector_norm(x.reshape(-1)[:n], dtype=sdtype) / math.sqrt(n)
    return pack_signs(x), scale


def decompress(
    packed: torch.Tensor, scale: torch.Tensor | float, numel: int, out: torch.Tensor
) -> torch.Tensor:
    """Write ``scale * sign`` for the first ``numel`` packed signs into ``out`` and return ``out``.

    ``out`` is a floating tensor of any shape with exactly ``numel`` elements;
    the values are ``+scale`` / ``-scale`` rounded once to ``out.dtype``.
    """
    numel = _check_numel(numel, "decompress")
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"decompress: out must be a floating tensor, got {got}")
    if out.numel() != numel:
        raise ValueError(f"decompress: out must have {numel} elements, got {out.numel()} (shape {tuple(out.shape)})")
    signs = unpack_signs(packed, numel, dtype=out.dtype)
    # Multiplying by +-1 is exact, so rounding the scale first equals rounding scale*sign.
    s = torch.as_tensor(scale, device=out.device).to(out.dtype)
    with torch.no_grad():
        out.copy_(signs.mul_(s).view(out.shape))
    return out


def onebit_padded_numel(numel: int, world_size: int) -> int:
    """Smallest multiple of ``8 * world_size`` that is ``>= numel`` (see the padding rule above).

    >>> onebit_padded_numel(100, 3)
    120
    """
    numel = _check_numel(numel, "onebit_padded_numel")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"onebit_padded_numel: world_size must be an int >= 1, got {world_size!r}")
    unit = 8 * world_size
    return -(-numel // unit) * unit


class ErrorFeedback:
    """Error-feedback state of one tensor or bucket for the 1-bit all_reduce.

    Shapes (``P`` = ``onebit_padded_numel(numel, world_size)`` of the bucket):

    - ``worker_error``: 1-D, ``P`` elements, the work dtype (float32, float64 for float64
      tensors) and device of the tensor.  Step 1 of the scheme (``comm/algorithms/compressed.py``).
    - ``server_error``: 1-D, ``P // world_size`` elements (this rank's segment).  Step 3.

    Both are ``None`` until first used, then created as zeros; a later input of another size
    raises ``ValueError``.  A state loaded from a checkpoint moves to the input's device and dtype
    on first use.  One instance per bucket, owned by the caller; every rank keeps its own.

    The compressed all_reduce keeps each error *lazily* (``[Note: lazy error feedback]`` in
    ``ops/onebit_kernels.py``): between calls the buffer holds the last compensated value and the
    scale it was sent with, and reading ``worker_error``/``server_error`` turns it into the error.
    The state also owns the call's message buffers (``codec``), reused from call to call.
    """

    __slots__ = ("name", "_worker_error", "_server_error", "_worker_pending", "_server_pending", "_codec")

    _KEYS = ("worker_error", "server_error")

    def __init__(self, name: str = "") -> None:
        #: Shown in error messages, e.g. ``"bucket 3"``.
        self.name = name
        self._worker_error: torch.Tensor | None = None
        self._server_error: torch.Tensor | None = None
        # (scale, valid) while the buffer holds x rather than e (see the class docstring)
        self._worker_pending: tuple | None = None
        self._server_pending: tuple | None = None
        self._codec = None

    def __repr__(self) -> str:
        def desc(t: torch.Tensor | None) -> str:
            return "None" if t is None else f"{t.numel()} x {t.dtype} on {t.device}"

        return (
            f"ErrorFeedback(name={self.name!r}, worker_error={desc(self._worker_error)}, "
            f"server_error={desc(self._server_error)})"
        )

    @property
    def worker_error(self) -> torch.Tensor | None:
        self._settle()
        return self._worker_error

    @property
    def server_error(self) -> torch.Tensor | None:
        self._settle()
        return self._server_error

    def _settle(self) -> None:
        """Turn lazily kept values back into errors (``x - scale * sign(x)``, 0 on padding)."""
        for attr, pending_attr in (("_worker_error", "_worker_pending"), ("_server_error", "_server_pending")):
            pending = getattr(self, pending_attr)
            if pending is not None:
                with torch.no_grad():
                    self._codec.settle(getattr(self, attr), *pending)
                setattr(self, pending_attr, None)

    def _who(self) -> str:
        return f"ErrorFeedback({self.name!r})" if self.name else "ErrorFeedback"

    def _ready(self, err: torch.Tensor | None, x: torch.Tensor, which: str, op: str,
               numel: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{self._who()}.{op}: expects a floating tensor, got {got}")
        if not x.is_contiguous():
            raise ValueError(
                f"{self._who()}.{op}: expects a contiguous tensor (it is updated in place), got strides {x.stride()}"
            )
        numel = x.numel() if numel is None else numel
        dtype = x.dtype if dtype is None else dtype
        if err is None:
            return torch.zeros(numel, dtype=dtype, device=x.device)
        if err.numel() != numel:
            raise ValueError(
                f"{self._who()}.{op}: {which} has {err.numel()} elements, but the tensor has {numel}"
            )
        if err.dtype != dtype or err.device != x.device:
            err = err.to(device=x.device, dtype=dtype)
        return err

    # -- the fused steps of the compressed all_reduce (comm/algorithms/compressed.py) ----------------

    def worker_step(self, tensor: torch.Tensor, world_size: int, rank: int):
        """Step 1 on this rank's flat ``tensor`` (``numel`` elements, unchanged): compensate, compress.

        Returns the codec whose ``send`` rows now hold the signs of every segment and the scale;
        the worker error absorbs what they fail to carry.  Half-precision tensors work in float32.
        """
        dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
        key = (tensor.numel(), world_size, rank, dtype, tensor.device)
        if self._codec is None or self._codec.key != key:
            self._settle()  # a pending error is kept in the old codec's terms
            self._codec = codec_for(*key)
        codec = self._codec
        op = "compressed all_reduce"
        x = self._ready(self._worker_error, tensor, "worker_error", op, codec.padded, dtype)
        server = self._ready(self._server_error, tensor, "server_error", op, codec.seg, dtype)
        self._worker_error, self._server_error = x, server
        pending = self._worker_pending
        with torch.no_grad():
            scale = codec.worker(tensor, x, None if pending is None else pending[0])
        self._worker_pending = (scale, codec.numel)
        return codec

    def server_step(self) -> None:
        """Step 3, after ``worker_step``: from ``codec.recv`` (every rank's row for this rank's
        segment) to ``codec.mine`` (the segment's mean, compressed again); the server error absorbs
        the residual."""
        codec, pending = self._codec, self._server_pending
        with torch.no_grad():
            scale = codec.server(self._server_error, None if pending is None else pending[0])
        self._server_pending = (scale, codec.valid)

    # -- the unfused steps, one tensor at a time -----------------------------------------------------

    @staticmethod
    def _compensate(x: torch.Tensor, err: torch.Tensor, valid: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.view(-1)
        with torch.no_grad():
            flat.add_(err)
            packed, scale = compress(flat, valid)
            decompress(packed, scale, flat.numel(), out=err)
            # err <- x - scale*sign: what the compressed message failed to carry.
            torch.sub(flat, err, out=err)
            if valid is not None:
                err[valid:] = 0  # the padding tail carries nothing; the receiver drops it
        return packed, scale

    def compensate_and_compress(self, x: torch.Tensor, valid: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1 on this rank's padded bucket ``x`` (contiguous, any shape, ``P`` elements).

        ``x`` is updated **in place** to ``x + worker_error``; returns
        ``compress(x)``; afterwards ``worker_error == x - decompress(...)``
        exactly, in ``x``'s dtype.  With ``valid``, only ``x[:valid]`` counts: the
        scale ignores the padding tail and the error there stays 0.
        """
        self._settle()
        err = self._ready(self._worker_error, x, "worker_error", "compensate_and_compress")
        self._worker_error = err
        return self._compensate(x, err, valid)

    def server_compensate_and_compress(self, segment_mean: torch.Tensor,
                                       valid: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3 on the average of the decompressed chunks of this rank's segment (``P // world_size`` elements).

        Same contract as ``compensate_and_compress`` with the server error:
        ``segment_mean`` becomes ``segment_mean + server_error`` in place, its
        compression is returned, and the server error keeps the residual.
        """
        self._settle()
        err = self._ready(self._server_error, segment_mean, "server_error", "server_compensate_and_compress")
        self._server_error = err
        return self._compensate(segment_mean, err, valid)

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """The two error tensors (or ``None`` when not yet created).

        As with ``torch.nn.Module.state_dict`` the tensors are shared, not
        copied: the next compressed call works in them in place (they then hold that
        call's lazily kept values, not errors), so clone them to keep a snapshot.
        """
        self._settle()
        return {"worker_error": self._worker_error, "server_error": self._server_error}

    def load_state_dict(self, state: dict[str, torch.Tensor | None]) -> None:
        """Restore from ``state_dict()`` output; the tensors are copied, never aliased."""
        if not isinstance(state, dict):
            raise TypeError(f"{self._who()}.load_state_dict: expects a dict, got {type(state).__name__}")
        missing = [k for k in self._KEYS if k not in state]
        unexpected = [k for k in state if k not in self._KEYS]
        if missing or unexpected:
            raise ValueError(
                f"{self._who()}.load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
            )
        loaded = {}
        for key in self._KEYS:
            value = state[key]
            if value is None:
                loaded[key] = None
                continue
            if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point or value.dim() != 1:
                got = (
                    f"{value.dtype} tensor of shape {tuple(value.shape)}"
                    if isinstance(value, torch.Tensor)
                    else type(value).__name__
                )
                raise ValueError(
                    f"{self._who()}.load_state_dict: {key} must be a 1-D floating tensor or None, got {got}"
                )
            # + 0.0 turns -0.0 into +0.0, which the lazy update relies on (see ops/onebit_kernels.py)
            loaded[key] = value.detach().clone().add_(0.0)
        self._worker_error = loaded["worker_error"]
        self._server_error = loaded["server_error"]
        self._worker_pending = self._server_pending = None


def codec_for(numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
    """The codec (``onebit_kernels.Codec``) for a work ``dtype`` (float32 or float64) on ``device``: numpy blocks
    on CPU, fused cupy kernels on CUDA when cupy imports (``onebit_cuda``), whole-tensor torch ops otherwise."""
    from . import onebit_kernels  # the kernels load their C library on first use

    if device.type == "cpu":
        return onebit_kernels._CpuCodec(numel, n, rank, dtype, device)
    if device.type == "cuda":
        from .onebit_cuda import cupy_codec

        fused = cupy_codec(numel, n, rank, dtype, device)
        if fused is not None:
            return fused
    return onebit_kernels._TorchCodec(numel, n, rank, dtype, device)
