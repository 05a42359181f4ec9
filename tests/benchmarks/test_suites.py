"""The pytest-benchmark suites still run (each benchmark once, timing off): they live outside
``tests/`` and would otherwise rot unnoticed.  The multi-rank suite itself fails if its ranks were
started more than once, i.e. if any round timed a launch."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_collective_suite_runs_on_one_long_lived_pool():
    pytest.importorskip("pytest_benchmark", reason="the suites need pytest-benchmark: pip install 'zerocomm[bench]'")
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/suites/test_collectives_mp.py", "-q",
                           "-p", "no:cacheprovider", "--benchmark-disable"], cwd=ROOT, capture_output=True,
                          text=True, timeout=200, env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "8 passed" in done.stdout.splitlines()[-1]


@pytest.mark.timeout(240)
def test_hot_path_suite_runs():
    """The single-process kernel suite imports what the library exports today (it once imported a
    module that had moved, and nothing noticed)."""
    pytest.importorskip("pytest_benchmark", reason="the suites need pytest-benchmark: pip install 'zerocomm[bench]'")
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/suites/test_hot_paths.py", "-q",
                           "-p", "no:cacheprovider", "--benchmark-disable"], cwd=ROOT, capture_output=True,
                          text=True, timeout=200, env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
