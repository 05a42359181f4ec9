"""The on-disk format of a sharded checkpoint: shards with checksums, and the manifest written last.

Layout of one checkpoint folder ``step-00000020``::

    shard-00000.pt ...   one per rank (torch.save): its float32 master chunks, its optimizer state_dict,
                         the checkpoint's run id, its rank and the world size
    common.pt            written by rank 0, read by every rank on load: the model's buffers and the
                         parameters outside ZeRO (frozen ones), the learning-rate schedule's state and
                         the caller's ``client_state``
    manifest.json        written after every shard is complete: format, run id, world size, stage,
                         parameters, bucket layout, dtype and shape of every tensor a shard holds,
                         scaler, counters, and per shard (and for common.pt) its byte size and CRC-32

Format 2 (before common.pt) kept the buffers in shard 0 and had no schedule or client state; it is still
read: consolidation takes its buffers from shard 0, and a load leaves the model's buffers as they are.

[Note: what the manifest guards]
The manifest is ``{"manifest": {...}, "crc32": "xxxxxxxx"}``, the CRC taken over the canonical JSON of
the inner object, so a damaged manifest is told apart from damaged shards.  Each shard's CRC-32 is
computed while ``torch.save`` streams it out (no second pass on save) and checked by streaming the
file again before ``torch.load`` on load.  The run id is 128 random bits drawn from the operating
system (``uuid.uuid4``; never torch's generator, which the user seeds) once per save: a shard of the
same size from another save, of this run or another, has another CRC and another run id, and is
reported as foreign rather than merely corrupt.  CRC-32 finds accidents (flipped bits, truncation,
a mixed-up file), not tampering: the format trusts whoever can write the folder.
"""
from __future__ import annotations

import json
import os
import uuid
import zlib
from pathlib import Path

import torch

from .errors import (CheckpointCorruptError, CheckpointError, CheckpointForeignError, CheckpointIncompatibleError,
                     CheckpointMissingShardError, CheckpointNotFoundError)

FORMAT = "zerocomm.zero.checkpoint/3"
READABLE = (FORMAT, "zerocomm.zero.checkpoint/2")
"""Formats this zerocomm loads (2: buffers in shard 0, no common.pt)."""
MANIFEST = "manifest.json"
COMMON = "common.pt"
OLD_META = "meta.json"
"""What format 1 (zerocomm before checksums) wrote instead of a manifest."""

READ_CHUNK = 8 << 20
"""Bytes read at a time when checksumming a shard on load (one reused buffer)."""


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}.pt"


def new_run_id() -> str:
    """32 hex digits from the operating system's random source (never torch's seeded generator)."""
    return uuid.uuid4().hex


def run_id_numbers(run_id: str) -> list[int]:
    """A run id as two signed 64-bit integers, so ranks can compare it inside an int64 collective."""
    halves = [int(run_id[i:i + 16], 16) for i in (0, 16)]
    return [h - (1 << 64) if h >= 1 << 63 else h for h in halves]


def run_id_from_numbers(numbers) -> str:
    return "".join(f"{int(n) & ((1 << 64) - 1):016x}" for n in numbers)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in ``folder`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _ChecksumWriter:
    """A write-only file object that CRCs and counts what passes through it (torch.save streams into it)."""

    def __init__(self, handle):
        self.handle, self.crc, self.bytes = handle, 0, 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.bytes += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def write_shard(shard: dict, file: Path, *, after_first_write=None) -> tuple[int, int]:
    """``torch.save`` ``shard`` to ``file`` and fsync it; returns (bytes, CRC-32) of what was written.

    ``after_first_write`` (tests only) runs once the file holds a first piece of the payload, i.e.
    while the shard is half written."""
    with open(file, "wb") as handle:
        writer = _ChecksumWriter(handle)
        if after_first_write is not None:
            original = writer.write

            def write(data):
                written = original(data)
                handle.flush()
                after_first_write()
                writer.write = original
                return written
            writer.write = write
        torch.save(shard, writer)
        handle.flush()
        os.fsync(handle.fileno())
    return writer.bytes, writer.crc


def file_crc32(file: Path) -> int:
    """CRC-32 of a file, read in ``READ_CHUNK`` pieces into one reused buffer."""
    crc, buffer = 0, bytearray(READ_CHUNK)
    view = memoryview(buffer)
    with open(file, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                return crc
            crc = zlib.crc32(view[:count], crc)


def _canonical(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write ``folder/manifest.json`` (with its own CRC) and fsync it; the last file of a checkpoint."""
    body = {"manifest": manifest, "crc32": f"{zlib.crc32(_canonical(manifest)):08x}"}
    with open(folder / MANIFEST, "wb") as handle:
        handle.write(json.dumps(body, indent=1, sort_keys=True).encode())
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(folder: Path, rank: int | None = None) -> dict:
    """The manifest of a checkpoint folder, after checking its own CRC and format.

    Raises ``CheckpointNotFoundError`` (no manifest), ``CheckpointCorruptError`` (unreadable, CRC
    mismatch, fields missing) or ``CheckpointIncompatibleError`` (another format)."""
    file = folder / MANIFEST
    if not file.is_file():
        if (folder / OLD_META).is_file():
            raise CheckpointIncompatibleError.at(
                folder / OLD_META, f"a checkpoint of format 1 (before checksums); this zerocomm reads {FORMAT}: "
                "load and save it again with the zerocomm that wrote it", rank=rank)
        raise CheckpointNotFoundError.at(file, "no manifest: not a checkpoint folder, or its save did not finish",
                                         rank=rank)
    try:
        body = json.loads(file.read_bytes())
        manifest, recorded = body["manifest"], body["crc32"]
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointCorruptError.at(file, f"cannot read the manifest: {type(error).__name__}: {error}",
                                        rank=rank) from None
    actual = f"{zlib.crc32(_canonical(manifest)):08x}" if isinstance(manifest, dict) else None
    if actual != recorded:
        raise CheckpointCorruptError.at(file, f"the manifest's CRC-32 is {actual}, but it records {recorded}: "
                                        f"the manifest was damaged", rank=rank)
    if manifest.get("format") not in READABLE:
        raise CheckpointIncompatibleError.at(file, f"format {manifest.get('format')!r}, expected one of {READABLE}",
                                             rank=rank)
    missing = [k for k in ("run_id", "world_size", "stage", "shards", "tensors", "buckets", "params") if k not in manifest]
    if missing or len(manifest["shards"]) != manifest["world_size"]:
        raise CheckpointCorruptError.at(file, f"fields {missing} missing or {len(manifest.get('shards', []))} shards "
                                        f"for world size {manifest.get('world_size')}", rank=rank)
    return manifest


def verify_shard(folder: Path, manifest: dict, index: int, rank: int | None = None) -> Path:
    """Check that shard ``index`` is present, of the recorded size and CRC-32; returns its path.

    Raises ``CheckpointMissingShardError``, ``CheckpointCorruptError`` (size or CRC) or
    ``CheckpointForeignError`` (a whole shard of another save: its own run id differs)."""
    return verify_entry(folder, manifest, manifest["shards"][index], rank,
                        missing=f"shard missing (the checkpoint was written by {manifest['world_size']} ranks)")


def verify_entry(folder: Path, manifest: dict, entry: dict, rank: int | None = None, *, missing: str) -> Path:
    """Check the file a manifest entry (``{"file", "bytes", "crc32"}``) names: present (else
    ``CheckpointMissingShardError`` with ``missing``), of the recorded size and CRC-32; returns its path."""
    file = folder / entry["file"]
    if not file.is_file():
        raise CheckpointMissingShardError.at(file, missing, rank=rank)
    size = file.stat().st_size
    if size != entry["bytes"]:
        raise CheckpointCorruptError.at(file, f"{size} bytes, but {MANIFEST} records {entry['bytes']}: truncated "
                                        f"or overwritten", rank=rank)
    crc = f"{file_crc32(file):08x}"
    if crc != entry["crc32"]:
        theirs = _run_id_inside(file)
        if theirs is not None and theirs != manifest["run_id"]:
            raise CheckpointForeignError.at(file, f"a shard of another checkpoint (run id {theirs}; {MANIFEST} "
                                            f"has run id {manifest['run_id']})", rank=rank)
        raise CheckpointCorruptError.at(file, f"CRC-32 {crc}, but {MANIFEST} records {entry['crc32']}: the "
                                        f"shard's bytes changed after it was written", rank=rank)
    return file


def write_common(common: dict, folder: Path) -> dict:
    """Rank 0: write ``folder/common.pt`` and check that it loads as ``load_common`` will load it (tensors and
    plain Python values only, ``torch.load(weights_only=True)``); returns its manifest entry."""
    file = folder / COMMON
    nbytes, crc = write_shard(common, file)
    try:
        torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - whatever the unpickler refuses
        raise CheckpointError.at(file, f"client_state or the schedule's state holds objects a checkpoint cannot "
                                 f"load safely (torch.load(weights_only=True) refuses them: {error}); keep tensors, "
                                 f"numbers, strings, lists and dicts there") from None
    return {"file": COMMON, "bytes": nbytes, "crc32": f"{crc:08x}"}


def load_common(folder: Path, manifest: dict, rank: int | None = None) -> dict | None:
    """``common.pt``, verified against the manifest, or None for a format-2 checkpoint (which has none)."""
    entry = manifest.get("common")
    if entry is None:
        return None
    file = verify_entry(folder, manifest, entry, rank, missing="the checkpoint's common file is missing")
    try:
        common = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001
        raise CheckpointCorruptError.at(file, f"cannot read it: {error}", rank=rank) from None
    if not isinstance(common, dict) or common.get("run_id") != manifest["run_id"]:
        raise CheckpointForeignError.at(file, f"run id {common.get('run_id') if isinstance(common, dict) else None}, "
                                        f"but {MANIFEST} has {manifest['run_id']}", rank=rank)
    return common


def _run_id_inside(file: Path) -> str | None:
    """The run id a shard carries, or None when it cannot be read (only called after a CRC mismatch)."""
    try:
        shard = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        return str(shard.get("run_id")) if isinstance(shard, dict) else None
    except Exception:  # noqa: BLE001 - a damaged file is simply "not foreign"
        return None


def load_shard(folder: Path, manifest: dict, index: int, rank: int | None = None) -> dict:
    """Shard ``index``, verified (``verify_shard``), loaded memory-mapped on the CPU, and checked against
    the manifest: run id, rank, world size, and the dtype and shape of every tensor."""
    file = verify_shard(folder, manifest, index, rank)
    try:
        # mmap: only the tensors actually read are paged in (consolidation reads the masters, not the
        # optimizer state), so peak memory stays near one full copy plus one shard's masters.
        shard = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - every unpickling failure means the same to the user
        raise CheckpointCorruptError.at(file, f"cannot read the shard: {error}", rank=rank) from None
    if not isinstance(shard, dict) or shard.get("run_id") != manifest["run_id"]:
        raise CheckpointForeignError.at(file, f"run id {shard.get('run_id') if isinstance(shard, dict) else None}, "
                                        f"but {MANIFEST} has {manifest['run_id']}", rank=rank)
    if shard.get("rank") != index or shard.get("world_size") != manifest["world_size"]:
        raise CheckpointCorruptError.at(file, f"holds rank {shard.get('rank')} of {shard.get('world_size')}, "
                                        f"expected rank {index} of {manifest['world_size']}", rank=rank)
    _check_tensors(file, shard, manifest["tensors"], rank)
    return shard


def describe_tensors(masters, optimizer_state: dict) -> dict:
    """The dtype and shape of what a shard holds, as the manifest records it (the same for every shard)."""
    return {"masters": [[str(m.dtype), list(m.shape)] for m in masters],
            "state": {str(position): {key: [str(v.dtype), list(v.shape)] for key, v in state.items()
                                      if isinstance(v, torch.Tensor)}
                      for position, state in optimizer_state["state"].items()}}


def _check_tensors(file: Path, shard: dict, expected: dict, rank: int | None) -> None:
    seen = describe_tensors(shard["masters"], shard["optimizer"])
    if seen != expected:
        problem = next((f"master of bucket {b}: {s[0]} {tuple(s[1])}, manifest {e[0]} {tuple(e[1])}"
                        for b, (s, e) in enumerate(zip(seen["masters"], expected["masters"])) if s != e),
                       f"tensors {seen} differ from the manifest's {expected}")
        raise CheckpointCorruptError.at(file, f"dtype or shape differs from {MANIFEST}: {problem}", rank=rank)


def as_checkpoint_error(error: BaseException, file, rank: int | None) -> CheckpointError:
    """A ``CheckpointError`` for an unexpected exception met while reading ``file`` (so ranks can agree on it)."""
    if isinstance(error, CheckpointError):
        return error
    return CheckpointError.at(file, f"{type(error).__name__}: {error}", rank=rank)
