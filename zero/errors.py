"""Typed errors of zerocomm.zero.

Configuration errors are also ``ValueError``\\ s and state errors ``RuntimeError``\\ s, so code that
catches the builtin kinds keeps working.  Messages name the rank where one is known, the object
(bucket, parameter, checkpoint file) and the offending value.

Checkpoint errors form a family under ``CheckpointError``; each carries ``rank`` (the rank that found
the problem, ``None`` outside a process group), ``file`` (the path concerned) and ``reason`` (what was
wrong).  Loading and saving agree across ranks first, so every rank of the group raises the same
class with the same message.
"""
from __future__ import annotations


class ZeroError(Exception):
    """Base class of every zerocomm.zero error."""


class ZeroConfigError(ZeroError, ValueError):
    """A configuration value (or a DeepSpeed key) that zerocomm.zero does not accept."""


class ZeroStateError(ZeroError, RuntimeError):
    """An operation came at the wrong time: a bucket filled twice, a step before its reductions, ..."""


class CheckpointError(ZeroError, RuntimeError):
    """A checkpoint cannot be written, read or matched to this model; the message names the file.

    ``CheckpointError(message)`` keeps the plain form; ``CheckpointError.at(file, reason, rank=r)``
    builds the message "rank r: FILE: REASON" and keeps the three parts as attributes.
    """

    def __init__(self, message: str = "", *, rank: int | None = None, file=None, reason: str | None = None):
        super().__init__(message)
        self.rank, self.file, self.reason = rank, None if file is None else str(file), reason or message

    @classmethod
    def at(cls, file, reason: str, *, rank: int | None = None) -> "CheckpointError":
        where = f"rank {rank}: " if rank is not None else ""
        return cls(f"{where}{file}: {reason}", rank=rank, file=file, reason=reason)


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint at the path: neither a manifest nor a ``latest`` file naming one."""


class CheckpointCorruptError(CheckpointError):
    """A file's bytes are not what the manifest recorded: checksum or size mismatch, unreadable manifest or shard."""


class CheckpointMissingShardError(CheckpointError):
    """A shard the manifest lists is not there."""


class CheckpointForeignError(CheckpointError):
    """A shard (or a rank's view of ``latest``) belongs to another checkpoint: its run id differs."""


class CheckpointIncompatibleError(CheckpointError):
    """A whole, valid checkpoint that does not fit this model, stage, optimizer or bucket layout."""


class CheckpointSaveError(CheckpointError):
    """A save failed on some rank (I/O error, a peer that died or timed out); the previous checkpoint is intact."""


#: Every class the ranks can agree on, by name (they exchange names, never pickles).
CHECKPOINT_ERRORS = {cls.__name__: cls for cls in (
    CheckpointError, CheckpointNotFoundError, CheckpointCorruptError, CheckpointMissingShardError,
    CheckpointForeignError, CheckpointIncompatibleError, CheckpointSaveError, ZeroStateError)}
