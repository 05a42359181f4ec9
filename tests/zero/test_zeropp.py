"""ZeRO++ (zero/zeropp.py) at 2 and 4 ranks on pretend hosts (``ZEROCOMM_HOST`` per rank), on gloo and MPI,
against plain ZeRO-3 on the same ranks and data (support/zeropp_checks.py runs the ranks' side; the GPU check
runs it on CUDA tensors, support/cuda_staging_checks.py).

Tolerances:

* The plain run is ZeRO-3; qgZ also runs at stage 2 (plain stages 2 and 3 agree to 1e-5, far inside the bounds).
* hpZ alone changes which ranks backward gathers from, not the values: the same losses and parameters as
  plain ZeRO-3 to 1e-6 relative (the values moved are bit-identical; the bound leaves room for nothing else).
* qwZ quantizes the weights forward and backward compute with to int8 in blocks of 256 (half a step: at most
  1/254 of a block's largest magnitude), qgZ the gradients to int4 (at most 1/14 of a block's largest
  magnitude per stage, two stages).  The issue's target is the loss within 1% of plain ZeRO-3's, which the
  tests hold over 8 steps of the LM (Adam, lr 3e-3; measured: about 1e-3 with int4 gradients, 1e-4 with
  int8 weights).  Parameters are held to 2 x steps x lr in absolute terms: Adam moves a parameter by about
  lr per step whatever its gradient's size, so a gradient of pure noise can send two runs up to that far
  apart, and no further.
"""
import pytest

from support import zeropp_checks
from support.worlds import worlds

EXACT = 1e-6
LOSS = 1e-2
LR, STEPS = 3e-3, 8
PARAMS = 2 * STEPS * LR

# pretend hosts by world size: (names, hpZ partition size that divides every host)
LAYOUTS = {2: [("ab", 1), ("aa", 2)], 4: [("aabb", 2), ("abab", 2), ("aaaa", 4)]}
QWZ = {"zero_quantized_weights": True}
QGZ = {"zero_quantized_gradients": True}


def _cases(hpz: int) -> list:
    hp = {"zero_hpz_partition_size": hpz}
    # algorithm None (and no shared memory, which one real host would choose): each collective's default, and
    # qwZ's gathers go hierarchical where the (pretend) hosts hold several ranks
    return [hp, QWZ, QGZ, {**QGZ, "quantized_gradient_bits": 8}, {**QWZ, **hp, **QGZ}, {**QGZ, "stage": 2},
            {**QWZ, **hp, **QGZ, "algorithm": None, "shared_memory": False}]


@pytest.mark.parametrize("world", worlds(sizes=(2, 4)), indirect=True)
def test_each_part_and_all_three_against_plain_zero3(world):
    for names, hpz in LAYOUTS[world.world_size]:
        cases = _cases(hpz)
        reports = world.run(zeropp_checks.against_plain, names, cases, timeout=300)
        for rank, rows in enumerate(reports):
            for fields, loss_err, param_err, info in rows:
                where = f"hosts {names!r}, rank {rank}, {fields}"
                quantized = fields.get("zero_quantized_weights") or fields.get("zero_quantized_gradients")
                if not quantized:
                    assert loss_err <= EXACT and param_err <= EXACT, f"{where}: {loss_err:.2e}, {param_err:.2e}"
                else:
                    assert loss_err <= LOSS, f"{where}: losses differ by {loss_err:.2e} relative"
                    assert param_err <= PARAMS, f"{where}: parameters differ by {param_err:.2e}"
                assert info["secondary_bytes"] == info["expected_secondary"], where
                if fields.get("zero_hpz_partition_size", 1) > 1:
                    assert info["gathered"]["secondary"] > 0, f"{where}: backward never used the secondary shards"
                if fields.get("zero_quantized_weights"):
                    assert info["gathered"]["quantized"] > 0, where
                    spans = len(set(names)) > 1 and len(set(names)) < len(names)  # several hosts, one with 2+ ranks
                    expected = "hierarchical" if spans and fields.get("algorithm", "native") is None else \
                        fields.get("algorithm", "native")
                    assert info["quantized_algorithm"] == expected, f"{where}: {info['quantized_algorithm']}"
                if fields.get("zero_quantized_gradients"):
                    assert sum(info["sent"].values()) > 0, where


@pytest.mark.parametrize("world", [("gloo", 4)], indirect=True)
def test_secondary_shards_count_in_the_memory_report(world):
    reports = world.run(zeropp_checks.against_plain, "aabb", [{"zero_hpz_partition_size": 2}], steps=2, timeout=300)
    for rank, rows in enumerate(reports):
        (_, _, _, info), = rows
        assert info["secondary_bytes"] == info["expected_secondary"] > 0, f"rank {rank}: {info}"
        # the secondary shards are the only parameter memory hpZ adds (between steps: shards, persistent unit)
        assert info["state"]["params"] - info["plain_state"]["params"] == info["secondary_bytes"], f"rank {rank}"
        assert {k: v for k, v in info["state"].items() if k != "params"} == \
            {k: v for k, v in info["plain_state"].items() if k != "params"}, f"rank {rank}: {info}"


@pytest.mark.parametrize("world", [("gloo", 4)], indirect=True)
def test_with_qwz_backward_computes_with_forwards_weights(world):
    """hpZ's secondary shard keeps forward's int8 codes: backward's gathered unit equals forward's bit for bit."""
    for names in ("aabb", "abab"):
        for rank, got in enumerate(world.run(zeropp_checks.backward_weights_equal_forward, names, timeout=300)):
            where = f"hosts {names!r}, rank {rank}"
            assert got["backward_units"] > 0 and got["secondary_gathered"] > 0, f"{where}: {got}"
            assert got["missing_forward"] == [] and got["equal"], f"{where}: {got}"


@pytest.mark.parametrize("world", [("gloo", 4)], indirect=True)
def test_a_partition_size_that_splits_no_host_evenly_is_refused(world):
    for rank, message in enumerate(world.run(zeropp_checks.hpz_refused, "aaab", 2, timeout=120)):
        assert "zero_hpz_partition_size (2)" in message and "'b': ranks [3]" in message, f"rank {rank}: {message}"


@pytest.mark.parametrize("world", worlds(sizes=(2, 4)), indirect=True)
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_reduce_scatter_matches_a_numpy_model_of_the_hierarchy(world, bits):
    layouts = {2: ["ab", "aa"], 4: ["aabb", "abab", "abcd", "aaaa"]}[world.world_size]
    for names in layouts:
        for rank, got in enumerate(world.run(zeropp_checks.quantized_reduce_scatter, names, bits, 64, 600,
                                             timeout=120)):
            where = f"hosts {names!r}, rank {rank}, int{bits}"
            assert got["vs_model"] <= 1e-6 and got["vs_model_2"] <= 1e-6, f"{where}: {got}"
            # Rounding bound: half a step (max/(2 qmax)) per decoded piece; stage 1 decodes L-1 pieces of
            # inputs, stage 2 H-1 pieces of host sums (up to L times the inputs); then divided by N.
            n_hosts, per_host, qmax = len(got["hosts"]), len(got["hosts"][0]), 2 ** (bits - 1) - 1
            bound = ((per_host - 1) + (n_hosts - 1) * per_host) / world.world_size / (2 * qmax)
            assert got["vs_exact"] <= bound * (1 + 1e-5) + 1e-7, f"{where}: {got}, bound {bound:.3g}"
            if n_hosts == 1:
                assert got["sent"]["cross"] == 0, where
            if n_hosts == world.world_size:
                assert got["sent"]["intra"] == 0, where


@pytest.mark.parametrize("world", [("gloo", 4)], indirect=True)
def test_checkpoints_move_between_zeropp_and_plain_zero3(world, tmp_path):
    zeropp = {"zero_quantized_weights": True, "zero_hpz_partition_size": 2, "zero_quantized_gradients": True}
    for rank, out in enumerate(world.run(zeropp_checks.checkpoint_round_trip, "aabb", str(tmp_path), zeropp,
                                         timeout=300)):
        for label, seen in out.items():
            assert seen == {"masters_equal": True, "state_equal": True, "finite": True}, f"rank {rank}, {label}"


def test_deepspeed_keys_and_python_fields_turn_the_parts_on():
    from zerocomm.zero import ZeroConfig, ZeroConfigError

    config = ZeroConfig.from_deepspeed({"zero_optimization": {
        "stage": 3, "zero_quantized_weights": True, "zero_hpz_partition_size": 2, "zero_quantized_gradients": True}})
    assert (config.zero_quantized_weights, config.zero_hpz_partition_size, config.zero_quantized_gradients) == \
        (True, 2, True)
    for fields, words in (({"quantized_gradient_bits": 3}, ["quantized_gradient_bits", "3"]),
                          ({"quantization_block": 15}, ["quantization_block", "even", "15"]),
                          ({"zero_hpz_partition_size": 0}, ["zero_hpz_partition_size", "0"]),
                          ({"zero_quantized_weights": 1}, ["zero_quantized_weights", "bool"])):
        with pytest.raises(ZeroConfigError) as info:
            ZeroConfig(stage=3, **fields)
        assert all(word in str(info.value) for word in words), str(info.value)
