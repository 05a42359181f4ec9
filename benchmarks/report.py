"""Turning a sweep's rows into what rank 0 prints and writes: a table, JSON and CSV.

Pure functions over :class:`~zerocomm.benchmarks.collectives.Row` values and a
metadata dict; nothing here communicates.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict
from typing import Any, Iterable, Optional, Sequence

from tabulate import tabulate

from .collectives import Row
from .units import ROOTED

TIMING_CONVENTION = "nccl-tests: warm-up calls, a barrier, then back-to-back calls timed together and averaged"

#: Fields of the run's metadata copied into every JSON/CSV row, so rows of several runs
#: (``--compare``, files concatenated later) still say what produced them.
ROW_META_FIELDS = ("target", "backend", "world_size", "dtype", "op", "in_place", "device")

#: CSV columns, in order: what ran, then every field of Row but the per-rank tuple, plus the ratio.
CSV_FIELDS = (*ROW_META_FIELDS, "collective", "algorithm", "size", "count", "time_us", "time_min_us",
              "time_median_us", "time_max_us", "algbw", "busbw", "busbw_vs_native", "wrong", "note")


def native_ratios(rows: Sequence[Row]) -> list[Optional[float]]:
    """For each row, its busbw over the ``native`` row's busbw for the same (collective, size).

    Equal to native's time over this row's time: above 1 means faster than native.
    ``None`` for native rows themselves and wherever either side has no time.
    """
    native = {(r.collective, r.size): r.time_us for r in rows if r.algorithm == "native"}
    ratios: list[Optional[float]] = []
    for row in rows:
        base = native.get((row.collective, row.size))
        if row.algorithm == "native" or not base or not row.time_us:
            ratios.append(None)
        else:
            ratios.append(base / row.time_us)
    return ratios


def header_lines(meta: dict[str, Any]) -> list[str]:
    """The ``#`` lines above the table: what ran, and how to read its numbers."""
    n = meta["world_size"]
    roots = ", ".join(c for c in meta["collectives"] if c in ROOTED)
    lines = [
        f"# zerocomm-bench collectives: {meta['target']} on {meta['backend']}, {n} ranks, "
        f"{meta['device']} ({meta['threads']} torch thread(s) per rank), dtype {meta['dtype']}, "
        f"op {meta['op']}" + (f", root {meta['root']} ({roots})" if roots else ""),
        f"# timing ({TIMING_CONVENTION}): {meta['warmup']} warm-up calls, a barrier, "
        f"{meta['iters']} back-to-back blocking calls;",
        "#   time = their span / iters on each rank, the maximum over ranks, in µs;",
        "#   min / median / max = single calls of that loop, each the maximum over ranks, in µs"
        + (" (in place)" if meta.get("in_place") else ""),
        "# size = S in bytes: all_reduce, broadcast, reduce: the buffer; all_gather: the gathered output;",
        "#   reduce_scatter: the full input; all_to_all: the full send buffer; gather: root's receive buffer;",
        "#   scatter: root's send buffer.  count = elements of one rank's share",
        f"# algbw = S / time (GB/s, 1e9 B); busbw = algbw x factor(n = {n}): all_reduce 2(n-1)/n;",
        "#   reduce_scatter, all_gather, all_to_all, gather, scatter (n-1)/n; broadcast, reduce 1",
    ]
    algorithms = meta["algorithms"]
    if "native" in algorithms and len(algorithms) > 1:
        lines.append("# busbw/native = this algorithm's busbw over native's at the same size (> 1: faster)")
    if meta["check"]:
        lines.append("# #wrong = elements differing from the numpy reference, summed over ranks")
    return lines


def _number(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _footnotes(rows: Sequence[Row]) -> dict[str, int]:
    """Each distinct note, numbered from 1 in order of first appearance."""
    numbers: dict[str, int] = {}
    for row in rows:
        if row.note and row.note not in numbers:
            numbers[row.note] = len(numbers) + 1
    return numbers


def format_table(rows: Sequence[Row], *, check: bool, show_ratio: bool) -> str:
    """The aligned table of ``rows`` (one line per row, rows in the order given).

    A row without numbers says ``unsupported [k]``; footnote k (see :func:`summary_lines`)
    quotes the error, so a long message is printed once, not on every size.
    """
    ratios = native_ratios(rows)
    footnotes = _footnotes(rows)
    headers = ["collective", "algorithm", "size (B)", "count", "time (µs)", "min", "median", "max",
               "algbw (GB/s)", "busbw (GB/s)"]
    if show_ratio:
        headers.append("busbw/native")
    headers.append("#wrong")
    if footnotes:
        headers.append("note")
    body = []
    for row, ratio in zip(rows, ratios):
        line = [row.collective, row.algorithm, str(row.size), str(row.count), _number(row.time_us, ".1f"),
                _number(row.time_min_us, ".1f"), _number(row.time_median_us, ".1f"), _number(row.time_max_us, ".1f"),
                _number(row.algbw, ".4f"), _number(row.busbw, ".4f")]
        if show_ratio:
            line.append(_number(ratio, ".2f"))
        line.append(("N/A" if not check or row.wrong is None else str(row.wrong)))
        if footnotes:
            line.append(f"unsupported [{footnotes[row.note]}]" if row.note else "")
        body.append(line)
    # Cells are preformatted strings (fixed decimals, so right alignment lines up the points);
    # tabulate must not re-parse them, or it drops trailing zeros.
    align = ["left", "left"] + ["right"] * (len(headers) - 2 - bool(footnotes)) + ["left"] * bool(footnotes)
    return tabulate(body, headers=headers, disable_numparse=True, colalign=align)


def summary_lines(rows: Sequence[Row], *, check: bool) -> list[str]:
    """``#`` lines under the table: the footnotes of unsupported cells, then nccl-tests' closing lines
    (see :func:`closing_lines`)."""
    lines = [f"# [{number}] {note}" for note, number in _footnotes(rows).items()]
    return lines + closing_lines([(r.algorithm, r.busbw, r.wrong) for r in rows], check=check)


def closing_lines(cells: Sequence[tuple[str, Optional[float], Optional[int]]], *, check: bool,
                  label: str = "") -> list[str]:
    """nccl-tests' last lines, which scripts grep for, from (algorithm, busbw, wrong) per row.

    ``# Out of bounds values : W OK`` (``FAILED`` when W > 0) counts the wrong elements of every
    checked row; ``# Avg bus bandwidth    : X`` is the mean busbw (GB/s) over every row that has one,
    as nccl-tests averages over its sizes; when several algorithms ran, a further line gives the
    mean of each.  ``label`` (e.g. ``"gloo, 4 ranks"``) is appended after the numbers.
    """
    suffix = f" ({label})" if label else ""
    if check:
        wrong = sum(w or 0 for _, _, w in cells)
        lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}{suffix}"]
    else:
        lines = [f"# Out of bounds values : not checked (-c 0){suffix}"]
    measured = [(algorithm, busbw) for algorithm, busbw, _ in cells if busbw is not None]
    average = sum(b for _, b in measured) / len(measured) if measured else 0.0
    lines.append(f"# Avg bus bandwidth    : {average:.6g}{suffix}")
    algorithms = list(dict.fromkeys(a for a, _ in measured))
    if len(algorithms) > 1:
        means = [f"{a} {sum(b for x, b in measured if x == a) / sum(1 for x, _ in measured if x == a):.6g}"
                 for a in algorithms]
        lines.append(f"#   by algorithm (GB/s): {', '.join(means)}")
    return lines


def rows_as_dicts(rows: Iterable[Row], meta: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """Rows as plain dicts, each led by the ``ROW_META_FIELDS`` of ``meta`` (when given), with
    ``busbw_vs_native`` added (JSON keeps ``rank_times_us``)."""
    rows = list(rows)
    lead = {key: meta.get(key) for key in ROW_META_FIELDS} if meta is not None else {}
    out = []
    for row, ratio in zip(rows, native_ratios(rows)):
        record = {**lead, **asdict(row)}
        record["rank_times_us"] = list(row.rank_times_us)
        record["busbw_vs_native"] = ratio
        out.append(record)
    return out


def write_json(path: str, meta: dict[str, Any], rows: Sequence[Row]) -> None:
    """Write ``{"meta": meta, "rows": [...]}`` to ``path``; every row carries ``ROW_META_FIELDS``."""
    write_json_records(path, meta, rows_as_dicts(rows, meta))


def write_json_records(path: str, meta: dict[str, Any], records: Sequence[dict[str, Any]]) -> None:
    """Write ``{"meta": meta, "rows": records}`` to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "rows": list(records)}, handle, indent=2)
        handle.write("\n")


def write_csv(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """Write one CSV line per row with the columns of ``CSV_FIELDS``."""
    write_csv_records(path, rows_as_dicts(rows, meta))


def write_csv_records(path: str, records: Sequence[dict[str, Any]], fields: Sequence[str] = CSV_FIELDS) -> None:
    """Write one CSV line per record (dicts such as :func:`rows_as_dicts` makes) with ``fields``."""
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for record in records:
            writer.writerow({k: ("" if record.get(k) is None else record[k]) for k in fields})
