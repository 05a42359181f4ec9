"""The torch-optimizer surface on a GPU over NCCL: parameter groups, the config's optimizer and schedule, and a
checkpoint that restores CUDA buffers, frozen parameters, the schedule and client state, with the optimizer
state on the device or offloaded to the host (support/zero_api_checks.py ``device_resume``).

One rank per GPU, started with spawn (CUDA cannot be forked); without a CUDA device the module skips at
collection, decided without initializing CUDA.
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0
if GPUS < 1:
    pytest.skip(reason="needs a CUDA device (none on this machine)", allow_module_level=True)

from support import zero_api_checks  # noqa: E402


@pytest.mark.timeout(600)
def test_groups_schedule_and_checkpoint_on_one_gpu():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    store_path = os.path.join(tempfile.mkdtemp(), "store")
    process = context.Process(target=zero_api_checks.device_rank_main, args=(0, 1, store_path, queue))
    process.start()
    rank, failures = queue.get(timeout=540)
    process.join(timeout=60)
    assert not failures, "\n".join(failures)
