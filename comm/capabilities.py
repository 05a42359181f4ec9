"""The backend capability matrix: one source of truth for selection, docs and tests.

A *cell* is (backend, device, collective, algorithm, dtype, op).  Its answer comes
from the same functions the call path uses — ``select.refusal`` (the reduction
kernels' dtype rules, the algorithm registry, the backend's native table) and the
device check — so the matrix cannot drift from what a call does.

    python -m zerocomm.comm.capabilities              # markdown (docs/capabilities.md)
    python -m zerocomm.comm.capabilities --json       # every cell as JSON
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Dict, Iterator, List, Optional

import torch

from .algorithms import ALGORITHM_NAMES
from .backends import BACKENDS as _BACKEND_TABLE
from .backends import backend_class
from .reduce_op import OP_NAMES, SUPPORTED_DTYPES, op_admits
from .select import refusal

BACKENDS = tuple(_BACKEND_TABLE)
DEVICES = ("cpu", "cuda")
#: Collectives as the matrix names them (send/recv is the point-to-point pair).
COLLECTIVES = ("broadcast", "scatter", "reduce", "all_reduce", "gather", "all_gather", "reduce_scatter",
               "all_to_all", "send/recv", "barrier")
REDUCING = ("reduce", "all_reduce", "reduce_scatter")
OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    backend: str
    device: str
    collective: str
    algorithm: str
    dtype: str
    op: Optional[str]
    supported: bool
    reason: str = ""
    """Why the cell is unsupported (empty when supported)."""
    instead: str = ""
    """What to use instead (empty when supported)."""


def transport_class(backend: str):
    """The backend's class, imported without starting MPI or touching CUDA."""
    return backend_class(backend)


def native_operations() -> Dict[str, Dict[str, str]]:
    """``{backend: {collective: how}}``: what each backend runs natively and what zerocomm composes."""
    return {backend: transport_class(backend).native_table() for backend in BACKENDS}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _algorithms(collective: str) -> List[str]:
    if collective == "send/recv":
        return ["native"]
    # recursive doubling is an all_reduce schedule only; every other name is listed for every collective,
    # so a refused (collective, algorithm) pair shows its reason and alternative.
    # recursive doubling and 1-bit compression ("onebit": all_reduce(..., compression="onebit")) exist for
    # all_reduce only.
    return [a for a in ALGORITHM_NAMES if a not in ("recursive_doubling", "onebit") or collective == "all_reduce"]


def _cell(backend: str, cls, device: str, collective: str, algorithm: str, dtype: torch.dtype,
          op: Optional[str]) -> Cell:
    args = (backend, device, collective, algorithm, _dtype_name(dtype), op)
    if device != cls.device_type:
        other = "nccl" if device == "cuda" else "gloo or mpi"
        return Cell(*args, False, f"backend {backend} moves {cls.device_type} tensors, not {device}",
                    f"backend {other}")
    if collective == "send/recv":
        reason = cls.can_move(dtype)
        return Cell(*args, reason is None, reason or "", "" if reason is None else "another dtype")
    reason = refusal(collective, cls, dtype, op, algorithm)
    if reason is None:
        return Cell(*args, True)
    others = [a for a in ALGORITHM_NAMES if a not in (algorithm, "onebit")
              and refusal(collective, cls, dtype, op, a) is None]
    instead = f"algorithm={' or '.join(others)}" if others else (
        "another op" if op is not None else "another dtype")
    return Cell(*args, False, reason, instead)


def iter_cells(backends=BACKENDS) -> Iterator[Cell]:
    """Every cell of the matrix, in a stable order."""
    for backend in backends:
        cls = transport_class(backend)
        for device in DEVICES:
            for collective in COLLECTIVES:
                for algorithm in _algorithms(collective):
                    for dtype in SUPPORTED_DTYPES:
                        for op in (OPS if collective in REDUCING else (None,)):
                            yield _cell(backend, cls, device, collective, algorithm, dtype, op)


def capability_matrix(backends=BACKENDS) -> List[Cell]:
    """The whole matrix as a list of :class:`Cell`."""
    return list(iter_cells(backends))


def lookup(backend: str, device: str, collective: str, algorithm: str, dtype: torch.dtype,
           op=None) -> Cell:
    """One cell's answer.  ``op`` is a ``ReduceOp`` or its name in any case ("BAND", "band"); ``None`` for
    collectives that do not reduce."""
    if op is not None:
        name = OP_NAMES.get(op) if not isinstance(op, str) else op.lower()
        if name not in OPS:
            raise ValueError(f"lookup: op must be a ReduceOp or one of {[o.upper() for o in OPS]}, got {op!r}")
        op = name
    return _cell(backend, transport_class(backend), device, collective, algorithm, dtype, op)


# -- rendering ---------------------------------------------------------------------------

_GUIDE = """\
# Backend capability matrix

*Generated by `python -m zerocomm.comm.capabilities > docs/capabilities.md`; a test fails when this file
differs from what the code says.*

## How to read it

Every call is one *cell*: (backend, device, collective, algorithm, dtype, reduce op).  A cell either works, or
the call raises `zerocomm.comm.UnsupportedError` at once — before any byte moves, on every rank — with a message
that names the backend, device, collective, algorithm and dtype, says why, and says what to use instead.  Ask
from code with `zerocomm.comm.capabilities.lookup(...)` or take every cell with `capability_matrix()`
(`python -m zerocomm.comm.capabilities --json`).

In the tables below a row is (collective, algorithm) and a column a dtype.  **all** means every reduce op the
dtype admits works (floats: SUM AVG PRODUCT MIN MAX; integers: SUM PRODUCT MIN MAX BAND BOR BXOR; bool: SUM and
MAX and BOR (logical or), PRODUCT and MIN and BAND (logical and), BXOR, as torch reduces bool); otherwise the cell lists the ops that work; **—** means nothing works, and the reasons follow
each table.  Collectives that do not reduce show **yes**.  Algorithms: `native` is the backend's own
implementation (or zerocomm's composition where the backend lacks one, as the native-operations table says);
`ring`, `tree` and `recursive_doubling` are zerocomm's, written once over the backend's point-to-point layer;
`onebit` is `all_reduce(..., op=ReduceOp.AVG, compression="onebit")`, the 1-bit compressed mean with error
feedback (its sub-collectives run natively or on ring/tree): it serves AVG on floating dtypes only.
`shm` moves bytes through shared memory and needs every rank of the group on one host (`ZEROCOMM_HOST` or
the hostname): its cells say **yes/all** for such groups; a group spanning hosts gets `UnsupportedError` naming
`hierarchical` or `ring`, and `auto` offers `shm` only to groups known to share a host.

## What zerocomm adds to torch.distributed

| | torch.distributed (torch 2.13 wheels) | zerocomm |
|---|---|---|
| MPI backend | not in torch's wheels (`is_mpi_available()` is False); needs a source build | `mpi` through mpi4py, every collective, bfloat16 via a zerocomm reduction op |
| gloo `reduce_scatter` (CPU) | all_reduce of the whole input + copy (twice the traffic) | same as `native`; `ring` gives a true reduce-scatter ((n-1)/n of the input on the wire) |
| gloo `ReduceOp.AVG` | not on integer dtypes; float support depends on version | floats on every backend and algorithm; integers refused with a clear error |
| ranks on one host (CPU) | gloo moves loopback TCP, MPI its own shared memory | `shm`: a reduction reads peers' buffers in place in shared memory; `shared_empty` tensors skip even the copy in |
| bitwise ops on NCCL | `BAND`/`BOR`/`BXOR` unsupported | `algorithm="ring"` or `"tree"` serves them on CUDA |
| choice of algorithm | fixed per backend | `native`, `ring`, `tree`, `recursive_doubling`, `shm`, `auto` on every backend |
| errors | backend-specific; gloo aborts a rank on a shape mismatch | typed errors before any byte moves; the mismatch check (on by default) names the mismatched ranks |
"""


def _dtypes() -> List[str]:
    return [_dtype_name(d) for d in SUPPORTED_DTYPES]


def render_markdown(backends=BACKENDS) -> str:
    cells = capability_matrix(backends)
    lines = [_GUIDE, "## Native operations per backend", "",
             "| collective | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    natives = native_operations()
    for collective in COLLECTIVES:
        lines.append(f"| {collective} | " + " | ".join(natives[b].get(collective, "—") for b in backends) + " |")
    for backend in backends:
        for device in DEVICES:
            group = [c for c in cells if c.backend == backend and c.device == device]
            if all(not c.supported for c in group):
                lines += ["", f"## {backend} on {device}", "",
                          f"Nothing: {group[0].reason}; use {group[0].instead}."]
                continue
            lines += ["", f"## {backend} on {device}", "",
                      "| collective | algorithm | " + " | ".join(_dtypes()) + " |",
                      "|---|---|" + "---|" * len(_dtypes())]
            reasons: Dict[str, int] = {}
            for collective in COLLECTIVES:
                for algorithm in _algorithms(collective):
                    row = []
                    for dtype in _dtypes():
                        these = [c for c in group if c.collective == collective and c.algorithm == algorithm
                                 and c.dtype == dtype]
                        row.append(_summarize(these, reasons))
                    lines.append(f"| {collective} | {algorithm} | " + " | ".join(row) + " |")
            if reasons:
                lines += ["", "Refusals in this table:", ""]
                lines += [f"{number}. {text}" for text, number in reasons.items()]
    return "\n".join(lines) + "\n"


def _summarize(cells: List[Cell], reasons: Dict[str, int]) -> str:
    works = [c for c in cells if c.supported]
    refused = [c for c in cells if not c.supported]
    notes = []
    for cell in refused:
        # Ops a dtype does not admit are part of the dtype rules stated above, not notes.
        if cell.op is not None and ("needs" in cell.reason or "not defined" in cell.reason):
            continue
        text = f"{cell.reason}; use {cell.instead}"
        notes.append(reasons.setdefault(text, len(reasons) + 1))
    marks = "".join(f"<sup>{n}</sup>" for n in sorted(set(notes)))
    if not works:
        return "—" + marks
    if cells[0].op is None:
        return "yes" + marks
    if all(op_admits(c.op, getattr(torch, c.dtype)) is not None for c in refused):
        return "all"  # only ops the dtype itself does not admit were refused
    return " ".join(c.op.upper() for c in works) + marks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerocomm.comm.capabilities",
                                     description="Print zerocomm's backend capability matrix.")
    parser.add_argument("--json", action="store_true", help="every cell as JSON instead of markdown tables")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="limit to these backends")
    args = parser.parse_args(argv)
    backends = tuple(args.backend) if args.backend else BACKENDS
    if args.json:
        json.dump([dataclasses.asdict(c) for c in capability_matrix(backends)], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_markdown(backends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
