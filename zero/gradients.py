"""Gradient buckets and the two ways a rank keeps reduced gradients (the "gradients" part).

A *bucket* is a group of gradients reduced in one collective.  Its life in one boundary backward
(the backward that ends a gradient-accumulation cycle)::

    begin()            every slot is expected                 EXPECTING
    add(pos, grad) ×k  copied into the bucket's buffer        (buffer taken on the first add)
    launch()           the async collective starts            IN_FLIGHT
    wait()             its Work is waited for                 REDUCED (a transient buffer is freed)
    reset()            the step consumed the result           IDLE

The bucket does not know which collective runs or where its buffer comes from: the gradients part
that builds and owns it does.  Two parts (the ``GradientsPart`` interface, parts.py), named by the stage's
row in ``STAGES`` (stages.py):

* ``FullGradients`` (stages 0 and 1): one full-size buffer for every bucket, kept between steps;
  each bucket is all-reduced, or reduce-scattered, in place.  Memory: Φ elements.
* ``ShardedGradients`` (stages 2 and 3): a bucket's full-size buffer is in use from its first gradient
  to the end of its reduction, which writes this rank's chunk straight into the gradient shard, and
  then serves the next bucket.  Memory: Φ/N elements of gradients, plus at most
  ``max_inflight_buckets`` bucket buffers (communication buffers, not gradients: stage 2 keeps them
  from one step to the next, stage 3 and offloading stages free them at the end of each step).

Both average over ranks (``ReduceOp.AVG``).  Misuse raises ``ZeroStateError`` naming the rank, the
bucket and the parameter.
"""
from __future__ import annotations

import collections
import enum
import time
from typing import Callable, Optional

import torch

from .. import comm as dist
from .errors import ZeroStateError
from .partition import BucketLayout
from .parts import GradientsPart, ReduceScatter, Reduction
from .zeropp import build_quantized_reduce_scatter

#: ``acquire(layout) -> buffer``: a 1-D tensor of ``layout.padded_numel`` elements to copy gradients into.
Acquire = Callable[[BucketLayout], torch.Tensor]
#: ``reduce(layout, buffer) -> Work``: launch the collective on a filled buffer (async).
Reduce = Callable[[BucketLayout, torch.Tensor], object]


class BucketState(enum.Enum):
    IDLE = "idle"
    EXPECTING = "expecting gradients"
    IN_FLIGHT = "in flight"
    REDUCED = "reduced"


def tensor_bytes(tensor: Optional[torch.Tensor]) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def release_storage(tensor: Optional[torch.Tensor]) -> None:
    """Free a finished collective's buffer now.  The communication layer may hold references to it a
    while longer (an executor's last task, reference cycles only the garbage collector breaks), which
    would keep every transient bucket alive; resizing the storage to zero frees the memory whoever
    still refers to it.  Storages a backend pinned are left to the reference count."""
    if tensor is not None and tensor.untyped_storage().resizable():
        tensor.untyped_storage().resize_(0)


class GradientBucket:
    """Gradients of ``layout``'s parameters, reduced in one collective.

    Args:
        layout: the bucket's parameters and their offsets.
        acquire: gives the buffer to fill, on the first ``add`` of a round.
        reduce: launches the collective on the filled buffer and returns its ``Work``.
        persistent: keep the buffer between rounds (a view of a full gradient buffer); otherwise ``wait``
            hands it to ``release``.
        release: takes back a non-persistent buffer once its reduction has been waited for (the gradients
            part reuses it for the next bucket; by default its memory is freed).
        rank: this process's rank, for messages.
        on_reduced: called with the layout once the reduction has been waited for (an offloading optimizer
            state starts copying the reduced elements to the host there).
    """

    def __init__(self, layout: BucketLayout, *, acquire: Acquire, reduce: Reduce, persistent: bool,
                 release: Callable[[torch.Tensor], None] = release_storage, rank: int = 0,
                 on_reduced: Optional[Callable[[BucketLayout], None]] = None):
        self.layout = layout
        self._acquire = acquire
        self._reduce = reduce
        self._persistent = persistent
        self._release = release
        self._rank = rank
        self._on_reduced = on_reduced
        self.buffer: Optional[torch.Tensor] = None
        self._views: Optional[list] = None
        self._arrived = bytearray(len(layout.slots))  # per position: 1 once its gradient arrived this round
        self._left = 0  # gradients still expected this round
        self.work = None
        self.state = BucketState.IDLE
        self.launched_s: Optional[float] = None
        """``time.perf_counter()`` of the last launch."""

    def __repr__(self) -> str:
        return (f"GradientBucket({self.layout.index}, {len(self.layout.slots)} params, "
                f"{self.layout.padded_numel} elements, {self.state.value})")

    def _where(self) -> str:
        return f"rank {self._rank}: bucket {self.layout.index}"

    def begin(self) -> None:
        """Expect every parameter's gradient (the start of a boundary backward)."""
        if self.state in (BucketState.EXPECTING, BucketState.IN_FLIGHT):
            raise ZeroStateError(
                f"{self._where()} is still {self.state.value} from the previous boundary backward: backward() ran "
                f"again before optimizer.step() consumed the reduced gradients; call step() after every "
                f"gradient_accumulation_steps backward passes")
        self._arrived = bytearray(len(self.layout.slots))
        self._left = len(self._arrived)
        self.work = None
        self.state = BucketState.EXPECTING

    @property
    def pending(self) -> set:
        """Positions (in ``layout.slots``) whose gradients have not arrived this round."""
        if self.state is not BucketState.EXPECTING:
            return set()
        return {position for position, arrived in enumerate(self._arrived) if not arrived}

    def _slot_views(self) -> list:
        if self.buffer is None:
            buffer = self._acquire(self.layout)
            if buffer.numel() != self.layout.padded_numel:
                raise ZeroStateError(f"{self._where()}: acquire gave {buffer.numel()} elements, "
                                     f"expected {self.layout.padded_numel}")
            buffer[self.layout.numel:].zero_()  # padding reduces to zero and leaves the optimizer idle there
            self.buffer = buffer
            self._views = None
        if self._views is None:
            self._views = [self.buffer[s.offset:s.offset + s.numel].view(s.shape) for s in self.layout.slots]
        return self._views

    def add(self, position: int, grad: Optional[torch.Tensor]) -> bool:
        """Copy ``grad`` (zeros if ``None``) into slot ``position``; True when the bucket is complete.

        Called once per parameter per boundary backward, so it stays a few bytecodes and one copy: no
        Python call besides the copy once the buffer is taken (the gradient is detached instead of
        entering ``torch.no_grad``, which costs eight calls)."""
        if self.state is not BucketState.EXPECTING or self._arrived[position]:
            slot = self.layout.slots[position]
            if self.state is not BucketState.EXPECTING:
                raise ZeroStateError(f"{self._where()}: gradient of {slot.name!r} arrived while the bucket is "
                                     f"{self.state.value} (expected {BucketState.EXPECTING.value})")
            raise ZeroStateError(f"{self._where()}: gradient of {slot.name!r} arrived twice in one backward")
        views = self._views if self._views is not None else self._slot_views()
        view = views[position]
        if grad is None:
            view.zero_()
        else:
            if grad.shape != view.shape:
                raise ZeroStateError(f"{self._where()}: gradient of {self.layout.slots[position].name!r} has "
                                     f"shape {tuple(grad.shape)}, expected {tuple(view.shape)}")
            view.copy_(grad.detach() if grad.requires_grad else grad)
        self._arrived[position] = 1
        self._left -= 1
        return not self._left

    def launch(self) -> None:
        """Start the reduction (asynchronously); every slot must have arrived."""
        if self.state is not BucketState.EXPECTING or self._left:
            missing = [self.layout.slots[p].name for p in sorted(self.pending)]
            raise ZeroStateError(f"{self._where()}: launch while {self.state.value} with gradients of {missing} "
                                 f"missing")
        self._slot_views()
        self.launched_s = time.perf_counter()
        self.work = self._reduce(self.layout, self.buffer)
        self.state = BucketState.IN_FLIGHT

    def is_completed(self) -> bool:
        return self.state is BucketState.REDUCED or (self.state is BucketState.IN_FLIGHT and
                                                     (self.work is None or self.work.is_completed()))

    def wait(self) -> None:
        """Wait for the reduction (no-op unless in flight); raises its error (a ``CommError``)."""
        if self.state is not BucketState.IN_FLIGHT:
            return
        if self.work is not None:
            self.work.wait()
        self.work = None
        self.state = BucketState.REDUCED
        if self._on_reduced is not None:
            self._on_reduced(self.layout)
        if not self._persistent:
            self._release(self.buffer)
            self.buffer = None
            self._views = None

    def reset(self) -> None:
        """Back to idle after the step consumed the reduced gradients."""
        if self.state is BucketState.IN_FLIGHT:
            raise ZeroStateError(f"{self._where()}: reset while its reduction is in flight")
        self.state = BucketState.IDLE
        self._left = 0


class _ThenWork:
    """A ``Work`` whose ``wait`` also runs ``then`` once (copying a chunk out of an all-reduced buffer)."""

    def __init__(self, work, then):
        self._work, self._then = work, then

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self) -> bool:
        self._work.wait()
        if self._then is not None:
            self._then()
            self._then = None
        return True


class FullGradients(GradientsPart):
    """A persistent full-size gradient buffer; every bucket reduced in place (stages 0 and 1).

    ``reduced(layout)`` is the part of the bucket this rank's optimizer updates (``owned(layout)``:
    the whole bucket when the optimizer state is not sharded, the rank's chunk otherwise).  Its buckets'
    buffers are views of the one buffer: never released.
    """

    def __init__(self, layouts: list, *, dtype: torch.dtype, device: torch.device, reduction: Reduction,
                 owned: Callable[[BucketLayout], tuple], rank: int, group=None, algorithm: Optional[str] = None,
                 on_reduced: Optional[Callable[[BucketLayout], None]] = None):
        self.layouts, self.dtype, self.device = layouts, dtype, device
        self.reduction, self.owned, self.rank = reduction, owned, rank
        self.group, self.algorithm = group, algorithm
        self.buffer: Optional[torch.Tensor] = None  # allocated by the first boundary backward
        # Index arithmetic done once: the step's path stays inside this file.
        self._chunk = [layout.chunk_bounds(rank) for layout in layouts]
        self._owned = [(layout.offset + owned(layout)[0], layout.offset + owned(layout)[1]) for layout in layouts]
        self._numel = sum(layout.padded_numel for layout in layouts)
        #: A group of one rank: the average over ranks is the buffer itself, so no collective is launched.
        self.alone = bool(layouts) and layouts[0].world_size == 1
        self.buckets = [GradientBucket(layout, acquire=self.acquire, reduce=self.reduce, persistent=True, rank=rank,
                                       on_reduced=on_reduced) for layout in layouts]

    @classmethod
    def build(cls, layouts, *, plan, config, parameters, state, dtype, rank, world_size, group, on_reduced):
        return cls(layouts, dtype=dtype, device=parameters.device, reduction=plan.reduction, owned=parameters.owned,
                   rank=rank, group=group, algorithm=config.algorithm, on_reduced=on_reduced)

    def acquire(self, layout: BucketLayout) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = torch.zeros(self._numel, dtype=self.dtype, device=self.device)
        return self.buffer[layout.offset:layout.offset + layout.padded_numel]

    def reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        if self.alone:
            return None
        if self.reduction is Reduction.ALL_REDUCE:
            return dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                                   algorithm=self.algorithm)
        lo, hi = self._chunk[layout.index]
        return dist.reduce_scatter_tensor(buffer[lo:hi], buffer, op=dist.ReduceOp.AVG, group=self.group,
                                          async_op=True, algorithm=self.algorithm)

    def reduced(self, layout: BucketLayout) -> torch.Tensor:
        lo, hi = self._owned[layout.index]
        return self.buffer[lo:hi]

    def end_step(self) -> None:
        pass

    def nbytes(self, buckets) -> int:
        return tensor_bytes(self.buffer)


class ShardedGradients(GradientsPart):
    """This rank's reduced gradient shard, and the bucket buffers it is reduced from (stages 2, 3).

    At most ``max_inflight`` bucket buffers exist at once (0: unbounded): taking another first frees
    the reductions that have finished, then waits for the oldest.  A finished bucket's buffer is a
    *spare*, reused by the next bucket rather than freed: a fresh buffer costs the kernel's page faults
    and zeroing on first touch (about 2.7 ms per 8 MiB on the 2-core test machine, ten times the copy
    into it).  Every buffer therefore has the largest bucket's size.

    ``keep_buffers`` (stage 2) keeps the spares from one step to the next, as DeepSpeed keeps its
    two reduction buffers.  Freeing 16 MiB (two 2 M-element buckets) after every step let glibc hand
    the top of its heap back to the kernel, and the next backward faulted as much in again: 4,000 more
    page faults per step and about 4 % of stage 2's step on the test machine (measured; the spares' own
    memory did not fault).  The price is the spares' memory through forward, where the peak is.  Stage
    3 and the offloading stages, chosen for memory, free them at the end of each step, so between steps
    only the shard remains.
    """

    transient_buffers = True

    def __init__(self, layouts: list, *, dtype: torch.dtype, device: torch.device, reduction: Reduction,
                 max_inflight: int, rank: int, group=None, algorithm: Optional[str] = None, keep_shard: bool = True,
                 keep_buffers: bool = False, reduce_scatter: Optional[ReduceScatter] = None,
                 on_reduced: Optional[Callable[[BucketLayout], None]] = None):
        self.layouts, self.dtype, self.device = layouts, dtype, device
        self.keep_buffers = keep_buffers
        self.reduction, self.rank = reduction, rank
        self.group, self.algorithm = group, algorithm
        # keep_shard=False (an optimizer state that streams gradients to files): each bucket reduces into a chunk
        # of its own, handed over once by ``reduced`` and forgotten, so no whole shard is ever held.
        self.shard = torch.zeros(sum(l.chunk_numel for l in layouts), dtype=dtype, device=device) if keep_shard \
            else None
        self._handed: dict = {}  # keep_shard=False: bucket index -> its reduced chunk, until handed over
        self.max_inflight = max_inflight
        self._inflight: collections.deque = collections.deque()
        self._spares: list = []  # whole buffers (``_buffer_numel`` elements) whose reductions have finished
        self._buffer_numel = max((layout.padded_numel for layout in layouts), default=0)
        self._chunk = [layout.chunk_bounds(rank) for layout in layouts]
        self._shard_range = [(layout.shard_offset, layout.shard_offset + layout.chunk_numel) for layout in layouts]
        #: A group of one rank: its chunk of a bucket is the whole bucket and the average over ranks the gradients
        #: themselves, so each bucket's gradients are copied straight into the shard (the bucket's buffer is its
        #: range of the shard, kept) and no collective is launched.
        self.alone = bool(layouts) and layouts[0].world_size == 1 and self.shard is not None
        self.reduce_scatter: ReduceScatter = reduce_scatter or dist.reduce_scatter_tensor
        """The bucket's reduce-scatter (``zeropp.QuantizedReduceScatter`` under ``zero_quantized_gradients``)."""
        self.buckets = [GradientBucket(layout, acquire=self.acquire, reduce=self.reduce, persistent=self.alone,
                                       release=self.release, rank=rank, on_reduced=on_reduced) for layout in layouts]

    @classmethod
    def build(cls, layouts, *, plan, config, parameters, state, dtype, rank, world_size, group, on_reduced):
        """Also ZeRO++'s qgZ reduce-scatter when ``config.zero_quantized_gradients`` asks for it (every rank of
        ``group`` builds it together), and a chunk per bucket handed over once for a state that
        ``streams_gradients``."""
        quantized = build_quantized_reduce_scatter(config, rank=rank, world_size=world_size, group=group)
        return cls(layouts, dtype=dtype, device=parameters.device, reduction=plan.reduction,
                   max_inflight=config.max_inflight_buckets, rank=rank, group=group, algorithm=config.algorithm,
                   keep_shard=not state.streams_gradients, keep_buffers=plan.keep_bucket_buffers,
                   reduce_scatter=quantized, on_reduced=on_reduced)

    def acquire(self, layout: BucketLayout) -> torch.Tensor:
        if self.alone:
            return self.reduced(layout)
        while self._inflight and self._inflight[0].is_completed():
            self._inflight.popleft().wait()
        while self.max_inflight and len(self._inflight) >= self.max_inflight:
            self._inflight.popleft().wait()
        whole = self._spares.pop() if self._spares else \
            torch.empty(self._buffer_numel, dtype=self.dtype, device=self.device)
        return whole[:layout.padded_numel]

    def release(self, buffer: torch.Tensor) -> None:
        """Take back a bucket's buffer (a view from ``acquire``) once its reduction has finished."""
        if self.max_inflight and len(self._spares) >= self.max_inflight:
            release_storage(buffer)
            return
        self._spares.append(torch.empty(0, dtype=self.dtype, device=self.device).set_(buffer.untyped_storage()))

    def reduce(self, layout: BucketLayout, buffer: torch.Tensor):
        if self.alone:
            return None
        self._inflight.append(self.buckets[layout.index])
        if self.shard is None:
            out = self._handed[layout.index] = torch.empty(layout.chunk_numel, dtype=self.dtype, device=self.device)
        else:
            out = self.reduced(layout)
        if self.reduction is Reduction.REDUCE_SCATTER:
            return self.reduce_scatter(out, buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                                       algorithm=self.algorithm)
        work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group, async_op=True,
                               algorithm=self.algorithm)
        lo, hi = self._chunk[layout.index]
        return _ThenWork(work, lambda: out.copy_(buffer[lo:hi]))

    def reduced(self, layout: BucketLayout) -> Optional[torch.Tensor]:
        """This rank's reduced elements of ``layout`` (keep_shard=False: the chunk on the first call after its
        reduction, None afterwards)."""
        if self.shard is None:
            return self._handed.pop(layout.index, None)
        lo, hi = self._shard_range[layout.index]
        return self.shard[lo:hi]

    def end_step(self) -> None:
        self._inflight.clear()
        self._handed.clear()
        if self.keep_buffers:
            return
        for spare in self._spares:
            release_storage(spare)
        self._spares.clear()

    def nbytes(self, buckets) -> int:
        """Bytes of gradients: the shard, chunks not yet handed over, and the buffers holding a bucket now."""
        return (tensor_bytes(self.shard) + sum(tensor_bytes(chunk) for chunk in self._handed.values())
                + sum(bucket.buffer.untyped_storage().nbytes() for bucket in buckets
                      if bucket.buffer is not None and not self.alone))

    def spare_bytes(self) -> int:
        """Bytes of bucket buffers waiting for their next bucket (communication buffers, not model state)."""
        return sum(tensor_bytes(spare) for spare in self._spares)
