"""An opt-in recorder of every collective, with per-op summaries and a Chrome trace.

    with dist.profile() as prof:               # or ZEROCOMM_PROFILE=out.json in the environment
        with prof.span("backward"):            # optional: mark computation, to see overlap
            loss.backward()
    print(prof.table())
    prof.export_chrome_trace("trace.json")     # open in https://ui.perfetto.dev

Each record holds op, group size, bytes (S, as nccl-tests defines it, and the bytes this
rank sent), algorithm, backend, and start/end times taken on the thread that ran the
collective — so an async collective's bar spans its real execution, and bars that
overlap a ``span`` show communication overlapping computation.  The summary's algbw and
busbw use the *group's* size, never the world's.

Off (the default), nothing is recorded and no call is synchronized; on, results are
unchanged: the recorder only reads clocks and sizes.  CUDA work is timed on the host
(launch to completion of ``wait``), which is what the rank experiences.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Dict, List

from .traffic import CallRecord, bus_factor, observing


class Profiler:
    """Collects :class:`CallRecord`\\ s while registered on the world (see :func:`profile`)."""

    def __init__(self) -> None:
        self.records: List[CallRecord] = []
        self.spans: List[tuple] = []
        self._lock = threading.Lock()
        self._origin = time.perf_counter()

    # -- observer protocol ----------------------------------------------------------
    def on_start(self, record: CallRecord) -> None:
        pass

    def on_end(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)

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
        from tabulate import tabulate  # optional dependency: the bench extra
        rows = [[op, s["count"], s["size_bytes"], s["bytes_sent"], f"{s['mean_latency_us']:.1f}",
                 f"{s['algbw_GBps']:.3f}", f"{s['busbw_GBps']:.3f}"] for op, s in sorted(self.summary().items())]
        return tabulate(rows, headers=["op", "count", "bytes (S)", "bytes sent", "mean µs", "algbw GB/s",
                                       "busbw GB/s"])

    # -- export ---------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "records": [dict(op=r.op, group_ranks=r.group_ranks, algorithm=r.algorithm, backend=r.backend,
                             size_bytes=r.size_bytes, bytes_sent=r.bytes_sent, bytes_received=r.bytes_received,
                             measured=r.measured, rank=r.rank, start_us=(r.start_s - self._origin) * 1e6,
                             end_us=(r.end_s - self._origin) * 1e6) for r in self.records],
            "spans": [dict(name=n, start_us=(s - self._origin) * 1e6, end_us=(e - self._origin) * 1e6, thread=t)
                      for n, s, e, t in self.spans],
            "summary": self.summary(),
        }

    def export_json(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(self.to_json(), handle, indent=1)

    def chrome_trace(self) -> dict:
        """Trace Event Format: one process per rank, a track for collectives and one for spans."""
        events = []
        for r in self.records:
            events.append({"name": r.op, "cat": "comm", "ph": "X", "pid": r.rank, "tid": "collectives",
                           "ts": (r.start_s - self._origin) * 1e6, "dur": max(r.seconds * 1e6, 0.01),
                           "args": {"algorithm": r.algorithm, "backend": r.backend, "group_size": r.group_size,
                                    "bytes": r.size_bytes, "bytes_sent": r.bytes_sent}})
        rank = self.records[0].rank if self.records else 0
        for name, start, end, thread in self.spans:
            events.append({"name": name, "cat": "compute", "ph": "X", "pid": rank, "tid": f"compute ({thread})",
                           "ts": (start - self._origin) * 1e6, "dur": (end - start) * 1e6})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(self.chrome_trace(), handle)


def profile(registry=None):
    """Context manager recording every collective of this process while open; yields the :class:`Profiler`."""
    if registry is None:
        from .group import WORLD as registry
    return observing(registry, Profiler())
