"""What the collective benchmark's numbers mean: sizes, per-op layouts and bandwidths.

Pure functions, no processes and no communication, so each definition is unit-tested
on its own.  The conventions are nccl-tests' (see docs/benchmarks.md):

* **S** (``size``) is the whole buffer of the collective, not a rank's share:
  all_reduce, broadcast, reduce: the buffer; all_gather: the gathered output;
  reduce_scatter: the full input; all_to_all: the full send buffer; gather: the
  root's receive buffer; scatter: the root's send buffer.
* **algbw** = S / t, in GB/s with 1 GB = 1e9 bytes.
* **busbw** = algbw x a factor of the group size n that makes the number comparable
  with a link's bandwidth whatever n is (all_reduce 2(n-1)/n; reduce_scatter,
  all_gather, all_to_all, gather, scatter (n-1)/n; broadcast, reduce 1).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: The eight collectives, in the order the benchmark runs and prints them.
COLLECTIVES = (
    "broadcast",
    "scatter",
    "reduce",
    "all_reduce",
    "gather",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
)

#: Collectives that move no data, measured once at S = 0 when asked for (``--ops barrier``; ``tune`` measures
#: it for the auto table), not among the eight a sweep runs by default.
SIZELESS = ("barrier",)

#: torch.distributed's names of the tensor forms the benchmark calls, accepted as aliases.
ALIASES = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}

#: Collectives whose S is n chunks of one rank's share (so S is rounded to a multiple of n elements).
PARTITIONED = frozenset({"scatter", "gather", "all_gather", "reduce_scatter", "all_to_all"})

#: Collectives that combine values with a reduction op (the others only move data).
REDUCING = frozenset({"reduce", "all_reduce", "reduce_scatter"})

#: Collectives with a root rank.
ROOTED = frozenset({"broadcast", "scatter", "reduce", "gather"})

# Units of --sizes.  Bare K/M/G are binary, as in nccl-tests' -b/-e; KB/MB/GB are decimal.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def canonical_collective(name: str) -> str:
    """The benchmark's name for ``name`` (a canonical name or a torch tensor-form alias).

    Raises ``ValueError`` naming the unknown value and the accepted ones.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in COLLECTIVES and key not in SIZELESS:
        raise ValueError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES + SIZELESS)}")
    return key


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``"8"``, ``"8B"``, ``"64KiB"``, ``"1.5MiB"``, ``"4M"`` (binary), ``"1MB"`` (decimal).

    Raises ``ValueError`` quoting ``text`` when it is not a whole, positive number of bytes.
    """
    match = _SIZE_RE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; expected a number with an optional unit "
                         f"(B, KiB, MiB, GiB, K, M, G, KB, MB, GB), e.g. '64MiB'")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value) or value <= 0:
        raise ValueError(f"size {text!r} is {value:g} bytes; expected a whole number of bytes above 0")
    return int(value)


def size_sweep(spec: str, factor: int = 2) -> list[int]:
    """The sizes (bytes, ascending, distinct) that ``spec`` names.

    ``spec`` is a comma-separated list of single sizes (``"1MiB"``) and ranges
    (``"8B:64MiB"``); a range runs lo, lo*factor, lo*factor**2, ... while <= hi, as
    nccl-tests' ``-b/-e/-f`` do (so hi itself appears only when the steps land on it).
    """
    if int(factor) != factor or factor < 2:
        raise ValueError(f"factor must be a whole number >= 2, got {factor!r}")
    sizes: set[int] = set()
    for part in spec.split(","):
        if not part.strip():
            raise ValueError(f"empty item in sizes {spec!r}")
        if ":" in part:
            lo_text, _, hi_text = part.partition(":")
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo > hi:
                raise ValueError(f"size range {part!r} runs backwards: {lo} B > {hi} B")
            size = lo
            while size <= hi:
                sizes.add(size)
                size *= int(factor)
        else:
            sizes.add(parse_size(part))
    return sorted(sizes)


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it >= 1: ``"8 B"``, ``"64 KiB"``, ``"1.5 MiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class Layout:
    """The buffers of one collective call for a requested S.

    ``chunk``: elements of one rank's share (for all_reduce, broadcast and reduce the
    whole buffer); this is the ``count`` column, as nccl-tests prints it.
    ``elements``: elements in S (``n * chunk`` for partitioned collectives, else ``chunk``).
    ``nbytes``: S actually used, in bytes (``elements * itemsize``).
    """

    chunk: int
    elements: int
    nbytes: int


def op_layout(collective: str, size_bytes: int, n: int, itemsize: int) -> Layout:
    """The layout that serves a requested S of ``size_bytes`` on a group of ``n`` ranks.

    As in nccl-tests, S is rounded down to whole elements (and, for partitioned
    collectives, to a multiple of ``n`` elements); unlike nccl-tests, never below one
    element per rank, so a tiny S still moves data and the row says the S really used.
    """
    collective = canonical_collective(collective)
    if collective in SIZELESS:  # whatever S was asked for: there is no buffer
        return Layout(chunk=0, elements=0, nbytes=0)
    if n < 1 or itemsize < 1 or size_bytes < 1:
        raise ValueError(f"op_layout needs n >= 1, itemsize >= 1 and size_bytes >= 1; "
                         f"got n={n}, itemsize={itemsize}, size_bytes={size_bytes}")
    if collective in PARTITIONED:
        chunk = max(1, size_bytes // (n * itemsize))
        elements = n * chunk
    else:
        chunk = elements = max(1, size_bytes // itemsize)
    return Layout(chunk=chunk, elements=elements, nbytes=elements * itemsize)


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for ``collective`` on a group of ``n`` ranks (nccl-tests' factors).

    all_reduce moves each byte twice around a ring (reduce-scatter, then all-gather):
    2(n-1)/n.  The other partitioned collectives move every chunk but the rank's own
    once: (n-1)/n.  broadcast and reduce move the buffer once across a link: 1.
    """
    collective = canonical_collective(collective)
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in PARTITIONED:
        return (n - 1) / n
    return 1.0


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """S / t in GB/s (1 GB = 1e9 bytes); ``seconds`` must be > 0."""
    if seconds <= 0:
        raise ValueError(f"time must be > 0 s, got {seconds!r}")
    return nbytes / seconds / 1e9


def busbw_gbps(collective: str, nbytes: int, seconds: float, n: int) -> float:
    """algbw x :func:`bus_factor` in GB/s, with ``n`` the size of the group the collective ran on."""
    return algbw_gbps(nbytes, seconds) * bus_factor(collective, n)
