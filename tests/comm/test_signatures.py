"""zerocomm.comm is a drop-in for torch.distributed: same names, parameters, order and defaults.

zerocomm's own options may only follow torch's parameters, keyword-only.
"""
import inspect

import pytest
import torch.distributed as td

import zerocomm.comm as dist

TORCH_FUNCTIONS = [
    "init_process_group", "destroy_process_group", "is_initialized", "is_available", "get_rank", "get_world_size",
    "get_backend", "new_group", "get_global_rank", "get_group_rank", "barrier", "broadcast", "scatter", "reduce",
    "all_reduce", "gather", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "all_gather_single", "reduce_scatter_single",
]


def _torch_params(function):
    return list(inspect.signature(function).parameters.values())


@pytest.mark.parametrize("name", TORCH_FUNCTIONS)
def test_signature_matches_torch(name):
    ours = _torch_params(getattr(dist, name))
    theirs = _torch_params(getattr(td, name))
    assert len(ours) >= len(theirs), f"{name}: zerocomm lacks parameters {[p.name for p in theirs[len(ours):]]}"
    for mine, torch_param in zip(ours, theirs):
        assert (mine.name, mine.kind) == (torch_param.name, torch_param.kind), \
            f"{name}: parameter {mine.name} ({mine.kind}) differs from torch's {torch_param.name} ({torch_param.kind})"
        assert mine.default == torch_param.default, \
            f"{name}({mine.name}=...): default {mine.default!r} differs from torch's {torch_param.default!r}"
    extras = ours[len(theirs):]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras), \
        f"{name}: zerocomm's own options must be keyword-only, got {[(p.name, p.kind) for p in extras]}"


def test_p2pop_signature_matches_torch():
    ours = _torch_params(dist.P2POp.__init__)
    theirs = _torch_params(td.P2POp.__init__)
    assert [(p.name, p.default) for p in ours] == [(p.name, p.default) for p in theirs]


def test_exports_cover_torch_names():
    missing = [n for n in TORCH_FUNCTIONS + ["ReduceOp", "group", "GroupMember", "Work", "P2POp"] if n not in dist.__all__]
    assert not missing


def test_reduce_op_is_torchs():
    assert dist.ReduceOp.SUM == td.ReduceOp.SUM
    assert {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"} <= set(dir(dist.ReduceOp))


def test_group_world_is_none_before_init():
    assert not dist.is_initialized()
    assert dist.group.WORLD is None


def test_errors_are_torch_dist_errors():
    for error in (dist.CommTimeoutError, dist.UnsupportedError, dist.CollectiveMismatchError,
                  dist.NotInitializedError, dist.InvalidArgumentError):
        assert issubclass(error, td.DistError)
    assert issubclass(dist.InvalidArgumentError, ValueError)
