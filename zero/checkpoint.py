"""Sharded checkpoints: save, load (at the same or another world size), and the on-disk format.

Layout of a checkpoint directory ``path``::

    path/latest                   the name of the newest complete checkpoint, e.g. "step-00000020"
    path/step-00000020/meta.json  world size, stage, parameters, bucket layout, scaler, counters
    path/step-00000020/shard-00000.pt ...  one per rank: its float32 master chunks, its optimizer
                                  state_dict; rank 0's also holds buffers and parameters outside ZeRO

[Note: atomic saves]
Every rank writes its shard into ``step-N.tmp-<nonce>``; rank 0 then writes meta.json (with each
shard's byte size), renames the folder to ``step-N`` and replaces ``latest`` with ``os.replace``.
A crash at any point leaves ``latest`` naming the previous complete checkpoint; nothing older is
deleted.

[Note: resharding]
The bucket layout (which parameters share a bucket, at which offsets) does not depend on the world
size, only the padding does.  So a checkpoint written by N ranks loads on M ranks bucket by bucket:
the N chunks of a bucket, concatenated, give the bucket's real elements, which are re-padded for M
and cut into M chunks — for the float32 master and for every optimizer state tensor shaped like
the master (Adam's moments).  Scalar state (Adam's ``step``) is taken from shard 0.  Loading
validates everything — format, stage, parameter names and shapes, layout, every shard's presence
and size — before it changes anything, and raises ``CheckpointError`` naming the file.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
import torch

from .. import comm as dist
from .errors import CheckpointError, ZeroStateError

FORMAT = "zerocomm.zero.checkpoint/1"
META = "meta.json"
LATEST = "latest"


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}.pt"


def describe_layout(optimizer) -> list:
    """The bucket layout as meta.json stores it: per bucket its padded size and [index, offset, numel] slots."""
    return [{"padded_numel": layout.padded_numel, "slots": [[s.index, s.offset, s.numel] for s in layout.slots]}
            for layout in optimizer.layouts]


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


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def save_checkpoint(optimizer, path) -> Path:
    """Write this rank's shard (every rank of the group calls it); returns the checkpoint's folder."""
    if not optimizer.at_step_boundary:
        raise ZeroStateError(f"rank {optimizer.rank}: save() inside a gradient-accumulation cycle; save between "
                             f"optimizer.step() and the next backward")
    optimizer.synchronize()
    root = Path(path)
    group, rank, world = optimizer.group, optimizer.rank, optimizer.world_size
    # Tensors handed to collectives live on the model's device (NCCL moves CUDA tensors only); what is
    # written to disk is copied to the CPU, so a checkpoint loads on any device.
    device = optimizer.device  # not the masters': offloaded masters live in host memory or files
    nonce = torch.randint(0, 2 ** 62, (1,), dtype=torch.int64) if rank == 0 else torch.zeros(1, dtype=torch.int64)
    nonce = nonce.to(device)
    dist.broadcast(nonce, group=group, group_src=0, algorithm=optimizer.algorithm)
    name = f"step-{optimizer.step_count:08d}"
    tmp = root / f"{name}.tmp-{int(nonce.item()):x}"
    if rank == 0:
        tmp.mkdir(parents=True, exist_ok=False)
    dist.barrier(group=group)
    shard = {"rank": rank, "world_size": world, "masters": [m.detach().to("cpu", copy=True) for m in optimizer.master],
             "optimizer": optimizer.optimizer.state_dict()}
    if rank == 0:
        managed = {id(p) for p in optimizer.params}
        shard["extras"] = {key: value.detach().to("cpu", copy=True) for key, value in
                           optimizer.model.state_dict(keep_vars=True).items() if id(value) not in managed}
    target = tmp / shard_name(rank)
    torch.save(shard, target)
    with open(target, "rb+") as handle:
        os.fsync(handle.fileno())
    sizes = torch.zeros(world, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(sizes, torch.tensor([target.stat().st_size], dtype=torch.int64, device=device),
                                group=group, algorithm=optimizer.algorithm)
    sizes = sizes.tolist()
    final = root / name
    if rank == 0:
        meta = {"format": FORMAT, "stage": optimizer.stage, "world_size": world,
                "precision": optimizer.config.precision, "step_count": optimizer.step_count,
                "skipped_steps": optimizer.skipped_steps,
                "scaler": optimizer.scaler.state_dict() if optimizer.scaler is not None else None,
                "params": [[n, list(p.shape)] for n, p in zip(optimizer.param_names, optimizer.params)],
                "buckets": describe_layout(optimizer), "state_dict_keys": _state_keys(optimizer),
                "optimizer_class": type(optimizer.optimizer).__name__, "master_order": _master_order(optimizer),
                "shards": [{"file": shard_name(r), "bytes": int(sizes[r])} for r in range(world)]}
        _fsync_write(tmp / META, json.dumps(meta, indent=1).encode())
        if final.exists():  # the same step saved again: move the old copy aside, then drop it
            aside = root / f"{name}.old-{int(nonce.item()):x}"
            final.rename(aside)
            tmp.rename(final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_write(root / f"{LATEST}.tmp", name.encode())
        os.replace(root / f"{LATEST}.tmp", root / LATEST)
    dist.barrier(group=group)
    return final


def resolve(path) -> Path:
    """The checkpoint folder ``path`` means: itself if it holds meta.json, else the one ``path/latest`` names."""
    root = Path(path)
    if (root / META).is_file():
        return root
    latest = root / LATEST
    if latest.is_file():
        folder = root / latest.read_text().strip()
        if not (folder / META).is_file():
            raise CheckpointError(f"{latest} names {folder.name}, which has no {META}")
        return folder
    raise CheckpointError(f"no checkpoint at {root}: neither {root / META} nor {latest} exists")


def read_meta(folder: Path) -> dict:
    """meta.json of a checkpoint folder, after checking that every shard it lists is there, whole."""
    file = folder / META
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file}: cannot read the checkpoint's metadata: {error}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a zerocomm checkpoint (format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                              f"expected {FORMAT!r})")
    for entry in meta["shards"]:
        shard = folder / entry["file"]
        if not shard.is_file():
            raise CheckpointError(f"{shard}: shard missing (the checkpoint was written by {meta['world_size']} ranks)")
        size = shard.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(f"{shard}: {size} bytes, but {file} records {entry['bytes']}: truncated or "
                                  f"overwritten")
    return meta


def load_shard(folder: Path, rank: int) -> dict:
    file = folder / shard_name(rank)
    try:
        # mmap: only the tensors actually read are paged in (consolidation reads the masters, not the
        # optimizer state), so peak memory stays near one full copy plus one shard's masters.
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - every unpickling failure means the same to the user
        raise CheckpointError(f"{file}: cannot read the shard: {error}") from None


def check_compatible(optimizer, meta: dict, folder: Path) -> None:
    """Raise ``CheckpointError`` if the checkpoint cannot be loaded into ``optimizer``'s model and stage."""
    file = folder / META
    if meta["stage"] != optimizer.stage:
        raise CheckpointError(f"{file}: written by ZeRO stage {meta['stage']}, but this optimizer is stage "
                              f"{optimizer.stage}; load it with stage {meta['stage']}, or consolidate() it and "
                              f"load the state_dict into the model")
    here = [[n, list(p.shape)] for n, p in zip(optimizer.param_names, optimizer.params)]
    if len(here) != len(meta["params"]):
        raise CheckpointError(f"{file}: the checkpoint has {len(meta['params'])} trainable parameters, this model "
                              f"{len(here)}: a checkpoint of another model")
    for (name, shape), (their_name, their_shape) in zip(here, meta["params"]):
        if name != their_name or shape != their_shape:
            raise CheckpointError(f"{file}: parameter {their_name!r} of shape {tuple(their_shape)} in the checkpoint "
                                  f"is {name!r} of shape {tuple(shape)} in this model: a checkpoint of another model")
    layout = describe_layout(optimizer)
    for index, (mine, theirs) in enumerate(zip(layout, meta["buckets"])):
        if mine["slots"] != theirs["slots"]:
            raise CheckpointError(f"{file}: bucket {index} holds parameters {[s[0] for s in theirs['slots']]} in the "
                                  f"checkpoint but {[s[0] for s in mine['slots']]} here: use the bucket sizes the "
                                  f"checkpoint was written with")
    if len(layout) != len(meta["buckets"]):
        raise CheckpointError(f"{file}: {len(meta['buckets'])} buckets in the checkpoint, {len(layout)} here")
    if meta["optimizer_class"] != type(optimizer.optimizer).__name__ or meta["master_order"] != _master_order(optimizer):
        raise CheckpointError(f"{file}: written with optimizer {meta['optimizer_class']} over buckets "
                              f"{meta['master_order']}, but this one is {type(optimizer.optimizer).__name__} over "
                              f"{_master_order(optimizer)}")


def chunk_width(meta: dict, bucket: dict) -> int:
    """Elements of one bucket in each shard: a chunk, or the whole bucket for stage 0 (not sharded)."""
    return bucket["padded_numel"] if meta["stage"] == 0 else bucket["padded_numel"] // meta["world_size"]


def shards_to_read(meta: dict) -> range:
    """Stage 0 shards are identical: reading shard 0 is enough."""
    return range(1) if meta["stage"] == 0 else range(meta["world_size"])


def _assemble(folder: Path, meta: dict) -> tuple[list, list, dict]:
    """Stream every shard once: per bucket the real elements of the master and of each elementwise
    optimizer state key (concatenated chunks, padding cut off), plus shard 0's optimizer state_dict."""
    buckets = meta["buckets"]
    numel = [sum(slot[2] for slot in b["slots"]) for b in buckets]
    order = meta["master_order"]
    masters = [torch.empty(b["padded_numel"], dtype=torch.float32) for b in buckets]
    states: list[dict] = [{} for _ in buckets]
    template = None
    for rank in shards_to_read(meta):
        shard = load_shard(folder, rank)
        if template is None:
            template = shard["optimizer"]
        for b, chunk in enumerate(shard["masters"]):
            width = chunk_width(meta, buckets[b])
            masters[b][rank * width:(rank + 1) * width].copy_(chunk)
        for position, state in shard["optimizer"]["state"].items():
            b = order[int(position)]
            width = chunk_width(meta, buckets[b])
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0:
                    continue
                if value.shape != (width,):
                    raise CheckpointError(f"{folder / shard_name(rank)}: optimizer state {key!r} of bucket {b} has "
                                          f"shape {tuple(value.shape)}, not the master's ({width},): it cannot be "
                                          f"resharded (only elementwise state can)")
                full = states[b].setdefault(key, torch.empty(buckets[b]["padded_numel"], dtype=value.dtype))
                full[rank * width:(rank + 1) * width].copy_(value)
        del shard
    return ([m[:n] for m, n in zip(masters, numel)], [{k: v[:n] for k, v in s.items()} for s, n in zip(states, numel)],
            template)


def load_checkpoint(optimizer, path) -> Path:
    """Restore parameters, optimizer state, loss scale and counters (every rank of the group calls it).

    The checkpoint may come from another world size (see the note on resharding).  Returns the folder read.
    """
    if not optimizer.at_step_boundary:
        raise ZeroStateError(f"rank {optimizer.rank}: load() inside a gradient-accumulation cycle")
    folder = resolve(path)
    meta = read_meta(folder)
    check_compatible(optimizer, meta, folder)
    optimizer.synchronize()
    rank, world = optimizer.rank, optimizer.world_size
    if meta["world_size"] == world or meta["stage"] == 0:  # stage 0 shards are all the same
        shard = load_shard(folder, rank if meta["world_size"] == world else 0)
        masters, state_dict = shard["masters"], shard["optimizer"]
    else:
        full_masters, full_states, state_dict = _assemble(folder, meta)
        masters = [_rechunk(m, optimizer, layout) for m, layout in zip(full_masters, optimizer.layouts)]
        order = meta["master_order"]
        for position, state in state_dict["state"].items():
            b = order[int(position)]
            for key, full in full_states[b].items():
                state[key] = _rechunk(full, optimizer, optimizer.layouts[b])
    for b, (master, values) in enumerate(zip(optimizer.master, masters)):
        if tuple(values.shape) != tuple(master.shape):
            raise CheckpointError(f"{folder}: bucket {b}'s master chunk has shape {tuple(values.shape)}, expected "
                                  f"{tuple(master.shape)}")
    with torch.no_grad():
        for master, values in zip(optimizer.master, masters):
            master.copy_(values)
    optimizer.optimizer.load_state_dict(state_dict)
    optimizer.step_count = meta["step_count"]
    optimizer.skipped_steps = meta["skipped_steps"]
    if optimizer.scaler is not None and meta["scaler"] is not None:
        optimizer.scaler.load_state_dict(meta["scaler"])
    optimizer.refresh_parameters()
    return folder


def _rechunk(real: torch.Tensor, optimizer, layout) -> torch.Tensor:
    """What ``optimizer``'s rank updates of a bucket whose real (unpadded) elements are ``real``."""
    padded = torch.zeros(layout.padded_numel, dtype=real.dtype)
    padded[:real.numel()].copy_(real)
    lo, hi = optimizer.shard_bounds(layout)
    return padded[lo:hi].clone()

