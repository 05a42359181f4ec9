"""Typed errors of the comm layer.

Every error subclasses ``torch.distributed.DistError`` so code written against
``torch.distributed`` that catches its errors keeps working; the errors a backend
raises in torch (a timeout, a peer gone, a mismatch) also subclass
``torch.distributed.DistBackendError``.  Errors about the caller's arguments are
also ``ValueError``\\ s, as torch's are.
"""
from __future__ import annotations

import torch.distributed as _td


class CommError(_td.DistError):
    """Base class of every zerocomm comm error."""


class CommTimeoutError(CommError, _td.DistBackendError):
    """A blocking call ran past its deadline; the message names the op, the group and the peer awaited."""


class CollectiveMismatchError(CommError, _td.DistBackendError):
    """Ranks called different collectives, or the same one with different shapes, dtypes or roots."""


class UnsupportedError(CommError):
    """The (backend, device, collective, algorithm, dtype, op) cell is not supported; the message says what to use."""


class NotInitializedError(CommError, ValueError):
    """A call needed the default group before ``init_process_group``."""


class InvalidArgumentError(CommError, ValueError):
    """The caller's arguments are wrong on this rank (dtype, size, root, membership); raised before any byte moves."""


class PeerError(CommError, _td.DistBackendError):
    """A peer failed or went away while this rank waited on it."""
