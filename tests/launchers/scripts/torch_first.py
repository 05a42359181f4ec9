"""A program that initializes torch's default group itself, then zerocomm's: torch's stays its own.

Started by torchrun or mpiexec; writes report-RANK.json in the working folder.
"""
import json
import os

import torch
import torch.distributed as td

import zerocomm.comm as dist

if "RANK" in os.environ:  # torchrun
    td.init_process_group("gloo")
else:  # mpiexec (MPICH's Hydra says PMI_RANK and PMI_SIZE): torch's group met through a file in this folder
    td.init_process_group("gloo", init_method=f"file://{os.getcwd()}/torch-store", rank=int(os.environ["PMI_RANK"]),
                          world_size=int(os.environ["PMI_SIZE"]))
dist.init_process_group()  # mpi under mpiexec: its store must not be served where torch's group is kept
mine = torch.tensor([1.0])
td.all_reduce(mine)
theirs = torch.tensor([1.0])
dist.all_reduce(theirs)
report = {"rank": dist.get_rank(), "torch_backend": str(td.get_backend()), "torch_sum": mine.item(),
          "zerocomm_sum": theirs.item()}
dist.destroy_process_group()
report["torch_initialized_after_zerocomm_destroy"] = td.is_initialized()
td.destroy_process_group()
with open(f"report-{report['rank']}.json", "w") as file:  # lines of several ranks on one pipe can interleave
    json.dump(report, file)
