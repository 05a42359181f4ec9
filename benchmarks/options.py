"""The command line's shared vocabulary: the one convention for multi-value flags, argument types, and
the errors that stop a run before any rank starts.

Convention: a flag that takes several values takes them comma-separated in one argument,
``--nprocs 2,4`` or ``--nprocs=2,4``, everywhere (``--backends``, ``--algorithms``, ``--ops``,
``--sizes``, ``--world-sizes``, ...).  Each item is checked by the argument's type, so argparse
itself reports ``argument --algorithms: unknown algorithm 'foo'; expected one of ...``.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")

BACKENDS = ("gloo", "mpi", "nccl")


class UsageError(ValueError):
    """A bad argument or environment value, found before any rank started; the message names it."""


def split_commas(text: str) -> list[str]:
    """The items of a comma-separated value, stripped; empty items are an error."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; expected comma-separated values, e.g. 'a,b'")
    return items


def list_of(item: Callable[[str], T], name: str = "value") -> Callable[[str], list[T]]:
    """An argparse ``type`` reading a comma-separated list whose items ``item`` converts (and checks)."""
    def parse(text: str) -> list[T]:
        values = [item(part) for part in split_commas(text)]
        if len(set(map(repr, values))) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a {name}")
        return values

    parse.__name__ = f"comma-separated {name}s"  # argparse quotes this name in "invalid ... value"
    return parse


def choice(choices: Iterable[str], name: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    """An argparse ``type`` accepting one of ``choices`` (or an alias of one), case-insensitively."""
    choices, aliases = tuple(choices), dict(aliases or {})

    def parse(text: str) -> str:
        key = text.strip().lower()
        key = aliases.get(key, key)
        if key not in choices:
            raise argparse.ArgumentTypeError(f"unknown {name} {text!r}; expected one of {', '.join(choices)}")
        return key

    parse.__name__ = name
    return parse


def positive_int(text: str) -> int:
    """An int >= 1 (world sizes, iterations, threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def step_factor(text: str) -> int:
    """An int >= 2 (the factor between swept sizes)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value} must be >= 2")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0 (warm-up calls, a root rank)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (timeouts in seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be > 0")
    return value


def require(module: str, flag: str, extra: str) -> None:
    """Import ``module`` now (in the parent, before any rank starts) or say which extra installs it."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"{flag} needs the Python package {module!r} ({exc}); "
                         f"install it with: pip install 'zerocomm[{extra}]'") from None
