"""Process-wide defaults of the comm layer, read from the environment through ``environment.py``.

Environment variables:
    ZEROCOMM_ALGORITHM      default ``algorithm=`` of every collective ("auto" if unset).
    ZEROCOMM_SEGMENT_BYTES  pipeline segment size of ring and tree algorithms.
    ZEROCOMM_TIMEOUT        seconds: the default deadline of every blocking call (init, collectives,
                            object collectives, barrier) when ``init_process_group`` gets no
                            ``timeout``; default 300 (see docs/failures.md for why).
    ZEROCOMM_CHECK          "0": skip the per-call mismatch check (one small round before each
                            collective; on by default, see docs/failures.md).
    ZEROCOMM_DEBUG          "1": the full check: every rank's whole fingerprint is all-gathered
                            before each collective (the default check exchanges a hash of it).
    ZEROCOMM_SWITCH_INTERVAL  seconds; if set, ``sys.setswitchinterval`` at init.  An async
                            collective's executor thread waits for the GIL up to this long
                            (Python's default 5 ms) when the training thread is busy in Python;
                            1e-4 to 5e-4 lets communication overlap computation more closely.
    ZEROCOMM_PROFILE        a path: record every collective from init to destroy and write
                            ``PATH.rankN.json`` and ``PATH.rankN.trace.json`` (Chrome trace).
    ZEROCOMM_MAX_QUEUED     calls a group may have queued behind the running one before a caller waits.
    ZEROCOMM_TORCH_DEFAULT_GROUP  "0": ``init_process_group`` leaves torch's default process group alone
                            (by default it makes it stand for zerocomm's world).

``init_process_group`` reads them (through :meth:`CommConfig.from_env`; ``environment.py`` is the one
place the environment is read); ``configure`` changes the live configuration; ``destroy_process_group`` drops it.
"""
from __future__ import annotations

import dataclasses

from . import environment
from .algorithms import ALGORITHM_CHOICES
from .errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CommConfig:
    algorithm: str = "auto"
    """Algorithm used when a call does not pass ``algorithm=``: one of ``comm.algorithms.ALGORITHM_CHOICES``."""
    segment_bytes: int = 4 << 20
    """Bytes per pipelined segment in ring/tree algorithms; smaller pipelines deeper, costs more messages.
    The default was the best of those measured for 16-64 MiB all_reduce (docs/bench/guides.md)."""
    timeout_s: float = 300.0
    """Default deadline, in seconds, of every blocking call of a group whose ``init_process_group``/``new_group``
    got no ``timeout``.  Five minutes, not torch's 30 (gloo) or 10 (NCCL): a peer that is known dead (its
    connection closed, its process gone, an MPI error) fails a call at once whatever this is, so the
    deadline only bounds a peer that is alive but stuck, and a stuck job should not hold its
    allocation for half an hour.  Raise it for programs whose ranks legitimately wait longer at one
    call (one rank loading a large checkpoint while the others wait in a broadcast)."""
    check: bool = True
    """Mismatch check before each collective: one small round (``check.py``: a shared-memory round on one host, else
    a SUM all_reduce of a 16-float64 stage) comparing a 62-bit hash of (sequence number, collective, op, dtype,
    element count, root, algorithm); ranks that disagree raise ``CollectiveMismatchError`` on every rank, naming
    both sides, instead of returning garbage, aborting or hanging."""
    debug: bool = False
    """The full check: all-gather every rank's whole fingerprint before each collective (implies ``check``)."""
    switch_interval_s: float = 0.0
    """If positive, applied with ``sys.setswitchinterval`` at init (0: leave the interpreter's default)."""
    profile_path: str = ""
    """If set, the profiler records from init to destroy and writes its files with this prefix."""
    torch_default_group: bool = True
    """``init_process_group`` also makes torch's default process group stand for zerocomm's world (on the
    "zerocomm" c10d backend), so ``torch.distributed.get_rank()``, ``DistributedSampler`` and torch's own
    collectives see the same ranks.  A program that initialized torch's default group first keeps its own.
    ``ZEROCOMM_TORCH_DEFAULT_GROUP=0`` leaves torch's default group alone."""
    max_queued: int = 1024
    """Calls a group may hold queued behind the running one; the next caller waits (back-pressure), within
    its deadline.  Large enough for ZeRO's bucketed reductions, small enough to bound what queued calls pin."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHM_CHOICES or self.algorithm == "onebit":
            raise InvalidArgumentError(f"algorithm must be one of {tuple(a for a in ALGORITHM_CHOICES if a != 'onebit')}"
                                       f", got {self.algorithm!r} (1-bit compression is all_reduce's "
                                       "compression='onebit')")
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 1:
            raise InvalidArgumentError(f"segment_bytes must be a positive int, got {self.segment_bytes!r}")
        if not isinstance(self.timeout_s, (int, float)) or not 0 < self.timeout_s < float("inf"):
            raise InvalidArgumentError(f"timeout_s must be a positive finite number of seconds, got {self.timeout_s!r}")
        if not isinstance(self.max_queued, int) or self.max_queued < 1:
            raise InvalidArgumentError(f"max_queued must be a positive int, got {self.max_queued!r}")

    @classmethod
    def from_env(cls, environ=None) -> "CommConfig":
        """The configuration the ``ZEROCOMM_*`` variables describe; a bad value names its variable."""
        env = environ
        fields = {}
        for variable, field, parse in _VARIABLES:
            text = environment.get(variable, env)
            if text == "":
                continue
            try:
                fields[field] = parse(text)
            except ValueError as error:
                raise InvalidArgumentError(f"environment variable {variable}={text!r}: {error}") from None
        try:
            return cls(**fields)
        except InvalidArgumentError as error:
            variable = next(v for v, f, _ in _VARIABLES if str(error).startswith(f))
            raise InvalidArgumentError(f"environment variable {variable}={environment.get(variable, env)!r}: "
                                       f"{error}") from None


def _flag(text: str) -> bool:
    return text not in ("0", "false", "False", "no")


#: (variable, field, parser): the environment as the configuration reads it.
_VARIABLES = (
    ("ZEROCOMM_ALGORITHM", "algorithm", str),
    ("ZEROCOMM_SEGMENT_BYTES", "segment_bytes", int),
    ("ZEROCOMM_TIMEOUT", "timeout_s", float),
    ("ZEROCOMM_CHECK", "check", _flag),
    ("ZEROCOMM_DEBUG", "debug", _flag),
    ("ZEROCOMM_PROFILE", "profile_path", str),
    ("ZEROCOMM_SWITCH_INTERVAL", "switch_interval_s", float),
    ("ZEROCOMM_MAX_QUEUED", "max_queued", int),
    ("ZEROCOMM_TORCH_DEFAULT_GROUP", "torch_default_group", _flag),
)

