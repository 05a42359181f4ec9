"""Start ranks with the launchers users start them with (torchrun, ``python -m torch.distributed.run``,
mpiexec), as subprocesses with a deadline: on the deadline the launcher's whole session is killed and the
test fails showing its output."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
LAUNCH_TIMEOUT_S = 180


def tool(name: str) -> str:
    """The launcher ``name`` installed next to this Python (the README's set-up puts torchrun and mpiexec there)."""
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed next to this Python ({BIN}); the README's set-up installs it")
    return str(path)


def clean_env(**extra) -> dict:
    """This process's environment without zerocomm's, torchelastic's and MPI's variables (a launcher sets its
    own), one intra-op thread per rank, unbuffered output, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROCOMM_", "TORCHELASTIC_", "PMI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def launch(command: list, cwd: Path, timeout: float = LAUNCH_TIMEOUT_S, env=None) -> subprocess.CompletedProcess:
    """Run ``command`` in its own session and return it finished, its output in ``stdout``."""
    proc = subprocess.Popen(command, cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish within {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, None)
