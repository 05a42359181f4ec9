"""A gradient bucket: gradients reduced together, launched the moment the last one arrives.

Life of a bucket in one boundary backward (the backward that ends a gradient-accumulation cycle)::

    begin()            every slot is expected              state "filling"
    add(pos, grad) ×k  copies into the bucket's buffer     (buffer acquired on the first add)
    launch()           the stage's async collective        state "launched"
    wait()             waits for its Work; a transient     state "done"
                       buffer is released

The bucket does not know which collective runs: the stage passes ``acquire`` (where the
bucket-sized gradient buffer comes from) and ``reduce`` (the collective, returning its ``Work``),
so stages 0, 1 and 2 share this class.  Misuse raises ``ZeroStateError`` naming the bucket and the
parameter, never an ``assert``.
"""
from __future__ import annotations

import collections

import time
from typing import Callable, Optional

import torch

from .errors import ZeroStateError
from .partition import BucketLayout, slot_views

#: ``acquire(layout) -> buffer``: a 1-D tensor of ``layout.padded_numel`` elements to copy gradients into.
Acquire = Callable[[BucketLayout], torch.Tensor]
#: ``reduce(layout, buffer) -> Work``: launch the stage's collective on a full buffer (async).
Reduce = Callable[[BucketLayout, torch.Tensor], object]


class GradientBucket:
    """Gradients of ``layout``'s parameters, reduced in one collective.

    Args:
        layout: the bucket's parameters and their offsets.
        acquire: gives the buffer to fill, on the first ``add`` of a round.
        reduce: launches the collective on the filled buffer and returns its ``Work``.
        persistent: keep the buffer between rounds (stages 0 and 1: it is a view of the full
            gradient buffer); otherwise it is dropped after ``wait`` (stage 2).
        rank: this process's rank, for messages.
    """

    def __init__(self, layout: BucketLayout, *, acquire: Acquire, reduce: Reduce, persistent: bool,
                 rank: int = 0):
        self.layout = layout
        self._acquire = acquire
        self._reduce = reduce
        self._persistent = persistent
        self._rank = rank
        self.buffer: Optional[torch.Tensor] = None
        self._views: Optional[list] = None
        self._pending: set = set()
        self.work = None
        self.state = "idle"
        self.launched_s: Optional[float] = None
        """``time.perf_counter()`` when the last launch happened."""
        self.done_s: Optional[float] = None

    def __repr__(self) -> str:
        return (f"GradientBucket({self.layout.index}, {len(self.layout.slots)} params, "
                f"{self.layout.padded_numel} elements, {self.state})")

    def _where(self) -> str:
        return f"rank {self._rank}: bucket {self.layout.index}"

    def begin(self) -> None:
        """Expect every parameter's gradient (the start of a boundary backward)."""
        if self.state in ("filling", "launched"):
            raise ZeroStateError(
                f"{self._where()} is still {self.state} from the previous boundary backward: backward() ran "
                f"again before optimizer.step() consumed the reduced gradients; call step() after every "
                f"gradient_accumulation_steps backward passes")
        self._pending = set(range(len(self.layout.slots)))
        self.work = None
        self.state = "filling"

    @property
    def pending(self) -> set:
        """Positions (in ``layout.slots``) whose gradients have not arrived this round."""
        return set(self._pending)

    def _ensure_buffer(self) -> list:
        if self.buffer is None:
            buffer = self._acquire(self.layout)
            if buffer.numel() != self.layout.padded_numel:
                raise ZeroStateError(f"{self._where()}: acquire gave {buffer.numel()} elements, "
                                     f"expected {self.layout.padded_numel}")
            buffer[self.layout.numel:].zero_()  # padding reduces to zero and leaves the optimizer idle there
            self.buffer = buffer
            self._views = None
        if self._views is None:
            self._views = slot_views(self.buffer, self.layout)
        return self._views

    def add(self, position: int, grad: Optional[torch.Tensor]) -> bool:
        """Copy ``grad`` (zeros if ``None``) into slot ``position``; True when the bucket is complete."""
        slot = self.layout.slots[position]
        if self.state != "filling":
            raise ZeroStateError(f"{self._where()}: gradient of {slot.name!r} arrived while the bucket is "
                                 f"{self.state} (expected filling)")
        if position not in self._pending:
            raise ZeroStateError(f"{self._where()}: gradient of {slot.name!r} arrived twice in one backward")
        view = self._ensure_buffer()[position]
        with torch.no_grad():
            if grad is None:
                view.zero_()
            else:
                if tuple(grad.shape) != slot.shape:
                    raise ZeroStateError(f"{self._where()}: gradient of {slot.name!r} has shape "
                                         f"{tuple(grad.shape)}, expected {slot.shape}")
                view.copy_(grad)
        self._pending.discard(position)
        return not self._pending

    def launch(self) -> None:
        """Start the reduction (asynchronously); every slot must have arrived."""
        if self.state != "filling" or self._pending:
            missing = [self.layout.slots[p].name for p in sorted(self._pending)]
            raise ZeroStateError(f"{self._where()}: launch while {self.state} with gradients of {missing} "
                                 f"missing")
        self._ensure_buffer()
        self.launched_s = time.perf_counter()
        self.work = self._reduce(self.layout, self.buffer)
        self.state = "launched"

    def is_completed(self) -> bool:
        return self.state == "done" or (self.state == "launched" and
                                        (self.work is None or self.work.is_completed()))

    def wait(self) -> None:
        """Wait for the reduction; raises its error (a ``CommError``) if it failed."""
        if self.state != "launched":
            raise ZeroStateError(f"{self._where()}: wait while {self.state} (expected launched)")
        if self.work is not None:
            self.work.wait()
        self.work = None
        self.done_s = time.perf_counter()
        self.state = "done"
        if not self._persistent:
            release_storage(self.buffer)
            self.buffer = None
            self._views = None

    def reset(self) -> None:
        """Back to idle after the step consumed the reduced gradients."""
        if self.state == "launched":
            raise ZeroStateError(f"{self._where()}: reset while its reduction is in flight")
        self.state = "idle"
        self._pending = set()


def release_storage(tensor: Optional[torch.Tensor]) -> None:
    """Free a finished collective's buffer now.  The communication layer may hold references to it a
    while longer (an executor's last task, reference cycles that only the garbage collector breaks),
    which would keep every transient bucket alive; resizing the storage to zero frees the memory
    whoever still refers to it.  Storages a backend pinned (MPI's numpy views) are left to the
    reference count."""
    if tensor is not None and tensor.untyped_storage().resizable():
        tensor.untyped_storage().resize_(0)


class InflightBuckets:
    """Bucket reductions in flight, oldest first, at most ``limit`` of them (0: unbounded).

    Stages 2 and 3 allocate a full-size bucket buffer per reduction and free it when the reduction is
    waited for; bounding how many are in flight bounds that memory.  ``make_room()`` first collects the
    reductions that have finished, then waits for the oldest until fewer than ``limit`` remain.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._queue: collections.deque = collections.deque()

    def make_room(self) -> None:
        while self._queue and self._queue[0].is_completed():
            self._finish(self._queue.popleft())
        while self.limit and len(self._queue) >= self.limit:
            self._finish(self._queue.popleft())

    def add(self, bucket: GradientBucket) -> None:
        self._queue.append(bucket)

    def clear(self) -> None:
        self._queue.clear()

    @staticmethod
    def _finish(bucket: GradientBucket) -> None:
        if bucket.state == "launched":
            bucket.wait()
