"""Ranks agree on an outcome before anyone acts on it: every rank raises the same error, or none does.

``agree(problem, numbers, ...)`` is called by every rank of the group with its own finding
(``None`` or an exception from ``CHECKPOINT_ERRORS``) and a fixed count of int64 ``numbers``.  It
returns every rank's numbers when no rank had a problem; otherwise every rank raises the same
class, whose message is the lowest failing rank's, followed by what the other failing ranks found.

[Note: no pickles]
The exchange is one ``all_gather_into_tensor`` of ``[ok, message length, *numbers]`` per rank and,
only when some rank failed, a second one of the UTF-8 messages padded to the longest.  Error
classes travel by name and are looked up in a table, so nothing a peer sends is unpickled.  Both
collectives run under the group's timeout: a rank that died or never arrives makes the others
raise ``PeerError`` / ``CommTimeoutError`` from zerocomm.comm, which callers turn into a checkpoint
error (see checkpoint.py).
"""
from __future__ import annotations

import json
from typing import Sequence

import torch

from .. import comm as dist
from .errors import CHECKPOINT_ERRORS, CheckpointError, ZeroStateError


def _encode(problem: BaseException) -> bytes:
    kind = type(problem).__name__ if type(problem).__name__ in CHECKPOINT_ERRORS else "CheckpointError"
    return json.dumps({"type": kind, "message": str(problem), "rank": getattr(problem, "rank", None),
                       "file": getattr(problem, "file", None), "reason": getattr(problem, "reason", None)}).encode()


def agree(problem: BaseException | None, numbers: Sequence[int] = (), *, group, device, algorithm=None) -> list[list[int]]:
    """Every rank of ``group`` calls it; returns ``numbers`` of every rank (index = rank) or raises.

    ``numbers`` must have the same length on every rank (send zeros where a rank has none).
    ``device``: where the exchanged tensors live (the parameters' device; CUDA for NCCL)."""
    world = dist.get_world_size(group)
    message = _encode(problem) if problem is not None else b""
    mine = torch.tensor([0 if problem is not None else 1, len(message), *numbers], dtype=torch.int64, device=device)
    table = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(table, mine, group=group, algorithm=algorithm)
    rows = table.view(world, -1).tolist()
    if all(row[0] == 1 for row in rows):
        return [row[2:] for row in rows]
    longest = max(row[1] for row in rows)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:len(message)] = torch.frombuffer(bytearray(message), dtype=torch.uint8) if message else padded[:0]
    texts = torch.empty(world * longest, dtype=torch.uint8, device=device)
    dist.all_gather_into_tensor(texts, padded.to(device), group=group, algorithm=algorithm)
    texts = texts.view(world, longest).cpu()
    found = [json.loads(bytes(texts[r, :rows[r][1]].tolist())) for r in range(world) if rows[r][0] != 1]
    raise _error_for(found) from problem


def _error_for(found: list[dict]) -> Exception:
    """One exception for every failing rank's finding: the first one's class and message, then the others'."""
    first = found[0]
    others = [f["message"] for f in found[1:] if f["message"] != first["message"]]
    text = first["message"] + ("".join(f"; also {m}" for m in others[:3]) +
                               (f"; and {len(others) - 3} more" if len(others) > 3 else "") if others else "")
    cls = CHECKPOINT_ERRORS.get(first["type"], CheckpointError)
    if cls is ZeroStateError:
        return cls(text)
    return cls(text, rank=first["rank"], file=first["file"], reason=first["reason"])
