"""The MPI mismatch check's two schedules meeting: ranks checking in MPI's collective (a native call) and
ranks checking in recursive doubling's own messages (``_mpicheck.c``), in every mix.

The collective's ranks answer the recursive-doubling ranks' messages, and those then join the collective
(see the note on answering in ``_mpicheck.c``): every rank must raise ``CollectiveMismatchError`` naming
both sides, its tensor untouched, and the group must work after it.  Three ranks exercise the fold of the
ranks beyond a power of two (each side of it), four the plain exchanges; each mix runs twice, so the
second call takes the short path (in C where built).
"""
import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

NOT_BUILT = "the _mpifast extension was not built or not bound (no compiler, or an MPI other than MPICH)"


def every_mix() -> dict:
    """For each proper, non-empty set of ranks calling native (the rest recursive doubling), twice: what
    each call raised, whether its tensor stayed as it was, and a SUM all_reduce of ones after it."""
    from zerocomm.comm.group import WORLD
    if WORLD.default.communicator._fast is None:
        return {"skip": NOT_BUILT}
    n, rank = dist.get_world_size(), dist.get_rank()
    out = {}
    for mix in range(1, (1 << n) - 1):
        algorithm = "native" if mix >> rank & 1 else "recursive_doubling"
        for attempt in range(2):
            tensor = torch.full((4,), float(rank + 1))
            try:
                dist.all_reduce(tensor, algorithm=algorithm)
                outcome = ("no error", "")
            except dist.CommError as error:
                outcome = (type(error).__name__, str(error))
            after = torch.ones(2)
            dist.all_reduce(after)
            out[(mix, attempt)] = (*outcome, tensor.tolist() == [float(rank + 1)] * 4, after.tolist())
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (3, 4)), indirect=True)
def test_every_mix_of_native_and_recursive_doubling_raises_in_step(world):
    outs = world.run(every_mix, timeout=120)
    if "skip" in outs[0]:
        pytest.skip(outs[0]["skip"])
    n = len(outs)
    assert len(outs[0]) == 2 * ((1 << n) - 2), sorted(outs[0])
    for rank, out in enumerate(outs):
        for (mix, attempt), (name, message, untouched, after) in out.items():
            case = (rank, f"native on ranks {[r for r in range(n) if mix >> r & 1]}", attempt)
            assert name == "CollectiveMismatchError", (case, name, message)
            assert "algorithm native" in message and "algorithm recursive_doubling" in message, (case, message)
            assert untouched, f"{case}: the tensor changed though the call was refused"
            assert after == [float(n)] * 2, (case, after)
