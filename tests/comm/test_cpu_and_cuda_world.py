"""One world for CPU and CUDA tensors, as torch's default ("cpu:gloo,cuda:nccl") on a machine with a GPU per rank.

No GPU here, so the CUDA half is NCCL's stand-in (``backends.STAND_INS``: the NCCL backend's own methods over
gloo and host memory): ``init_process_group("cpu:gloo,cuda:nccl-standin")`` makes the world torch's default
would be on a GPU machine, with the stand-in where NCCL would be.  Checked at 2 and 3 ranks: ``get_backend``
answers the device map, CPU calls run on the gloo world, the CUDA twin (what CUDA tensors are handed to) is a
working communicator over the same ranks, made once and shared by the calls that ask, and subgroups made by
``new_group`` follow the world.  The choice of the default backend is checked with CUDA faked, and the README's
example runs verbatim under torchrun in a world chosen as on a machine with a GPU per rank.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zerocomm.comm import bootstrap
from zerocomm.comm.errors import InvalidArgumentError

from launchers.test_launchers import readme_example
from support.launchers import clean_env, launch, tool


@pytest.mark.parametrize("n", [2, 3])
def test_cpu_and_cuda_world_with_the_nccl_standin(n):
    # Ranks forked from a fresh interpreter, not from pytest's process (whose torch state they would inherit).
    done = subprocess.run([sys.executable, "-c", _FRESH.format(n=n)], capture_output=True, text=True, timeout=180,
                          cwd=TESTS_DIR)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The ranks share one stdout: their lines may run together, so each report is found by its own pattern.
    ranks = sorted(json.loads(report)["rank"] for report in re.findall(r'\{"rank": \d+, "ok": true\}', done.stdout))
    assert ranks == list(range(n)), done.stdout + done.stderr[-3000:]


TESTS_DIR = str(Path(__file__).resolve().parents[1])
_FRESH = """
import sys
from support.cpu_cuda_world import world_body
from zerocomm.benchmarks.launch import run_forked
sys.exit(run_forked({n}, "cpu:gloo,cuda:nccl-standin", world_body))
"""


def test_backend_strings_parse_as_torch_takes_them():
    assert bootstrap.device_backends("gloo") == ("gloo", None)
    assert bootstrap.device_backends("nccl") == ("nccl", None)  # NCCL alone, as torch's "nccl"
    assert bootstrap.device_backends("cuda:nccl") == ("nccl", None)
    assert bootstrap.device_backends("cpu:gloo") == ("gloo", None)
    assert bootstrap.device_backends("cpu:gloo,cuda:nccl") == ("gloo", "nccl")
    assert bootstrap.device_backends("cuda:nccl,cpu:gloo") == ("gloo", "nccl")
    assert bootstrap.device_backends("cpu:gloo,cuda:gloo") == ("gloo", None)  # CUDA staged through the host
    for bad in ("cpu:nccl", "cpu:gloo,cpu:gloo", "tpu:xla", "cpu:gloo,cuda:mpi"):
        with pytest.raises(InvalidArgumentError, match="device:backend"):
            bootstrap.device_backends(bad)


def test_default_backend_is_cpu_and_cuda_where_every_local_rank_has_a_gpu(monkeypatch):
    monkeypatch.delenv("PMI_RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert bootstrap.default_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # two ranks per GPU: NCCL refuses that; gloo stages CUDA tensors
    assert bootstrap.default_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bootstrap.default_backend() == "gloo"


#: Loaded first in every rank: CUDA reported present, a GPU per local rank, before the README's script runs.
_PRETEND_GPUS = """import torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 8
torch.distributed.is_nccl_available = lambda: True
"""


def test_readme_example_verbatim_in_a_world_chosen_for_a_gpu_per_rank(tmp_path):
    """The README's script, unchanged, under torchrun, where CUDA reports a GPU per rank: the world it gets is
    "cpu:gloo,cuda:nccl", and its CPU tensors reduce there (an NCCL world, as before, would refuse them)."""
    (tmp_path / "script.py").write_text(readme_example())
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_PRETEND_GPUS)
    env = clean_env(PYTHONPATH=str(tmp_path / "site"))
    done = launch([tool("torchrun"), "--standalone", "--nproc-per-node", "2", "script.py"], tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "cpu:gloo,cuda:nccl [1.0, 1.0, 1.0, 1.0] [0.0, 1.0, 2.0, 3.0]" in done.stdout, done.stdout[-4000:]
