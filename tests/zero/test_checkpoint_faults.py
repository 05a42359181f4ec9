"""Checkpoint faults: damaged, foreign or missing files on load, and a rank that dies, stalls or fails at each
point of a save.  Every case asserts that every rank (every survivor) raises the same typed error within the
group timeout + 5 s, that no rank's state changed on a failed load, and that a crashed save leaves a
checkpoint that loads, after which a rerun with the same seed saves and loads again.

Load cases run in the session's rank pools (gloo at 2 and 3 ranks, MPI at 2); save faults need a rank to
die, which ends an mpiexec job as a whole (no survivors to observe), so they run on gloo in fresh forked
worlds (support/crash_world.py).
"""
import subprocess
import sys

import pytest

from support import ckpt_fault_checks as checks
from support.crash_world import run_world
from support.worlds import worlds

from zerocomm.zero import (CheckpointCorruptError, CheckpointError, CheckpointForeignError, CheckpointSaveError,
                           checkpoint, consolidate)
from zerocomm.zero.manifest import MANIFEST

POOL_TIMEOUT_S = 30.0  # the pools' group timeout (harness.py op_timeout_s)
GROUP_TIMEOUT_S = 3.0  # the crash worlds' group timeout
SLACK_S = 5.0

LOAD_EXPECTED = {  # case: (error class, words its message must hold)
    "flipped byte in a shard": ("CheckpointCorruptError", ["shard-0000{v}.pt", "CRC-32", "rank {v}:"]),
    "foreign shard of the same size": ("CheckpointForeignError", ["shard-0000{v}.pt", "another checkpoint", "run id"]),
    "truncated shard": ("CheckpointCorruptError", ["shard-0000{v}.pt", "truncated", "rank {v}:"]),
    "missing shard": ("CheckpointMissingShardError", ["shard-0000{v}.pt", "shard missing"]),
    "overwritten shard header": ("CheckpointCorruptError", ["shard-0000{v}.pt", "CRC-32"]),
    "flipped byte in the manifest": ("CheckpointCorruptError", [MANIFEST, "rank 0:"]),
    "truncated manifest": ("CheckpointCorruptError", [MANIFEST, "cannot read the manifest"]),
    "garbage latest": ("CheckpointCorruptError", ["latest", "not a checkpoint folder"]),
    "ranks read different checkpoints": ("CheckpointForeignError", ["the ranks read different checkpoints", "rank 1"]),
}


@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_a_damaged_checkpoint_fails_on_every_rank_alike_and_changes_nothing(world, tmp_path):
    if world.backend == "mpi" and world.world_size == 3:
        pytest.skip("MPI runs these cases at 2 ranks only: 3 ranks add nothing the gloo run does not, at 4x its time")
    results = world.run(checks.load_faults, str(tmp_path / "ckpt"), timeout=300)
    victim = 1
    assert sorted(results[0]) == sorted(checks.LOAD_CASES + ("restored",))
    for case, (kind, words) in LOAD_EXPECTED.items():
        seen = [r[case] for r in results]
        assert all(s["error"] == kind for s in seen), (case, seen)
        assert all("CheckpointError" in s["family"] for s in seen)
        assert len({s["message"] for s in seen}) == 1, f"{case}: the ranks raised different messages: {seen}"
        for word in words:
            assert word.format(v=victim) in seen[0]["message"], (case, word, seen[0]["message"])
        assert all(s["untouched"] for s in seen), f"{case}: a rank's model or optimizer changed: {seen}"
        assert all(s["elapsed"] <= POOL_TIMEOUT_S + SLACK_S for s in seen), (case, [s["elapsed"] for s in seen])
    for r in results:
        assert r["restored"] == {"step_count": 1, "changed": True}


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True)
def test_consolidation_and_its_command_line_refuse_damaged_shards(world, tmp_path):
    root = tmp_path / "ckpt"
    world.run(checks.save_twice, str(root), str(tmp_path / "other"))
    folder = root / "step-00000001"
    good = subprocess.run([sys.executable, "-m", "zerocomm.zero.consolidate", "--check", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "2 shards verified" in good.stdout, good.stderr
    expected = consolidate(root)
    (folder / "shard-00001.pt").write_bytes((tmp_path / "other" / "step-00000001" / "shard-00001.pt").read_bytes())
    with pytest.raises(CheckpointForeignError, match="shard-00001.pt: a shard of another checkpoint"):
        consolidate(root)
    out = tmp_path / "model.pt"
    for argv in (["--check", str(root)], [str(root), str(out)]):
        bad = subprocess.run([sys.executable, "-m", "zerocomm.zero.consolidate", *argv], capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 1 and "CheckpointForeignError" in bad.stderr, bad.stderr
    assert not out.exists()
    checks._flip(folder / "shard-00000.pt", 1000)
    with pytest.raises(CheckpointCorruptError, match="shard-00000.pt: CRC-32"):
        consolidate(root)
    assert expected  # the good checkpoint consolidated before the damage


# Where a save is interrupted, and by whom: every rank writes a shard; rank 0 alone publishes.
SAVE_FAULTS = [
    ("shard_started", 1, "die"),
    ("shard_half_written", 0, "die"),
    ("shard_half_written", 1, "die"),
    ("shard_written", 1, "die"),
    ("manifest_written", 0, "die"),
    ("moved_aside", 0, "die"),
    ("renamed", 0, "die"),
    ("latest_written", 0, "die"),
    ("shard_written", 1, "stall"),
    ("manifest_written", 0, "stall"),
    ("shard_started", 1, "fail"),
]
# What a load must find afterwards: the previous checkpoint (A), unless the crash came after `latest` was
# replaced (B: the new one, complete); a re-save of the same step (moved_aside) holds A either way.
AFTER = {"latest_written": ["B"]}


@pytest.mark.parametrize("point,victim,how", SAVE_FAULTS, ids=[f"{p}-rank{v}-{h}" for p, v, h in SAVE_FAULTS])
@pytest.mark.timeout(180)
def test_a_save_interrupted_anywhere_leaves_a_loadable_checkpoint_and_a_rerun_succeeds(tmp_path, point, victim, how):
    world_size = 3 if point == "shard_written" and how == "die" else 2  # one case at a non-power of two
    path = str(tmp_path / "ckpt")
    outcomes = run_world(checks.save_fault, world_size, path, point, victim, how, GROUP_TIMEOUT_S + 2,
                         group_timeout_s=GROUP_TIMEOUT_S, deadline_s=60)
    for outcome in outcomes:
        if outcome.rank == victim and how != "fail":
            assert outcome.status == "died", outcome
            continue
        assert outcome.status == "ok", outcome
        seen = outcome.value
        assert seen["error"] == "CheckpointSaveError" and "CheckpointError" in seen["family"], (outcome.rank, seen)
        assert seen["elapsed"] <= GROUP_TIMEOUT_S + SLACK_S, (outcome.rank, seen)
        assert seen["rng_untouched"], "a save drew from torch's random generator"
        if how == "fail":
            assert f"rank {victim}:" in seen["message"] and "No space left on device" in seen["message"], seen
        else:
            assert seen["cause"] in ("PeerError", "CommTimeoutError"), seen
    reruns = run_world(checks.rerun_after_fault, world_size, path, point, group_timeout_s=30, deadline_s=120)
    for outcome in reruns:
        assert outcome.status == "ok", outcome
        seen = outcome.value
        assert seen["loaded"] == AFTER.get(point, ["A"]), (point, seen)
        assert seen["leftovers_after"] == [], seen
        assert seen["reloaded_rerun"], seen
    left = reruns[0].value["leftovers_before"]
    if victim == 0 and point in ("shard_half_written", "manifest_written", "moved_aside"):
        assert left, "rank 0 died before publishing: its temporary folder should be there for the rerun to clean"
    elif victim != 0 or how == "fail":  # rank 0 survived and removed the failed save's folder itself
        assert left == [], f"a failed save left {left} behind"


def test_the_tests_fault_points_are_the_saves():
    assert {p for p, _, _ in SAVE_FAULTS} == set(checkpoint.FAULT_POINTS)
    assert issubclass(CheckpointSaveError, CheckpointError)


def test_run_ids_shard_crcs_and_the_manifests_own_crc(tmp_path):
    import torch

    from zerocomm.zero.manifest import (FORMAT, file_crc32, new_run_id, read_manifest, run_id_from_numbers,
                                        run_id_numbers, write_manifest, write_shard)

    ids = set()
    for _ in range(50):
        torch.manual_seed(0)  # a seeded torch generator does not make run ids repeat
        run_id = new_run_id()
        numbers = run_id_numbers(run_id)
        assert all(-(1 << 63) <= n < (1 << 63) for n in numbers) and run_id_from_numbers(numbers) == run_id
        ids.add(run_id)
    assert len(ids) == 50
    nbytes, crc = write_shard({"x": torch.arange(1000), "run_id": "r"}, tmp_path / "s.pt")
    assert nbytes == (tmp_path / "s.pt").stat().st_size and crc == file_crc32(tmp_path / "s.pt")
    manifest = {"format": FORMAT, "run_id": "r", "world_size": 1, "stage": 1, "tensors": {}, "buckets": [],
                "params": [], "shards": [{"file": "s.pt", "bytes": nbytes, "crc32": f"{crc:08x}"}]}
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    text = (tmp_path / "manifest.json").read_text()
    (tmp_path / "manifest.json").write_text(text.replace('"stage": 1', '"stage": 2'))
    with pytest.raises(CheckpointCorruptError, match="the manifest's CRC-32 is .* the manifest was damaged"):
        read_manifest(tmp_path)
