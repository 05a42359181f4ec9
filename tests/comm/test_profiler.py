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
        events = res["trace"]["traceEvents"]
        assert {e["name"] for e in events} >= {"all_reduce", "all_gather", "compute"}
        assert all(e["ph"] == "X" and e["dur"] > 0 for e in events)
        assert "all_reduce" in res["table"]
        if rank < 2:
            # A 2-rank subgroup's ring all_reduce of 4000 bytes: each rank sends 2·(2-1)/2·4000 bytes,
            # and busbw uses the group's size (2), not the world's (3).
            assert res["sub_records"] == [(2, 4000, 4000)]
    summary = results[0]["summary"]["all_reduce"]
    assert summary["count"] == 2 and summary["busbw_GBps"] > 0
