"""The point-to-point interface every backend implements, and that every algorithm uses.

A :class:`Transport` is one communicator: ``size`` processes numbered ``0..size-1``
(group ranks), of which this process is ``rank``.  It moves the bytes of contiguous
tensors between two of them, matched by ``(peer, tag)``; messages with the same
``(peer, tag)`` are received in the order they were sent (MPI's non-overtaking rule,
and gloo's per-slot FIFO).  It knows nothing about torch process groups, ranks of
other communicators or collectives: the shared-memory transport, a plug-in test
fake and the torch backends all fit behind it.

A backend may also offer *native* collectives (``transport.native``): methods that run
one collective on the backend's own implementation.  Each returns a :class:`Request`.
Which (collective, dtype, op) cells a native method serves is answered by
``transport.native_support(collective, dtype, op)``: ``None`` when it serves the
cell, else a sentence saying why not.  Algorithms in ``comm.algorithms`` never call
native methods; ``comm.api`` chooses between the two.
"""
from __future__ import annotations

import abc
import time
from typing import Optional, Sequence

import torch

#: Tags at or above this value are reserved for collectives; user send/recv tags
#: must be below it.  MPI guarantees at least 32767 tags, MPICH gives 2**29 - 1.
USER_TAG_LIMIT = 1 << 20


class Request(abc.ABC):
    """One posted operation (send, recv or native collective).

    ``wait(timeout_s)`` returns when done, or raises ``TimeoutError`` (the builtin;
    the caller turns it into a ``CommTimeoutError`` that names the op and group)
    when ``timeout_s`` seconds pass first.  ``None`` means wait forever.
    """

    @abc.abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (drives progress where the backend needs it)."""

    @abc.abstractmethod
    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Block, without spinning the CPU, until done or ``timeout_s`` seconds pass."""


class CompletedRequest(Request):
    """A request that was already done when posted (empty tensors, size-1 groups)."""

    def test(self) -> bool:
        return True

    def wait(self, timeout_s: Optional[float] = None) -> None:
        return None


class Transport(abc.ABC):
    """One communicator of ``size`` processes; this one is ``rank``.

    Attributes:
        name: backend name ("gloo", "mpi", "nccl", ...).
        rank: this process's rank within the communicator.
        size: number of processes in the communicator.
        device_type: the device whose tensors it moves ("cpu" or "cuda").
    """

    name: str
    rank: int
    size: int
    device_type: str = "cpu"

    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """Post a send of the contiguous ``tensor`` to ``peer``; ``tensor`` must not change until done."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """Post a receive into the contiguous ``tensor`` from ``peer``; it must have the sender's byte size."""

    @classmethod
    def can_move(cls, dtype: torch.dtype) -> Optional[str]:
        """``None`` if ``isend``/``irecv`` can move tensors of ``dtype``, else why not."""
        return None

    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        """``None`` if the backend's own ``collective`` serves (dtype, op); else why not.  Class-level, so the
        capability matrix can ask without a communicator."""
        return f"{cls.name} has no native {collective}"

    @classmethod
    def native_table(cls) -> dict:
        """``{collective: "native" | "composed: how" | "none: why"}`` for docs and the capability matrix."""
        return {}

    def split(self, ranks: Sequence[int], key: str) -> Optional["Transport"]:
        """A new communicator over ``ranks`` (ranks of this one, in order).

        Every member of *this* communicator calls it with the same ``ranks`` and ``key``;
        non-members get ``None``.
        """
        raise NotImplementedError(f"{self.name} transport cannot split")

    def close(self) -> None:
        """Release the communicator's resources."""


def wait_all(requests: Sequence[Request], deadline: Optional[float]) -> None:
    """Wait for every request, each bounded by the absolute ``deadline`` (``time.monotonic()`` seconds)."""
    for req in requests:
        req.wait(remaining(deadline))


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (never negative), or ``None`` for no deadline."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
