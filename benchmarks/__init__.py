"""zerocomm.benchmarks: ``zerocomm-bench``, measurements of zerocomm.comm through its public API only.

The collective microbenchmark (nccl-tests' conventions: S, algbw, busbw, averaged
back-to-back calls, the maximum over ranks) is split by role: ``units`` (definitions),
``reference`` (expected results), ``collectives`` (one rank's measurement), ``report``
(table, JSON, CSV), ``launch`` (starting ranks), ``target`` (the module measured) and
``__main__`` (the command line).  See docs/benchmarks.md.
"""
