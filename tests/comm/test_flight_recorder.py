"""The flight recorder (zerocomm/comm/flight.py): a hang names its culprit and what it last did.

Three faults, each at 2 and 3 ranks on gloo and MPI, on a fresh group with a 1.5 s deadline: the last rank
skips call #3 (it leaves the group instead), is stuck in Python past the deadline, or calls a different
collective.  Every other rank's error must name the last rank and its last call -- collective, number and
the caller's file:line in this file -- read from what that rank published to the store; every rank writes its
record under ``ZEROCOMM_FLIGHT_DUMP``; ``zerocomm-trace flight DIR`` must name call #3 as the first divergent
one and the last rank as missing (or different).  Then unit tests: the ring wraps, a record's state follows
the group's marks, and the offline merge on hand-made records.
"""
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

TIMEOUT = datetime.timedelta(seconds=1.5)
HERE = Path(__file__).name


def _line(marker: str) -> int:
    """The line of this file that ends with ``# <marker>`` (where a call under test is made)."""
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(marker)


def fault(kind: str, folder: str) -> dict:
    """Run on every rank: calls #1 and #2 on a new group, then call #3 with the last rank at fault."""
    os.environ["ZEROCOMM_FLIGHT_DUMP"] = folder
    if kind == "skip":  # every call's caller recorded: the missing rank's last completed call says where it was made
        os.environ["ZEROCOMM_FLIGHT_CALLERS"] = "1"
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        late = size - 1
        handle = dist.new_group(list(range(size)), timeout=TIMEOUT)
        name = getattr(handle, "zerocomm_group", handle).name
        x = torch.ones(2)
        for _ in range(2):
            dist.all_reduce(x, group=handle)  # flight: before
        seen = {"rank": rank, "group": name, "error": None, "type": None}
        start = time.monotonic()
        try:
            if rank != late:
                dist.all_reduce(x, group=handle)  # flight: survivors
            elif kind == "skip":
                pass  # it leaves the group instead (below)
            elif kind == "stuck":
                time.sleep(TIMEOUT.total_seconds() + 1.5)  # flight: stuck
            else:
                dist.broadcast(x, 0, group=handle)  # flight: different
        except dist.CommError as error:
            seen["type"], seen["error"] = type(error).__name__, str(error)
        seen["took"] = time.monotonic() - start
        dist.destroy_process_group(handle)  # writes this rank's record (ZEROCOMM_FLIGHT_DUMP)
        return seen
    finally:
        os.environ.pop("ZEROCOMM_FLIGHT_DUMP", None)
        os.environ.pop("ZEROCOMM_FLIGHT_CALLERS", None)


def _trace(folder: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks.flight_report", "flight", str(folder)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
@pytest.mark.parametrize("kind", ["skip", "stuck", "different"])
def test_a_survivors_error_names_the_faulty_rank_and_its_last_call(world, kind, tmp_path):
    ranks = world.run(fault, kind, str(tmp_path), timeout=60)
    size = len(ranks)
    late = size - 1
    before, different = f"{HERE}:{_line('flight: before')}", f"{HERE}:{_line('flight: different')}"
    stuck = f"{HERE}:{_line('flight: stuck')}"
    for seen in ranks:
        if seen["rank"] == late and kind != "different":
            continue  # it made no call #3: nothing failed for it
        text = seen["error"]
        assert text is not None, seen
        if kind == "different":
            assert seen["type"] == "CollectiveMismatchError", seen
        else:
            assert seen["type"] in ("CommTimeoutError", "PeerError"), seen
            assert seen["took"] < TIMEOUT.total_seconds() + 3.5, seen
        assert "Flight recorder" in text, text
        if seen["rank"] == late:
            continue  # the peers it names all called all_reduce #3
        if kind == "different":
            assert re.search(rf"rank {late} called broadcast #3 \(\w+, 8 B float32, \w+\) at "
                             rf"\S*{re.escape(different)}\b", text), text
        elif kind == "skip":  # callers recorded: where its last call was made
            assert re.search(rf"rank {late} did not arrive: it last called all_reduce #2 \(completed, 8 B float32, "
                             rf"\w+\) at \S*{re.escape(before)}\b", text), text
        else:  # where it stands, read off its stack by its publisher's thread
            assert re.search(rf"rank {late} did not arrive: it last called all_reduce #2 \(completed, 8 B float32, "
                             rf"\w+\); it is now at \S*{re.escape(stuck)}, outside any collective", text), text
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"flight-rank{r}.json" for r in range(size)]
    report = _trace(tmp_path)
    group = ranks[0]["group"]
    assert f"group {group} (ranks {list(range(size))}): the ranks diverge first at call #3" in report, report
    if kind == "different":
        assert f"different call at #3: rank(s) [{late}]" in report, report
        assert re.search(rf"rank {late}: #3 broadcast 8 B float32 \(\w+, \w+\) at \S*{re.escape(different)}"
                         r"  <- differs", report), report
    else:
        assert f"missing at call #3: rank(s) [{late}]" in report, report
        at = rf" at \S*{re.escape(before)}" if kind == "skip" else ""
        assert re.search(rf"rank {late}: missing \(its last call is #2 all_reduce 8 B float32 \(\w+, completed\)"
                         rf"{at}\)", report), report
        survivors = f"{HERE}:{_line('flight: survivors')}"
        assert re.search(rf"rank 0: #3 all_reduce 8 B float32 \(\w+, failed\) at \S*{re.escape(survivors)}",
                         report), report


# -- the parts, without a world ------------------------------------------------------------------------------

class _FakeGroup:
    """What flight.py reads of a group: its ring, call number, marks, failure and name."""

    from zerocomm.comm.group import Group
    TAG_SPAN = Group.TAG_SPAN

    def __init__(self):
        from zerocomm.comm import flight
        self.flight = [None] * flight.RING
        self.flight_sizes = [0] * flight.RING
        self.flight_callers = [None] * flight.RING
        self.seq = self.flight_origin = 1000
        self.flight_started = self.flight_done = None
        self.failure = None
        self.name = "g9"


def _record(group, collective="all_reduce", nbytes=8):
    """What Group.run writes for one call."""
    from zerocomm.comm import flight
    from zerocomm.comm import check
    slot = (group.seq + 1) & flight.MASK
    cell = check.fingerprint_cell(collective, "sum", torch.float32, -1, "ring")
    group.flight[slot] = (hash(cell), cell)
    group.flight_sizes[slot] = nbytes
    group.flight_callers[slot] = (sys._getframe().f_code, sys._getframe().f_lasti)  # flight: unit record
    group.seq += 1  # after the record, as Group.run


def _tag(group, seq):
    from zerocomm.comm.group import _TAG_SPAN
    from zerocomm.comm.transport import USER_TAG_LIMIT
    return USER_TAG_LIMIT + seq % _TAG_SPAN


def test_the_ring_keeps_the_last_calls_in_order_after_it_wraps():
    from zerocomm.comm import flight
    group = _FakeGroup()
    total = flight.RING * 2 + 37
    for n in range(total):
        _record(group, nbytes=4 * (n + 1))
    rows = [flight.as_row(group, record) for record in flight.records(group)]
    kept = flight.RING - 1  # the oldest slot is the next call's, perhaps being written
    assert len(rows) == kept
    assert [row[0] for row in rows] == list(range(total - kept + 1, total + 1))
    assert [row[2] for row in rows] == [4 * n for n in range(total - kept + 1, total + 1)]
    assert all(row[7].endswith(f"{HERE}:{_line('flight: unit record')}") for row in rows), rows[:2]
    assert flight.head([group])["g9"][0] == total
    group.flight_callers = None  # the default: no caller per call, and nothing says where it was
    assert flight.head([group])["g9"][7] == flight.UNKNOWN


def test_a_records_state_follows_the_groups_marks():
    from zerocomm.comm import flight
    group = _FakeGroup()
    for _ in range(4):
        _record(group)
    first = group.flight_origin
    group.flight_started = group.flight_done = _tag(group, first + 2)  # #1, #2 done
    group.flight_started = _tag(group, first + 3)  # #3 running, #4 queued behind it
    states = [flight.as_row(group, record)[6] for record in flight.records(group)]
    assert states == ["completed", "completed", "started", "queued"]
    group.failure = RuntimeError("timed out")
    assert [flight.as_row(group, record)[6] for record in flight.records(group)][2] == "failed"


def test_outside_walks_past_the_library_to_the_caller():
    from zerocomm.comm import flight
    frame = sys._getframe()
    assert flight.outside(frame) is frame  # this file is the library's user
    lasti, number = frame.f_lasti, frame.f_lineno
    line = flight.where(frame.f_code, lasti)
    assert line.endswith(f"{HERE}:{number}"), line


def _dump(rank, world_size, groups, failure=None):
    return {"rank": rank, "world_size": world_size, "host": "h", "pid": 100 + rank, "failure": failure,
            "groups": {name: {"ranks": list(range(world_size)), "records": rows} for name, rows in groups.items()}}


def _row(seq, collective="all_reduce", nbytes=8, state="completed", where="train.py:10"):
    return [seq, collective, nbytes, nbytes // 4, "float32", "ring", state, where]


def test_the_merge_finds_the_first_divergent_call_on_hand_made_records():
    from zerocomm.benchmarks import flight_report
    records = {
        0: _dump(0, 3, {"world": [_row(1), _row(2), _row(3, state="failed", where="train.py:20")]},
                 failure="rank 0: all_reduce timed out"),
        1: _dump(1, 3, {"world": [_row(1), _row(2), _row(3, state="failed", where="train.py:20")]}),
        2: _dump(2, 3, {"world": [_row(1), _row(2, where="train.py:12")]}),
    }
    found = flight_report.diverge([0, 1, 2], {r: c["groups"]["world"]["records"] for r, c in records.items()})
    assert found["seq"] == 3 and found["missing"] == [2] and found["differ"] == []
    text = flight_report.report(records)
    assert "group world (ranks [0, 1, 2]): the ranks diverge first at call #3" in text, text
    assert "rank 2: missing (its last call is #2 all_reduce 8 B float32 (ring, completed) at train.py:12)" in text
    assert "missing at call #3: rank(s) [2]" in text
    assert "its failure: rank 0: all_reduce timed out" in text

    # A different size at #2 is the first divergence, before anyone is missing; a rank without a file is named.
    records[1]["groups"]["world"]["records"][1] = _row(2, nbytes=16)
    del records[2]
    found = flight_report.diverge([0, 1, 2], {0: records[0]["groups"]["world"]["records"],
                                              1: records[1]["groups"]["world"]["records"], 2: None})
    assert found["seq"] == 2 and found["missing"] == [], found
    text = flight_report.report(records)
    assert "no record from rank(s) [2]" in text, text
    assert "the ranks diverge first at call #2" in text, text

    # Equal records: no divergence.  A ring that wrapped on one rank is compared from where every rank has calls.
    same = {r: _dump(r, 2, {"world": [_row(s) for s in range(1 if r else 5, 9)]}) for r in range(2)}
    assert flight_report.diverge([0, 1], {r: c["groups"]["world"]["records"] for r, c in same.items()}) is None
    assert "no divergence in its 8 recorded call(s)" in flight_report.report(same)


def test_zerocomm_trace_flight_reads_a_folder(tmp_path):
    import json
    for rank in range(2):
        rows = [_row(1), _row(2)] if rank == 0 else [_row(1)]
        (tmp_path / f"flight-rank{rank}.json").write_text(json.dumps(_dump(rank, 2, {"world": rows})))
    report = _trace(tmp_path)
    assert "the ranks diverge first at call #2" in report and "missing at call #2: rank(s) [1]" in report, report


# -- a peer that dies ------------------------------------------------------------------------------------------

def _killed_peer(spec, folder: str) -> int:
    """Rank 1 dies after call #2; rank 0 writes the text of its error on call #3 to ``folder``."""
    os.environ["ZEROCOMM_FLIGHT_DUMP"] = folder
    dist.init_process_group(**spec.kwargs(), timeout=datetime.timedelta(seconds=20))
    x = torch.ones(2)
    for _ in range(2):
        dist.all_reduce(x)  # flight: before death
    if dist.get_rank() == 1:
        time.sleep(1.6)  # flight: dies here (its head, and then where it stands, published every 0.5 s)
        os._exit(0)
    try:
        dist.all_reduce(x)
        text = "no error"
    except dist.CommError as error:
        text = f"{type(error).__name__}: {error}"
    Path(folder, "error.txt").write_text(text)
    dist.destroy_process_group()
    return 0


def test_a_lost_peer_is_named_with_its_last_call(tmp_path):
    """gloo (under MPI the launcher ends the job when a rank dies): the survivor raises at once, not at the
    deadline, and names the dead rank's last call from what it published."""
    from zerocomm.benchmarks.launch import run_forked
    started = time.monotonic()
    assert run_forked(2, "gloo", lambda spec: _killed_peer(spec, str(tmp_path))) == 0
    assert time.monotonic() - started < 19, "the survivor waited for its deadline"
    text = (tmp_path / "error.txt").read_text()
    dies = f"{HERE}:{_line('flight: dies here (its head, and then where it stands, published every 0.5 s)')}"
    assert text.startswith(("PeerError", "CommTimeoutError")), text
    assert re.search(rf"rank 1 did not arrive: it last called all_reduce #2 \(completed, 8 B float32, \w+\); "
                     rf"it is now at \S*{re.escape(dies)}, outside any collective", text), text
    assert (tmp_path / "flight-rank0.json").exists() and not (tmp_path / "flight-rank1.json").exists()
    report = _trace(tmp_path)
    assert "no record from rank(s) [1]" in report and "rank(s) [1] left none" in report, report
    assert re.search(rf"its failure: .*rank 1 .*all_reduce #2 \(completed.*{re.escape(dies)}", report), report
