"""One task of a simulated ``srun python slurm_task.py``: only Slurm's variables say who it is.

It joins with ``init_process_group()`` (no backend, no init_method, so ``env://``), all_reduces, all_gathers
every rank's host name, prints one line and writes ``report-RANK.json`` in the working directory with what it
saw: torch's variables before init (none are set) and after (what zerocomm derived from Slurm's).
"""
import json
import os
import socket

import torch

import zerocomm.comm as dist

TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
before = {name: os.environ.get(name) for name in TORCH_VARIABLES}
dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
# Integer values, so the sums are exact in any order: 1 + ... + n, and 0 + ... + (n - 1) from Slurm's ids.
mine = torch.tensor([float(rank + 1), float(os.environ["SLURM_PROCID"])])
dist.all_reduce(mine)
hosts = [None] * n
dist.all_gather_object(hosts, socket.gethostname())
after = {name: os.environ.get(name) for name in TORCH_VARIABLES}
report = {"rank": rank, "size": n, "backend": str(dist.get_backend()), "sums": mine.tolist(), "hosts": hosts,
          "host": socket.gethostname(), "slurm_procid": int(os.environ["SLURM_PROCID"]), "before": before,
          "after": after}
print(f"task {report['slurm_procid']} on {report['host']}: rank {rank}/{n} local {after['LOCAL_RANK']}/"
      f"{after['LOCAL_WORLD_SIZE']} master {after['MASTER_ADDR']}:{after['MASTER_PORT']} backend "
      f"{report['backend']} all_reduce {report['sums']} hosts {hosts}", flush=True)
dist.destroy_process_group()
with open(f"report-{rank}.json", "w") as file:
    json.dump(report, file)
