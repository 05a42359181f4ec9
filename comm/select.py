"""Which algorithm serves a call, and why.

Order of precedence: the call's ``algorithm=``, else the process default
(``set_default_algorithm`` or ``ZEROCOMM_ALGORITHM``), else ``"auto"``.  ``auto``
looks the call up in ``auto_table.json`` — written by ``zerocomm-bench tune`` from
measurements on this kind of machine — and takes the first row that can serve the
call.  An explicit algorithm that cannot serve the call raises ``UnsupportedError``
naming backend, device, collective, algorithm, dtype and what to use instead, before
any byte moves.  Every decision is logged at DEBUG level on the
``zerocomm.comm.select`` logger.

A group whose ranks run on several hosts reads the backend's section ``"<backend>+hosts"``
(measured across hosts, e.g. with ``zerocomm-bench cluster``) when the table has one; a group
whose ranks share one host reads ``"<backend>+one_host"`` (rows that may name "shm", written by
``zerocomm-bench tune --add shm``) for the collectives it has.  The plain ``"<backend>"`` rows
name only algorithms that run anywhere: they serve groups whose hosts are unknown, and every
collective a section lacks.  The group learns its hosts at ``init_process_group`` (``comm.topology``).

Everything here depends only on the cell (backend, group size, collective, dtype, op,
requested algorithm, whether the group spans hosts), so :func:`rule` is computed once per cell and cached: a call
pays a dictionary lookup, not a table walk.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import List, NamedTuple, Optional

import torch

from .algorithms import ALGORITHM_NAMES, ALGORITHMS, COMPRESSED
from .errors import UnsupportedError
from .reduce_op import for_dtype, op_admits

log = logging.getLogger("zerocomm.comm.select")

_TABLE_PATH = os.path.join(os.path.dirname(__file__), "auto_table.json")
#: The table's "any size" bound (benchmarks/tune.py writes it).
UNBOUNDED = 1 << 62
#: Algorithms "auto" and the suggestions may pick: every exact one.
_EXACT = tuple(name for name in ALGORITHM_NAMES if name not in COMPRESSED)


@functools.lru_cache(maxsize=1)
def auto_table() -> dict:
    """``{backend: {collective: [[max_world_size, max_bytes, algorithm], ...]}}``; first matching row wins."""
    try:
        with open(_TABLE_PATH) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def refusal(collective: str, backend, dtype: torch.dtype, op: Optional[str], algorithm: str,
            one_host: Optional[bool] = True) -> Optional[str]:
    """``None`` if ``algorithm`` can serve the cell on ``backend`` (a backend class), else the reason it cannot.

    ``one_host``: whether the group's ranks share one host (``None``: not known yet); only "shm" asks.
    """
    if op is not None:
        op = for_dtype(op, dtype)  # bool's SUM and PRODUCT: or and and
        reason = op_admits(op, dtype)
        if reason is not None:
            return reason
    if algorithm == "onebit":
        return _onebit_refusal(collective, dtype, op)
    if algorithm == "native":
        return backend.native_support(collective, dtype, op)
    if (collective, algorithm) not in ALGORITHMS:
        return f"zerocomm has no {algorithm} {collective}"
    if algorithm == "shm":
        return _shm_refusal(backend, one_host)
    if algorithm == "hierarchical" and backend.device_type != "cpu":
        return f"hierarchical runs on CPU backends (it learns the hosts with CPU tensors), not {backend.device_type}"
    return backend.can_move(dtype)


def _shm_refusal(backend, one_host: Optional[bool]) -> Optional[str]:
    if backend.device_type != "cpu":
        return f"shm moves host memory and backend {backend.name} moves {backend.device_type} tensors"
    if one_host is False:
        return "the group's ranks run on several hosts and shm needs them all on one"
    return None


def _onebit_refusal(collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
    if collective != "all_reduce":
        return "1-bit compression applies to all_reduce only"
    if not dtype.is_floating_point:
        return f"1-bit compression needs a floating dtype, got {dtype}"
    if op != "avg":
        return f"1-bit compression needs op AVG (it computes the mean over ranks), got {str(op).upper()}"
    return None


def alternatives(collective: str, backend, dtype: torch.dtype, op: Optional[str], exclude: str) -> List[str]:
    """The exact algorithms other than ``exclude`` that serve the cell."""
    return [alg for alg in _EXACT if alg != exclude and refusal(collective, backend, dtype, op, alg) is None]


class Rule(NamedTuple):
    """How a cell picks its algorithm: a fixed ``algorithm`` (or its ``refusal``), or size ``rows``."""

    algorithm: Optional[str]
    rows: Optional[tuple]
    """``((max_bytes, algorithm), ...)`` for "auto": the first row whose bound covers the call's S wins."""
    refusal: Optional[str]


def host_section(backend) -> Optional[dict]:
    """The table's section for groups of ``backend`` that span several hosts, or ``None``."""
    return auto_table().get(f"{backend.name}+hosts")


def one_host_section(backend) -> Optional[dict]:
    """The table's section for groups of ``backend`` whose ranks share one host, or ``None``."""
    return auto_table().get(f"{backend.name}+one_host")


@functools.lru_cache(maxsize=4096)
def rule(backend, size: int, collective: str, dtype: torch.dtype, op: Optional[str], choice: str,
         one_host: Optional[bool] = None) -> Rule:
    """The cached selection rule of one cell (``backend`` is the backend class, ``size`` the group's,
    ``one_host`` whether its ranks share a host, ``None`` if not known: "auto" then never picks "shm",
    reads the table's ``<backend>+one_host`` rows only when it is ``True`` and ``<backend>+hosts`` only
    when it is ``False``)."""
    if choice != "auto":
        return Rule(choice, None, refusal(collective, backend, dtype, op, choice, one_host))

    def serves(algorithm: str) -> bool:
        if algorithm == "shm" and one_host is not True:
            return False
        return refusal(collective, backend, dtype, op, algorithm, one_host) is None

    rows = []
    # Across hosts, or on one: that section, for the collectives it has; the plain rows otherwise.
    if one_host is False:
        across = host_section(backend) or {}
    elif one_host:
        across = one_host_section(backend) or {}
    else:
        across = {}
    table = across.get(collective) or auto_table().get(backend.name, {}).get(collective, [])
    for max_world, max_bytes, algorithm in table:
        if size <= max_world and serves(algorithm):
            rows.append((max_bytes, algorithm))
    # Past the table (or without one): the first exact algorithm that serves the cell, never one that
    # is only worth it where measured (shm, hierarchical).
    fallback = next((a for a in _EXACT if a not in ("shm", "hierarchical") and serves(a)), None)
    if fallback is None:
        return Rule("native", None, refusal(collective, backend, dtype, op, "native"))
    rows.append((UNBOUNDED, fallback))
    return Rule(None, tuple(rows), None)


def raise_unsupported(collective: str, group, dtype: torch.dtype, op: Optional[str], choice: str, reason: str):
    """Raise the one ``UnsupportedError`` wording: backend, device, collective, algorithm, dtype, why, instead."""
    backend = group.backend_type
    if choice == "onebit":
        if op not in (None, "avg"):
            exact = f"ReduceOp.{op.upper()}"
        else:
            exact = "ReduceOp.AVG" if dtype.is_floating_point else "ReduceOp.SUM, then divide,"
        instead = f"use all_reduce with {exact} without compression instead"
    else:
        others = alternatives(collective, backend, dtype, op, choice)
        instead = (f"use algorithm={' or '.join(repr(a) for a in others)} instead" if others
                   else "no algorithm serves this cell; use another dtype or op")
    raise UnsupportedError(
        f"rank {group.my_global_rank}: {collective} is unsupported on backend {backend.name!r} "
        f"(device {backend.device_type}) with algorithm={choice!r}, dtype {dtype}"
        f"{'' if op is None else f', op {op.upper()}'}: {reason}; {instead}")
