"""One mismatch protocol for every mix of algorithms: whatever each rank's call reaches for (``auto``
picking by size on each rank, explicit algorithms, shm against native, different collectives), ranks
that disagree raise ``CollectiveMismatchError`` on every rank, well inside the group's deadline, and
the group stays usable.

Each case runs on a fresh group whose deadline is the library's default (300 s): a mix whose ranks
checked in different places would wait that long, and the pool's own deadline (below it) would then
fail the test naming the stuck ranks.
"""
import time

import pytest
import torch

from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 120.0
#: The bound a detected mismatch must stay within (the issue's liveness bound, far above the ~10 ms it takes).
DETECTED_WITHIN_S = 5.0

#: (name, per-rank calls cycled over the ranks): each call is (collective, elements, algorithm).
CASES = [
    ("auto: sizes in different rows of the table", [("all_reduce", 1024, "auto"), ("all_reduce", 2048, "auto")]),
    ("auto: 8 elements against 1M", [("all_reduce", 8, "auto"), ("all_reduce", 1 << 20, "auto")]),
    ("shm against native, same size", [("all_reduce", 1024, "shm"), ("all_reduce", 1024, "native")]),
    ("native against shm, same size", [("all_reduce", 1024, "native"), ("all_reduce", 1024, "shm")]),
    ("shm against ring", [("all_reduce", 4096, "shm"), ("all_reduce", 4096, "ring")]),
    ("ring against tree", [("all_reduce", 4096, "ring"), ("all_reduce", 4096, "tree")]),
    ("native against recursive doubling", [("all_reduce", 8, "native"), ("all_reduce", 8, "recursive_doubling")]),
    ("hierarchical against native", [("all_reduce", 4096, "hierarchical"), ("all_reduce", 4096, "native")]),
    ("shm all_reduce against native broadcast", [("all_reduce", 64, "shm"), ("broadcast", 64, "native")]),
    ("auto all_gather against auto all_reduce", [("all_gather_into_tensor", 256, "auto"),
                                                 ("all_reduce", 256, "auto")]),
]


def _call(collective: str, numel: int, algorithm: str, group) -> None:
    n = dist.get_world_size(group)
    if collective == "all_reduce":
        dist.all_reduce(torch.ones(numel), group=group, algorithm=algorithm)
    elif collective == "broadcast":
        dist.broadcast(torch.ones(numel), group_src=0, group=group, algorithm=algorithm)
    else:
        dist.all_gather_into_tensor(torch.empty(n * numel), torch.ones(numel), group=group, algorithm=algorithm)


def mismatch_records(cases) -> list:
    """On every rank: for each case, what its call raised, how long it took, and the all_reduce after it."""
    rank, n = dist.get_rank(), dist.get_world_size()
    records = []
    for name, calls in cases:
        group = dist.new_group(list(range(n)))  # a fresh group, the default deadline, nothing cached
        record = {"case": name, "raised": None, "message": ""}
        start = time.monotonic()
        try:
            _call(*calls[rank % len(calls)], group)
        except Exception as error:  # the test asserts the type
            record["raised"], record["message"] = type(error).__name__, str(error)
        record["seconds"] = time.monotonic() - start
        after = torch.ones(3)
        dist.all_reduce(after, group=group)
        record["after"] = after.tolist()
        dist.destroy_process_group(group)
        records.append(record)
    return records


@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_every_mix_of_algorithms_ends_in_a_mismatch_error_on_every_rank(world):
    per_rank = world.run(mismatch_records, CASES, timeout=RUN_TIMEOUT_S)
    n = world.world_size
    problems = []
    for rank, records in enumerate(per_rank):
        for r in records:
            where = f"rank {rank}, {r['case']}"
            if r["raised"] != "CollectiveMismatchError":
                problems.append(f"{where}: raised {r['raised']}, expected CollectiveMismatchError: {r['message']}")
            elif f"rank {rank}" not in r["message"] or "but rank" not in r["message"]:
                problems.append(f"{where}: the message names neither this rank nor the one that differs: "
                                f"{r['message']}")
            if r["seconds"] > DETECTED_WITHIN_S:
                problems.append(f"{where}: took {r['seconds']:.1f} s (bound {DETECTED_WITHIN_S} s)")
            if r["after"] != [float(n)] * 3:
                problems.append(f"{where}: the all_reduce after the mismatch gave {r['after']}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
