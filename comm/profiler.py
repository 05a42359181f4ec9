"""An opt-in recorder of every collective, with per-op summaries and a Chrome trace.

    with dist.profile() as prof:               # or ZEROCOMM_PROFILE=out.json in the environment
        with prof.span("backward"):            # optional: mark computation, to see overlap
            loss.backward()
    print(prof.table())
    prof.export_chrome_trace(f"trace.rank{dist.get_rank()}.json")  # open in https://ui.perfetto.dev

    merge_chrome_traces("trace", "trace.json")  # afterwards: every rank's file in one trace
                                                # (zerocomm-bench trace trace -o trace.json)

Each record holds op, group size, bytes (S, as nccl-tests defines it, and the bytes this
rank sent), algorithm, backend, and start/end times taken on the thread that ran the
collective — so an async collective's bar spans its real execution, and bars that
overlap a ``span`` show communication overlapping computation.  The summary's algbw and
busbw use the *group's* size, never the world's.

Off (the default), nothing is recorded and no call is synchronized; on, results are
unchanged: the recorder only reads clocks and sizes.  CUDA work is timed on the host
(launch to completion of ``wait``), which is what the rank experiences.

[Note: one clock across ranks]
Records keep ``time.perf_counter()`` seconds (steady, precise, but each process has its own zero).
The Chrome trace converts them to wall-clock microseconds since the Unix epoch with one offset
``time.time() - time.perf_counter()`` taken when the profiler is created, so the ranks of one host
share a time axis without any communication, and a clock adjustment during the run cannot bend one
rank's intervals.  Ranks on different hosts line up as well as their clocks are synchronized (NTP:
typically well under a millisecond).  In the trace, ``pid`` is the global rank and ``tid`` a small
integer per track, each named by ``process_name`` / ``thread_name`` metadata events.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import threading
import time
from typing import Dict, Iterable, List, Optional, Union

from .group import WORLD
from .traffic import CallRecord, bus_factor, observing


class Profiler:
    """Collects :class:`CallRecord`\\ s while registered on the world (see :func:`profile`)."""

    def __init__(self) -> None:
        self.records: List[CallRecord] = []
        self.spans: List[tuple] = []
        self._record_threads: List[str] = []  # the thread that ran each record, for its track
        self._lock = threading.Lock()
        self._origin = time.perf_counter()
        self._unix_offset_s = _unix_offset()

    # -- observer protocol ----------------------------------------------------------
    def on_start(self, record: CallRecord) -> None:
        pass

    def on_end(self, record: CallRecord) -> None:
        thread = threading.current_thread().name  # on_end runs on the thread that ran the collective
        with self._lock:
            self.records.append(record)
            self._record_threads.append(thread)

    # -- user annotations -----------------------------------------------------------
    @contextlib.contextmanager
    def span(self, name: str):
        """Mark a stretch of computation (shown on its own track in the trace)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.spans.append((name, start, time.perf_counter(), threading.current_thread().name))

    # -- summaries ------------------------------------------------------------------
    def summary(self) -> Dict[str, dict]:
        """Per op: count, total bytes (S), bytes sent, mean latency (µs), algbw and busbw (GB/s)."""
        out: Dict[str, dict] = {}
        for record in self.records:
            entry = out.setdefault(record.op, {"count": 0, "size_bytes": 0, "bytes_sent": 0, "seconds": 0.0,
                                               "busbw_weighted": 0.0})
            entry["count"] += 1
            entry["size_bytes"] += record.size_bytes
            entry["bytes_sent"] += record.bytes_sent
            entry["seconds"] += record.seconds
            entry["busbw_weighted"] += record.size_bytes * bus_factor(record.op, record.group_size)
        for entry in out.values():
            seconds = entry["seconds"]
            entry["mean_latency_us"] = 1e6 * seconds / entry["count"]
            entry["algbw_GBps"] = entry["size_bytes"] / seconds / 1e9 if seconds > 0 else 0.0
            entry["busbw_GBps"] = entry.pop("busbw_weighted") / seconds / 1e9 if seconds > 0 else 0.0
        return out

    def table(self) -> str:
        from tabulate import tabulate
        rows = [[op, s["count"], s["size_bytes"], s["bytes_sent"], f"{s['mean_latency_us']:.1f}",
                 f"{s['algbw_GBps']:.3f}", f"{s['busbw_GBps']:.3f}"] for op, s in sorted(self.summary().items())]
        return tabulate(rows, headers=["op", "count", "bytes (S)", "bytes sent", "mean µs", "algbw GB/s",
                                       "busbw GB/s"])

    # -- export ---------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "records": [dict(op=r.op, group_ranks=r.group_ranks, algorithm=r.algorithm, backend=r.backend,
                             size_bytes=r.size_bytes, bytes_sent=r.bytes_sent, bytes_received=r.bytes_received,
                             measured=r.measured, rank=r.rank, issued_us=(r.issued_s - self._origin) * 1e6,
                             start_us=(r.start_s - self._origin) * 1e6,
                             end_us=(r.end_s - self._origin) * 1e6) for r in self.records],
            "spans": [dict(name=n, start_us=(s - self._origin) * 1e6, end_us=(e - self._origin) * 1e6, thread=t)
                      for n, s, e, t in self.spans],
            "summary": self.summary(),
            "origin_unix_us": self.unix_us(self._origin),  # start_us/end_us count from here
        }

    def export_json(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(self.to_json(), handle, indent=1)

    @staticmethod
    def merge_chrome_traces(sources, out: Optional[str] = None) -> dict:
        """:func:`merge_chrome_traces`, reachable from the public ``zerocomm.comm.Profiler``."""
        return merge_chrome_traces(sources, out)

    def unix_us(self, perf_s: float) -> float:
        """A ``time.perf_counter()`` time of this process as microseconds since the Unix epoch."""
        return (perf_s + self._unix_offset_s) * 1e6

    def chrome_trace(self) -> dict:
        """Trace Event Format: one process per rank (``pid`` = global rank), one track (``tid``) for
        the collectives of each thread that ran some and one for the spans of each thread; timestamps
        in wall-clock µs, so the files of several ranks merge into one aligned trace."""
        rank = self.records[0].rank if self.records else _own_rank()
        tracks: Dict[str, int] = {}

        def tid(name: str) -> int:
            return tracks.setdefault(name, len(tracks) + 1)

        events = []
        for record, thread in zip(self.records, self._record_threads):
            events.append({"name": record.op, "cat": "comm", "ph": "X", "pid": record.rank,
                           "tid": tid(f"collectives ({thread})"), "ts": self.unix_us(record.start_s),
                           "dur": max(record.seconds * 1e6, 0.01),
                           "args": {"algorithm": record.algorithm, "backend": record.backend,
                                    "group_size": record.group_size, "group_ranks": list(record.group_ranks),
                                    "bytes": record.size_bytes, "bytes_sent": record.bytes_sent,
                                    "queued_us": (record.start_s - record.issued_s) * 1e6}})
        for name, start, end, thread in self.spans:
            events.append({"name": name, "cat": "compute", "ph": "X", "pid": rank, "tid": tid(f"compute ({thread})"),
                           "ts": self.unix_us(start), "dur": max((end - start) * 1e6, 0.01)})
        meta = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        for name, number in tracks.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": number, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": number,
                         "args": {"sort_index": number}})
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"clock": "wall clock, µs since the Unix epoch", "ranks": [rank]}}

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(self.chrome_trace(), handle)


def _unix_offset() -> float:
    """``time.time() - time.perf_counter()``, read between two perf_counter reads to halve the error."""
    before = time.perf_counter()
    wall = time.time()
    after = time.perf_counter()
    return wall - (before + after) / 2


def _own_rank() -> int:
    """This process's global rank, or 0 outside a process group (a trace with spans only)."""
    return WORLD.default.my_global_rank if WORLD.default is not None else 0


def rank_trace_files(prefix: str) -> List[str]:
    """The per-rank Chrome traces ``PREFIX.rankN.trace.json`` (what ``ZEROCOMM_PROFILE=PREFIX`` writes),
    ordered by rank."""
    found = glob.glob(glob.escape(prefix) + ".rank*.trace.json")
    numbered = []
    for path in found:
        middle = path[len(prefix) + len(".rank"):-len(".trace.json")]
        if middle.isdigit():
            numbered.append((int(middle), path))
    return [path for _, path in sorted(numbered)]


def merge_chrome_traces(sources: Union[str, Iterable[str]], out: Optional[str] = None) -> dict:
    """One Chrome trace holding every rank's events; written to ``out`` when given.

    ``sources`` is a list of per-rank trace files, or one ``ZEROCOMM_PROFILE`` prefix whose
    ``PREFIX.rankN.trace.json`` files are read.  Each file keeps its ``pid`` (its rank); two files
    with the same rank are an error (a stale file of another run, most likely).  Timestamps are
    already on one clock (see the note above); the merged trace counts them from its earliest event
    and records that origin in ``otherData["origin_unix_us"]``.
    """
    if isinstance(sources, str):
        paths = [sources] if os.path.isfile(sources) else rank_trace_files(sources)
        if not paths:
            raise FileNotFoundError(f"no trace files: {sources!r} is neither a file nor a prefix of "
                                    f"{sources}.rankN.trace.json files")
    else:
        paths = list(sources)
        if not paths:
            raise ValueError("merge_chrome_traces needs at least one trace file")
    events: List[dict] = []
    owner: Dict[int, str] = {}
    for path in paths:
        with open(path) as handle:
            trace = json.load(handle)
        file_events = trace["traceEvents"] if isinstance(trace, dict) else trace
        for pid in sorted({e["pid"] for e in file_events if "pid" in e}):
            if pid in owner:
                raise ValueError(f"rank {pid} appears in both {owner[pid]!r} and {path!r}; "
                                 f"merge the files of one run only")
            owner[pid] = path
        events.extend(file_events)
    timed = [e["ts"] for e in events if e.get("ph") != "M" and "ts" in e]
    origin = min(timed) if timed else 0.0
    for event in events:
        if event.get("ph") != "M" and "ts" in event:
            event["ts"] = event["ts"] - origin
    merged = {"traceEvents": events, "displayTimeUnit": "ms",
              "otherData": {"clock": "wall clock, µs from origin_unix_us", "origin_unix_us": origin,
                            "ranks": sorted(owner), "files": paths}}
    if out is not None:
        with open(out, "w") as handle:
            json.dump(merged, handle)
    return merged


def profile(registry=None):
    """Context manager recording every collective of this process while open; yields the :class:`Profiler`."""
    if registry is None:
        registry = WORLD
    return observing(registry, Profiler())
