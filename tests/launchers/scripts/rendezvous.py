"""One rank started by hand (no launcher), meeting its peers through the init_method given, writing
report-RANK.json: ``python rendezvous.py INIT_METHOD RANK WORLD_SIZE`` (env:// reads RANK and WORLD_SIZE
from the environment instead, with MASTER_ADDR and MASTER_PORT)."""
import json
import sys

import torch
import torch.distributed as td

import zerocomm.comm as dist

init_method = sys.argv[1]
if init_method == "env://":
    dist.init_process_group("gloo", init_method=init_method)
else:
    dist.init_process_group("gloo", init_method=init_method, rank=int(sys.argv[2]), world_size=int(sys.argv[3]))
mine = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(mine)
report = {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": mine.item(), "torch_rank": td.get_rank()}
dist.destroy_process_group()
with open(f"report-{report['rank']}.json", "w") as file:
    json.dump(report, file)
