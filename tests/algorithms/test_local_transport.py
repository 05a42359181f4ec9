"""The in-process fake transport itself: FIFO per (src, dst, tag), byte-size checks, bounded waits."""
import threading

import pytest
import torch

from support.local_transport import (
    LocalFabric,
    MessageSizeError,
    SendBufferModifiedError,
    run_ranks,
)


def test_fifo_per_key_and_tags_are_separate():
    def body(t):
        if t.rank == 0:
            reqs = [t.isend(torch.tensor([float(i)]), 1, tag=i % 2) for i in range(6)]
            for r in reqs:
                r.wait(5)
            return None
        # Post tag 1 first: tags do not overtake each other's order, only within a tag is order kept.
        bufs = {tag: [torch.empty(1) for _ in range(3)] for tag in (1, 0)}
        reqs = [t.irecv(b, 0, tag) for tag, bs in bufs.items() for b in bs]
        for r in reqs:
            r.wait(5)
        return {tag: [b.item() for b in bs] for tag, bs in bufs.items()}

    assert run_ranks(2, body)[1] == {0: [0.0, 2.0, 4.0], 1: [1.0, 3.0, 5.0]}


def test_byte_size_mismatch_fails_both_sides():
    def body(t):
        if t.rank == 0:
            t.isend(torch.ones(4), 1, 3).wait(5)
        else:
            t.irecv(torch.empty(2), 0, 3).wait(5)

    with pytest.raises(MessageSizeError, match=r"rank 0 sent 16 bytes to rank 1 \(tag 3\), but rank 1 posted a receive of 8 bytes") as info:
        run_ranks(2, body)
    assert any("raised on rank" in note for note in info.value.__notes__)


def test_dtypes_may_differ_when_bytes_match():
    def body(t):
        if t.rank == 0:
            t.isend(torch.tensor([1.0]), 1, 0).wait(5)
            return None
        out = torch.empty(4, dtype=torch.uint8)
        t.irecv(out, 0, 0).wait(5)
        return out

    assert torch.equal(run_ranks(2, body)[1], torch.tensor([1.0]).view(torch.uint8))


def test_wait_times_out_with_the_awaited_peer():
    t0, _ = LocalFabric(2).transports()
    req = t0.irecv(torch.empty(1), 1, 42)
    assert not req.test()
    with pytest.raises(TimeoutError, match=r"^recv from rank 1 \(tag 42\)$"):
        req.wait(0.01)
    with pytest.raises(TimeoutError, match=r"^send to rank 1 \(tag 5\)$"):
        t0.isend(torch.empty(1), 1, 5).wait(0.01)


def test_modified_send_buffer_is_caught():
    fabric = LocalFabric(2)
    t0, t1 = fabric.transports()
    buf = torch.zeros(3)
    send = t0.isend(buf, 1, 0)
    buf[1] = 7.0  # too early: the send has not completed
    recv = t1.irecv(torch.empty(3), 0, 0)
    with pytest.raises(SendBufferModifiedError, match=r"rank 0 changed the buffer of its send to rank 1 \(tag 0\)"):
        send.wait(1)
    with pytest.raises(SendBufferModifiedError):
        recv.wait(1)


def test_counters_and_pending():
    fabric = LocalFabric(3)
    t0, t1, _ = fabric.transports()
    t0.isend(torch.empty(5, dtype=torch.float64), 1, 0)
    assert fabric.pending() == 1
    t1.irecv(torch.empty(5, dtype=torch.float64), 0, 0).wait(1)
    assert fabric.pending() == 0
    assert fabric.bytes_sent == [40, 0, 0] and fabric.messages_sent == [1, 0, 0]


def test_run_ranks_prefers_the_root_cause_over_timeouts():
    def body(t):
        if t.rank == 2:
            raise KeyError("boom")
        t.irecv(torch.empty(1), 2, 0).wait(0.2)

    with pytest.raises(KeyError, match="boom") as info:
        run_ranks(3, body)
    notes = " ".join(info.value.__notes__)
    assert "raised on rank 2 of 3" in notes and "rank 0: TimeoutError" in notes


def test_run_ranks_names_hung_ranks():
    release = threading.Event()

    def body(t):
        if t.rank == 1:
            release.wait(5)

    try:
        with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 still running"):
            run_ranks(2, body, timeout_s=0.1)
    finally:
        release.set()


def test_argument_checks():
    t0, _ = LocalFabric(2).transports()
    with pytest.raises(ValueError, match=r"peer must be in \[0, 2\), got 2"):
        t0.isend(torch.empty(1), 2, 0)
    with pytest.raises(ValueError, match="contiguous"):
        t0.irecv(torch.empty(3, 2).t(), 1, 0)
