"""Algorithm selection, cross-rank checks and timeouts through the public API."""
import datetime
import logging

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist
from zerocomm.comm import select


def _expected_auto(backend: str, collective: str, n: int, nbytes: int) -> str:
    # The test worlds run on one host: the "+one_host" rows first, the plain rows for what they lack.
    table = select.auto_table()
    rows = table.get(f"{backend}+one_host", {}).get(collective) or table.get(backend, {}).get(collective, [])
    for max_world, max_bytes, algorithm in rows:
        if n <= max_world and nbytes <= max_bytes:
            return algorithm
    return "native"


def selection_answers():
    n = dist.get_world_size()
    backend = str(dist.get_backend())
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("zerocomm.comm.select")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        answers = {}
        for nbytes in (8, 4096, 1 << 20):
            t = torch.empty(nbytes // 4)
            answers[nbytes] = (dist.which_algorithm("all_reduce", t, dist.ReduceOp.SUM),
                               _expected_auto(backend, "all_reduce", n, nbytes))
        explicit = dist.which_algorithm("all_reduce", torch.empty(4), dist.ReduceOp.SUM, algorithm="tree")
        dist.set_default_algorithm("ring")
        by_default = dist.which_algorithm("all_reduce", torch.empty(4), dist.ReduceOp.SUM)
        x = torch.ones(5)
        dist.all_reduce(x)  # runs with the default ("ring") and logs it
        dist.set_default_algorithm("auto")
        try:
            dist.gather(torch.ones(2), [torch.empty(2) for _ in range(n)] if dist.get_rank() == 0 else None,
                        algorithm="ring")
            refusal = None
        except dist.UnsupportedError as error:
            refusal = str(error)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)  # selection logging sends every later call of this rank down the full path
    return {"answers": answers, "explicit": explicit, "by_default": by_default, "x": x.tolist(),
            "refusal": refusal, "logged": [r.getMessage() for r in records]}


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (3,)), indirect=True)
def test_selection_is_explicit_default_or_table_and_observable(world):
    for res in world.run(selection_answers):
        for nbytes, (chosen, expected) in res["answers"].items():
            assert chosen == expected, f"{nbytes} B: auto chose {chosen}, the table says {expected}"
        assert res["explicit"] == "tree" and res["by_default"] == "ring"
        assert res["x"] == [3.0] * 5
        assert any("all_reduce" in line and "-> ring" in line for line in res["logged"]), res["logged"]
        refusal = res["refusal"]
        assert refusal and "gather" in refusal and "'ring'" in refusal and "use algorithm=" in refusal
        assert "native" in refusal and "tree" in refusal


def all_to_all_choices():
    """(algorithm run, which_algorithm's answer, the table's) for even all_to_all_single calls by size, then for one
    with uneven splits (which_algorithm answers for even splits only: None)."""
    from zerocomm.comm.api import WORLD
    from zerocomm.comm.traffic import observing

    n, rank = dist.get_world_size(), dist.get_rank()
    backend = str(dist.get_backend())

    class Algorithms:
        def __init__(self):
            self.seen = []

        def on_start(self, record):
            pass

        def on_end(self, record):
            self.seen.append(record.algorithm)

    observer = Algorithms()
    answers = []
    with observing(WORLD, observer):
        for nbytes in (8 * n, 4096 * n, (1 << 20) * n):
            sent = (torch.arange(nbytes) % 251).to(torch.uint8)
            received = torch.empty_like(sent)
            dist.all_to_all_single(received, sent)
            # every rank sent the same buffer, so each receives its own chunk of it from every rank
            assert torch.equal(received.view(n, -1), sent.view(n, -1)[rank].expand(n, -1)), nbytes
            answers.append((observer.seen[-1], dist.which_algorithm("all_to_all", sent),
                            _expected_auto(backend, "all_to_all", n, nbytes)))
        # Uneven: rank r sends r + 1 + j elements to rank j, so ranks send different totals, and "auto" must not
        # choose by size: every rank runs the first row that serves every size.
        counts = [rank + 1 + j for j in range(n)]
        back = [j + 1 + rank for j in range(n)]
        sent = torch.full((sum(counts),), rank, dtype=torch.uint8)
        received = torch.empty(sum(back), dtype=torch.uint8)
        dist.all_to_all_single(received, sent, back, counts)
        assert received.tolist() == [j for j in range(n) for _ in range(back[j])]
        answers.append((observer.seen[-1], None, _expected_auto(backend, "all_to_all", n, select.UNBOUNDED)))
    return answers


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_all_to_all_chooses_by_size_when_every_rank_sends_alike(world):
    results = world.run(all_to_all_choices)
    for answers in results:
        assert answers == results[0]  # every rank chose alike
        for chosen, predicted, expected in answers:
            assert chosen == expected, answers
            assert predicted in (None, expected), answers


def mismatched_call():
    dist.configure(debug=True)
    try:
        size = 4 + dist.get_rank()  # each rank a different length: a bug debug mode must name
        dist.all_reduce(torch.ones(size))
        outcome = None
    except dist.CollectiveMismatchError as error:
        outcome = str(error)
    finally:
        dist.configure(debug=False)
    check = torch.ones(2)
    dist.all_reduce(check)  # nobody is left stuck
    return outcome, check.tolist(), dist.get_world_size()


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_debug_mode_names_the_mismatched_ranks(world):
    for rank, (message, check, n) in enumerate(world.run(mismatched_call)):
        assert message is not None, f"rank {rank} raised no CollectiveMismatchError"
        assert "rank 0" in message and "rank 1" in message and "4 elements" in message and "5 elements" in message
        assert check == [float(n)] * 2


def absent_peer():
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    if dist.get_rank() != 0:
        return None  # rank 1 never joins the collective
    try:
        dist.all_reduce(torch.ones(8), group=group, algorithm="ring")
    except dist.CommTimeoutError as error:
        return str(error)
    return "no timeout"


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2,)), indirect=True)
def test_timeout_names_op_group_and_peer(world):
    message = world.run(absent_peer, timeout=60)[0]
    # The mismatch check runs first, as the group's native all_reduce: it cannot say which rank is missing,
    # only that not every rank of the group arrived at this call (named by its number and arguments).
    assert "all_reduce" in message and "[0, 1]" in message and "every rank to reach" in message, message
    assert "timed out" in message and "8 elements" in message, message
