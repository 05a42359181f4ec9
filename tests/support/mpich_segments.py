"""MPICH's shared-memory segments that killed jobs leave in ``/dev/shm``.

MPICH unlinks its node segment (``/dev/shm/mpich_shm_*``) once every local rank has mapped it, so a
segment left behind is from ranks that were killed, aborted or timed out before then -- what the
fault tests do on purpose.  :func:`remove_orphaned` deletes the ones made since a moment that no live
process maps; a segment of a job still running is kept.
"""
from __future__ import annotations

import os

SHM = "/dev/shm"
PREFIX = "mpich_shm_"


def remove_orphaned(since: float, folder: str = SHM) -> list[str]:
    """Delete ``folder``'s MPICH segments modified at or after ``since`` (epoch seconds) that no process
    maps; the paths removed."""
    try:
        names = [name for name in os.listdir(folder) if name.startswith(PREFIX)]
    except OSError:
        return []
    candidates = set()
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime >= since:
                candidates.add(path)
        except OSError:  # removed meanwhile
            continue
    if not candidates:
        return []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                candidates -= {line.split(maxsplit=5)[-1].strip() for line in maps if PREFIX in line}
        except OSError:  # the process ended, or its maps are not ours to read
            continue
    removed = []
    for path in sorted(candidates):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
