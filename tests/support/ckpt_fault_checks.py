"""Rank-side checkpoint fault checks: damaged checkpoints on load, crashes and failures during save.

Each load case damages one file of a good checkpoint (rank 0 does it between barriers), then every
rank tries to load it and reports the exception (class, family, message), how long ``load`` took,
and whether its model and optimizer are exactly as before; the file is then put back and a good
load must succeed.  The save cases arm ``zerocomm.zero.checkpoint.fault_hook`` so that one rank dies,
stalls or fails at a named point of a save (they run in crash_world.py's fresh worlds).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import torch

from zerocomm.zero import checkpoint

from .dist import dist
from .zero_ckpt_checks import _fresh, _global_step, _params

LOAD_CASES = ("flipped byte in a shard", "foreign shard of the same size", "truncated shard", "missing shard",
              "overwritten shard header", "flipped byte in the manifest", "truncated manifest", "garbage latest",
              "ranks read different checkpoints")


def _snapshot(model, optimizer) -> dict:
    state = optimizer.optimizer.state_dict()["state"]
    tensors = {f"{p}.{k}": v.detach().clone() for p, s in state.items() for k, v in s.items()
               if isinstance(v, torch.Tensor)}
    return {"params": _params(model, optimizer), "state": tensors, "masters": [m.detach().clone() for m in
                                                                                optimizer.master],
            "step_count": optimizer.step_count}


def _same(a: dict, b: dict) -> bool:
    return (a["step_count"] == b["step_count"] and sorted(a["params"]) == sorted(b["params"])
            and all(torch.equal(a["params"][n], b["params"][n]) for n in a["params"])
            and sorted(a["state"]) == sorted(b["state"]) and all(torch.equal(a["state"][k], b["state"][k])
                                                                 for k in a["state"])
            and all(torch.equal(x, y) for x, y in zip(a["masters"], b["masters"])))


def _error(exc: BaseException) -> dict:
    return {"error": type(exc).__name__, "family": [c.__name__ for c in type(exc).__mro__], "message": str(exc),
            "cause": type(exc.__cause__).__name__ if exc.__cause__ is not None else None}


def _flip(file: Path, offset: int) -> None:
    with open(file, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x10]))


def _damage(case: str, root: Path, folder: Path, other: Path) -> None:
    """Rank 0: damage the checkpoint ``folder`` (under ``root``) the way ``case`` says; ``other`` is a
    checkpoint of another save of the same state (same sizes)."""
    victim = folder / checkpoint.shard_name(1 if dist.get_world_size() > 1 else 0)
    manifest = folder / checkpoint.MANIFEST
    if case == "flipped byte in a shard":
        _flip(victim, victim.stat().st_size // 2)
    elif case == "foreign shard of the same size":
        assert (other / victim.name).stat().st_size == victim.stat().st_size
        shutil.copyfile(other / victim.name, victim)
    elif case == "truncated shard":
        with open(victim, "r+b") as handle:
            handle.truncate(victim.stat().st_size - 100)
    elif case == "missing shard":
        victim.unlink()
    elif case == "overwritten shard header":
        with open(victim, "r+b") as handle:
            handle.write(b"XXXX")
    elif case == "flipped byte in the manifest":  # a digit of a recorded size: still valid JSON
        text = manifest.read_bytes()
        at = text.index(b'"bytes": ') + len(b'"bytes": ')
        manifest.write_bytes(text[:at] + bytes([text[at] ^ 0x01]) + text[at + 1:])
    elif case == "truncated manifest":
        manifest.write_bytes(manifest.read_bytes()[:200])
    elif case == "garbage latest":
        (root / checkpoint.LATEST).write_bytes(b"\x00\xff../etc")


def load_faults(path: str) -> dict:
    """Every load case: per case what this rank raised, how long load took, and whether it changed anything."""
    rank = dist.get_rank()
    root = Path(path)
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    folder = Path(optimizer.save(root))
    other = Path(optimizer.save(root / "another-save"))  # the same state, another run id
    _global_step(model, optimizer, 1)  # the live state now differs from the checkpoint's
    before = _snapshot(model, optimizer)
    backup = root / "backup"
    results = {}
    for case in LOAD_CASES:
        dist.barrier()
        if rank == 0:
            shutil.copytree(folder, backup / folder.name)
            shutil.copyfile(root / checkpoint.LATEST, backup / checkpoint.LATEST)
            _damage(case, root, folder, other)
        dist.barrier()
        where = root if case != "ranks read different checkpoints" else (folder if rank == 0 else other)
        start = time.monotonic()
        try:
            optimizer.load(where)
            seen = {"error": None}
        except Exception as exc:  # noqa: BLE001 - the test asserts which
            seen = _error(exc)
        seen["elapsed"] = time.monotonic() - start
        seen["untouched"] = _same(before, _snapshot(model, optimizer))
        results[case] = seen
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder)
            shutil.copytree(backup / folder.name, folder)
            shutil.copyfile(backup / checkpoint.LATEST, root / checkpoint.LATEST)
            shutil.rmtree(backup)
        dist.barrier()
    optimizer.load(root)  # the restored checkpoint loads: the cases above failed for their damage only
    results["restored"] = {"step_count": optimizer.step_count, "changed": not _same(before, _snapshot(model, optimizer))}
    optimizer.remove_hooks()
    return results


def save_twice(path: str, other: str) -> None:
    """One step, then the same state saved under ``path`` and under ``other`` (two run ids, equal sizes)."""
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    optimizer.save(path)
    optimizer.save(other)
    optimizer.remove_hooks()


# -- save faults (run in crash_world.run_world) ------------------------------------------------------------
def _hook(point: str, victim: int, how: str, stall_s: float):
    def hook(at: str, rank: int) -> None:
        if at != point or rank != victim:
            return
        if how == "die":  # as abrupt as a crash gets: no cleanup, no flush, sockets closed by the kernel
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "stall":  # stops answering with every socket open, then goes away
            time.sleep(stall_s)
            os._exit(3)
        else:
            raise OSError(28, "No space left on device (injected)")
    return hook


def save_fault(path: str, point: str, victim: int, how: str, stall_s: float = 0.0) -> dict:
    """Save once (step 1), then save again with a fault at ``point`` on rank ``victim``: step 2, or step 1
    again for ``moved_aside`` (a re-save of the same step).  Reports the second save's outcome and time."""
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    optimizer.save(path)
    if point != "moved_aside":
        _global_step(model, optimizer, 1)
    rng = torch.get_rng_state()
    checkpoint.fault_hook = _hook(point, victim, how, stall_s)
    start = time.monotonic()
    try:
        optimizer.save(path)
        seen = {"error": None}
    except Exception as exc:  # noqa: BLE001 - the test asserts which
        seen = _error(exc)
    finally:
        checkpoint.fault_hook = None
    seen["elapsed"] = time.monotonic() - start
    seen["rng_untouched"] = torch.equal(rng, torch.get_rng_state())
    optimizer.remove_hooks()
    return seen


def _leftovers(root: Path) -> list:
    return sorted(p.name for p in root.iterdir() if checkpoint.TMP_MARK in p.name or checkpoint.ASIDE_MARK in p.name)


def rerun_after_fault(path: str, point: str) -> dict:
    """After ``save_fault`` crashed: rerun the same seeded training, load what is on disk, compare it with
    the states of step 1 (A) and step 2 (B), save again where the crashed save did, and load that."""
    root = Path(path)
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    states = {"A": _snapshot(model, optimizer)}
    if point != "moved_aside":
        _global_step(model, optimizer, 1)
        states["B"] = _snapshot(model, optimizer)
    dist.barrier()
    leftovers_before = _leftovers(root)
    reader_model, reader = _fresh(2)
    reader.load(root)
    loaded = _snapshot(reader_model, reader)
    which = [name for name, state in states.items() if _same(state, loaded)]
    optimizer.save(root)  # the rerun's save, at the step that crashed: must not collide with anything left
    dist.barrier()
    leftovers_after = _leftovers(root)
    reader.load(root)
    again = _same(_snapshot(reader_model, reader), _snapshot(model, optimizer))
    reader.remove_hooks()
    optimizer.remove_hooks()
    return {"loaded": which, "leftovers_before": leftovers_before, "leftovers_after": leftovers_after,
            "reloaded_rerun": again}
