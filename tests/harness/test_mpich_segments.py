"""The clean-up of MPICH segments that killed jobs leave: only recent ones that no process maps go."""
import mmap
import os
import time

from support import mpich_segments


def test_only_recent_unmapped_segments_are_removed(tmp_path):
    since = time.time()
    old = tmp_path / "mpich_shm_old_0"
    old.write_bytes(b"\0" * 4096)
    os.utime(old, (since - 60, since - 60))  # left before this moment: not ours to judge
    orphan = tmp_path / "mpich_shm_orphan_0"
    orphan.write_bytes(b"\0" * 4096)
    live = tmp_path / "mpich_shm_live_0"
    live.write_bytes(b"\0" * 4096)
    other = tmp_path / "not_mpich_0"
    other.write_bytes(b"\0" * 4096)
    with open(live, "r+b") as file, mmap.mmap(file.fileno(), 4096):  # mapped by a live process: this one
        removed = mpich_segments.remove_orphaned(since, folder=str(tmp_path))
    assert removed == [str(orphan)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_live_0", "mpich_shm_old_0", "not_mpich_0"]
