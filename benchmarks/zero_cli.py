"""``zerocomm-bench zero``: the ZeRO benchmark (``zero_bench``) as a subcommand, its options on the
subparser like every other subcommand's."""
from __future__ import annotations

import argparse
from typing import Sequence

HELP = "ZeRO stages 0-3 against torch DDP, ZeroRedundancyOptimizer and FSDP2: step time, memory, traffic"

DESCRIPTION = """\
Trains the same seeded small GPT (about 10 M parameters; --small: 30 K) on the same batches with
Adam under torch DDP, torch's ZeroRedundancyOptimizer, FSDP2 and zerocomm's ZeRO stages 0-3
(native, ring and shm collectives; CPU and NVMe offload), each variant in freshly started ranks
over gloo, and prints one row per variant:

  step ms           median wall time of a step, the slowest rank's, after warm-up
  × DDP             step time over torch DDP's at the same world size
  peak MiB          the largest rank's peak resident memory above where it started
  model states MiB  parameters + gradients + optimizer state one rank holds
  sent/step MiB     bytes one rank sends per step
  last loss         the variants train alike (the same model, batches and seed)

Examples:
  zerocomm-bench zero --nprocs 2 --small           # a quick check on a 30 K-parameter model
  zerocomm-bench zero --nprocs 2,4 --steps 5       # the full comparison
  zerocomm-bench zero --only "torch DDP,stage 2" --interleave 3 --repeat 5

Use --interleave for step-time ratios on a machine whose speed drifts (every variant in the same
ranks, in turn).  Timings are for comparing side by side in one run, not across runs.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .zero_bench import add_arguments as zero_arguments

    zero_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """The ``zero`` subcommand: the options checked before any rank starts, then the default mode or
    ``--interleave``'s."""
    from . import zero_bench, zero_interleaved

    shape = zero_bench.checked(args)
    if args.interleave:
        return zero_interleaved.main(args, shape)
    return zero_bench.run(args, shape)


def main(argv: Sequence[str]) -> int:
    """``zerocomm-bench zero ARGV``."""
    from .cli import main as bench_main

    return bench_main(["zero", *argv])
