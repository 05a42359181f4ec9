"""Sharded checkpoints: save and load (at the same or another world size) so that a checkpoint is
never silently wrong, never half loaded and never lost.

Layout of a checkpoint root ``path`` (the format of one checkpoint folder is in manifest.py)::

    path/latest                        the name of the newest complete checkpoint, e.g. "step-00000020"
    path/step-00000020/                shard-00000.pt ..., common.pt (rank 0: buffers, frozen parameters, the
                                       schedule's state, client_state) and manifest.json, written last
    path/step-00000030.tmp-<run id>/   a save in progress, or one that crashed (the next save removes it)

[Note: atomic saves]
Rank 0 draws the save's run id (``uuid4``: the operating system's randomness, never torch's seeded
generator, so a rerun with the same seed gets another name) and removes what crashed saves left
behind; every rank learns the id in the first agreement and writes its shard, with its CRC-32
computed while it streams out, into ``step-N.tmp-<run id>``.  A second agreement collects every
shard's size and CRC (or every rank raises ``CheckpointSaveError``).  Rank 0 then writes the manifest,
renames the folder to ``step-N`` and replaces ``latest`` with ``os.replace``, fsyncing each step; a
third agreement tells every rank the outcome.  Re-saving an existing step moves the old folder to
``step-N.old-<run id>`` for the instant between the two renames; a crash there leaves ``latest``
naming a missing folder, so ``resolve`` then takes the complete old copy, and the next save renames
it back.  A crash at any other point leaves ``latest`` naming the previous complete checkpoint;
nothing older is deleted.

[Note: agree, then load]
Every rank resolves the folder, reads the manifest (its own CRC), checks that the checkpoint fits
the model, stage and optimizer, and reads and checks every shard it needs (present, size, CRC-32,
run id, rank, dtypes and shapes) and common.pt (every rank takes rank 0's buffers, as DeepSpeed's
ranks take rank 0's module state) and reshards it, all into fresh tensors.  Then the ranks agree
(agreement.py): every rank raises the same typed error, or every rank has read the same checkpoint
(same run id) and only then copies it in.  Every exchange runs under the group's timeout; a rank
that died or hangs makes the others raise ``CheckpointError`` (load) or ``CheckpointSaveError`` (save)
from zerocomm.comm's ``PeerError`` / ``CommTimeoutError``.

[Note: resharding]
The bucket layout (which parameters share a bucket, at which offsets) does not depend on the world
size, only the padding does.  So a checkpoint written by N ranks loads on M ranks bucket by bucket:
the N chunks of a bucket, concatenated, give the bucket's real elements, which are re-padded for M
and cut into M chunks — for the float32 master and for every optimizer state tensor shaped like
the master (Adam's moments).  Scalar state (Adam's ``step``) is taken from shard 0.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from pathlib import Path
from typing import Callable, Optional

import torch

from .. import comm as dist
from .agreement import agree
from .errors import (CheckpointError, CheckpointForeignError, CheckpointIncompatibleError, CheckpointNotFoundError,
                     CheckpointCorruptError, CheckpointSaveError, ZeroStateError)
from .manifest import (COMMON, FORMAT, MANIFEST, OLD_META, as_checkpoint_error, describe_tensors, fsync_dir,
                       load_common, load_shard, new_run_id, read_manifest, run_id_from_numbers, run_id_numbers,
                       shard_name, write_common, write_manifest, write_shard)

LATEST = "latest"
TMP_MARK = ".tmp-"
ASIDE_MARK = ".old-"
_log = logging.getLogger("zerocomm.zero")

FAULT_POINTS = ("shard_started", "shard_half_written", "shard_written", "manifest_written", "moved_aside",
                "renamed", "latest_written")
"""The points of a save where ``fault_hook`` is called: every rank for the first three, rank 0 for the rest."""

fault_hook: Optional[Callable[[str, int], None]] = None
"""For fault-injection tests only: called as ``fault_hook(point, rank)`` at each of ``FAULT_POINTS``."""


def _fault(point: str, rank: int) -> None:
    if fault_hook is not None:
        fault_hook(point, rank)


def describe_layout(optimizer) -> list:
    """The bucket layout as the manifest stores it: per bucket its padded size, [index, offset, numel] slots
    and parameter group."""
    return [{"padded_numel": layout.padded_numel, "slots": [[s.index, s.offset, s.numel] for s in layout.slots],
             "group": layout.group} for layout in optimizer.layouts]


def _state_keys(optimizer) -> list:
    """[key, "param", managed index] or [key, "extra", key] for every entry of the plain model's state_dict."""
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    keys = []
    for key, value in optimizer.model.state_dict(keep_vars=True).items():
        if id(value) in index:
            keys.append([key, "param", index[id(value)]])
        else:
            keys.append([key, "extra", key])
    return keys


def _master_order(optimizer) -> list:
    """For each parameter of the torch optimizer, in its state_dict's order, the bucket it is the master of."""
    position = {id(m): b for b, m in enumerate(optimizer.master)}
    return [position[id(p)] for group in optimizer.optimizer.param_groups for p in group["params"]]


def _device(optimizer) -> torch.device:
    """Where the agreements' tensors live: the model's device (NCCL moves CUDA tensors only), not the
    masters' (offloaded masters live in host memory or files)."""
    return optimizer.device


def _exchange(optimizer, problem, numbers, failure: type, what: str) -> list[list[int]]:
    """``agree`` over the optimizer's group; a peer that died or timed out becomes ``failure`` on this rank."""
    try:
        return agree(problem, numbers, group=optimizer.group, device=_device(optimizer), algorithm=optimizer.algorithm)
    except dist.CommError as error:
        raise failure(f"rank {optimizer.rank}: {what} failed: the ranks could not agree: {error}",
                      rank=optimizer.rank, reason=str(error)) from error


# -- save ---------------------------------------------------------------------------------------------------
def save_checkpoint(optimizer, path, client_state: Optional[dict] = None) -> Path:
    """Write a checkpoint under ``path`` (every rank of the group calls it); returns its folder ``path/step-N``.
    Rank 0's ``client_state`` is kept (in common.pt, with the buffers, frozen parameters and the schedule's
    state) and comes back from ``load_checkpoint``.

    Raises ``ZeroStateError`` inside a gradient-accumulation cycle and ``CheckpointSaveError`` when any rank
    fails (every rank raises the same); the previous checkpoint stays loadable either way."""
    rank, world = optimizer.rank, optimizer.world_size
    root, name = Path(path), f"step-{optimizer.step_count:08d}"
    what = f"saving {root / name}"
    problem = None
    if not optimizer.at_step_boundary:
        problem = ZeroStateError(f"rank {rank}: save() inside a gradient-accumulation cycle; save between "
                                 f"optimizer.step() and the next backward")
    optimizer.synchronize()
    run_id = new_run_id() if rank == 0 else "0" * 32
    if rank == 0 and problem is None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            clean_stale(root)
        except OSError as error:
            problem = CheckpointSaveError.at(root, f"cannot prepare the checkpoint folder: {error}", rank=rank)
    run_id = run_id_from_numbers(_exchange(optimizer, problem, run_id_numbers(run_id), CheckpointSaveError, what)[0])

    tmp = root / f"{name}{TMP_MARK}{run_id}"
    file, problem, nbytes, crc, layout_crc, common = tmp / shard_name(rank), None, 0, 0, 0, None
    try:
        shard = _shard(optimizer, run_id)
        tensors = describe_tensors(shard["masters"], shard["optimizer"])
        layout_crc = zlib.crc32(json.dumps(tensors, sort_keys=True).encode())
        tmp.mkdir(parents=True, exist_ok=True)  # the run id makes the name unique: every rank may create it
        _fault("shard_started", rank)
        nbytes, crc = write_shard(shard, file, after_first_write=lambda: _fault("shard_half_written", rank))
        del shard
        if rank == 0:
            common = write_common(_common(optimizer, run_id, client_state), tmp)
        _fault("shard_written", rank)
    except Exception as error:  # noqa: BLE001 - disk full, permissions, an unpicklable state: all agreed on
        problem = CheckpointSaveError.at(file, f"cannot write the shard: {type(error).__name__}: {error}", rank=rank)
    try:
        written = _exchange(optimizer, problem, [nbytes, crc, layout_crc], CheckpointSaveError, what)
        odd = [r for r, row in enumerate(written) if row[2] != written[0][2]]
        if odd:
            raise CheckpointSaveError.at(tmp, f"ranks {odd} hold optimizer state of other dtypes or shapes than "
                                         f"rank 0: such a checkpoint could not be loaded", rank=rank)
    except CheckpointError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise

    problem = None
    if rank == 0:
        try:
            write_manifest(tmp, _manifest(optimizer, run_id, tensors, written, common))
            _fault("manifest_written", rank)
            _publish(root, tmp, name, run_id, rank)
        except Exception as error:  # noqa: BLE001
            problem = CheckpointSaveError.at(tmp, f"cannot publish the checkpoint: {type(error).__name__}: {error}",
                                             rank=rank)
            shutil.rmtree(tmp, ignore_errors=True)
    _exchange(optimizer, problem, [], CheckpointSaveError, what)
    return root / name


def _shard(optimizer, run_id: str) -> dict:
    """What this rank writes: CPU copies of its masters, its optimizer state_dict."""
    return {"run_id": run_id, "rank": optimizer.rank, "world_size": optimizer.world_size,
            "step_count": optimizer.step_count,
            "masters": [m.detach().to("cpu", copy=True) for m in optimizer.master],
            "optimizer": optimizer.optimizer.state_dict()}


def _common(optimizer, run_id: str, client_state: Optional[dict]) -> dict:
    """What rank 0 writes for every rank: the model's tensors outside ZeRO (buffers, frozen parameters), the
    schedule's state and the caller's ``client_state``."""
    managed = {id(p) for p in optimizer.params}
    schedule = optimizer.lr_scheduler
    return {"run_id": run_id,
            "extras": {key: value.detach().to("cpu", copy=True) for key, value in
                       optimizer.model.state_dict(keep_vars=True).items() if id(value) not in managed},
            "lr_scheduler": schedule.state_dict() if schedule is not None else None,
            "client_state": client_state}


def _manifest(optimizer, run_id: str, tensors: dict, written: list, common: dict) -> dict:
    return {"format": FORMAT, "run_id": run_id, "stage": optimizer.stage, "world_size": optimizer.world_size,
            "precision": optimizer.config.precision, "step_count": optimizer.step_count,
            "skipped_steps": optimizer.skipped_steps, "global_steps": optimizer.global_steps, "common": common,
            "scaler": optimizer.scaler.state_dict() if optimizer.scaler is not None else None,
            "params": [[n, list(p.shape)] for n, p in zip(optimizer.param_names, optimizer.params)],
            "buckets": describe_layout(optimizer), "state_dict_keys": _state_keys(optimizer),
            "optimizer_class": type(optimizer.optimizer).__name__, "master_order": _master_order(optimizer),
            "tensors": tensors,
            "shards": [{"file": shard_name(r), "bytes": int(row[0]), "crc32": f"{int(row[1]):08x}"}
                       for r, row in enumerate(written)]}


def _publish(root: Path, tmp: Path, name: str, run_id: str, rank: int) -> None:
    """Rank 0: make the complete ``tmp`` the checkpoint ``name`` and point ``latest`` at it (see the note)."""
    fsync_dir(tmp)
    final, aside = root / name, None
    if final.exists():
        aside = root / f"{name}{ASIDE_MARK}{run_id}"
        final.rename(aside)
        _fault("moved_aside", rank)
    try:
        tmp.rename(final)
    except OSError:
        if aside is not None:
            aside.rename(final)
        raise
    fsync_dir(root)
    _fault("renamed", rank)
    pointer = root / f"{LATEST}{TMP_MARK}{run_id}"
    with open(pointer, "wb") as handle:
        handle.write(name.encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(pointer, root / LATEST)
    fsync_dir(root)
    _fault("latest_written", rank)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def clean_stale(root: Path) -> list[str]:
    """Remove what interrupted saves left under ``root`` (temporary folders and pointers; old copies whose
    replacement is complete), restore an old copy whose replacement never arrived; log and return what was done.

    Rank 0 calls it at the start of every save: one job saves into a root at a time."""
    done = []
    for entry in sorted(root.iterdir()):
        if TMP_MARK in entry.name and entry.name.startswith(("step-", LATEST)):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            done.append(f"removed {entry.name}")
        elif ASIDE_MARK in entry.name and entry.name.startswith("step-") and entry.is_dir():
            target = root / entry.name.split(ASIDE_MARK)[0]
            if (target / MANIFEST).is_file():
                shutil.rmtree(entry)
                done.append(f"removed {entry.name}")
            elif not target.exists():
                entry.rename(target)
                done.append(f"restored {entry.name} as {target.name}")
    if done:
        _log.warning("%s: cleaned up after an interrupted save: %s", root, "; ".join(done))
    return done


# -- load ---------------------------------------------------------------------------------------------------
def resolve(path, rank: int | None = None) -> Path:
    """The checkpoint folder ``path`` means: itself if it holds a manifest, else the one ``path/latest`` names."""
    root = Path(path)
    if (root / MANIFEST).is_file() or (root / OLD_META).is_file():
        return root
    latest = root / LATEST
    if latest.is_file():
        try:
            name = latest.read_bytes().decode("utf-8", "replace").strip()
        except OSError as error:
            raise CheckpointCorruptError.at(latest, f"cannot read it: {error}", rank=rank) from None
        if not name or name != Path(name).name or name.startswith("."):
            raise CheckpointCorruptError.at(latest, f"names {name!r}, not a checkpoint folder", rank=rank)
        folder = root / name
        if (folder / MANIFEST).is_file():
            return folder
        for aside in sorted(root.glob(f"{name}{ASIDE_MARK}*")):  # a re-save of this step crashed between renames
            if (aside / MANIFEST).is_file():
                return aside
        raise CheckpointNotFoundError.at(latest, f"names {name}, which has no {MANIFEST}", rank=rank)
    raise CheckpointNotFoundError.at(root, f"no checkpoint at {root}: neither {MANIFEST} nor {LATEST} exists",
                                     rank=rank)


def check_compatible(optimizer, manifest: dict, folder: Path) -> None:
    """Raise ``CheckpointIncompatibleError`` if the checkpoint cannot be loaded into ``optimizer``'s model and stage."""
    rank = optimizer.rank

    def refuse(reason: str):
        raise CheckpointIncompatibleError.at(folder / MANIFEST, reason, rank=rank)

    if manifest["stage"] != optimizer.stage:
        refuse(f"written by ZeRO stage {manifest['stage']}, but this optimizer is stage {optimizer.stage}; load it "
               f"with stage {manifest['stage']}, or consolidate() it and load the state_dict into the model")
    here = [[n, list(p.shape)] for n, p in zip(optimizer.param_names, optimizer.params)]
    if len(here) != len(manifest["params"]):
        refuse(f"the checkpoint has {len(manifest['params'])} trainable parameters, this model {len(here)}: a "
               f"checkpoint of another model")
    for (name, shape), (their_name, their_shape) in zip(here, manifest["params"]):
        if name != their_name or shape != their_shape:
            refuse(f"parameter {their_name!r} of shape {tuple(their_shape)} in the checkpoint is {name!r} of shape "
                   f"{tuple(shape)} in this model: a checkpoint of another model")
    layout = describe_layout(optimizer)
    for index, (mine, theirs) in enumerate(zip(layout, manifest["buckets"])):
        if mine["slots"] != theirs["slots"]:
            refuse(f"bucket {index} holds parameters {[s[0] for s in theirs['slots']]} in the checkpoint but "
                   f"{[s[0] for s in mine['slots']]} here: use the bucket sizes the checkpoint was written with")
        if mine["group"] != theirs.get("group", 0):
            refuse(f"bucket {index} belongs to parameter group {theirs.get('group', 0)} in the checkpoint but to "
                   f"group {mine['group']} here: use the parameter groups the checkpoint was written with")
    if len(layout) != len(manifest["buckets"]):
        refuse(f"{len(manifest['buckets'])} buckets in the checkpoint, {len(layout)} here")
    if manifest["optimizer_class"] != type(optimizer.optimizer).__name__ or \
            manifest["master_order"] != _master_order(optimizer):
        refuse(f"written with optimizer {manifest['optimizer_class']} over buckets {manifest['master_order']}, but "
               f"this one is {type(optimizer.optimizer).__name__} over {_master_order(optimizer)}")


def chunk_width(manifest: dict, bucket: dict) -> int:
    """Elements of one bucket in each shard: a chunk, or the whole bucket for stage 0 (not sharded)."""
    return bucket["padded_numel"] if manifest["stage"] == 0 else bucket["padded_numel"] // manifest["world_size"]


def shards_to_read(manifest: dict) -> range:
    """Stage 0 shards are identical: reading shard 0 is enough."""
    return range(1) if manifest["stage"] == 0 else range(manifest["world_size"])


def _assemble(folder: Path, manifest: dict, rank: int | None) -> tuple[list, list, dict]:
    """Stream every shard once: per bucket the real elements of the master and of each elementwise
    optimizer state key (concatenated chunks, padding cut off), plus shard 0's optimizer state_dict."""
    buckets = manifest["buckets"]
    numel = [sum(slot[2] for slot in b["slots"]) for b in buckets]
    order = manifest["master_order"]
    masters = [torch.empty(b["padded_numel"], dtype=torch.float32) for b in buckets]
    states: list[dict] = [{} for _ in buckets]
    template = None
    for index in shards_to_read(manifest):
        shard = load_shard(folder, manifest, index, rank)
        if template is None:
            template = shard["optimizer"]
        for b, chunk in enumerate(shard["masters"]):
            width = chunk_width(manifest, buckets[b])
            masters[b][index * width:(index + 1) * width].copy_(chunk)
        for position, state in shard["optimizer"]["state"].items():
            b = order[int(position)]
            width = chunk_width(manifest, buckets[b])
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0:
                    continue
                if value.shape != (width,):
                    raise CheckpointIncompatibleError.at(
                        folder / shard_name(index), f"optimizer state {key!r} of bucket {b} has shape "
                        f"{tuple(value.shape)}, not the master's ({width},): it cannot be resharded (only "
                        f"elementwise state can)", rank=rank)
                full = states[b].setdefault(key, torch.empty(buckets[b]["padded_numel"], dtype=value.dtype))
                full[index * width:(index + 1) * width].copy_(value)
        del shard
    return ([m[:n] for m, n in zip(masters, numel)], [{k: v[:n] for k, v in s.items()} for s, n in zip(states, numel)],
            template)


def _prepare(optimizer, folder: Path, manifest: dict) -> tuple[list, dict, Optional[dict]]:
    """This rank's masters and optimizer state_dict from the checkpoint, read, verified and resharded into
    tensors of its own, and the common file (None in format 2); ``optimizer`` is only read."""
    rank, world = optimizer.rank, optimizer.world_size
    if manifest["world_size"] == world or manifest["stage"] == 0:  # stage 0 shards are all the same
        shard = load_shard(folder, manifest, rank if manifest["world_size"] == world else 0, rank)
        masters, state_dict = shard["masters"], shard["optimizer"]
    else:
        full_masters, full_states, state_dict = _assemble(folder, manifest, rank)
        masters = [_rechunk(m, optimizer, layout) for m, layout in zip(full_masters, optimizer.layouts)]
        order = manifest["master_order"]
        for position, state in state_dict["state"].items():
            b = order[int(position)]
            for key, full in full_states[b].items():
                state[key] = _rechunk(full, optimizer, optimizer.layouts[b])
    file = folder / MANIFEST
    for b, (master, values) in enumerate(zip(optimizer.master, masters)):
        if tuple(values.shape) != tuple(master.shape):
            raise CheckpointIncompatibleError.at(file, f"bucket {b}'s master chunk has shape {tuple(values.shape)}, "
                                                 f"expected {tuple(master.shape)}", rank=rank)
    groups, theirs = optimizer.optimizer.param_groups, state_dict.get("param_groups", [])
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in theirs]:
        raise CheckpointIncompatibleError.at(file, f"the optimizer's parameter groups hold "
                                             f"{[len(g['params']) for g in theirs]} tensors in the checkpoint, "
                                             f"{[len(g['params']) for g in groups]} here", rank=rank)
    order = _master_order(optimizer)
    for position, state in state_dict["state"].items():
        shape = tuple(optimizer.master[order[int(position)]].shape)
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != shape:
                raise CheckpointIncompatibleError.at(file, f"optimizer state {key!r} of bucket {order[int(position)]} "
                                                     f"has shape {tuple(value.shape)}, the master {shape}", rank=rank)
    common = load_common(folder, manifest, rank)
    if common is not None:
        _check_extras(optimizer, common["extras"], folder, rank)
    return masters, state_dict, common


def _extras_of(optimizer) -> dict:
    """The model's tensors outside ZeRO by state_dict key (buffers, frozen parameters)."""
    managed = {id(p) for p in optimizer.params}
    return {key: value for key, value in optimizer.model.state_dict(keep_vars=True).items() if id(value) not in managed}


def _check_extras(optimizer, extras: dict, folder: Path, rank: int) -> None:
    for key, tensor in _extras_of(optimizer).items():
        if key not in extras:
            raise CheckpointIncompatibleError.at(folder / COMMON, f"the model's {key!r} (a buffer or frozen "
                                                 f"parameter) is not in the checkpoint", rank=rank)
        if tuple(extras[key].shape) != tuple(tensor.shape):
            raise CheckpointIncompatibleError.at(folder / COMMON, f"{key!r} has shape {tuple(extras[key].shape)} in "
                                                 f"the checkpoint, {tuple(tensor.shape)} in this model", rank=rank)


def load_checkpoint(optimizer, path) -> tuple[Path, Optional[dict]]:
    """Restore parameters, optimizer state, loss scale, counters, the model's buffers and frozen parameters and
    the schedule's state (every rank of the group calls it); returns ``(folder, client_state)``.

    The checkpoint may come from another world size (see the note on resharding).  Every rank checks
    everything before any rank changes anything (see the note on agree, then load): on any problem every
    rank raises the same ``CheckpointError`` subclass (or ``ZeroStateError`` inside an accumulation cycle)
    and the optimizer and model are untouched."""
    rank = optimizer.rank
    optimizer.synchronize()
    problem, folder, manifest, prepared = None, Path(path), None, None
    try:
        if not optimizer.at_step_boundary:
            raise ZeroStateError(f"rank {rank}: load() inside a gradient-accumulation cycle")
        folder = resolve(path, rank)
        manifest = read_manifest(folder, rank)
        check_compatible(optimizer, manifest, folder)
        prepared = _prepare(optimizer, folder, manifest)
    except (CheckpointError, ZeroStateError) as error:
        problem = error
    except Exception as error:  # noqa: BLE001 - an unforeseen failure is agreed on too, never a hang
        problem = as_checkpoint_error(error, folder, rank)
    run_id = manifest["run_id"] if problem is None else "0" * 32
    seen = [run_id_from_numbers(n) for n in _exchange(optimizer, problem, run_id_numbers(run_id), CheckpointError,
                                                      f"loading {path}")]
    if len(set(seen)) > 1:  # e.g. `latest` changed between the ranks' reads, or ranks see different folders
        raise CheckpointForeignError("the ranks read different checkpoints: "
                                     + ", ".join(f"rank {r} run id {s}" for r, s in enumerate(seen)),
                                     rank=rank, file=path, reason="the ranks read different checkpoints")
    common = _apply(optimizer, manifest, *prepared)
    return folder, (common or {}).get("client_state")


def _apply(optimizer, manifest: dict, masters: list, state_dict: dict, common: Optional[dict]) -> Optional[dict]:
    """Copy an agreed checkpoint in: the only part of loading that changes anything."""
    with torch.no_grad():
        for master, values in zip(optimizer.master, masters):
            master.copy_(values)
        if common is not None:
            for key, tensor in _extras_of(optimizer).items():
                tensor.copy_(common["extras"][key])
    optimizer.optimizer.load_state_dict(state_dict)
    optimizer.step_count = manifest["step_count"]
    optimizer.skipped_steps = manifest["skipped_steps"]
    optimizer.global_steps = manifest.get("global_steps", optimizer.step_count + optimizer.skipped_steps)
    if optimizer.scaler is not None and manifest["scaler"] is not None:
        optimizer.scaler.load_state_dict(manifest["scaler"])
    schedule = (common or {}).get("lr_scheduler")
    if optimizer.lr_scheduler is not None and schedule is not None:
        optimizer.lr_scheduler.load_state_dict(schedule)
    elif optimizer.lr_scheduler is not None or schedule is not None:
        _log.warning("rank %d: %s", optimizer.rank, "the checkpoint has no schedule state: the lr_scheduler starts "
                     "over" if schedule is None else "the checkpoint's schedule state is not used: the optimizer has "
                     "no lr_scheduler")
    optimizer.refresh_parameters()
    return common


def _rechunk(real: torch.Tensor, optimizer, layout) -> torch.Tensor:
    """What ``optimizer``'s rank updates of a bucket whose real (unpadded) elements are ``real``."""
    padded = torch.zeros(layout.padded_numel, dtype=real.dtype)
    padded[:real.numel()].copy_(real)
    lo, hi = optimizer.shard_bounds(layout)
    return padded[lo:hi].clone()

