"""The mismatch check's one protocol (``comm/check.py``): the digest's width and collisions, the stage's format
and verdict, and every backend and algorithm reaching the same checker object.

The digest and the stage are tested directly, against numpy sums standing in for the ranks; the worlds then show
that each group's plans hold the methods of that group's one ``MismatchCheck`` (in the segment, and through the
backend's ``reduce_stage``), that a rank calling another algorithm is named on every rank either way, and that no
module of ``comm/`` carries a check of its own.
"""
import ast
import itertools
import pathlib
import random

import numpy as np
import pytest
import torch

from support.check_place import checks_through_the_backend
from support.worlds import worlds

from zerocomm.comm import check

COMM = pathlib.Path(check.__file__).resolve().parent


# -- the digest --------------------------------------------------------------------------------------

def _fingerprints(count: int, seed: int):
    """``count`` distinct (tag, numel, cell code) triples: consecutive tags, per-rank counts, every cell's code."""
    rng = random.Random(seed)
    cells = [hash(check.fingerprint_cell(c, op, dtype, root, a))
             for c in ("all_reduce", "broadcast", "all_gather") for op in ("sum", "max", None)
             for dtype in (torch.float32, torch.int64) for root in (-1, 0, 3) for a in ("native", "ring", "shm")]
    seen = set()
    while len(seen) < count:
        seen.add((rng.randrange(1 << 20, 1 << 28), rng.choice([-1, 0, 1, 8, 1000, rng.randrange(1 << 40)]),
                  rng.choice(cells)))
    return sorted(seen)


def test_the_digest_is_62_bits_wide_and_uses_all_of_them():
    assert check.DIGEST_BITS == 62 and check.DIGEST_MASK == (1 << 62) - 1
    codes = [check.digest(*f) for f in _fingerprints(20000, 1)]
    assert all(0 <= code < 1 << check.DIGEST_BITS for code in codes)
    ored = 0
    for code in codes:
        ored |= code
    assert ored == check.DIGEST_MASK  # every one of the 62 bits is set by some call, none above
    # Each bit is set in about half the digests (a biased bit would waste width): 20000 draws, 4.5 sigma.
    for bit in range(check.DIGEST_BITS):
        share = sum(code >> bit & 1 for code in codes) / len(codes)
        assert abs(share - 0.5) < 0.016, (bit, share)


def test_distinct_calls_do_not_collide():
    fingerprints = _fingerprints(200000, 2)
    codes = {check.digest(*f) for f in fingerprints}
    assert len(codes) == len(fingerprints)  # 2e5 calls in 2**62: a collision has odds of about 4e-9
    # Neighbouring calls, the ones a skipped or repeated call confuses, differ in about half their bits.
    tag, numel, cell = fingerprints[0]
    for other in ((tag + 1, numel, cell), (tag, numel + 1, cell), (tag, numel, cell ^ 1)):
        flipped = bin(check.digest(tag, numel, cell) ^ check.digest(*other)).count("1")
        assert 15 <= flipped <= 47, (other, flipped)


def test_the_digest_in_c_is_its_python_twin():
    from zerocomm.comm import shm
    if shm.digest_in_c is None:
        pytest.skip("the C extension zerocomm.comm._shmfast is not built here: only the Python twin runs")
    for fingerprint in _fingerprints(5000, 3):
        assert shm.digest_in_c(*fingerprint) == check.digest_twin(*fingerprint), fingerprint


# -- the stage ---------------------------------------------------------------------------------------

def _reduced(headers) -> list:
    """The header after a SUM over the ranks' headers, in float64 as the transports sum it."""
    return np.sum(np.array(headers, dtype=np.float64), axis=0).tolist()


def test_the_stage_header_carries_the_whole_digest():
    assert check.STAGE == check.STAGE_HEADER + check.STAGE_PAYLOAD == 16
    for code in [0, 1, check.DIGEST_MASK] + [check.digest(*f) for f in _fingerprints(1000, 4)]:
        header = check.stage_header(code)
        assert len(header) == check.STAGE_HEADER
        pieces = header[0::2]
        assert [p * p for p in pieces] == list(header[1::2])
        assert sum(int(p) << (check.PIECE_BITS * k) for k, p in enumerate(pieces)) == code


@pytest.mark.parametrize("n", [2, 3, 5, 8, 1000])
def test_the_stage_agrees_exactly_when_every_rank_holds_the_same_digest(n):
    rng = random.Random(n)
    for _ in range(200):
        code = rng.randrange(1 << check.DIGEST_BITS)
        header = check.stage_header(code)
        assert check.stage_agrees(_reduced([header] * n), header, n)
        # One rank off by one bit anywhere: every rank sees it, whatever it holds itself.
        odd = code ^ 1 << rng.randrange(check.DIGEST_BITS)
        headers = [header] * (n - 1) + [check.stage_header(odd)]
        for mine in (header, check.stage_header(odd)):
            assert not check.stage_agrees(_reduced(headers), mine, n)


def test_the_stage_sees_differences_whose_sums_cancel():
    """Two ranks at p-1 and p+1 sum to what two at p do: the squares tell them apart (Cauchy-Schwarz)."""
    for piece in (1, 2, 1000, (1 << check.PIECE_BITS) - 2):
        for k in range(4):
            shifted = [(piece + d) << (check.PIECE_BITS * k) for d in (-1, 0, 0, 1)]
            if any(s > check.DIGEST_MASK for s in shifted):
                continue
            headers = [check.stage_header(s) for s in shifted]
            mine = check.stage_header(piece << (check.PIECE_BITS * k))
            assert not check.stage_agrees(_reduced(headers), mine, 4), (piece, k)


def test_the_stage_sums_stay_exact_below_exact_ranks():
    biggest = (1 << check.PIECE_BITS) - 1
    assert (check.EXACT_RANKS - 1) * biggest * biggest < 1 << 53
    assert check.EXACT_RANKS * biggest * biggest >= 1 << 52  # no smaller than it needs to be


# -- no other copies ---------------------------------------------------------------------------------

def test_no_module_of_comm_carries_a_mismatch_check_of_its_own():
    """The digest is computed only by check.py (and, in C, beside the segment round that compares it); no backend
    defines a check, and the stage's format is nowhere but check.py."""
    offenders = []
    for path in sorted(COMM.rglob("*.py")):
        if path.name == "check.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("agree", "digest", "digest_twin", "stage_header",
                                                                   "stage_agrees", "name_mismatch"):
                offenders.append(f"{path.relative_to(COMM)}: def {node.name}")
            if isinstance(node, ast.Name) and node.id in ("DISAGREE", "AGREE", "AGREE_AND_REDUCED"):
                offenders.append(f"{path.relative_to(COMM)}: {node.id}")
    assert not list(COMM.rglob("_mpicheck.c"))
    assert offenders == []


# -- every backend and algorithm reaches the group's one checker ----------------------------------------

ALGORITHMS = ("native", "ring", "tree", "recursive_doubling", "shm", "hierarchical")


def checkers_and_mismatches() -> dict:
    """For each place the check can meet (the segment, the backend's stage): which object each algorithm's plan row
    is checked by, and what a rank calling another algorithm than its peers raised."""
    import zerocomm.comm as dist
    from zerocomm.comm.group import WORLD
    rank = dist.get_rank()
    out = {}
    for place in ("segment", "backend"):
        group = WORLD.default
        seen = {}
        with (checks_through_the_backend(group) if place == "backend" else _nothing()):
            for algorithm in ALGORITHMS:
                if place == "backend" and algorithm == "shm":
                    continue  # refused without a segment (before any byte moves)
                tensor = torch.ones(3)
                dist.all_reduce(tensor, algorithm=algorithm)
                plan = next(p for k, p in WORLD.plans.items()  # this group's: earlier tests' subgroups keep theirs
                            if k[0] == "all_reduce" and k[4] == algorithm and p.group is group)
                checker = plan.rows[0].checker
                seen[algorithm] = (checker.__self__ is group.check, checker.__name__, tensor.tolist())
            try:  # rank 0 calls ring, the others native: every rank names the mismatch
                dist.all_reduce(torch.ones(5), algorithm="ring" if rank == 0 else "native")
                seen["mismatch"] = "none"
            except dist.CollectiveMismatchError as error:
                seen["mismatch"] = ("named", "ring" in str(error) and "native" in str(error))
            after = torch.ones(2)
            dist.all_reduce(after)
            seen["after"] = after.tolist()
        out[place] = seen
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (3,)), indirect=True)
def test_every_backend_and_algorithm_reaches_the_groups_one_checker(world):
    outs = world.run(checkers_and_mismatches, timeout=120)
    n = world.world_size
    for rank, out in enumerate(outs):
        for place, seen in out.items():
            expected_name = {"segment": "in_segment", "backend": "through_backend"}[place]
            for algorithm, (same_object, name, values) in ((a, seen[a]) for a in ALGORITHMS if a in seen):
                assert same_object, (rank, place, algorithm)
                assert name == ("in_first_sync" if algorithm == "shm" else expected_name), (rank, place, algorithm)
                assert values == [float(n)] * 3, (rank, place, algorithm, values)
            assert seen["mismatch"] == ("named", True), (rank, place, seen["mismatch"])
            assert seen["after"] == [float(n)] * 2, (rank, place)
