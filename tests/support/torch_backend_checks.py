"""What the ranks run for tests/comm/test_torch_backend.py: torch's own trainers on the zerocomm c10d backend.

``init_torch_zerocomm`` is a pool's ``init``: it makes ``"zerocomm"`` torch's default backend
(``transport`` = the pool's backend: "gloo" or "mpi").  Every trainer function then builds the
same model twice, trains one copy on the default (zerocomm) group and the other on a
``new_group(backend="gloo")`` of torch's own gloo, with the same data, and returns the largest
parameter difference after every step.
"""
from __future__ import annotations

import gc

import torch
import torch.distributed as td

STEPS = 4


def init_torch_zerocomm(setup) -> None:
    """torch's ``init_process_group(backend="zerocomm")``, the transport chosen by ``pg_options``."""
    from zerocomm.comm.c10d import Options

    store = setup.store
    if store is None:  # under mpiexec: a TCPStore whose port rank 0 broadcasts over MPI
        from mpi4py import MPI
        is_master = setup.rank == 0
        store = td.TCPStore("127.0.0.1", 0, setup.world_size, is_master=is_master, wait_for_workers=False) \
            if is_master else None
        port = MPI.COMM_WORLD.bcast(store.port if is_master else None, root=0)
        if not is_master:
            store = td.TCPStore("127.0.0.1", port, setup.world_size, is_master=False)
    td.init_process_group("zerocomm", store=store, rank=setup.rank, world_size=setup.world_size,
                          timeout=setup.timeout, pg_options=Options(transport=setup.backend))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 5))


def _batch(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + td.get_rank())
    return torch.randn(6, 12, generator=generator)


def _gloo_group():
    return td.new_group(backend="gloo")


def _full(p) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def _train_pair(make, steps: int = STEPS) -> dict:
    """Train ``make(group)`` (→ (module, optimizer)) on zerocomm's group and on gloo's; diffs per step."""
    gloo = _gloo_group()
    ours, theirs = make(td.group.WORLD), make(gloo)
    diffs = []
    for step in range(steps):
        x = _batch(step)
        for module, optimizer in (ours, theirs):
            optimizer.zero_grad()
            module(x).square().mean().backward()
            optimizer.step()
        diffs.append(max((_full(a) - _full(b)).abs().max().item()
                         for a, b in zip(ours[0].parameters(), theirs[0].parameters())))
    moved = max((_full(a) - _full(b)).abs().max().item() for a, b in zip(ours[0].parameters(), _model().parameters()))
    # [Note: teardown order]  The modules go first, then the gloo group.  If a DDP Reducer held the last
    # reference to torch's ProcessGroupGloo, its destructor (run under the GIL, in a dealloc or a gc pass) would
    # join gloo's worker threads while one of them waits for the GIL to drop a Python object kept by a finished
    # work's thread-local state: a deadlock (seen over the MPI transport, about 1 run in 4 at world size 3).
    # destroy_process_group drops the last reference with the GIL released.
    del ours, theirs
    gc.collect()
    td.destroy_process_group(gloo)
    return {"backend": td.get_backend(), "diffs": diffs, "moved": moved,
            "pg": type(td.group.WORLD).__name__}


def ddp_matches_gloo() -> dict:
    from torch.nn.parallel import DistributedDataParallel

    def make(group):
        module = DistributedDataParallel(_model(), process_group=group)
        return module, torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)

    return _train_pair(make)


def zero_redundancy_matches_gloo() -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    def make(group):
        module = DistributedDataParallel(_model(), process_group=group)
        return module, ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                               process_group=group)

    return _train_pair(make)


def fsdp2_matches_gloo() -> dict:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def make(group):
        mesh = DeviceMesh.from_group(group, "cpu")
        module = _model()
        for layer in module:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module, torch.optim.Adam(module.parameters(), lr=0.01)

    return _train_pair(make)


def collectives_on_c10d() -> dict:
    """torch's module functions on the zerocomm default group: results against closed forms."""
    n, r = td.get_world_size(), td.get_rank()
    out = {}
    t = torch.full((5,), float(r + 1))
    td.all_reduce(t)
    out["all_reduce"] = t.tolist() == [n * (n + 1) / 2] * 5
    b = torch.full((3,), float(r))
    td.broadcast(b, src=n - 1)
    out["broadcast"] = b.tolist() == [float(n - 1)] * 3
    gathered = torch.empty(n * 2)
    td.all_gather_into_tensor(gathered, torch.full((2,), float(r)))
    out["all_gather_into_tensor"] = gathered.tolist() == [float(i) for i in range(n) for _ in range(2)]
    parts = [torch.empty(2) for _ in range(n)]
    td.all_gather(parts, torch.full((2,), float(r)))
    out["all_gather"] = [p.tolist() for p in parts] == [[float(i)] * 2 for i in range(n)]
    shard = torch.empty(2)
    td.reduce_scatter_tensor(shard, torch.arange(2 * n, dtype=torch.float32))
    out["reduce_scatter_tensor"] = shard.tolist() == [float(n * (2 * r)), float(n * (2 * r + 1))]
    shard_list = torch.empty(2)
    td.reduce_scatter(shard_list, [torch.full((2,), float(j)) for j in range(n)])
    out["reduce_scatter"] = shard_list.tolist() == [float(n * r)] * 2
    received = [torch.empty(1) for _ in range(n)]
    td.all_to_all(received, [torch.tensor([float(10 * r + j)]) for j in range(n)])
    out["all_to_all"] = [x.item() for x in received] == [float(10 * j + r) for j in range(n)]
    single = torch.empty(n)
    td.all_to_all_single(single, torch.tensor([float(10 * r + j) for j in range(n)]))
    out["all_to_all_single"] = single.tolist() == [float(10 * j + r) for j in range(n)]
    coalesced = [torch.ones(2), torch.ones(3) * 2]
    td.all_reduce_coalesced(coalesced)
    out["all_reduce_coalesced"] = coalesced[0].tolist() == [float(n)] * 2 and coalesced[1].tolist() == [2.0 * n] * 3
    work = td.all_reduce(torch.ones(4), async_op=True)
    out["work_future"] = work.get_future().wait()[0].tolist() == [float(n)] * 4
    td.barrier()
    peer = (r + 1) % n
    if n > 1:
        message = torch.tensor([float(r)])
        inbox = torch.empty(1)
        sends = td.isend(message, dst=peer)
        td.recv(inbox, src=(r - 1) % n)
        sends.wait()
        out["send_recv"] = inbox.item() == float((r - 1) % n)
    return out
