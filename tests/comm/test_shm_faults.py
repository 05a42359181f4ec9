"""A rank killed with SIGKILL while its group holds shared memory.

Three gloo ranks forked from the test process (not the shared pools: a death would take a pool
down) run one "shm" all_reduce, so the arena (and, zero-copy, a heap) is mapped everywhere; then
one rank kills itself and the others call the next shm all_reduce (or one small round of another
collective: broadcast, scatter, gather, all_gather, all_to_all, reduce, barrier).  They must get a typed error
(``PeerError``: the waiter sees the process is gone, or ``CommTimeoutError``) within the group's
timeout plus 5 s, and no segment made by any of the ranks may remain in /dev/shm.
"""
import datetime
import multiprocessing
import os
import signal
import time

import pytest
import torch

TIMEOUT_S = 6.0
N = 3


def _small_call(dist, collective: str, rank: int) -> None:
    """One small "shm" call of ``collective`` (one round through the segment), as every rank of N makes it."""
    x = torch.full((3,), float(rank))
    if collective == "broadcast":
        dist.broadcast(x, 0, algorithm="shm")
    elif collective == "scatter":
        dist.scatter(x, list(torch.zeros(3 * N).chunk(N)) if rank == 0 else None, src=0, algorithm="shm")
    elif collective == "gather":
        dist.gather(x, list(torch.zeros(3 * N).chunk(N)) if rank == 0 else None, dst=0, algorithm="shm")
    elif collective == "all_gather":
        dist.all_gather_into_tensor(torch.zeros(3 * N), x, algorithm="shm")
    elif collective == "all_to_all":
        dist.all_to_all_single(torch.zeros(3 * N), torch.ones(3 * N), algorithm="shm")
    elif collective == "reduce":
        dist.reduce(x, 0, algorithm="shm")
    elif collective == "barrier":
        dist.barrier(algorithm="shm")
    else:
        dist.all_reduce(x, algorithm="shm")


def _rank(rank: int, folder: str, conn, victim: int, zero_copy: bool, collective: str = "all_reduce") -> None:
    code = 0
    try:
        import zerocomm.comm as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=N,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        x = dist.shared_empty(1 << 18) if zero_copy else torch.empty(1 << 18)
        x.fill_(1.0)
        dist.all_reduce(x, algorithm="shm")
        conn.send(("ready", os.getpid(), float(x[0])))
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            if collective == "all_reduce":
                dist.all_reduce(x, algorithm="shm")
            else:
                _small_call(dist, collective, rank)
            conn.send(("no error", "", time.monotonic() - start))
        except Exception as error:  # judged by the parent
            conn.send((type(error).__name__, str(error), time.monotonic() - start))
    except BaseException as error:
        conn.send(("setup failed", repr(error), 0.0))
        code = 1
    os._exit(code)


def _leftovers(pids) -> list:
    return [name for name in os.listdir("/dev/shm") if any(name.startswith(f"zerocomm-{pid}-") for pid in pids)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zero_copy", [False, True], ids=["copy", "zero-copy"])
@pytest.mark.parametrize("victim", [0, 1], ids=["creator-killed", "peer-killed"])
def test_a_killed_rank_gives_the_others_a_typed_error_and_leaves_no_segment(tmp_path, victim, zero_copy):
    _kill_and_judge(tmp_path, victim, zero_copy, "all_reduce")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["broadcast", "scatter", "gather", "all_gather", "all_to_all", "reduce",
                                        "barrier"])
def test_a_rank_killed_before_a_small_round_gives_the_others_peer_error(tmp_path, collective):
    """The one-round small calls (``Arena.move_round`` and its kin): the survivors wait in the round's sync for a
    rank that never arrives, see its process gone and raise ``PeerError`` naming it, within the timeout."""
    reports = _kill_and_judge(tmp_path, 1, False, collective)
    assert all(kind == "PeerError" for kind, _, _ in reports.values()), reports


def _kill_and_judge(tmp_path, victim: int, zero_copy: bool, collective: str) -> dict:
    """Start N ranks, kill ``victim`` after one shm all_reduce, have the others call ``collective``; assert each got a
    typed error within the timeout (plus 5 s) and that no segment is left; returns ``{rank: (kind, text, waited)}``."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(N)]
    ranks = [context.Process(target=_rank, args=(r, str(tmp_path), pipes[r][1], victim, zero_copy, collective))
             for r in range(N)]
    for process in ranks:
        process.start()
    try:
        ready = [pipes[r][0].recv() if pipes[r][0].poll(60) else ("silent",) for r in range(N)]
        assert all(msg[0] == "ready" and msg[2] == float(N) for msg in ready), ready
        reports = {}
        for r in range(N):
            if r != victim:
                assert pipes[r][0].poll(TIMEOUT_S + 30), f"rank {r} did not report"
                reports[r] = pipes[r][0].recv()
        for process in ranks:
            process.join(30)
        assert ranks[victim].exitcode == -signal.SIGKILL
        for r, (kind, text, waited) in reports.items():
            assert kind in ("PeerError", "CommTimeoutError"), (r, kind, text)
            assert waited < TIMEOUT_S + 5, (r, waited, text)
            if kind == "PeerError":
                assert f"rank {victim}" in text, text
        assert _leftovers([msg[1] for msg in ready]) == []
        return reports
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join(5)


def _on_two_hosts(rank: int, folder: str, conn) -> None:
    """Ranks 0, 2 on pretend host a, rank 1 on b: explicit shm is refused before any byte moves."""
    code = 0
    try:
        os.environ["ZEROCOMM_HOST"] = "a" if rank % 2 == 0 else "b"
        import zerocomm.comm as dist
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=N,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        x = torch.ones(5)
        try:
            dist.all_reduce(x, algorithm="shm")
            refusal = None
        except dist.UnsupportedError as error:
            refusal = str(error)
        plain = dist.shared_empty(3)
        chosen = [dist.which_algorithm("all_reduce", torch.ones(n)) for n in (2, 1 << 20)]
        even = dist.new_group([0, 2])  # one host: shm works there
        if rank != 1:
            y = torch.full((4,), float(rank))
            dist.all_reduce(y, group=even, algorithm="shm")
            summed = y.tolist()
        else:
            summed = None
        dist.all_reduce(x)  # the world is unaffected by the refusal
        conn.send((refusal, x.tolist(), type(plain).__name__, plain.shape, chosen, summed))
    except BaseException as error:
        conn.send(("setup failed", repr(error)))
        code = 1
    os._exit(code)


def test_ranks_on_several_hosts_refuse_shm_and_share_within_a_host(tmp_path):
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe(duplex=False) for _ in range(N)]
    ranks = [context.Process(target=_on_two_hosts, args=(r, str(tmp_path), pipes[r][1])) for r in range(N)]
    for process in ranks:
        process.start()
    try:
        reports = [pipes[r][0].recv() if pipes[r][0].poll(60) else ("silent",) for r in range(N)]
        for rank, report in enumerate(reports):
            assert len(report) == 6, report
            refusal, world_sum, plain_type, plain_shape, chosen, summed = report
            assert refusal and "several hosts" in refusal and "'ring'" in refusal, refusal
            assert world_sum == [float(N)] * 5
            assert (plain_type, tuple(plain_shape)) == ("Tensor", (3,))
            assert "shm" not in chosen, chosen
            assert summed == (None if rank == 1 else [2.0] * 4)
    finally:
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
