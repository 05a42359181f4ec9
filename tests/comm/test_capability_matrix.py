"""Capability-matrix tests, generated from ``zerocomm.comm.capabilities``.

Every supported cell runs its collective and checks the result against numpy; every
unsupported cell must raise ``UnsupportedError`` at once, on every rank, naming backend,
device, collective, algorithm and dtype and saying what to use instead — and no peer is
left waiting (a checked all_reduce follows each batch of refusals).  Cells whose backend or
device is not on this machine are skipped with the reason.  The session ends with one
summary line (see tests/comm/conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.worlds import MPI_SKIP_REASON

import zerocomm.comm as dist
from zerocomm.comm.capabilities import BACKENDS, DEVICES, capability_matrix

WORLD_SIZE = 3   # not a power of two
NUMEL = 5        # not divisible by the world size
ROOT = WORLD_SIZE - 1

_NP = {"float32": np.float64, "float64": np.float64, "float16": np.float64, "bfloat16": np.float64,
       "int8": np.int64, "int32": np.int64, "int64": np.int64, "uint8": np.int64, "bool": np.bool_}


def _data(rank: int, numel: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: values 1 and 2 (exact in every dtype, products stay small)."""
    pattern = (np.arange(numel) + rank) % 2
    if dtype == "bool":
        return pattern == 0
    return (pattern + 1).astype(_NP[dtype])


def _tensor(values: np.ndarray, dtype: str) -> torch.Tensor:
    """A new tensor (never sharing memory with ``values``: collectives write in place)."""
    return torch.tensor(values).to(getattr(torch, dtype))


def _reduce(arrays, op: str, dtype: str) -> np.ndarray:
    stack = np.stack(arrays)
    if dtype == "bool":
        return {"min": np.logical_and, "band": np.logical_and, "product": np.logical_and, "max": np.logical_or,
                "bor": np.logical_or, "sum": np.logical_or, "bxor": np.logical_xor}[op].reduce(stack, 0)
    if op == "avg":
        return stack.sum(0) / len(arrays)
    return {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
            "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op].reduce(stack, 0)


_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR}


def _run_cell(cell) -> tuple:
    """Run one cell on this rank; return (actual numpy result or None, expected or None)."""
    rank, n, dtype, alg = dist.get_rank(), dist.get_world_size(), cell.dtype, cell.algorithm
    everyone = [_data(r, NUMEL, dtype) for r in range(n)]
    mine = _tensor(everyone[rank], dtype)
    kw = {"algorithm": alg}
    c = cell.collective
    if c == "all_reduce" and alg == "onebit":
        # Every rank holds the same ±1.5 pattern: 1-bit compression of a constant-magnitude tensor is exact,
        # so a wrong chunk route or scale shows as a wrong sign or value.
        from zerocomm.ops import ErrorFeedback
        same = np.where(np.arange(NUMEL) % 3 == 0, -1.5, 1.5)
        mine = torch.tensor(same).to(getattr(torch, dtype)) if dtype != "bool" else mine
        dist.all_reduce(mine, op=_OPS[cell.op], compression="onebit", compression_state=ErrorFeedback())
        return mine, same
    if c == "all_reduce":
        dist.all_reduce(mine, op=_OPS[cell.op], **kw)
        return mine, _reduce(everyone, cell.op, dtype)
    if c == "reduce":
        dist.reduce(mine, dst=ROOT, op=_OPS[cell.op], **kw)
        return mine, _reduce(everyone, cell.op, dtype) if rank == ROOT else everyone[rank]
    if c == "reduce_scatter":
        full = [_data(r, n * NUMEL, dtype) for r in range(n)]
        out = torch.empty(NUMEL, dtype=getattr(torch, dtype))
        dist.reduce_scatter_tensor(out, _tensor(full[rank], dtype), op=_OPS[cell.op], **kw)
        return out, _reduce(full, cell.op, dtype)[rank * NUMEL:(rank + 1) * NUMEL]
    if c == "broadcast":
        dist.broadcast(mine, src=ROOT, **kw)
        return mine, everyone[ROOT]
    if c == "all_gather":
        out = torch.empty(n * NUMEL, dtype=mine.dtype)
        dist.all_gather_into_tensor(out, mine, **kw)
        return out, np.concatenate(everyone)
    if c == "gather":
        chunks = [torch.empty_like(mine) for _ in range(n)] if rank == ROOT else None
        dist.gather(mine, chunks, dst=ROOT, **kw)
        return (torch.cat(chunks), np.concatenate(everyone)) if rank == ROOT else (None, None)
    if c == "scatter":
        out = torch.empty_like(mine)
        pieces = [_tensor(_data(100 + r, NUMEL, dtype), dtype) for r in range(n)] if rank == ROOT else None
        dist.scatter(out, pieces, src=ROOT, **kw)
        return out, _data(100 + rank, NUMEL, dtype)
    if c == "all_to_all":
        send = _tensor(np.concatenate([_data(10 * rank + j, NUMEL, dtype) for j in range(n)]), dtype)
        out = torch.empty(n * NUMEL, dtype=send.dtype)
        dist.all_to_all_single(out, send, **kw)
        return out, np.concatenate([_data(10 * j + rank, NUMEL, dtype) for j in range(n)])
    if c == "barrier":
        dist.barrier(**kw)
        return None, None
    if c == "send/recv":
        if n == 1:
            return None, None
        out = torch.empty_like(mine)
        request = dist.irecv(out, src=(rank - 1) % n)
        dist.send(mine, dst=(rank + 1) % n)
        request.wait()
        return out, everyone[(rank - 1) % n]
    raise AssertionError(f"no runner for collective {c}")


def _matches(actual: torch.Tensor, expected: np.ndarray, dtype: str) -> bool:
    got = actual.to(torch.float64).numpy() if actual.dtype in (torch.bfloat16, torch.float16) else actual.numpy()
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        return np.allclose(got, expected, rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6)
    return np.array_equal(got, expected.astype(got.dtype))


def run_cells(backend: str, device: str) -> dict:
    """Every cell of (backend, device) on this rank: counts and failure descriptions."""
    cells = [c for c in capability_matrix((backend,)) if c.device == device]
    passed = refused = 0
    failures = []
    for cell in cells:
        label = f"{cell.collective}/{cell.algorithm}/{cell.dtype}/{cell.op}"
        if cell.supported:
            try:
                actual, expected = _run_cell(cell)
            except Exception as error:  # a supported cell must work: report it, keep going
                failures.append(f"{label}: raised {type(error).__name__}: {error}")
                continue
            if actual is not None and not _matches(actual, expected, cell.dtype):
                failures.append(f"{label}: got {actual.tolist()}, expected {expected.tolist()}")
                continue
            passed += 1
        else:
            try:
                _run_cell(cell)
            except dist.UnsupportedError as error:
                text = str(error)
                wanted = [backend, device, cell.algorithm, "use"]
                if cell.collective != "barrier":  # a barrier moves no data: its cells are dtype-independent
                    wanted.append(cell.dtype)
                missing = [w for w in wanted if w not in text]
                if missing:
                    failures.append(f"{label}: refusal does not name {missing}: {text}")
                else:
                    refused += 1
            except Exception as error:
                failures.append(f"{label}: expected UnsupportedError, got {type(error).__name__}: {error}")
            else:
                failures.append(f"{label}: expected UnsupportedError, but the call ran")
    # Nobody was left waiting by a refusal: a checked all_reduce on every rank still works.
    check = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(check)
    if check.tolist() != [dist.get_world_size() * (dist.get_world_size() + 1) / 2] * 3:
        failures.append(f"final all_reduce after the refusals gave {check.tolist()}")
    return {"cells": len(cells), "passed": passed, "refused": refused, "failures": failures}


def _skip_reason(backend: str, device: str) -> str | None:
    if backend == "nccl":
        return "nccl cells need CUDA devices (none on this machine); tests/comm/test_nccl.py runs them on a GPU"
    if device == "cuda":
        return f"{backend}'s cuda cells need a CUDA tensor to pass, and this machine has no CUDA device"
    if backend == "mpi":
        from zerocomm.comm.backends.mpi import mpi_available
        reason = mpi_available()
        if reason:
            return f"{MPI_SKIP_REASON} ({reason})"
    return None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_capability_cells(backend, device, pool_registry, capability_summary):
    cells = [c for c in capability_matrix((backend,)) if c.device == device]
    reason = _skip_reason(backend, device)
    if reason is not None:
        capability_summary.skip(len(cells), reason)
        pytest.skip(f"{len(cells)} cells: {reason}")
    world = pool_registry.get(backend, WORLD_SIZE)
    results = world.run(run_cells, backend, device, timeout=300)
    failures = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{len(failures)} cell failures:\n" + "\n".join(failures[:40])
    # Every rank saw the same cells; count once.
    capability_summary.add(results[0]["passed"], results[0]["refused"])
    assert results[0]["passed"] + results[0]["refused"] == len(cells)
