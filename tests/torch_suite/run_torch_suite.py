"""Run torch's own ``_DistTestBase`` cases (torch/testing/_internal/distributed/distributed_test.py, from the
installed torch) on CPU with ``dist`` replaced by ``zerocomm.comm``.  Opt-in: not collected by the default
test run (``tests/torch_suite`` holds no ``test_*.py``).

    flock /tmp/zerocomm-heavy.lock python tests/torch_suite/run_torch_suite.py --world-size 2 [-k EXPR] [--junit F]
        [--no-torch-default-group]   # zerocomm.comm only: torch's default group left uninitialized

Each case forks ``world-size`` ranks (torch's ``MultiProcessTestCase``; fork, not spawn, so the patched
module is what the ranks run); every rank calls ``zerocomm.comm.init_process_group("gloo")`` and, unless
``--no-torch-default-group``, torch's ``init_process_group("zerocomm")`` too, so the cases that hand torch's
DDP the default group run DDP on zerocomm's c10d backend.  The script prints pytest's summary, then the pass
rate = passed / (passed + failed), torch's own skips (CUDA, NCCL, MPI-only cases) apart, and the cases
zerocomm excludes (``torch_suite_cases.EXCLUDED``, each with its reason), counted both ways.
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
    junit = args.junit or os.path.join(os.environ["TEMP_DIR"], "junit.xml")
    argv += ["--junitxml", junit]
    status = pytest.main(argv)
    if os.path.exists(junit):
        print(summary(junit, args.world_size))
    return status


def summary(junit: str, world_size: int) -> str:
    """Pass rate from pytest's JUnit report: passed / (passed + failed), torch's own skips apart; zerocomm's
    exclusions (``torch_suite_cases.EXCLUDED``) listed with their reasons and counted both ways."""
    import xml.etree.ElementTree as ElementTree
    counts = {"passed": 0, "failed": 0, "excluded": 0, "skipped": 0}
    excluded = []
    for case in ElementTree.parse(junit).iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            message = skipped.get("message", "")
            kind = "excluded" if "excluded by zerocomm" in message else "skipped"
            counts[kind] += 1
            if kind == "excluded":
                excluded.append(f"  {case.get('name')}: {message.split('excluded by zerocomm: ', 1)[-1][:160]}")
        elif case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        else:
            counts["passed"] += 1
    ran = counts["passed"] + counts["failed"]
    lines = [f"torch suite, world size {world_size}: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['excluded']} excluded by zerocomm, {counts['skipped']} skipped by torch's own conditions",
             f"pass rate {counts['passed'] / max(ran, 1):.1%} of {ran} cases run; "
             f"{counts['passed'] / max(ran + counts['excluded'], 1):.1%} counting the exclusions as failures"]
    return "\n".join(lines + (["excluded:"] + excluded if excluded else []))


if __name__ == "__main__":
    sys.exit(main())
