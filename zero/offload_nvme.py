"""Optimizer state in files (ZeRO-Infinity's optimizer offload): stepped piece by piece, I/O double-buffered.

Each optimizer-state tensor shaped like a bucket's master (Adam's ``exp_avg`` and ``exp_avg_sq``), and the
float32 master itself when it is not the parameters' own storage (bf16/fp16), lives in one file per
(bucket, name) under ``nvme_path/zerocomm-<pid>-rank<r>-<nonce>/``.  Scalar state (Adam's ``step``) stays
in memory.  The reduced gradient shard lives in files too (one per bucket, ``grad``): each bucket's reduced
elements are written as soon as their reduction has been waited for (during backward for every bucket but
the last few), so no whole gradient shard is ever in memory.

[Note: gradients stream to the files]
``gradient_ready(bucket, grad, factor)`` (called by the wrapper when a bucket's reduction is final) scales the
elements by ``factor`` (1 / accumulation steps / loss scale, as the in-memory states do in ``set_gradients``),
adds their float64 sum of squares to the bucket's total when clipping or fp16 needs the global norm, and
hands them to the I/O thread, which writes them and drops them.  With a gradients part that forgets each
reduced chunk once handed over (``ShardedGradients(keep_shard=False)``) the gradient shard's memory is at
most the chunks being written.  The step reads each gradient piece beside the state's pieces and applies a
clipping coefficient there, so the values the optimizer sees are the same float32 values as without offload.
Parameters offloaded to files (``offload_param: nvme``, stage 3) are one more file per bucket: the step reads
each parameter piece, and writes the updated piece back (fp32: the parameter file *is* the master file).

[Note: one step, piece by piece]
A *piece* is at most ``piece_numel`` consecutive elements of one bucket's shard.  ``buffer_count`` slots
each hold one piece of every file-backed tensor.  The step walks the pieces in order::

    read piece i+1 into a free slot      (a thread: os.preadv per file)
    step piece i                         (this thread: the torch optimizer on views of the slot)
    write piece i back                   (a thread: os.pwritev per file; the slot is free when done)

so reading ahead and writing behind overlap the arithmetic, and resident memory holds the slots only:
``buffer_count x piece_numel x 4 bytes x files per bucket``, whatever the model's size.  The torch
optimizer runs unchanged on each piece: the master parameter's ``.data`` and ``.grad`` and its state
entries are pointed at the piece, scalar state (``step``) is reset before each piece of a bucket so it
advances once per step, and the first step lets the optimizer create fresh state for every piece.

[Note: checkpoints see ordinary tensors]
Between steps each file-backed entry of ``optimizer.state`` (and the master) is a tensor mapped from its
file (``torch.from_file``, shared): ``optimizer.state_dict()`` and ``torch.save`` read the files through
the page cache, ``load_state_dict`` hands back tensors that a post-hook writes into the files, and the
mappings are renewed after each step and each load, so pages a checkpoint touched stop counting in the
process's resident set.  The training path never touches the mappings; it uses pread/pwrite only.
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import uuid
import weakref
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from .errors import ZeroConfigError, ZeroStateError
from .optimizer_state import OptimizerFactory, check_optimizer
from .parts import BucketTakingState, FileParamStore
from .precision import sum_of_squares

MASTER = "master"
GRAD = "grad"
_FLOAT = torch.float32
_ITEM = 4  # bytes per float32 element


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")  # any dtype (numpy has no bfloat16)


def _pread(fd: int, tensor: torch.Tensor, offset: int) -> None:
    view, done = _bytes_of(tensor), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise ZeroStateError(f"short read from offload file (fd {fd}) at byte {offset + done}")
        done += got


def _pwrite(fd: int, tensor: torch.Tensor, offset: int) -> None:
    view, done = _bytes_of(tensor), 0
    while done < len(view):
        done += os.pwritev(fd, [view[done:]], offset + done)


class SwapFiles:
    """One file per (bucket, name) of float32 elements under ``folder``; removed when this object dies."""

    def __init__(self, folder: Path, numels: Sequence[int]):
        self.folder = folder
        self.numels = list(numels)
        self._fds: dict = {}
        self._paths: dict = {}  # adopted files, by (bucket, name)
        folder.mkdir(parents=True, exist_ok=False)
        self._finalizer = weakref.finalize(self, _remove, folder, self._fds)

    def path(self, bucket: int, name: str) -> Path:
        return self._paths.get((bucket, name), self.folder / f"bucket{bucket:04d}.{name}")

    def has(self, bucket: int, name: str) -> bool:
        return (bucket, name) in self._fds

    def create(self, bucket: int, name: str) -> None:
        path = self.path(bucket, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, self.numels[bucket] * _ITEM)  # sparse: unwritten elements read as zeros
        self._fds[(bucket, name)] = fd

    def adopt(self, bucket: int, name: str, path: Path) -> None:
        """Use another owner's file (a parameter file) under ``name``; it is not removed with this folder."""
        self._fds[(bucket, name)] = os.open(path, os.O_RDWR)
        self._paths[(bucket, name)] = Path(path)

    def read(self, bucket: int, name: str, out: torch.Tensor, start: int) -> None:
        _pread(self._fds[(bucket, name)], out, start * _ITEM)

    def write(self, bucket: int, name: str, values: torch.Tensor, start: int) -> None:
        _pwrite(self._fds[(bucket, name)], values, start * _ITEM)

    def mapped(self, bucket: int, name: str) -> torch.Tensor:
        """The whole file as a float32 tensor (shared mapping: writes reach the file)."""
        return torch.from_file(str(self.path(bucket, name)), shared=True, size=self.numels[bucket], dtype=_FLOAT)

    def nbytes(self) -> int:
        """Bytes of the files this object owns (adopted files are counted by their owner)."""
        return sum(self.numels[bucket] * _ITEM for bucket, name in self._fds if (bucket, name) not in self._paths)

    def close(self) -> None:
        self._finalizer()


def _remove(folder: Path, fds: dict) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
    shutil.rmtree(folder, ignore_errors=True)


class NvmeOptimizerState(BucketTakingState):
    """This rank's optimizer state, gradient shard (and float32 masters, under mixed precision) in files; see the
    notes.

    Args:
        param_shards: per bucket, the elements this rank updates, in the parameters' storage (CPU tensors; with
            ``param_store`` the store's mappings of its files).
        full32: per bucket, the same elements in float32 (``None`` when the parameters are float32: then the
            masters are the parameters' storage).
        factory: builds the torch optimizer over the masters (one per bucket).
        rank: for messages and the folder's name.
        folder: ``nvme_path``.
        buffer_count: slots (pieces in memory at once), at least 2.
        piece_numel: elements per piece.
        needs_norm: keep each streamed gradient's sum of squares (gradient clipping or fp16 asks for the norm).
        param_store: stage-3 parameter shards kept in files (``offload_param: nvme``, offload_param.py): the step
            reads and writes the parameters through it, piece by piece.
    """

    streams_gradients = True
    """The wrapper may let the gradients part forget each reduced chunk once ``gradient_ready`` has taken it."""

    def __init__(self, param_shards: Sequence[torch.Tensor], full32: Optional[Sequence[torch.Tensor]],
                 factory: OptimizerFactory, rank: int, *, folder, buffer_count: int, piece_numel: int,
                 needs_norm: bool = True, param_store: Optional[FileParamStore] = None):
        if param_shards[0].device.type != "cpu":
            raise ZeroConfigError(f"rank {rank}: offload_optimizer 'nvme' reads and writes host memory; parameters "
                                  f"on {param_shards[0].device} need offload_optimizer 'cpu' (or a CPU model)")
        self.rank = rank
        self.param_store = param_store
        self.master_in_params = full32 is None and param_store is not None
        """fp32 with parameters in files: the parameter file is the master file."""
        self.aliased = full32 is None and param_store is None
        """fp32 with parameters in memory: the masters are the parameters' storage (no file)."""
        self.param_shards = list(param_shards)
        self.piece_numel, self.buffer_count, self.needs_norm = piece_numel, buffer_count, needs_norm
        numels = [shard.numel() for shard in param_shards]
        self.files = SwapFiles(Path(folder) / f"zerocomm-{os.getpid()}-rank{rank}-{uuid.uuid4().hex[:8]}", numels)
        for bucket in range(len(numels)):
            self.files.create(bucket, GRAD)
            if self.master_in_params:
                self.files.adopt(bucket, MASTER, param_store.path(bucket))
        if self.aliased:
            self.masters = [nn.Parameter(shard) for shard in param_shards]
        else:
            for bucket, values in enumerate(full32 or ()):
                self.files.create(bucket, MASTER)
                self.files.write(bucket, MASTER, values.detach().contiguous(), 0)
            self.masters = [nn.Parameter(self.files.mapped(bucket, MASTER)) for bucket in range(len(numels))]
        self.optimizer = factory(list(self.masters))
        check_optimizer(self.optimizer, self.masters, rank)
        self.optimizer.register_load_state_dict_post_hook(lambda optimizer: self._after_load())
        self.elementwise: Optional[list] = None
        """Names of the optimizer's state tensors shaped like the master (learnt on the first step or load)."""
        self._slots: list = []  # per slot, its rows (one per file name), allocated on first use
        self._initialized: set = set()  # buckets whose state exists (in the files)
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"zerocomm-nvme-{rank}")
        weakref.finalize(self, self._io.shutdown, wait=False)
        self._params_current = False
        self._grad_writes: dict = {}  # bucket -> the Future writing its gradient file this step
        self._sumsq: dict = {}  # bucket -> float64 sum of squares of its scaled gradient (needs_norm)
        self._coefficient = 1.0  # the clipping factor, applied to each gradient piece in the step
        self.read_bytes = 0
        """Bytes read from the files since construction."""
        self.written_bytes = 0
        """Bytes written to the files since construction (gradients included)."""

    @classmethod
    def build(cls, param_shards, full32, factory, rank, config, *, device=None, param_store=None):
        """``offload_optimizer: nvme`` under ``config.nvme_path``; a ``param_store`` whose shards are files
        (``offload_param: nvme``) is stepped in place, one in memory is reached through ``param_shards``."""
        return cls(param_shards, full32, factory, rank, folder=config.nvme_path,
                   buffer_count=config.offload_buffer_count, piece_numel=config.offload_buffer_numel,
                   needs_norm=config.gradient_clipping > 0 or config.precision == "fp16",
                   param_store=param_store if param_store is not None and param_store.in_files else None)

    # -- the contract the wrapper uses (parts.OptimizerState) --------------------------------------------
    def gradient_ready(self, index: int, grad: torch.Tensor, factor: float) -> None:
        """Bucket ``index``'s reduced elements ``grad`` are final: scale them by ``factor`` and start writing them
        to the bucket's gradient file (the I/O thread keeps ``grad`` alive until written)."""
        values = grad if grad.dtype == _FLOAT else grad.to(_FLOAT)
        if factor != 1.0:
            values.mul_(factor)  # as the in-memory states scale in set_gradients: the same float32 values
        if self.needs_norm:
            self._sumsq[index] = sum_of_squares([values])
        self._grad_writes[index] = self._io.submit(self.files.write, index, GRAD, values, 0)
        self.written_bytes += values.numel() * _ITEM

    def set_gradients(self, grads: Sequence[Optional[torch.Tensor]], factor: float) -> list:
        """Stream the buckets whose gradients did not reach ``gradient_ready`` (``grads[b]``, scaled by ``factor``)
        and wait until every gradient file is written.  Returns no tensors: the norm comes from
        ``streamed_sum_of_squares``."""
        for bucket, grad in enumerate(grads):
            if bucket not in self._grad_writes:
                if grad is None:
                    raise ZeroStateError(f"rank {self.rank}: bucket {bucket}'s reduced gradient was handed over "
                                         f"before the optimizer state took it")
                self.gradient_ready(bucket, grad, factor)
        for future in self._grad_writes.values():
            future.result()
        return []

    @property
    def streamed_sum_of_squares(self) -> torch.Tensor:
        """Σ g² (float64, 1 element) of this step's scaled gradients, added bucket by bucket in index order (the
        order the in-memory states' ``sum_of_squares`` adds them)."""
        total = torch.zeros(1, dtype=torch.float64)
        for bucket in sorted(self._sumsq):
            total += self._sumsq[bucket]
        return total

    def scale_gradients(self, coefficient: float) -> None:
        self._coefficient *= coefficient

    def clear_gradients(self) -> None:
        self._grad_writes, self._sumsq, self._coefficient = {}, {}, 1.0

    def step(self) -> None:
        """Every piece of every bucket: read ahead, step, write behind (see the note on one step)."""
        pieces = [(bucket, start, min(start + self.piece_numel, numel))
                  for bucket, numel in enumerate(self.files.numels) if bucket in self._grad_writes
                  for start in range(0, numel, self.piece_numel)]
        if not self._slots:
            self._slots = [[] for _ in range(self.buffer_count)]
        free = list(range(self.buffer_count))
        reads: dict = {}
        writes: list = []  # (future, slot), oldest first
        scalars: dict = {}

        def start_read(i: int) -> None:
            while not free:  # every slot is being written: wait for the oldest write
                future, slot = writes.pop(0)
                future.result()
                free.append(slot)
            slot = free.pop(0)
            reads[i] = (self._io.submit(self._read_piece, pieces[i], slot), slot)
            bucket, start, end = pieces[i]
            self.read_bytes += len(self._names(bucket)) * (end - start) * _ITEM  # counted here, not in the threads

        if pieces:
            start_read(0)
        for i, piece in enumerate(pieces):
            future, slot = reads.pop(i)
            future.result()
            if i + 1 < len(pieces):
                start_read(i + 1)
            outputs = self._step_piece(piece, slot, scalars)
            writes.append((self._io.submit(self._write_piece, piece, outputs), slot))
            self.written_bytes += sum(values.numel() for _, values in outputs) * _ITEM
        for future, _ in writes:
            future.result()
        self._finish_step(scalars)

    def write_back(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Mixed precision: the parameters already got each piece during the step; after a load, copy from the
        master files.  (fp32: the masters are the parameters' storage or file.)"""
        if self.aliased or self.master_in_params or self._params_current:
            self._params_current = False
            return
        buffer = torch.empty(min(self.piece_numel, max(self.files.numels)), dtype=_FLOAT)
        with torch.no_grad():
            for bucket, shard in enumerate(param_shards):
                for start in range(0, shard.numel(), buffer.numel()):
                    piece = buffer[:min(buffer.numel(), shard.numel() - start)]
                    self.files.read(bucket, MASTER, piece, start)
                    self._write_params(bucket, piece, start, shard)
        self._remap()

    def read_from(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Mixed precision: the masters take the parameters' values (set from outside)."""
        if self.aliased or self.master_in_params:
            return
        for bucket, shard in enumerate(param_shards):
            for start in range(0, shard.numel(), self.piece_numel):
                piece = shard[start:start + self.piece_numel].to(_FLOAT)
                self.files.write(bucket, MASTER, piece, start)

    def nbytes(self, param_storages: set) -> int:
        """Bytes in memory: the slots and the scalar state (the files are counted by ``placement``)."""
        host = sum(row.numel() * _ITEM for rows in self._slots for row in rows)
        return host + sum(v.numel() * v.element_size() for state in self.optimizer.state.values()
                          for v in state.values() if isinstance(v, torch.Tensor) and v.dim() == 0)

    def placement(self, where: str) -> dict:
        """Bytes of the optimizer state by where it lives: memory on the host, the rest in files (the gradient
        files: ``gradient_placement``)."""
        return {"device": 0, "host": self.nbytes(set()), "disk": self.files.nbytes() - self._grad_file_bytes()}

    def gradient_placement(self) -> dict:
        """The gradient shard's bytes on disk (its memory, the chunks being written, is the gradients part's)."""
        return {"device": 0, "host": 0, "disk": self._grad_file_bytes()}

    def _grad_file_bytes(self) -> int:
        return sum(self.files.numels) * _ITEM

    # -- pieces -----------------------------------------------------------------------------------------
    def _names(self, bucket: int) -> list:
        """Files read before stepping a piece of ``bucket``: the gradient, the master (unless the masters are the
        parameters in memory) and, once the bucket has state, every elementwise state tensor."""
        names = [GRAD] if self.aliased else [GRAD, MASTER]
        return names + (list(self.elementwise) if bucket in self._initialized else [])

    def _row(self, slot: int, row: int, count: int) -> torch.Tensor:
        rows = self._slots[slot]
        while len(rows) <= row:
            rows.append(torch.empty(min(self.piece_numel, max(self.files.numels)), dtype=_FLOAT))
        return rows[row][:count]

    def _read_piece(self, piece: tuple, slot: int) -> None:
        bucket, start, end = piece
        for row, name in enumerate(self._names(bucket)):
            self.files.read(bucket, name, self._row(slot, row, end - start), start)

    def _write_piece(self, piece: tuple, outputs: list) -> None:
        bucket, start, end = piece
        for name, values in outputs:
            if name is _PARAMS:
                self.param_store.write(bucket, values, start)
            else:
                self.files.write(bucket, name, values, start)

    def _write_params(self, bucket: int, values: torch.Tensor, start: int, shard: torch.Tensor) -> None:
        """Round ``values`` into the parameters' elements ``start:``, in memory or through the parameter store."""
        if self.param_store is not None:
            self.param_store.write(bucket, values, start)
        else:
            with torch.no_grad():
                shard[start:start + values.numel()].copy_(values)

    def _step_piece(self, piece: tuple, slot: int, scalars: dict) -> list:
        """Run the optimizer on one piece whose file-backed values are in ``slot``; returns [(file name, values)]
        to write back."""
        bucket, start, end = piece
        master, count = self.masters[bucket], end - start
        state = self.optimizer.state[master]
        fresh = bucket not in self._initialized
        if ("before", bucket) not in scalars:  # scalar state (Adam's step) as it was before this step
            scalars[("before", bucket)] = {k: _copy(v) for k, v in state.items() if k not in (self.elementwise or ())}
        names = self._names(bucket)
        rows = {name: self._row(slot, row, count) for row, name in enumerate(names)}
        grad = rows.pop(GRAD)
        if self._coefficient != 1.0:
            grad.mul_(self._coefficient)  # clipping, as the in-memory states apply it to the float32 gradient
        full = master.data
        master.grad = None
        master.data = self.param_shards[bucket][start:end] if self.aliased else rows[MASTER]
        try:
            state.clear()  # a fresh bucket: the optimizer creates its state for this piece, as on a first step
            if not fresh:
                state.update({k: _copy(v) for k, v in scalars[("before", bucket)].items()})
                state.update({name: values for name, values in rows.items() if name != MASTER})
            master.grad = grad
            self.optimizer.step()
            if fresh:
                self._learn(bucket, state, count)
            outputs = [(name, state[name].detach().reshape(-1)) for name in self.elementwise or ()]
            scalars[("after", bucket)] = {k: _copy(v) for k, v in state.items() if k not in (self.elementwise or ())}
        finally:
            master.grad = None
            master.data = full
            state.clear()
        if not self.aliased:
            outputs.append((MASTER, rows[MASTER]))  # fp32 with parameters in files: this is the parameter file
            if self.param_store is not None and not self.master_in_params:
                outputs.append((_PARAMS, rows[MASTER]))  # rounded by the store, written behind like the rest
            elif self.param_store is None:
                self._write_params(bucket, rows[MASTER], start, self.param_shards[bucket])
        return outputs

    def _learn(self, bucket: int, state: dict, count: int) -> None:
        """A bucket's first step: which state is elementwise (one file each), checked to be piece-shaped."""
        names = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() >= 1)
        for name in names:
            if state[name].numel() != count:
                raise ZeroConfigError(
                    f"rank {self.rank}: optimizer state {name!r} has {state[name].numel()} elements for a piece of "
                    f"{count}: offload_optimizer 'nvme' needs elementwise state (Adam, AdamW, SGD, ...)")
        if self.elementwise is None:
            self.elementwise = names
        elif names != self.elementwise:
            raise ZeroStateError(f"rank {self.rank}: bucket {bucket}'s optimizer state {names} differs from the "
                                 f"other buckets' {self.elementwise}")
        for name in names:
            if not self.files.has(bucket, name):
                self.files.create(bucket, name)

    def _finish_step(self, scalars: dict) -> None:
        """Scalars as after one step; file-backed entries mapped again from their files."""
        for bucket, master in enumerate(self.masters):
            if ("after", bucket) in scalars:
                self.optimizer.state[master].update(scalars[("after", bucket)])
                self._initialized.add(bucket)
        self._remap()
        self._params_current = True

    def _remap(self) -> None:
        """Point the master and every file-backed state entry at a fresh mapping of its file."""
        for bucket, master in enumerate(self.masters):
            if not self.aliased:
                master.data = self.files.mapped(bucket, MASTER)
            state = self.optimizer.state[master]
            for name in self.elementwise or ():
                if self.files.has(bucket, name):
                    state[name] = self.files.mapped(bucket, name)

    def _after_load(self) -> None:
        """``optimizer.load_state_dict`` put in-memory tensors into the state: write them into the files."""
        for bucket, master in enumerate(self.masters):
            state = self.optimizer.state[master]
            names = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() >= 1)
            if self.elementwise is None and names:
                self.elementwise = names
            if names:
                self._initialized.add(bucket)
            for name in names:
                if not self.files.has(bucket, name):
                    self.files.create(bucket, name)
                values = state[name].detach().reshape(-1)
                for start in range(0, values.numel(), self.piece_numel):
                    self.files.write(bucket, name, values[start:start + self.piece_numel].to(_FLOAT).contiguous(),
                                     start)
        self._remap()


_PARAMS = object()  # an output written through the parameter store rather than a state file


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value
