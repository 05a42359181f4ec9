"""Run torch's own ``_DistTestBase`` cases (torch/testing/_internal/distributed/distributed_test.py, from the
installed torch) on CPU with ``dist`` replaced by ``zerocomm.comm``.  Opt-in: not collected by the default
test run (``tests/torch_suite`` holds no ``test_*.py``).

    flock /tmp/zerocomm-heavy.lock python tests/torch_suite/run_torch_suite.py --world-size 2 [-k EXPR] [--junit F]
        [--no-torch-default-group]   # zerocomm.comm only: torch's default group left uninitialized

Each case forks ``world-size`` ranks (torch's ``MultiProcessTestCase``; fork, not spawn, so the patched
module is what the ranks run); every rank calls ``zerocomm.comm.init_process_group("gloo")``.  The script
prints pytest's summary; pass rate = passed / (passed + failed), skips (CUDA, NCCL, MPI-only cases) apart.
"""
import argparse
import multiprocessing
import os
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--junit", default=None, help="write a JUnit XML report here")
    parser.add_argument("--no-torch-default-group", dest="torch_default_group", action="store_false",
                        help="do not also initialize torch's default group on backend 'zerocomm' (the DDP cases, "
                             "which hand torch's DDP the default group, then fail)")
    parser.add_argument("--case-timeout", type=int, default=60, help="seconds per case (torch's default is 300)")
    args = parser.parse_args()
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(args.world_size),
                      DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.case_timeout))
    if args.torch_default_group:
        os.environ["ZEROCOMM_SUITE_TORCH_PG"] = "1"
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="zerocomm-torch-suite-"))
    import pytest
    here = os.path.dirname(os.path.abspath(__file__))
    argv = [os.path.join(here, "torch_suite_cases.py"), "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "--rootdir", here, "-rfE", "--tb=line"]
    if args.k:
        argv += ["-k", args.k]
    if args.junit:
        argv += ["--junitxml", args.junit]
    return pytest.main(argv)


if __name__ == "__main__":
    sys.exit(main())
