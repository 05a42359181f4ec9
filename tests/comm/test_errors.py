"""Wrong calls raise typed errors that name the op, the rank and the offending value, on every
rank that makes them, before any byte moves, and leave nobody stuck.

Every rank makes the same wrong call (a wrong call on one rank only would leave its peers waiting
in the collective: that is validate.py's debug mode, not tested here), catches the error, and
runs a correct all_reduce right after it: if any rank had sent a byte or were waiting, that
all_reduce would mismatch or time out.  Use before ``init_process_group`` is checked in the test
process itself, which never initializes.
"""
import re

import pytest
import torch

from support.cases import subgroup, subgroup_members
from support.dist import STANDIN, InvalidArgumentError, NotInitializedError, UnsupportedError, dist
from support.worlds import worlds

RUN_TIMEOUT_S = 60.0


def _wrong_calls(n: int, me: int, handle):
    """(case, kind of error, words the message must hold, call or None to sit out).

    The words are a list of strings, or a list of such lists when the message may put it either way.
    """
    members = subgroup_members(n)
    outsider = next((r for r in range(n) if r not in members), None)
    f32 = torch.ones(4)
    op = dist.ReduceOp
    calls = [
        ("all_reduce BAND on float32", "dtype", ["all_reduce", "band", "float32"],
         lambda: dist.all_reduce(f32.clone(), op.BAND)),
        ("all_reduce AVG on int32", "dtype", ["all_reduce", "avg", "int32"],
         lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op.AVG)),
        ("all_reduce AVG on bool", "dtype", ["all_reduce", "avg", "bool"],
         lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op.AVG)),
        ("reduce BXOR on float64", "dtype", ["reduce", "bxor", "float64"],
         lambda: dist.reduce(torch.ones(3, dtype=torch.float64), 0, op.BXOR)),
        ("all_gather_into_tensor output too large", "argument",
         [["all_gather_into_tensor", str(3 * n + 1), str(3 * n)], ["all_gather_into_tensor", str(3 * n + 1), "3"]],
         lambda: dist.all_gather_into_tensor(torch.zeros(3 * n + 1), torch.ones(3))),
        ("reduce_scatter_tensor output too large", "argument",
         # either side may be called wrong: the output (4, expected 3) or the input (3n, expected 4n)
         [["reduce_scatter_tensor", "4", "3"], ["reduce_scatter_tensor", str(3 * n), str(4 * n)]],
         lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(3 * n))),
        ("all_gather list one too long", "argument", ["all_gather", str(n + 1), str(n)],
         lambda: dist.all_gather([torch.zeros(2) for _ in range(n + 1)], torch.ones(2))),
        ("all_gather_into_tensor dtypes differ", "argument", ["all_gather_into_tensor", "float64", "float32"],
         lambda: dist.all_gather_into_tensor(torch.zeros(n, dtype=torch.float64), torch.ones(1))),
        ("all_to_all_single split sizes do not add up", "argument", ["all_to_all_single", "5", "4"],
         lambda: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [4] + [0] * (n - 1), [5] + [0] * (n - 1))),
        ("broadcast src outside the world", "argument", ["broadcast", "src", str(n + 2)],
         lambda: dist.broadcast(f32.clone(), n + 2)),
        ("reduce dst outside the world", "argument", ["reduce", "dst", str(n + 5)],
         lambda: dist.reduce(f32.clone(), n + 5)),
    ]
    if me in members:
        calls.append(("scatter group_src outside the subgroup", "argument", ["scatter", "group_src", str(len(members))],
                      lambda: dist.scatter(torch.zeros(2), None, group=handle, group_src=len(members))))
    else:
        calls.append(("scatter group_src outside the subgroup", "argument", [], None))
    if outsider is not None:
        calls.append(("broadcast src not in the subgroup", "argument", ["broadcast", "src", str(outsider)],
                      (lambda: dist.broadcast(f32.clone(), outsider, group=handle)) if me in members else None))
        # Only the non-members call: the members are not in this collective at all.
        calls.append(("a non-member calls the subgroup's all_reduce", "argument", ["all_reduce", "group"],
                      (lambda: dist.all_reduce(f32.clone(), group=handle)) if me not in members else None))
    if not STANDIN:
        # torch's gloo reads past such a tensor's storage (and aborts the process): not run under the stand-in
        calls.append(("all_reduce of a tensor whose elements overlap", "argument", ["all_reduce", "overlap", "(0, 1)"],
                      lambda: dist.all_reduce(torch.ones(2).expand(3, 2))))
        calls.append(("unknown algorithm", "argument", ["all_reduce", "bogus"],
                      lambda: dist.all_reduce(f32.clone(), algorithm="bogus")))
        calls.append(("ring all_reduce BAND on float32", "dtype", ["all_reduce", "band", "float32", "ring"],
                      lambda: dist.all_reduce(f32.clone(), op.BAND, algorithm="ring")))
        calls.append(("recursive doubling AVG on int32", "dtype", ["all_reduce", "avg", "int32"],
                      lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op.AVG,
                                              algorithm="recursive_doubling")))
    return calls


EXPECTED = {"dtype": (InvalidArgumentError, UnsupportedError), "argument": (InvalidArgumentError,)}


# --- what the ranks run ----------------------------------------------------------------------------

def wrong_call_records():
    """One record per case this rank took part in: what it raised and whether all_reduce then worked."""
    n, me = dist.get_world_size(), dist.get_rank()
    _, handle = subgroup()
    records = []
    for case, kind, words, call in _wrong_calls(n, me, handle):
        record = {"case": case, "kind": kind, "words": words, "raised": None, "typed": False, "message": ""}
        if call is not None:
            try:
                call()
            except Exception as exc:  # judged by the parent
                record.update(raised=type(exc).__name__, typed=isinstance(exc, EXPECTED[kind]), message=str(exc))
            records.append(record)
        check = torch.ones(1)
        dist.all_reduce(check)  # everyone, after every case: nobody may be stuck or out of step
        if call is not None:
            record["after"] = check.item()
    return records


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(), indirect=True)
def test_wrong_calls_raise_typed_errors_and_leave_nobody_stuck(world):
    per_rank = world.run(wrong_call_records, timeout=RUN_TIMEOUT_S)
    problems = []
    for rank, records in enumerate(per_rank):
        for r in records:
            where = f"rank {rank}, {r['case']}"
            wanted = " or ".join(t.__name__ for t in EXPECTED[r["kind"]])
            if r["raised"] is None:
                problems.append(f"{where}: raised nothing, expected {wanted}")
                continue
            if not r["typed"]:
                problems.append(f"{where}: raised {r['raised']}, expected {wanted}: {r['message']}")
            text = r["message"].lower()
            alternatives = r["words"] if r["words"] and isinstance(r["words"][0], list) else [r["words"]]
            missing = min(([w for w in words if w.lower() not in text] for words in alternatives), key=len)
            if not re.search(rf"\brank\W{{0,3}}{rank}\b", text):
                missing.append(f"rank {rank}")
            if missing:
                problems.append(f"{where}: the message does not name {missing}: {r['message']!r}")
            if r.get("after") != world.world_size:
                problems.append(f"{where}: the all_reduce after the error gave {r.get('after')}, "
                                f"expected {world.world_size}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


@pytest.mark.parametrize("call", [
    pytest.param(lambda: dist.all_reduce(torch.ones(1)), id="all_reduce"),
    pytest.param(lambda: dist.broadcast(torch.ones(1), 0), id="broadcast"),
    pytest.param(lambda: dist.all_gather_into_tensor(torch.ones(2), torch.ones(1)), id="all_gather_into_tensor"),
    pytest.param(lambda: dist.barrier(), id="barrier"),
    pytest.param(lambda: dist.send(torch.ones(1), 1), id="send"),
])
def test_use_before_init_raises_not_initialized(request, call):
    """In the test process, which never calls init_process_group (it forks the ranks)."""
    assert not dist.is_initialized()
    with pytest.raises(NotInitializedError) as caught:
        call()
    assert request.node.callspec.id in str(caught.value), f"the message does not name the op: {caught.value}"
