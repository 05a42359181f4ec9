"""The suites reuse the tests' rank pools (tests/support/harness.py): their ranks stay alive across
benchmarks, so a benchmark times collectives, not process start-up."""
import os
import sys

_TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
