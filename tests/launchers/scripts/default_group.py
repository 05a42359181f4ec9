"""One rank's view of the world through zerocomm and through torch's own API, written to report-RANK.json
in the working folder.

Started by a launcher (torchrun, ``python -m torch.distributed.run``, mpiexec); takes no arguments.
"""
import json
import socket

import torch
import torch.distributed as td
from torch.utils.data import DistributedSampler

import zerocomm.comm as dist

dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
report = {"rank": rank, "size": n, "host": socket.gethostname(), "zerocomm_backend": str(dist.get_backend()),
          "torch_rank": td.get_rank(), "torch_size": td.get_world_size(), "torch_backend": str(td.get_backend()),
          "sampler": list(DistributedSampler(list(range(10)), shuffle=False))}
mine = torch.tensor([float(rank + 1)])
td.all_reduce(mine)  # torch's own collective, on its default group
report["torch_sum"] = mine.item()
mine = torch.tensor([float(rank + 1)])
dist.all_reduce(mine)
report["zerocomm_sum"] = mine.item()
ends = td.new_group(sorted({0, n - 1}))  # torch's new_group under a default group that is zerocomm's world
if rank in (0, n - 1):
    mine = torch.tensor([float(rank + 1)])
    td.all_reduce(mine, group=ends)
    report["ends_sum"] = mine.item()
gathered = [None] * n
td.all_gather_object(gathered, rank * 10)
report["gathered"] = gathered
dist.destroy_process_group()
report["initialized_after_destroy"] = [dist.is_initialized(), td.is_initialized()]
with open(f"report-{report['rank']}.json", "w") as file:  # lines of several ranks on one pipe can interleave
    json.dump(report, file)
