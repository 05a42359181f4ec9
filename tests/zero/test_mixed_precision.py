"""Mixed precision as DeepSpeed casts: with ``bf16`` or ``fp16`` enabled the whole module runs in that dtype --
buffers (BatchNorm's running statistics) and frozen parameters included -- and float32 masters are kept for the
trainable parameters only.

Each model trains at 2 ranks under ZeRO and under torch's DDP with ``torch.autocast`` on torch's own gloo
(support/mixed_precision_checks.py), on the same data; the losses are compared step by step.

[Note: the tolerances]  Both runs take the same float32 start and the same batches; they differ in where the low
dtype rounds.  Autocast keeps float32 weights and runs batch norm and the loss in float32; ZeRO rounds the weights,
every activation and the running statistics to the low dtype.  One rounding costs at most the unit roundoff u
(bf16: 2^-8 = 0.39% relative, fp16: 2^-11 = 0.05%) of the value it rounds, and a loss of these small models passes
through about five roundings that do not cancel (two convolutions, two batch norms, the head; for the Llama: its
two blocks' projections and norms), so the two losses differ by up to about 5u at a step: 2% (bf16), 0.25% (fp16);
10 steps of AdamW at lr 1e-2 do not widen that measurably (measured: 0.2% bf16, 0.05% fp16, 0.1% LoRA).  Stage 3
in fp32 against DDP in fp32 differs only in the reduction order: 1e-5.
"""
from __future__ import annotations

import math

import pytest

from support import mixed_precision_checks as checks
from support.worlds import STANDIN

pytestmark = pytest.mark.skipif(STANDIN, reason="ZeRO runs on zerocomm only")

TOLERANCE = {"bf16": 2e-2, "fp16": 2.5e-3, "fp32": 1e-5}
STEPS = 10
LR = 1e-2
WORLD = [("gloo", 2)]


def _check_run(where: str, run: dict, precision: str, steps: int, world_size: int, total_masters: int) -> None:
    losses = run["losses"]
    assert run["finite"], (where, losses)
    assert losses[-2] < losses[0] and losses[-1] < losses[1], f"{where}: did not learn: {losses}"  # same batches
    assert run["applied"] >= steps - (2 if precision == "fp16" else 0), (where, run["applied"])  # fp16 may skip
    low = run["low"]
    assert run["buffer_dtypes"] in ([low], []), (where, run["buffer_dtypes"])
    assert run["frozen_dtypes"] == [low], (where, run["frozen_dtypes"])
    assert run["trainable_dtypes"] == [low], (where, run["trainable_dtypes"])
    assert run["master_dtypes"] == ["torch.float32"], (where, run["master_dtypes"])
    # float32 masters of the trainable parameters only: their shards cover them (with padding), never the frozen ones
    trainable = run["trainable_elements"]
    assert trainable <= total_masters < trainable + min(run["frozen_elements"], 64 * world_size), \
        (where, total_masters, trainable, run["frozen_elements"])
    assert run["worst_relative"] <= TOLERANCE[precision], \
        f"{where}: loss differs from DDP + autocast by {run['worst_relative']:.2%} at a step: {losses} against the " \
        f"reference"


@pytest.mark.parametrize("world", WORLD, indirect=True, ids=["gloo-2"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_batchnorm_cnn_with_a_frozen_layer_trains_like_ddp_with_autocast(world, precision):
    runs = world.run(checks.compare, "bn_cnn", [1, 2, 3], precision, STEPS, LR, timeout=240)
    for stage in (1, 2, 3):
        total = sum(per_rank["stages"][stage]["master_elements"] for per_rank in runs)
        for rank, per_rank in enumerate(runs):
            run = per_rank["stages"][stage]
            where = f"bn_cnn {precision} stage {stage} rank {rank}"
            _check_run(where, run, precision, STEPS, world.world_size, total)
            print(f"{where}: ZeRO {[round(x, 4) for x in run['losses']]}\n"
                  f"{' ' * len(where)}  DDP+autocast {[round(x, 4) for x in per_rank['reference']]} "
                  f"(at most {run['worst_relative']:.3%} apart)")


@pytest.mark.parametrize("world", WORLD, indirect=True, ids=["gloo-2"])
def test_stage3_fp32_matches_ddp_with_buffers_and_a_frozen_layer(world):
    """No cast at fp32; stage 3's persistent unit (every parameter of this small model) is gathered again before
    the next forward reads it (its post-step gather overlaps the step's end)."""
    for rank, per_rank in enumerate(world.run(checks.compare, "bn_cnn", [3], "fp32", 6, LR, timeout=120)):
        run = per_rank["stages"][3]
        assert run["frozen_dtypes"] == run["buffer_dtypes"] == ["torch.float32"], run
        assert run["worst_relative"] <= TOLERANCE["fp32"], (rank, run["losses"], per_rank["reference"])


@pytest.mark.parametrize("world", WORLD, indirect=True, ids=["gloo-2"])
def test_peft_lora_llama_with_gradient_checkpointing_trains_like_ddp_with_autocast(world):
    pytest.importorskip("transformers", reason="needs transformers: pip install 'zerocomm[test]'")
    pytest.importorskip("peft", reason="needs peft: pip install 'zerocomm[test]'")
    steps = 8
    runs = world.run(checks.compare, "lora_llama", [2, 3], "bf16", steps, 3 * LR, timeout=300)
    for stage in (2, 3):
        total = sum(per_rank["stages"][stage]["master_elements"] for per_rank in runs)
        for rank, per_rank in enumerate(runs):
            run = per_rank["stages"][stage]
            where = f"lora_llama bf16 stage {stage} rank {rank}"
            _check_run(where, run, "bf16", steps, world.world_size, total)
            assert all(math.isfinite(x) for x in per_rank["reference"]), per_rank["reference"]
            print(f"{where}: ZeRO {[round(x, 4) for x in run['losses']]}\n"
                  f"{' ' * len(where)}  DDP+autocast {[round(x, 4) for x in per_rank['reference']]} "
                  f"(at most {run['worst_relative']:.3%} apart)")
