"""Process-wide defaults of the comm layer, and the one place the environment is read.

Environment variables:
    ZEROCOMM_ALGORITHM      default ``algorithm=`` of every collective ("auto" if unset).
    ZEROCOMM_SEGMENT_BYTES  pipeline segment size of ring and tree algorithms.
    ZEROCOMM_DEBUG          "1": exchange a fingerprint before each collective and raise
                            ``CollectiveMismatchError`` when ranks disagree.
    ZEROCOMM_SWITCH_INTERVAL  seconds; if set, ``sys.setswitchinterval`` at init.  An async
                            collective's executor thread waits for the GIL up to this long
                            (Python's default 5 ms) when the training thread is busy in Python;
                            1e-4 to 5e-4 lets communication overlap computation more closely.
    ZEROCOMM_PROFILE        a path: record every collective from init to destroy and write
                            ``PATH.rankN.json`` and ``PATH.rankN.trace.json`` (Chrome trace).
"""
from __future__ import annotations

import dataclasses
import os

ALGORITHMS = ("native", "ring", "tree", "recursive_doubling", "auto")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CommConfig:
    algorithm: str = "auto"
    """Algorithm used when a call does not pass ``algorithm=``: one of ``ALGORITHMS``."""
    segment_bytes: int = 4 << 20
    """Bytes per pipelined segment in ring/tree algorithms; smaller pipelines deeper, costs more messages.
    4 MiB measured best for 16-64 MiB all_reduce on 2 cores, gloo and MPI, 2 and 4 ranks (1 MiB: 0.73-0.91
    of native's busbw at 4 gloo ranks; 4 MiB: 0.82-0.95)."""
    debug: bool = False
    """Cross-rank fingerprint check before each collective (one tiny all_gather per call)."""
    switch_interval_s: float = 0.0
    """If positive, applied with ``sys.setswitchinterval`` at init (0: leave the interpreter's default)."""
    profile_path: str = ""
    """If set, the profiler records from init to destroy and writes its files with this prefix."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 1:
            raise ValueError(f"segment_bytes must be a positive int, got {self.segment_bytes!r}")

    @classmethod
    def from_env(cls, environ=None) -> "CommConfig":
        env = os.environ if environ is None else environ
        return cls(
            algorithm=env.get("ZEROCOMM_ALGORITHM", "auto") or "auto",
            segment_bytes=int(env.get("ZEROCOMM_SEGMENT_BYTES", 4 << 20)),
            debug=env.get("ZEROCOMM_DEBUG", "0") not in ("", "0", "false", "False"),
            profile_path=env.get("ZEROCOMM_PROFILE", ""),
            switch_interval_s=float(env.get("ZEROCOMM_SWITCH_INTERVAL", 0) or 0),
        )
