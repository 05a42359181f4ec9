"""zerocomm as torch's c10d backend: ``init_process_group(backend="zerocomm")`` in plain torch code.

torch's module functions, DistributedDataParallel, FSDP2 (``fully_shard``) and
ZeroRedundancyOptimizer run on the zerocomm default group; the same model trained on torch's
own gloo (``new_group(backend="gloo")``) in the same ranks gives the same parameters after
every step.  World sizes 2 and 3, over zerocomm's gloo and MPI transports.
"""
import pytest

from support import torch_backend_checks as checks
from support.harness import ForkPool, MpiexecPool, MpiUnavailable
from support.worlds import MPI_SKIP_REASON, STANDIN, STANDIN_MPI_SKIP_REASON, worlds

pytestmark = pytest.mark.skipif(STANDIN, reason="the torch.distributed stand-in has no zerocomm c10d backend")

WORLDS = [("gloo", 2), ("gloo", 3), ("mpi", 2), ("mpi", 3)]
RUN_TIMEOUT_S = 120.0
#: Float tolerance: the two runs reduce in different orders (zerocomm's algorithm against gloo's ring),
#: a few float32 ulps of the gradients per step, amplified a little by momentum / Adam over 4 steps.
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{b}-{n}" for b, n in WORLDS])
def torch_world(request, tmp_path_factory):
    backend, size = request.param
    workdir = tmp_path_factory.mktemp(f"torch-backend-{backend}-{size}")
    if backend == "gloo":
        pool = ForkPool(size, backend, workdir=workdir, init=checks.init_torch_zerocomm)
    else:
        try:
            pool = MpiexecPool(size, backend, workdir=workdir, init=checks.init_torch_zerocomm)
        except MpiUnavailable as exc:
            pytest.skip(reason=f"{MPI_SKIP_REASON} ({exc})")
    yield pool
    pool.close()


def test_torch_functions_on_zerocomm_backend(torch_world):
    for rank, result in enumerate(torch_world.run(checks.collectives_on_c10d, timeout=RUN_TIMEOUT_S)):
        wrong = [name for name, ok in result.items() if not ok]
        assert not wrong, f"rank {rank}: wrong results from {wrong}"


@pytest.mark.parametrize("trainer", [checks.ddp_matches_gloo, checks.zero_redundancy_matches_gloo,
                                     checks.fsdp2_matches_gloo], ids=["ddp", "zero_redundancy", "fsdp2"])
def test_trainer_matches_torch_gloo(torch_world, trainer):
    for rank, result in enumerate(torch_world.run(trainer, timeout=RUN_TIMEOUT_S)):
        assert result["backend"] == "zerocomm" and result["pg"] == "ZerocommProcessGroup", result
        assert result["moved"] > 1e-3, f"rank {rank}: training did not change the parameters: {result}"
        for step, diff in enumerate(result["diffs"]):
            assert diff <= TOLERANCE, (f"rank {rank}: step {step}: parameters differ from torch gloo's by {diff} "
                                       f"(tolerance {TOLERANCE}); all steps: {result['diffs']}")


def ddp_on_a_zerocomm_group() -> dict:
    """torch's DDP handed zerocomm's own groups as they are (``group.WORLD``, and a ``new_group`` of the first
    and last ranks), and the ProcessGroup methods a comm hook calls on them; closed forms: rank r's input is
    all r + 1.  On the rank outside the subgroup (world size 3), ``monitored_barrier`` returns with torch's
    warning."""
    import warnings

    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    import zerocomm.comm as dist
    from zerocomm.comm.c10d import as_process_group

    r, n = dist.get_rank(), dist.get_world_size()
    members = sorted({0, n - 1})
    world, sub = dist.group.WORLD, dist.new_group(members)
    result = {"is_process_group": isinstance(world, td.ProcessGroup), "same_handle": as_process_group() is world}
    for name, group in (("world", world), ("sub", sub)):
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dist.monitored_barrier(group)
            result["non_member_warning"] = [str(w.message) for w in caught]
            continue
        torch.manual_seed(0)
        ddp = DistributedDataParallel(torch.nn.Linear(4, 2), process_group=group)
        ddp(torch.full((3, 4), float(r + 1))).sum().backward()
        t = torch.full((2,), float(r + 1))
        summed = group.allreduce([t]).get_future().wait()[0].tolist()
        group.monitored_barrier()
        result[name] = {"weight": ddp.module.weight.grad.tolist(), "bias": ddp.module.bias.grad.tolist(),
                        "summed": summed, "rank": (group.rank(), dist.get_rank(group)), "ranks": group.ranks}
        del ddp
    if sub is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(sub)  # the handle new_group returned destroys its group
        try:
            dist.all_reduce(torch.ones(1), group=sub)
        except dist.InvalidArgumentError as error:
            result["after_destroy"] = str(error)
    return result


@pytest.mark.parametrize("world", worlds(("gloo",), (2, 3)), indirect=True)
def test_ddp_and_hook_methods_on_a_zerocomm_group(world):
    n = world.world_size
    members = sorted({0, n - 1})
    for rank, result in enumerate(world.run(ddp_on_a_zerocomm_group, timeout=RUN_TIMEOUT_S)):
        assert result["is_process_group"] and result["same_handle"], (rank, result)
        for name, ranks in (("world", list(range(n))), ("sub", members)):
            if rank not in ranks:
                assert name not in result, (rank, result)
                assert result["non_member_warning"] == [
                    f"Running monitored_barrier on global rank {rank} which does not belong to the given group."]
                continue
            got = result[name]
            # d(sum(W x + b))/dW[i][j] = sum over the batch of x[:, j] = 3 (r + 1), averaged over the members.
            mean = sum(m + 1 for m in ranks) / len(ranks)
            assert got["weight"] == [[3 * mean] * 4] * 2, (rank, name, got)
            assert got["bias"] == [3.0, 3.0], (rank, name, got)
            assert got["summed"] == [mean * len(ranks)] * 2, (rank, name, got)
            assert got["rank"] == (ranks.index(rank),) * 2 and got["ranks"] == ranks, (rank, name, got)
        if rank in members:
            assert "was destroyed" in result.get("after_destroy", ""), (rank, result)
