"""An all_to_all whose ranks disagree on split sizes (rank a sends b more or fewer elements than b expects) fails
with ``CollectiveMismatchError`` on every rank, naming the pair, before any byte moves -- it returned garbage
before, silently, with every algorithm.  Both forms (``all_to_all_single`` with split sizes, the list form), every
algorithm that serves them, checked in the segment and through the backend's stage, at 2 and 3 ranks on gloo and
MPI; after the error the group runs the next all_to_all right (compared with the plain reference built here).
Then the balance itself: zero exactly when every pair agrees (see comm/check.py's [Note: split sizes])."""
import contextlib
import itertools
import random

import pytest
import torch

from support.check_place import checks_through_the_backend
from support.worlds import worlds

import zerocomm.comm as dist

ALGORITHMS = ("auto", "native", "ring", "shm")


def _splits(n: int, shift: int) -> list:
    """``splits[a][b]``: what rank a sends rank b (uneven, some empty)."""
    return [[(a * 3 + b + shift) % 4 for b in range(n)] for a in range(n)]


def _exchange(form: str, algorithm: str, sent: list, expected: list):
    """One all_to_all of this rank: ``sent[b]`` elements to b (values ``100*rank + b``), ``expected[b]`` from b."""
    rank = dist.get_rank()
    pieces = [torch.full((count,), 100.0 * rank + b) for b, count in enumerate(sent)]
    if form == "list":
        outputs = [torch.full((count,), -1.0) for count in expected]
        dist.all_to_all(outputs, pieces, algorithm=algorithm)
        return [o.tolist() for o in outputs]
    output = torch.full((sum(expected),), -1.0)
    dist.all_to_all_single(output, torch.cat(pieces), output_split_sizes=expected, input_split_sizes=sent,
                           algorithm=algorithm)
    return [p.tolist() for p in output.split(expected)]


def disagreeing_splits(place: str) -> dict:
    from zerocomm.comm.group import WORLD
    rank, n = dist.get_rank(), dist.get_world_size()
    splits = _splits(n, 1)
    out = {}
    context = checks_through_the_backend(WORLD.default) if place == "backend" else contextlib.nullcontext()
    with context:
        for form, algorithm in itertools.product(("single", "list"), ALGORITHMS):
            if place == "backend" and algorithm == "shm":
                continue  # refused without a segment
            sent = list(splits[rank])
            expected = [splits[b][rank] for b in range(n)]
            if rank == n - 1:
                expected[0] += 1  # the last rank expects one element more from rank 0 than rank 0 sends it
            try:
                _exchange(form, algorithm, sent, expected)
                seen = "no error"
            except dist.CollectiveMismatchError as error:
                seen = str(error)
            except Exception as error:  # anything else is a defect: shown in the assertion
                seen = f"{type(error).__name__}: {error}"
            # The group goes on: the next all_to_all, with agreeing splits, is right.
            expected = [splits[b][rank] for b in range(n)]
            got = _exchange(form, algorithm, sent, expected)
            right = got == [[100.0 * b + rank] * expected[b] for b in range(n)]
            out[(form, algorithm)] = (seen, right)
    return out


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
@pytest.mark.parametrize("place", ["segment", "backend"])
def test_disagreeing_split_sizes_fail_on_every_rank_naming_the_pair(world, place):
    n = world.world_size
    splits = _splits(n, 1)
    for rank, out in enumerate(world.run(disagreeing_splits, place, timeout=120)):
        for (form, algorithm), (seen, right) in out.items():
            assert (f"split sizes disagree: rank 0 sends {splits[0][n - 1]} elements to rank {n - 1}, which expects "
                    f"{splits[0][n - 1] + 1} from it") in seen, (rank, form, algorithm, seen)
            assert right, (rank, form, algorithm)


def test_the_balance_is_zero_exactly_when_every_pair_agrees():
    from zerocomm.comm.check import SPLITS_PRIME, split_balance, split_weight
    rng = random.Random(7)
    for n in (1, 2, 3, 5, 8):
        weights = [(tuple(split_weight(r, p, n) for p in range(n)), tuple(split_weight(p, r, n) for p in range(n)))
                   for r in range(n)]
        for _ in range(50):
            splits = [[rng.choice((0, 1, 7, 1 << 33)) for _ in range(n)] for _ in range(n)]
            expected = [[splits[b][r] for b in range(n)] for r in range(n)]
            total = sum(split_balance(weights[r], expected[r], splits[r]) for r in range(n))
            assert total % SPLITS_PRIME == 0
            a, b = rng.randrange(n), rng.randrange(n)
            expected[b][a] += rng.choice((1, -1, 1 << 20))  # one pair disagrees
            total = sum(split_balance(weights[r], expected[r], splits[r]) for r in range(n))
            assert total % SPLITS_PRIME != 0, (n, a, b)
