"""What a rank does in the batched collective suites, and how the parent judges the result.

A test sends ONE module-level function to every rank (``pool.run``); that function builds a
``Cases``, loops over groups x dtypes x ops x roots x algorithms, calls the collective through
``cases.call``, compares with numpy through ``cases.expect``, and returns ``cases.report()``
(plain data).  The parent passes the per-rank reports to ``assert_reports``, which fails listing
every mismatch of every rank.  Batching keeps one pool round trip per (test, world).  Not every
algorithm runs every option (shape, root, in_place) with every op: ``full_sweep``, ``takes_turn``
and ``sweep_root`` let the repetition go while each suite's docstring says what is still covered.

[Note: refusals]
``algorithm=`` may be refused with ``UnsupportedError``: that is a correct answer for "ring",
"tree", ... and is recorded, not failed, provided the message is not empty and every member of
the group refused the same case (a refusal on some ranks only would desynchronize them).  The
default path (no ``algorithm=``) and "native" may be refused only in the cells listed in
``NATIVE_MAY_REFUSE``, and only when the message names the dtype.  An error of any other type
aborts the rank's batch with the case named in a note: the ranks may be out of step after it.

Groups: every batch runs on the default group (``group=None``) and on a subgroup made by
``dist.new_group`` on every rank; only members run the subgroup's cases.  Subgroups alternate
between global roots (``src=``/``dst=``) and group roots (``group_src=``/``group_dst=``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np
import torch

from .dist import STANDIN, UnsupportedError, dist
from .reference import compare, rank_input, to_torch

REFUSED = object()
"""What ``Cases.call`` returns when the call was refused with ``UnsupportedError``."""

ALGORITHMS = ("native", "ring", "tree", "shm")
"""Explicit ``algorithm=`` values every collective is called with (besides none at all)."""

NATIVE_MAY_REFUSE = {
    "gloo": (torch.bool,),
    "mpi": (torch.bool, torch.float16, torch.bfloat16),  # MPI has no standard datatype for these
}
"""(backend -> dtypes) where the default algorithm or "native" may say UnsupportedError."""

SHAPES = [(0,), (1,), (7,), (3, 5), (257,)]
"""Empty, one element, sizes that no world size of 2..4 divides, 2-D, several hundred."""

MAX_FAILURES = 100

FULL_SWEEP = (None, "native")
"""Algorithms that run every option on the default group (``full_sweep``); the others take turns (``takes_turn``)."""


def full_sweep(algorithm, group_index: int) -> bool:
    """Whether ``algorithm`` runs every option on the ``group_index``-th group of ``groups()`` (0: the
    default group).  On the subgroup every algorithm takes turns: the subgroup is there for the group
    plumbing (group handles, group roots, non-contiguous members, ranks outside), the same for every op."""
    return algorithm in FULL_SWEEP and group_index == 0


def takes_turn(full: bool, turn: int, option: int, options: int, take: int) -> bool:
    """Whether ``option`` (0 <= option < options) runs on ``turn``.

    With ``full`` (see ``full_sweep``) every option runs.  Otherwise ``take`` options run a turn:
    ``turn * take`` to ``turn * take + take - 1``, modulo ``options``.  So any ``ceil(options / take)``
    consecutive turns run every option: a suite whose turn counts up along an inner loop (the ops
    of a dtype, or the dtypes) at least that many times still runs each option with each algorithm.
    """
    if full:
        return True
    return (option - turn * take) % options < take


def sweep_root(turn: int, shape_index: int, size: int) -> int:
    """The one root a ``full_sweep`` algorithm uses for a shape in the rooted suites (reduce, broadcast,
    scatter, gather): it moves on with the turn and with the shape, so a suite whose turn counts up along
    ``size`` or more consecutive values runs every shape at every root, and with ``size`` or more shapes
    a turn alone runs every root."""
    return (turn + shape_index) % size


def algorithms(*extra: str) -> tuple:
    """``None`` (no ``algorithm=`` argument) first, then the explicit names; only ``None`` under the stand-in."""
    return (None,) if STANDIN else (None,) + ALGORITHMS + extra


def red_op(name: str):
    """``"band"`` -> ``dist.ReduceOp.BAND``."""
    return getattr(dist.ReduceOp, name.upper())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def numel(shape) -> int:
    return math.prod(shape)


def block(src: int, dst: int, count: int, dtype: torch.dtype) -> np.ndarray:
    """Values global rank ``src`` sends to global rank ``dst``: differ by sender and by receiver."""
    return rank_input(src, count, dtype, "max", salt=1000 + dst)


# --- groups --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GroupCase:
    """One group a batch runs on, seen from a member: ``members`` are global ranks in group order."""

    label: str
    members: tuple
    handle: object  # None for the default group
    rank: int  # this process's rank in the group

    def __str__(self) -> str:
        return self.label

    @property
    def size(self) -> int:
        return len(self.members)

    def root(self, role: str, index: int) -> dict:
        """Keyword arguments naming group rank ``index`` as ``role`` ("src" or "dst")."""
        if self.handle is not None and index % 2 == 1:
            return {f"group_{role}": index}
        return {role: self.members[index]}


def subgroup_members(world_size: int) -> list[int]:
    """The subgroup of each world size: every rank but rank 1 (so not contiguous from 4 ranks on)."""
    if world_size <= 2:
        return [world_size - 1]
    return [r for r in range(world_size) if r != 1]


#: Per process, members -> (the default group it was made in, what new_group returned); every rank creates
#: the same subgroups in the same order.
_SUBGROUPS: dict = {}


def subgroup() -> tuple[tuple, object]:
    """The subgroup's members and what ``new_group`` returned on this rank (on a non-member, torch's
    ``GroupMember.NON_GROUP_MEMBER``).  Every rank must call it: the first call creates the group, and so
    does the first call after a test made the default group again (its subgroups went with the old one)."""
    members = tuple(subgroup_members(dist.get_world_size()))
    world = dist.group.WORLD
    made = _SUBGROUPS.get(members)
    if made is None or made[0] is not world:
        _SUBGROUPS[members] = made = (world, dist.new_group(list(members)))
    return members, made[1]


def groups() -> list[GroupCase]:
    """The default group and the subgroup, for those this rank belongs to.  Every rank must call it."""
    world_size, me = dist.get_world_size(), dist.get_rank()
    members, handle = subgroup()
    found = [GroupCase("world", tuple(range(world_size)), None, me)]
    if me in members:
        found.append(GroupCase(f"group{list(members)}", members, handle, members.index(me)))
    return found


# --- buffers -------------------------------------------------------------------------------------

GUARD = 3


def poison(dtype: torch.dtype):
    """A fill value that no expected output holds where it matters (outputs start with it)."""
    return True if dtype is torch.bool else 77


class Guarded:
    """A tensor of ``shape`` in the middle of a larger buffer, to catch writes outside it.

    ``values`` (numpy, from ``rank_input``) fill it; ``None`` fills it with ``poison``.
    """

    def __init__(self, values, dtype: torch.dtype, shape):
        count = numel(shape)
        self.guard = False if dtype is torch.bool else 99
        self.buffer = torch.full((count + 2 * GUARD,), self.guard, dtype=dtype)
        self.tensor = self.buffer[GUARD:GUARD + count].view(shape)
        if values is None:
            self.tensor.fill_(poison(dtype))
        else:
            self.tensor.copy_(to_torch(values, dtype).view(shape))

    def intact(self) -> bool:
        ends = torch.cat([self.buffer[:GUARD], self.buffer[self.buffer.numel() - GUARD:]])
        return bool((ends == self.guard).all())


# --- one rank's batch ----------------------------------------------------------------------------

class Cases:
    """Counts one rank's cases and collects its failures, refusals and result digests."""

    def __init__(self, backend: str):
        self.backend = backend
        self.rank = dist.get_rank()
        self.count = 0
        self.failures: list[str] = []
        self.refusals: dict[str, tuple] = {}  # case -> (ranks expected to refuse too, message)
        self.digests: dict[str, tuple] = {}  # case -> (ranks that must hold the same bits, sha1)

    def call(self, what: str, members, algorithm, fn, *args, dtype=None, **kwargs):
        """``fn(*args, **kwargs, algorithm=algorithm)``; its result, or ``REFUSED``.

        ``members``: the global ranks taking part (they must refuse alike); ``dtype``: the cell's
        dtype, for the refusal policy (None when the call moves no tensor).
        """
        self.count += 1
        if algorithm is not None:
            kwargs["algorithm"] = algorithm
        label = f"{what} algorithm={algorithm or '(default)'}"
        try:
            return fn(*args, **kwargs)
        except UnsupportedError as exc:
            self._refused(label, tuple(members), algorithm, dtype, str(exc))
            return REFUSED
        except Exception as exc:
            exc.add_note(f"rank {self.rank} was running case: {label}")
            raise

    def _refused(self, label, members, algorithm, dtype, message) -> None:
        if not message.strip():
            self.fail(f"{label}: UnsupportedError with an empty message")
        elif algorithm in (None, "native", "auto") and not (
                dtype in NATIVE_MAY_REFUSE.get(self.backend, ()) and dtype_name(dtype) in message):
            self.fail(f"{label}: the {algorithm or 'default'} algorithm must not refuse this cell on "
                      f"{self.backend}: UnsupportedError: {message}")
        else:
            self.refusals[label] = (members, message)

    def expect(self, what: str, actual, expected: np.ndarray) -> None:
        """``actual`` (a tensor or a ``Guarded``) equals ``expected`` (exactly, or to the dtype's
        one-rounding tolerance for floats); a ``Guarded``'s surroundings are untouched."""
        tensor = actual.tensor if isinstance(actual, Guarded) else actual
        problem = compare(tensor, expected, what)
        if problem:
            self.fail(problem)
        if isinstance(actual, Guarded) and not actual.intact():
            self.fail(f"{what}: wrote outside its {tuple(tensor.shape)} tensor: buffer {actual.buffer.tolist()[:40]}")

    def check(self, what: str, condition: bool, detail: str = "") -> None:
        if not condition:
            self.fail(f"{what}: {detail or 'check failed'}")

    def same_everywhere(self, what: str, members, tensor: torch.Tensor) -> None:
        """Records a digest of ``tensor``'s bits; every rank of ``members`` must hold the same."""
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        self.digests[what] = (tuple(members), hashlib.sha1(raw).hexdigest())

    def fail(self, message: str) -> None:
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(f"rank {self.rank}: {message}")
        elif len(self.failures) == MAX_FAILURES:
            self.failures.append(f"rank {self.rank}: ... more failures left out")

    def report(self) -> dict:
        return {"rank": self.rank, "count": self.count, "failures": self.failures,
                "refusals": self.refusals, "digests": self.digests}


# --- the parent's side ---------------------------------------------------------------------------

def assert_reports(reports: list[dict], *, min_cases: int = 1) -> str:
    """Fails with every rank's failures, uneven refusals and diverging results; else returns a summary."""
    __tracebackhide__ = True  # pytest shows the message, not this function
    problems = [failure for report in reports for failure in report["failures"]]
    by_rank = {report["rank"]: report for report in reports}
    for kind in ("refusals", "digests"):
        cases = {case: members for report in reports for case, (members, _) in report[kind].items()}
        for case, members in sorted(cases.items()):
            seen = {rank: by_rank[rank][kind].get(case, (None, None))[1] for rank in members}
            if kind == "refusals" and any(message is None for message in seen.values()):
                problems.append(f"{case}: refused on ranks {sorted(r for r, m in seen.items() if m is not None)} "
                                f"but not on the others of {list(members)}")
            if kind == "digests" and len(set(seen.values())) > 1:
                problems.append(f"{case}: ranks of {list(members)} hold different bits: {seen}")
    total = sum(report["count"] for report in reports)
    if total < min_cases:
        problems.append(f"only {total} cases ran on all ranks together, expected at least {min_cases}")
    refusals = sorted({case for report in reports for case in report["refusals"]})
    summary = f"{total} calls over {len(reports)} ranks; {len(refusals)} refused cases"
    if refusals:
        example = next(report["refusals"][refusals[0]][1] for report in reports if refusals[0] in report["refusals"])
        summary += f", e.g. {refusals[0]}: {example}"
    assert not problems, f"{len(problems)} problems ({summary}):\n" + "\n".join(problems)
    print(summary)
    return summary
