"""The short path of a blocking all_reduce in every way it checks the call (``group.CHECK_*``), with the
tensors a user passes: shaped, small enough to ride in the check's message and not, and each result
against numpy.  The first call of a cell takes the full path and admits it; the rest take the short path,
which the test confirms by the row it finds."""
import numpy as np
import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

SHAPES = [(1, 2), (2, 3), (1,), (4, 2, 2), (7, 11)]  # gloo carries 2 elements in its check, MPI 224 bytes


def _short_rows(group, dtype):
    from zerocomm.comm.group import WORLD
    g = WORLD.default if group is None else group.zerocomm_group
    return g.short.get(("native", dtype))


def short_path_results(through_agree: bool) -> dict:
    """Native SUM all_reduces of shaped tensors, three calls per shape, on a group made for the purpose;
    ``through_agree``: the group's arena is marked unusable first, so a gloo group checks through
    ``Backend.agree`` (a small tensor riding in it) instead of a sync of the segment."""
    from zerocomm.comm.group import CHECK_OFF
    n, rank = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(list(range(n)))
    if through_agree:
        group.zerocomm_group.communicator._zerocomm_no_segment = True  # what a failed segment leaves behind
    wrong, checks = [], set()
    for dtype in (torch.float32, torch.float64):
        for shape in SHAPES:
            for call in range(3):
                base = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
                tensor = torch.from_numpy(base * (rank + 1) + call).to(dtype)
                dist.all_reduce(tensor, group=group, algorithm="native")
                expected = sum(base * (r + 1) + call for r in range(n))
                if tensor.shape != shape or not np.allclose(tensor.double().numpy(), expected):
                    wrong.append((str(dtype), shape, call, tensor.flatten()[:4].tolist()))
        rows = _short_rows(group, dtype)
        checks.add(None if rows is None else rows[0][2])
    dist.destroy_process_group(group)
    return {"wrong": wrong, "checks": sorted(c for c in checks if c is not None), "admitted": None not in checks,
            "checked": CHECK_OFF not in checks}


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
@pytest.mark.parametrize("through_agree", [False, True], ids=["default", "through-agree"])
def test_shaped_tensors_on_the_short_path_match_numpy(world, through_agree):
    from zerocomm.comm.group import CHECK_IN_SYNC, CHECK_RIDES
    outs = world.run(short_path_results, through_agree)
    backend = world.backend
    for rank, out in enumerate(outs):
        assert out["wrong"] == [], (rank, out["wrong"][:3])
        assert out["admitted"] and out["checked"], (rank, out)
        # A group on one host checks through the segment unless it cannot (validate.segment_checks); through
        # the backend, gloo's and MPI's small native calls ride in the check
        expected = CHECK_RIDES if through_agree else CHECK_IN_SYNC
        assert out["checks"] == [expected], (rank, out)
