"""The capability matrix's one-line summary at the end of the session."""
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


@pytest.fixture(scope="session")
def capability_summary():
    return _SUMMARY


def pytest_terminal_summary(terminalreporter):
    if _SUMMARY.passed or _SUMMARY.refused or _SUMMARY.skipped:
        terminalreporter.write_line(_SUMMARY.line())
