"""A program that initializes torch's default group itself, then zerocomm's: torch's stays its own.

Started by torchrun; writes report-RANK.json in the working folder.
"""
import json

import torch
import torch.distributed as td

import zerocomm.comm as dist

td.init_process_group("gloo")
dist.init_process_group()
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
