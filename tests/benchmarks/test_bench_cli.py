"""End to end: ``python -m zerocomm.benchmarks`` on 2 local ranks, one tiny size, ``--check``.

gloo forks its ranks; MPI re-runs the command under mpiexec.  The MPI case needs
zerocomm.comm (torch's CPU wheel has no MPI backend), so it is skipped under the
``ZEROCOMM_BENCH_STANDIN=torch`` stand-in.
"""
import json
import os
import subprocess
import sys

import pytest

from zerocomm.benchmarks import units
from zerocomm.benchmarks.target import STANDIN_ENV, target_name

STANDIN = target_name() == "torch"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", [
    "gloo",
    pytest.param("mpi", marks=pytest.mark.skipif(STANDIN, reason=f"{STANDIN_ENV}=torch: torch has no MPI backend")),
])
def test_cli_prints_a_checked_row_for_every_op(backend, tmp_path):
    json_path = tmp_path / "rows.json"
    command = [sys.executable, "-m", "zerocomm.benchmarks", "--backend", backend, "--nprocs", "2",
               "--sizes", "64B", "--warmup", "1", "--iters", "2", "--check", "--json", str(json_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"

    lines = done.stdout.splitlines()
    assert any("nccl-tests" in line for line in lines if line.startswith("#")), done.stdout
    table = {line.split()[0] for line in lines if line and not line.startswith(("#", "-", "collective"))}
    assert table == set(units.COLLECTIVES), done.stdout
    assert "# check: 0 wrong element(s)" in done.stdout

    data = json.loads(json_path.read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["backend"] == backend
    native = {row["collective"]: row for row in data["rows"] if row["algorithm"] == "native"}
    assert set(native) == set(units.COLLECTIVES)
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in native.values())
    # every algorithm that ran got its result right
    assert all(row["wrong"] == 0 for row in data["rows"] if row["time_us"] is not None)
