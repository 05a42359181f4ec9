"""Point-to-point against numpy: send/recv, isend/irecv, batch_isend_irecv, tags, any-source recv.

Every dtype and ordered pair of ranks, on the default group and a subgroup (peers named by global
rank or, alternately, by group rank), at world sizes 2-4 on gloo and MPI; one ``pool.run`` per
test and world.  Blocking pairs run in one global order that every rank walks, so a blocking
send never waits on a receive its peer has not reached.
"""
import pytest
import torch

from support.cases import Cases, Guarded, assert_reports, dtype_name, groups, numel
from support.reference import DTYPES, rank_input
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 180.0
SHAPES = [(0,), (1,), (7,), (2, 3)]
CLOCKWISE, COUNTER = 1, 2  # tags of the two directions in the ring exchanges


def message(src: int, dst: int, count: int, dtype: torch.dtype, tag: int = 0):
    """Values global rank ``src`` sends to ``dst`` with ``tag``: each (src, dst, tag) differs."""
    return rank_input(src, count, dtype, "max", salt=3000 + 10 * dst + tag)


def _neighbours(grp):
    """(next, previous) group ranks of this rank in the group's ring."""
    return (grp.rank + 1) % grp.size, (grp.rank - 1) % grp.size


# --- what the ranks run ----------------------------------------------------------------------------

def send_recv_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for shape in SHAPES:
                count = numel(shape)
                for i, src in enumerate(grp.members):
                    for j, dst in enumerate(grp.members):
                        if src == dst or me not in (src, dst):
                            continue
                        what = f"send/recv {grp} {dtype_name(dtype)} shape={shape} {src}->{dst}"
                        if me == src:
                            buf = Guarded(message(src, dst, count, dtype), dtype, shape)
                            cases.call(what, (src, dst), None, dist.send, buf.tensor, group=grp.handle,
                                       dtype=dtype, **grp.root("dst", j))
                            cases.expect(f"{what} (input unchanged)", buf, message(src, dst, count, dtype))
                        else:
                            buf = Guarded(None, dtype, shape)
                            got = cases.call(what, (src, dst), None, dist.recv, buf.tensor, group=grp.handle,
                                             dtype=dtype, **grp.root("src", i))
                            cases.expect(what, buf, message(src, dst, count, dtype))
                            cases.check(what, got == src, f"recv returned {got!r}, expected the sender's global rank {src}")
    return cases.report()


def recv_any_source_cases(backend):
    """Group rank 0 receives from everyone else with src=None; the content names the sender."""
    cases = Cases(backend)
    for grp in groups():
        me, receiver = grp.members[grp.rank], grp.members[0]
        # One tag per dtype: a sender may post its float32 message while the receiver still
        # takes int64 ones, and an any-source receive matches any sender's message with its tag.
        for tag, dtype in ((11, torch.int64), (12, torch.float32)):
            what = f"recv(src=None) {grp} {dtype_name(dtype)}"
            if me != receiver:
                cases.call(what, grp.members, None, dist.send, torch.tensor([me] * 4, dtype=dtype),
                           receiver, group=grp.handle, tag=tag)
                continue
            senders = []
            for _ in grp.members[1:]:
                buf = torch.full((4,), -1, dtype=dtype)
                got = cases.call(what, grp.members, None, dist.recv, buf, group=grp.handle, tag=tag)
                cases.check(what, buf.tolist() == [got] * 4, f"recv returned {got!r} but the data came from {buf.tolist()}")
                senders.append(got)
            cases.check(what, sorted(senders) == list(grp.members[1:]), f"senders {senders}")
    return cases.report()


def isend_irecv_cases(backend):
    """Each rank sends to the next and receives from the previous; then two tags out of order."""
    cases = Cases(backend)
    for grp in groups():
        if grp.size < 2:
            continue
        me, (nxt, prv) = grp.members[grp.rank], _neighbours(grp)
        to, frm = grp.members[nxt], grp.members[prv]
        for dtype in DTYPES:
            for shape in SHAPES:
                count = numel(shape)
                what = f"isend/irecv ring {grp} {dtype_name(dtype)} shape={shape}"
                out = Guarded(message(me, to, count, dtype), dtype, shape)
                into = Guarded(None, dtype, shape)
                works = [cases.call(what, grp.members, None, dist.isend, out.tensor, group=grp.handle, **grp.root("dst", nxt)),
                         cases.call(what, grp.members, None, dist.irecv, into.tensor, group=grp.handle, **grp.root("src", prv))]
                _wait_all(cases, what, works)
                cases.expect(what, into, message(frm, me, count, dtype))
                cases.expect(f"{what} (input unchanged)", out, message(me, to, count, dtype))
        # Two messages to the same peer with different tags, received in the opposite order.
        dtype, count = torch.float32, 5
        what = f"isend/irecv tags {grp}"
        sends = [dist.isend(torch.from_numpy(message(me, to, count, dtype, tag)).to(dtype), to, group=grp.handle, tag=tag)
                 for tag in (CLOCKWISE, COUNTER)]
        bufs = {tag: torch.zeros(count, dtype=dtype) for tag in (COUNTER, CLOCKWISE)}
        recvs = [dist.irecv(bufs[tag], frm, group=grp.handle, tag=tag) for tag in (COUNTER, CLOCKWISE)]
        _wait_all(cases, what, recvs + sends)
        for tag, buf in bufs.items():
            cases.expect(f"{what} tag={tag}", buf, message(frm, me, count, dtype, tag))
    return cases.report()


def batch_isend_irecv_cases(backend):
    """One batch: send to both neighbours and receive from both, one tag per direction."""
    cases = Cases(backend)
    for grp in groups():
        if grp.size < 2:
            continue
        me, (nxt, prv) = grp.members[grp.rank], _neighbours(grp)
        to, frm = grp.members[nxt], grp.members[prv]
        for dtype in DTYPES:
            for shape in SHAPES:
                count = numel(shape)
                what = f"batch_isend_irecv {grp} {dtype_name(dtype)} shape={shape}"
                send_cw = torch.from_numpy(message(me, to, count, dtype, CLOCKWISE)).to(dtype).view(shape)
                send_ccw = torch.from_numpy(message(me, frm, count, dtype, COUNTER)).to(dtype).view(shape)
                recv_cw, recv_ccw = Guarded(None, dtype, shape), Guarded(None, dtype, shape)
                ops = [dist.P2POp(dist.isend, send_cw, to, grp.handle, CLOCKWISE),
                       dist.P2POp(dist.irecv, recv_cw.tensor, frm, grp.handle, CLOCKWISE),
                       dist.P2POp(dist.isend, send_ccw, frm, grp.handle, COUNTER),
                       dist.P2POp(dist.irecv, recv_ccw.tensor, to, grp.handle, COUNTER)]
                works = cases.call(what, grp.members, None, dist.batch_isend_irecv, ops)
                _wait_all(cases, what, works)
                cases.expect(f"{what} from previous", recv_cw, message(frm, me, count, dtype, CLOCKWISE))
                cases.expect(f"{what} from next", recv_ccw, message(to, me, count, dtype, COUNTER))
    return cases.report()


def _wait_all(cases, what, works):
    for work in works:
        cases.check(what, work is not None and hasattr(work, "wait"), f"expected a Work, got {work!r}")
        if work is not None:
            done = work.wait()
            cases.check(what, done is True, f"Work.wait() returned {done!r}, torch returns True")
            cases.check(what, work.is_completed(), "Work.is_completed() is False after wait()")


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(sizes=(2, 3, 4)), indirect=True)
@pytest.mark.parametrize("cases_fn", [send_recv_cases, recv_any_source_cases, isend_irecv_cases,
                                      batch_isend_irecv_cases], ids=lambda fn: fn.__name__.removesuffix("_cases"))
def test_point_to_point(world, cases_fn):
    assert_reports(world.run(cases_fn, world.backend, timeout=RUN_TIMEOUT_S))
