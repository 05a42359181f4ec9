"""Rank body of ``tests/comm/test_cpu_and_cuda_world.py``: a world for CPU and CUDA tensors, NCCL's stand-in as
its CUDA half (no GPU here)."""
import json

import torch


def world_body(spec):
    """One rank of a "cpu:gloo,cuda:nccl-standin" world (``run_forked``): what it asserts is the test's."""
    import zerocomm.comm as dist
    from zerocomm.comm import staging
    from zerocomm.comm.backends.gloo import GlooBackend
    from zerocomm.comm.backends.nccl import NcclHostStandIn

    dist.init_process_group(**spec.kwargs())
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "cpu:gloo,cuda:nccl-standin", dist.get_backend()
    world = dist.group.WORLD.zerocomm_group
    assert world.backend_type is GlooBackend
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [n * (n + 1) / 2] * 3, t
    twin = staging.cuda_twin(world)  # what a CUDA tensor's call is handed to (every rank asks together)
    assert twin is staging.cuda_twin(world), "the twin is made once"
    assert twin.backend_type is NcclHostStandIn and twin.ranks == world.ranks and twin.rank == world.rank
    x = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(x, group=twin)
    assert x.tolist() == [float(n * i + n * (n - 1) // 2) for i in range(4)], x
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.tensor([rank, -rank], dtype=torch.float32), group=twin)
    assert out.tolist() == [float(v) for r in range(n) for v in (r, -r)], out
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in range(n)]
    sub = dist.new_group(list(range(n)))
    assert dist.get_backend(sub) == "cpu:gloo,cuda:nccl-standin"
    sub_twin = staging.cuda_twin(sub.zerocomm_group)
    assert sub_twin is not None and sub_twin is not twin and sub_twin.backend_type is NcclHostStandIn
    y = torch.ones(5)
    dist.all_reduce(y, group=sub_twin)
    assert y.tolist() == [float(n)] * 5
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "ok": True}), flush=True)
    return 0
