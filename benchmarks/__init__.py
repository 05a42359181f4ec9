"""zerocomm.benchmarks: ``zerocomm-bench``, measurements of zerocomm.comm through its public API only.

The collective microbenchmark (nccl-tests' conventions: S, algbw, busbw, averaged
back-to-back calls, the maximum over ranks) is split by role: ``units`` (definitions),
``reference`` (expected results), ``collectives`` (one rank's measurement), ``report``
(table, closing lines, JSON, CSV), ``launch`` (starting ranks), ``target`` (the module measured
and the checks of the environment).  The command line is ``cli`` (one subparser per
subcommand, registered in ``cli.COMMANDS``), ``options`` (its shared argument types) and one
module per subcommand: ``collectives_cli``, ``compare``, ``tune``, ``compression``, ``zero_cli``
(for ``zero_bench``) and ``trace_cli``.  See docs/benchmarks.md.
"""
