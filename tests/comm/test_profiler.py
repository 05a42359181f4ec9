"""The comms profiler: records every collective, summarizes with the group's size, exports traces,
and changes nothing when off or on."""
import json

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist
from zerocomm.comm.group import WORLD


def profile_some_calls():
    rank, n = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group([0, 1])
    plain = torch.arange(8.0) + rank
    dist.all_reduce(plain, algorithm="ring")
    observers_when_off = len(WORLD.observers)
    with dist.profile() as prof:
        profiled = torch.arange(8.0) + rank
        dist.all_reduce(profiled, algorithm="ring")
        out = torch.empty(4 * n)
        work = dist.all_gather_into_tensor(out, torch.ones(4) * rank, async_op=True)
        with prof.span("compute"):
            torch.ones(100).sum()
        work.wait()
        if sub is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(torch.ones(1000), group=sub, algorithm="ring")
    summary = prof.summary()
    trace = json.loads(json.dumps(prof.chrome_trace()))
    return {"same_result": torch.equal(plain, profiled), "ops": sorted(r.op for r in prof.records),
            "group_sizes": sorted({r.group_size for r in prof.records}), "summary": summary, "trace": trace,
            "observers_when_off": observers_when_off, "table": prof.table(), "n": n,
            "sub_records": [(r.group_size, r.size_bytes, r.bytes_sent) for r in prof.records if r.group_size == 2]}


@pytest.mark.parametrize("world", worlds(("gloo",), (3,)), indirect=True)
def test_profiler_records_and_exports(world):
    results = world.run(profile_some_calls)
    for rank, res in enumerate(results):
        assert res["same_result"], "profiling changed a result"
        assert res["observers_when_off"] == 0
        expected_ops = ["all_gather", "all_reduce"] + (["all_reduce"] if rank < 2 else [])
        assert res["ops"] == sorted(expected_ops)
        events = [e for e in res["trace"]["traceEvents"] if e["ph"] != "M"]
        assert {e["name"] for e in events} >= {"all_reduce", "all_gather", "compute"}
        assert all(e["ph"] == "X" and e["dur"] > 0 for e in events)
        assert all(type(e["pid"]) is int and type(e["tid"]) is int and e["pid"] == rank for e in events)
        meta = [e for e in res["trace"]["traceEvents"] if e["ph"] == "M"]
        names = {(e["name"], e["tid"]): e["args"]["name"] for e in meta if e["name"].endswith("_name")}
        assert names[("process_name", 0)] == f"rank {rank}"
        assert {e["tid"] for e in events} <= {tid for kind, tid in names if kind == "thread_name"}
        assert "all_reduce" in res["table"]
        if rank < 2:
            # A 2-rank subgroup's ring all_reduce of 4000 bytes: each rank sends 2·(2-1)/2·4000 bytes (on one
            # host it rides in its check's segment round and is counted as the schedule's bytes), and busbw uses
            # the group's size (2), not the world's (3).
            assert res["sub_records"] == [(2, 4000, 4000)]
    summary = results[0]["summary"]["all_reduce"]
    assert summary["count"] == 2 and summary["busbw_GBps"] > 0


def trace_one_all_reduce(folder):
    """Rank 1 starts its profiler 0.3 s after rank 0, then both run one all_reduce and export."""
    import time

    rank = dist.get_rank()
    dist.barrier()
    if rank == 1:
        time.sleep(0.3)  # per-rank clocks that start at the profiler's creation would now disagree by 0.3 s
    with dist.profile() as prof:
        dist.barrier()
        dist.all_reduce(torch.ones(1 << 12), algorithm="ring")
    path = f"{folder}/run.rank{rank}.trace.json"
    prof.export_chrome_trace(path)
    return path


@pytest.mark.parametrize("world", worlds(("gloo",), (2,)), indirect=True)
def test_merged_trace_aligns_the_ranks_of_one_collective(world, tmp_path):
    """In the merged file each rank is a named process, and the two ranks' bars of one all_reduce
    overlap in time: neither rank can finish it before the other has started it."""
    from zerocomm.comm.profiler import merge_chrome_traces

    paths = world.run(trace_one_all_reduce, str(tmp_path))
    merged = merge_chrome_traces(str(tmp_path / "run"), str(tmp_path / "run.trace.json"))
    assert merged["otherData"]["ranks"] == [0, 1] and merged["otherData"]["files"] == paths
    on_disk = json.loads((tmp_path / "run.trace.json").read_text())
    events = on_disk["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    bars = {e["pid"]: e for e in events if e["ph"] == "X" and e["name"] == "all_reduce"}
    assert set(bars) == {0, 1}
    (start0, end0), (start1, end1) = ((bars[r]["ts"], bars[r]["ts"] + bars[r]["dur"]) for r in (0, 1))
    assert start0 < end1 and start1 < end0, f"rank 0 [{start0:.0f}, {end0:.0f}] µs, rank 1 [{start1:.0f}, {end1:.0f}] µs"
    assert min(e["ts"] for e in events if e["ph"] == "X") == 0  # counted from the earliest event


def test_merge_refuses_two_files_of_one_rank(tmp_path):
    from zerocomm.comm.profiler import merge_chrome_traces

    trace = {"traceEvents": [{"name": "all_reduce", "ph": "X", "pid": 0, "tid": 1, "ts": 1.0, "dur": 1.0}]}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(trace))
    with pytest.raises(ValueError, match="rank 0 appears in both"):
        merge_chrome_traces([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    with pytest.raises(FileNotFoundError, match="neither a file nor a prefix"):
        merge_chrome_traces(str(tmp_path / "nothing"))


def torch_profiler_events():
    """What torch's autograd profiler records for zerocomm's calls: (name, is_async, input shapes, count)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(torch.ones(3, 3), algorithm="ring")
        dist.all_reduce(torch.ones(2, 5), algorithm="native", async_op=True).wait()
        dist.broadcast(torch.ones(4, dtype=torch.complex64), 0)
        dist.all_gather([torch.empty(2, 2) for _ in range(n)], torch.ones(2, 2))
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(3, 2)])
        dist.barrier()
        if backend == "gloo":  # p2p events are gloo's own (see torch_events.py)
            peer = (rank + 1) % n
            work = dist.isend(torch.ones(rank + 1, 3), peer)
            dist.recv(torch.empty((rank - 1) % n + 1, 3), (rank - 1) % n)
            work.wait()
    events = [(e.name, e.is_async, e.input_shapes, e.count) for e in prof.function_events
              if e.name.startswith(backend + ":")]
    return {"events": events, "backend": backend, "rank": rank, "n": n}


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_torch_profiler_sees_torch_named_events(world):
    for result in world.run(torch_profiler_events):
        b, rank, n = result["backend"], result["rank"], result["n"]
        expected = [(f"{b}:all_reduce", True, [[3, 3]], 1), (f"{b}:all_reduce", True, [[2, 5]], 1),
                    (f"{b}:broadcast", True, [[4, 2]], 1), (f"{b}:all_gather", True, [[2, 2]], 1),
                    (f"{b}:all_reduce", True, [[2], [3, 2]], 1), (f"{b}:barrier", True, [], 1)]
        if b == "gloo":
            expected += [("gloo:send", True, [[rank + 1, 3]], 1), ("gloo:recv", True, [[(rank - 1) % n + 1, 3]], 1)]
        got = result["events"]
        assert sorted(got, key=repr) == sorted(expected, key=repr), (rank, got)
