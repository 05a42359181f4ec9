"""ZeRO stage 3 (memory, traffic, live-parameter bound, divergence, access outside forward) and
checkpoints (exact resume, N -> M resharding, consolidation, command line, bad input).

Stage 3's equivalence with data-parallel training is in test_zero_stages.py, with the other stages.
"""
import os
import subprocess
import sys

import pytest
import torch

from support import zero3_checks, zero_ckpt_checks
from support.worlds import worlds

FP32 = 4


@pytest.mark.parametrize("world", worlds(sizes=(2, 4)), indirect=True)
def test_stage3_model_state_bytes_are_sixteen_phi_over_n(world):
    n = world.world_size
    for precision, (param, grad, optim) in (("fp32", (4, 4, 8)), ("bf16", (2, 2, 12))):
        for seen in world.run(zero3_checks.state_bytes, precision):
            padded, persistent = seen["padded"], seen["persistent"]
            assert seen["phi"] <= padded <= seen["phi"] + seen["units"] * n * 16
            assert seen["bytes"] == {"params": param * padded // n + param * persistent,  # + persistent full copy
                                     "grads": grad * padded // n,
                                     "optimizer_state": optim * padded // n + 4 * seen["units"],
                                     "buffers": 0}, (precision, seen)
            assert seen["spare_bytes"] == 0  # between its steps stage 3 keeps no bucket buffer


@pytest.mark.parametrize("world", worlds(sizes=(2, 4)), indirect=True)
def test_stage3_moves_three_phi_per_step(world):
    n = world.world_size
    for seen in world.run(zero3_checks.traffic):
        padded, persistent = seen["padded"], seen["persistent"]
        assert seen["measured"]
        # Gathered in forward and again in backward; the root unit (kept from forward into backward) and the
        # persistent unit (after the step) once.
        root = seen["root"]
        assert root > 0
        gathered = 2 * (padded - persistent - root) + root + persistent
        assert seen["sent"] == {"all_gather": FP32 * gathered * (n - 1) // n,
                                "reduce_scatter": FP32 * padded * (n - 1) // n}


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_stage3_live_parameters_stay_under_the_limit_plus_one_prefetch(world):
    tight = world.run(zero3_checks.live_bound, 1)[0]
    root, block = tight["root"], max(tight["sizes"])
    assert tight["prefetches"] == 0 and tight["peak"] == root + block and tight["live_now"] == 0
    limit = root + block
    loose = world.run(zero3_checks.live_bound, limit)[0]
    assert loose["prefetches"] > 0
    assert limit < loose["peak"] <= limit + block


@pytest.mark.parametrize("world", worlds(sizes=(2,)), indirect=True)
def test_gathered_parameters_write_back_from_the_modifier_rank(world):
    for stage in (1, 2, 3):
        for seen in world.run(zero3_checks.gathered_write_back, stage):
            assert seen["seen"] == [0.5] * 4 and seen.get("after_discard", [0.5] * 4) == [0.5] * 4, (stage, seen)
            assert 0 < seen["moved_from_seen"] < 0.01  # one Adam step (lr 3e-3) from the written values


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_stage3_debug_mode_names_the_first_divergence(world):
    (name0, message0), (name1, message1) = world.run(zero3_checks.diverging_paths)
    assert name0 == name1 == "ZeroStateError"
    for message in (message0, message1):
        assert "rank 0 is at forward of unit 3 ('layers.2')" in message or \
               "while rank 0 is at forward of unit 3 ('layers.2')" in message
        assert "rank 1" in message and "backward of unit 0" in message


@pytest.mark.parametrize("world", worlds(sizes=(2,)), indirect=True)
def test_resume_is_bit_identical(world, tmp_path):
    for stage in (0, 1, 2, 3):
        for seen in world.run(zero_ckpt_checks.exact_resume, str(tmp_path / f"stage{stage}"), stage):
            assert seen == {"folder": "step-00000003", "resumed_at": 3, "same_losses": True, "same_params": True,
                            "same_scale": True}, (stage, seen)
    for seen in world.run(zero_ckpt_checks.exact_resume, str(tmp_path / "fp16"), 2, "fp16"):
        assert seen["same_losses"] and seen["same_params"] and seen["same_scale"]


def test_checkpoint_from_four_ranks_resumes_on_two_and_three(pool_registry, tmp_path):
    steps, more = 4, 5
    saved = {}
    four = pool_registry.get("gloo", 4)
    for stage in (1, 2, 3):
        losses = four.run(zero_ckpt_checks.train_and_save, str(tmp_path / f"stage{stage}"), stage, steps, timeout=120)
        saved[stage] = losses[0]
    for world_size in (2, 3):
        pool = pool_registry.get("gloo", world_size)
        for stage in (1, 2, 3):
            for seen in pool.run(zero_ckpt_checks.resume_elsewhere, str(tmp_path / f"stage{stage}"), stage, steps,
                                 more, timeout=120):
                assert seen["resumed_at"] == steps
                # The first steps ran on 4 ranks, the uninterrupted run's on 2 or 3: the global batch is
                # split into other row groups, so gradients differ in float32 rounding (~1e-7), which Adam
                # carries to ~1e-5 in the smallest parameters; the losses must agree to 1e-5.
                assert seen["loss_err"] <= 1e-5 and seen["param_err"] <= 1e-4, (world_size, stage, seen)


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(4,)), indirect=True)
def test_consolidated_state_dict_equals_data_parallel_and_the_command_line_writes_it(world, tmp_path):
    for stage in (1, 2, 3):
        path = tmp_path / f"stage{stage}"
        seen = world.run(zero_ckpt_checks.consolidated_vs_reference, str(path), stage)[0]
        assert seen["keys"] == seen["plain_keys"] and seen["load_result"] == "<All keys matched successfully>"
        assert seen["max_err"] <= 1e-5 and seen["tied"], (stage, seen["max_err"])
    from zerocomm.zero import consolidate
    from safetensors.torch import load_file as load_safetensors

    expected = consolidate(tmp_path / "stage3")
    for suffix in (".pt", ".safetensors"):
        out = tmp_path / f"model{suffix}"
        done = subprocess.run([sys.executable, "-m", "zerocomm.zero.consolidate", str(tmp_path / "stage3"), str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        got = torch.load(out, weights_only=True) if suffix == ".pt" else load_safetensors(out)
        assert sorted(got) == sorted(expected)
        assert all(torch.equal(got[key], expected[key]) for key in expected)
    bad = subprocess.run([sys.executable, "-m", "zerocomm.zero.consolidate", str(tmp_path / "nothing"),
                          str(tmp_path / "x.pt")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "CheckpointNotFoundError: " in bad.stderr and "no checkpoint at" in bad.stderr and not os.path.exists(tmp_path / "x.pt")


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_bad_checkpoints_give_clear_errors_and_change_nothing(world, tmp_path):
    for seen in world.run(zero_ckpt_checks.bad_inputs, str(tmp_path / "ckpt")):
        assert seen.pop("untouched") is True
        expected = {
            "another model": ("CheckpointIncompatibleError",
                              ["manifest.json", "a checkpoint of another model", "(32,)", "(48,)"]),
            "stage mismatch": ("CheckpointIncompatibleError", ["manifest.json", "stage 2", "stage 1"]),
            "no checkpoint": ("CheckpointNotFoundError", ["no checkpoint at", "nowhere"]),
            "missing shard": ("CheckpointMissingShardError", ["rank ", "shard-00001.pt", "shard missing"]),
            "truncated shard": ("CheckpointCorruptError", ["rank ", "shard-00000.pt", "100 bytes", "truncated"]),
        }
        assert sorted(seen) == sorted(expected)
        for case, (kind, words) in expected.items():
            name, message = seen[case]
            assert name == kind, (case, name, message)
            for word in words:
                assert word in message, (case, word, message)
    for seen in world.run(zero_ckpt_checks.interrupted_save, str(tmp_path / "crash")):
        assert seen == {"restored_step": 1, "restored": True}
