"""Which algorithm serves a call, and why.

Order of precedence: the call's ``algorithm=``, else the process default
(``set_default_algorithm`` or ``ZEROCOMM_ALGORITHM``), else ``"auto"``.  ``auto``
looks the call up in ``auto_table.json`` — written by ``benchmarks/tune.py`` from
measurements on this kind of machine — and takes the first candidate that can serve
the call.  An explicit algorithm that cannot serve the call raises
``UnsupportedError`` naming backend, device, collective, algorithm, dtype and what to
use instead, before any byte moves.  Every decision is logged at DEBUG level on the
``zerocomm.comm.select`` logger.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import List, Optional

import torch

from .algorithms import ALGORITHMS as _REGISTRY
from .config import ALGORITHMS
from .errors import InvalidArgumentError, UnsupportedError
from .reduce_op import op_admits

log = logging.getLogger("zerocomm.comm.select")

_TABLE_PATH = os.path.join(os.path.dirname(__file__), "auto_table.json")
_CONCRETE = ("native", "ring", "tree", "recursive_doubling")
_UNBOUNDED = 1 << 62  # the table's "any size" bound (benchmarks/tune.py)


@functools.lru_cache(maxsize=1)
def auto_table() -> dict:
    """``{backend: {collective: [[max_world_size, max_bytes, algorithm], ...]}}``; first matching row wins."""
    try:
        with open(_TABLE_PATH) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def refusal(collective: str, transport, dtype: torch.dtype, op: Optional[str], algorithm: str) -> Optional[str]:
    """``None`` if ``algorithm`` can serve the cell, else the reason it cannot."""
    if op is not None:
        reason = op_admits(op, dtype)
        if reason is not None:
            return reason
    if algorithm == "onebit":
        return _onebit_refusal(collective, dtype, op)
    if algorithm == "native":
        return transport.native_support(collective, dtype, op)
    if (collective, algorithm) not in _REGISTRY:
        return f"zerocomm has no {algorithm} {collective}"
    return transport.can_move(dtype)


def _onebit_refusal(collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
    if collective not in ("all_reduce", "compressed_all_reduce"):
        return "1-bit compression applies to all_reduce only"
    if not dtype.is_floating_point:
        return f"1-bit compression needs a floating dtype, got {dtype}"
    if op != "avg":
        return f"1-bit compression needs op AVG (it computes the mean over ranks), got {str(op).upper()}"
    return None


def alternatives(collective: str, transport, dtype: torch.dtype, op: Optional[str], exclude: str) -> List[str]:
    return [alg for alg in _CONCRETE if alg != exclude and refusal(collective, transport, dtype, op, alg) is None]


def _auto(collective: str, transport, dtype, op, nbytes: Optional[int]) -> str:
    """The table's choice.  ``nbytes`` must be the same on every rank (ranks that chose differently
    would deadlock); ``None`` when it cannot be (uneven all_to_all): then the largest-size row decides."""
    rows = auto_table().get(transport.name, {}).get(collective, [])
    for max_world, max_bytes, algorithm in rows:
        if transport.size <= max_world and (nbytes is None or nbytes <= max_bytes) and (
                nbytes is not None or max_bytes >= _UNBOUNDED):
            if refusal(collective, transport, dtype, op, algorithm) is None:
                return algorithm
    for algorithm in _CONCRETE:
        if refusal(collective, transport, dtype, op, algorithm) is None:
            return algorithm
    return "native"  # nothing serves it: let the explicit path raise the clear error


def select_algorithm(collective: str, group, dtype: torch.dtype, op: Optional[str], nbytes: Optional[int],
                     requested: Optional[str], default: str) -> str:
    """The algorithm that runs this call on ``group``; raises ``UnsupportedError`` if the request cannot."""
    choice = requested if requested is not None else default
    if choice not in ALGORITHMS:
        raise InvalidArgumentError(
            f"rank {group.my_global_rank}: {collective}: algorithm must be one of {ALGORITHMS}, got {choice!r}")
    transport = group.transport
    source = "explicit" if requested is not None else "default"
    if choice == "auto":
        choice, source = _auto(collective, transport, dtype, op, nbytes), "auto table"
    reason = refusal(collective, transport, dtype, op, choice)
    if reason is not None:
        raise_unsupported(collective, group, dtype, op, choice, reason)
    log.debug("%s: %d B %s on %s group of %d -> %s (%s)", collective, nbytes, dtype, transport.name,
              transport.size, choice, source)
    return choice


def raise_unsupported(collective: str, group, dtype: torch.dtype, op: Optional[str], choice: str, reason: str):
    """Raise the one ``UnsupportedError`` wording: backend, device, collective, algorithm, dtype, why, instead."""
    transport = group.transport
    if choice == "onebit":
        if op not in (None, "avg"):
            exact = f"ReduceOp.{op.upper()}"
        else:
            exact = "ReduceOp.AVG" if dtype.is_floating_point else "ReduceOp.SUM, then divide,"
        instead = f"use all_reduce with {exact} without compression instead"
    else:
        others = alternatives(collective, transport, dtype, op, choice)
        instead = (f"use algorithm={' or '.join(repr(a) for a in others)} instead" if others
                   else "no algorithm serves this cell; use another dtype or op")
    raise UnsupportedError(
        f"rank {group.my_global_rank}: {collective} is unsupported on backend {transport.name!r} "
        f"(device {transport.device_type}) with algorithm={choice!r}, dtype {dtype}"
        f"{'' if op is None else f', op {op.upper()}'}: {reason}; {instead}")


def check_compression(collective: str, group, dtype: torch.dtype, op: Optional[str]) -> None:
    """Raise ``UnsupportedError`` before any byte moves if 1-bit compression cannot serve the call."""
    reason = refusal(collective, group.transport, dtype, op, "onebit")
    if reason is not None:
        raise_unsupported(collective, group, dtype, op, "onebit", reason)
