"""The one-line summaries at the end of the session: the capability matrix's, and the differential suite's (one
per world size)."""
import collections

import pytest


class CapabilitySummary:
    def __init__(self):
        self.passed = 0
        self.refused = 0
        self.skipped = collections.Counter()

    def add(self, passed: int, refused: int) -> None:
        self.passed += passed
        self.refused += refused

    def skip(self, cells: int, reason: str) -> None:
        self.skipped[reason] += cells

    def line(self) -> str:
        skipped = sum(self.skipped.values())
        why = "; ".join(f"{count} because {reason}" for reason, count in self.skipped.items())
        return (f"capability matrix: {self.passed} cells passed, {self.refused} cells correctly refused, "
                f"{skipped} cells skipped" + (f" ({why})" if why else ""))


_SUMMARY = CapabilitySummary()
_DIFFERENTIAL: list = []


@pytest.fixture(scope="session")
def capability_summary():
    return _SUMMARY


@pytest.fixture(scope="session")
def differential_summary():
    """Lines the differential suite (test_differential.py) appends, one per world size."""
    return _DIFFERENTIAL


def pytest_terminal_summary(terminalreporter):
    if _SUMMARY.passed or _SUMMARY.refused or _SUMMARY.skipped:
        terminalreporter.write_line(_SUMMARY.line())
    for line in _DIFFERENTIAL:
        terminalreporter.write_line(line)
