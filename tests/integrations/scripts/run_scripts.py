"""Run several training scripts one after another in this process (each as ``__main__``, with its own
``sys.argv``), so that one launch pays for ``import torch`` and the process group once.

Launch: torchrun --nproc-per-node 2 run_scripts.py PLAN.json   (PLAN: a list of [script, arg, ...])
"""
import json
import runpy
import sys

import zerocomm.comm as dist

for command in json.loads(open(sys.argv[1]).read()):
    sys.argv = list(command)
    runpy.run_path(command[0], run_name="__main__")
if dist.is_initialized():
    dist.destroy_process_group()
