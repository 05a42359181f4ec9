"""The optimizer a DeepSpeed or torch user expects: ``ZeroOptimizer`` is a ``torch.optim.Optimizer`` with one
param group per user group, the config's ``optimizer`` and ``scheduler`` sections are built (DeepSpeed's
meanings, checked against closed forms written here), ``step()`` says whether it applied an update,
``steps_per_print`` logs, and ``state_dict`` and checkpoints restore everything, a Hugging Face model's
training included.

Multi-rank checks run in support/zero_api_checks.py against a plain torch optimizer on the global batch.
Tolerances: ZeRO averages the ranks' gradients, the reference takes the gradient of the global mean, so they
differ in the last float32 bits, which Adam carries to ~1e-6 relative in a few steps; 1e-5 bounds it.
"""
import math

import pytest
import torch

from support import zero_api_checks
from zerocomm.zero import ZeroConfig, ZeroConfigError
from zerocomm.zero.optim_factory import OptimizerConfig, build_optimizer
from zerocomm.zero.optimizer import resolve_factory
from zerocomm.zero.param_groups import param_groups_of
from zerocomm.zero.partition import plan_buckets
from zerocomm.zero.schedulers import (LRRangeTest, OneCycle, SchedulerConfig, WarmupCosineLR, WarmupDecayLR,
                                      WarmupLR, build_scheduler)

REL = 1e-5
STAGES = (0, 1, 2, 3)


def _torch_optimizer(cls=torch.optim.SGD, groups=1, lr=1.0, **kwargs):
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return cls(params, lr=lr, **kwargs)


def _lrs(schedule, updates: int, group: int = 0) -> list:
    """The lr each of ``updates`` updates runs at: the construction's, then one per step()."""
    out = [schedule.optimizer.param_groups[group]["lr"]]
    for _ in range(updates - 1):
        schedule.step()
        out.append(schedule.optimizer.param_groups[group]["lr"])
    return out


# -- schedules: DeepSpeed's formulas, as closed forms ------------------------------------------------------------
def test_warmup_lr_linear_and_log():
    linear = WarmupLR(_torch_optimizer(), warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=4,
                      warmup_type="linear")
    assert _lrs(linear, 7) == pytest.approx([0, 0, 0.25, 0.5, 0.75, 1.0, 1.0])  # counts -1, 0, 1, ... 5
    log = WarmupLR(_torch_optimizer(groups=2), warmup_min_lr=[0.1, 0.2], warmup_max_lr=1.0, warmup_num_steps=4)
    got = _lrs(log, 6)
    assert got == pytest.approx([0.1, 0.1, 0.1 + 0.9 * math.log(2) / math.log(4),
                                 0.1 + 0.9 * math.log(3) / math.log(4), 1.0, 1.0])
    assert log.optimizer.param_groups[1]["lr"] == pytest.approx(1.0)  # per-group minimums, one maximum
    assert log.state_dict() == {"last_batch_iteration": 4}


def test_warmup_decay_lr_reaches_zero_and_stays():
    schedule = WarmupDecayLR(_torch_optimizer(), total_num_steps=6, warmup_max_lr=1.0, warmup_num_steps=2,
                             warmup_type="linear")
    assert _lrs(schedule, 10) == pytest.approx([0, 0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0])


def test_warmup_cosine_lr_scales_each_groups_own_lr():
    optimizer = _torch_optimizer(groups=2, lr=2.0)
    optimizer.param_groups[1]["lr"] = 4.0
    schedule = WarmupCosineLR(optimizer, total_num_steps=6, warmup_num_steps=2, warmup_min_ratio=0.5,
                              cos_min_ratio=0.1, warmup_type="linear")
    ratios = [0.0, 0.5, 0.75] + [0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2 for k in (1, 2, 3, 4, 5)]
    assert _lrs(schedule, 8) == pytest.approx([2.0 * r for r in ratios])
    assert optimizer.param_groups[1]["lr"] == pytest.approx(4.0 * ratios[-1])
    with pytest.raises(ZeroConfigError, match=r"total_num_steps \(3\) must be greater than warmup_num_steps \(4\)"):
        WarmupCosineLR(_torch_optimizer(), total_num_steps=3, warmup_num_steps=4)


def test_one_cycle_lr_and_momentum():
    optimizer = _torch_optimizer(torch.optim.Adam, lr=1.0)
    schedule = OneCycle(optimizer, cycle_min_lr=1.0, cycle_max_lr=3.0, cycle_first_step_size=2, decay_step_size=2,
                        decay_lr_rate=0.5, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.1)
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.99)
    lrs, moms = [optimizer.param_groups[0]["lr"]], []
    for _ in range(6):
        schedule.step()
        lrs.append(optimizer.param_groups[0]["lr"])
        moms.append(optimizer.param_groups[0]["betas"][0])
    assert lrs == pytest.approx([1.0, 2.0, 3.0, 2.0, 1.0, 1 / 1.25, 1 / 1.5])
    assert moms == pytest.approx([0.85, 0.8, 0.85, 0.9, 0.9 * 1.05, 0.9 * 1.1])
    assert optimizer.param_groups[0]["betas"][1] == 0.99  # DeepSpeed sets the second beta to 0.99
    sgd = _torch_optimizer(torch.optim.SGD, lr=1.0, momentum=0.5)
    OneCycle(sgd, cycle_min_lr=1.0, cycle_max_lr=3.0).step()
    assert sgd.param_groups[0]["momentum"] == 0.5  # no betas: momentum is not cycled, as in DeepSpeed


def test_lr_range_test():
    smooth = LRRangeTest(_torch_optimizer(), lr_range_test_min_lr=0.1, lr_range_test_step_size=2)
    assert _lrs(smooth, 5) == pytest.approx([0.1, 0.1, 0.15, 0.2, 0.25])
    stairs = LRRangeTest(_torch_optimizer(), lr_range_test_min_lr=0.1, lr_range_test_step_size=2,
                         lr_range_test_staircase=True)
    assert _lrs(stairs, 5) == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.2])


def test_scheduler_sections_are_checked():
    assert isinstance(build_scheduler(SchedulerConfig(type="StepLR", params={"step_size": 2}), _torch_optimizer()),
                      torch.optim.lr_scheduler.StepLR)  # DeepSpeed's fallback: torch's classes by name
    for section, words in [({"type": "Warmup"}, ["'Warmup'", "WarmupLR"]),
                           ({"type": "ReduceLROnPlateau"}, ["ReduceLROnPlateau"]),
                           ({"type": "WarmupLR", "params": {"warmup_steps": 3}}, ["warmup_steps", "warmup_num_steps"]),
                           ({"type": "WarmupLR", "params": {"warmup_type": "cosine"}}, ["'cosine'", "linear"]),
                           ({"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}, ["warmup_max_lr", "auto"]),
                           ({"type": "WarmupLR", "extra": 1}, ["extra"])]:
        with pytest.raises(ZeroConfigError) as info:
            build_scheduler(SchedulerConfig.from_dict(section), _torch_optimizer())
        for word in words:
            assert word in str(info.value), (section, str(info.value))


# -- the optimizer section ----------------------------------------------------------------------------------------
def _built(section: dict) -> torch.optim.Optimizer:
    return build_optimizer(OptimizerConfig.from_dict(section), [{"params": [torch.nn.Parameter(torch.zeros(2))]}])


def test_optimizer_section_becomes_what_deepspeed_builds():
    adam = _built({"type": "Adam", "params": {"lr": 1e-3}})  # adam_w_mode defaults to true in DeepSpeed
    assert type(adam) is torch.optim.AdamW and adam.defaults["weight_decay"] == 0.0
    assert type(_built({"type": "Adam", "params": {"adam_w_mode": False}})) is torch.optim.Adam
    adamw = _built({"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "betas": [0.9, 0.95]}})
    assert (type(adamw), adamw.defaults["lr"], adamw.defaults["weight_decay"], adamw.defaults["betas"]) == \
        (torch.optim.AdamW, 1e-4, 0.1, (0.9, 0.95))
    assert _built({"type": "AdamW"}).defaults["weight_decay"] == 0.0  # FusedAdam's default, not torch's 0.01
    assert _built({"type": "AdamW", "params": {"torch_adam": True}}).defaults["weight_decay"] == 0.01
    assert type(_built({"type": "adagrad", "params": {"lr": 0.1}})) is torch.optim.Adagrad
    sgd = _built({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}})
    assert (type(sgd), sgd.defaults["momentum"]) == (torch.optim.SGD, 0.9)
    assert type(_built({"type": "RMSprop", "params": {"lr": 0.1}})) is torch.optim.RMSprop


@pytest.mark.parametrize("section, words", [
    ({"type": "OneBitAdam"}, ["not compatible with ZeRO", "OneBitAdam without initialize"]),
    ({"type": "Lamb"}, ["Lamb", "not implemented"]),
    ({"type": "LBFGS"}, ["LBFGS", "other elements"]),
    ({"type": "Adamm"}, ["'Adamm'", "AdamW"]),
    ({"type": "AdamW", "params": {"max_grad_norm": 1.0}}, ["max_grad_norm", "gradient_clipping"]),
    ({"type": "AdamW", "params": {"lr": "auto"}}, ["'lr'", "auto", "Hugging Face"]),
    ({"type": "AdamW", "params": {"learning_rate": 1e-3}}, ["learning_rate", "'lr'"]),
    ({"type": "Adam", "params": {"bias_correction": False}}, ["bias_correction"]),
    ({"type": "Adam", "params": {"amsgrad": True}}, ["amsgrad", "torch_adam"]),
    ({"params": {"lr": 1e-3}}, ["'type'"]),
])
def test_optimizer_sections_zerocomm_cannot_build_are_refused(section, words):
    with pytest.raises(ZeroConfigError) as info:
        ZeroConfig(optimizer=section)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_factory_and_an_optimizer_section_are_refused_naming_both():
    def my_factory(groups):
        return torch.optim.SGD(groups, lr=0.1)

    with pytest.raises(ZeroConfigError) as info:
        resolve_factory(my_factory, ZeroConfig(optimizer={"type": "AdamW", "params": {"lr": 1e-4}}))
    assert "my_factory" in str(info.value) and "AdamW" in str(info.value) and "0.0001" in str(info.value)
    with pytest.raises(ZeroConfigError, match="no optimizer"):
        resolve_factory(None, ZeroConfig())


# -- parameter groups and buckets ---------------------------------------------------------------------------------
def test_buckets_never_mix_groups_and_stay_full():
    # weights (group 0) and biases (group 1) interleaved in gradient-ready order, as in any MLP
    shapes = [(f"w{i}", (8,)) if i % 2 == 0 else (f"b{i}", (2,)) for i in range(12)]
    groups = [i % 2 for i in range(12)]
    layouts = plan_buckets(shapes, bucket_numel=16, world_size=2, alignment=1, param_groups=groups)
    names = {name: group for (name, _), group in zip(shapes, groups)}
    for layout in layouts:
        assert {names[slot.name] for slot in layout.slots} == {layout.group}
    assert [layout.numel for layout in layouts if layout.group == 0] == [16, 16, 16]  # full, not one per run
    assert [layout.numel for layout in layouts if layout.group == 1] == [12]
    assert sorted(slot.index for layout in layouts for slot in layout.slots) == list(range(12))
    assert plan_buckets(shapes, 16, 2) == plan_buckets(shapes, 16, 2, param_groups=[0] * 12)  # one group as before


def test_param_groups_options_and_frozen_parameters():
    model = zero_api_checks.Net(frozen=True)
    managed = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = param_groups_of(model, managed, [{"params": list(model.parameters()), "lr": 0.5}])
    assert groups.options == ({"lr": 0.5},) and set(groups.group_of) == {id(p) for _, p in managed}
    masters = [torch.zeros(4), torch.zeros(2), torch.zeros(6)]
    split = param_groups_of(model, managed, zero_api_checks.split_groups(model))
    shaped = split.shard_groups(masters, [1, 0, 1])
    assert [(len(g["params"]), g["weight_decay"]) for g in shaped] == [(1, 0.1), (2, 0.0)]
    assert shaped[1]["params"][0] is masters[0] and shaped[1]["params"][1] is masters[2]


# -- on ranks ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_param_groups_match_torch_and_follow_their_lr(world):
    for stage in STAGES:
        for rank, seen in enumerate(world.run(zero_api_checks.groups_match_reference, stage, timeout=120)):
            where = f"stage {stage}, rank {rank}"
            assert seen["torch"], where
            assert seen["err"] <= REL, f"{where}: parameters differ from torch's AdamW by {seen['err']:.2e}"
            assert not seen["mixed"] and not seen["wrong_group"], (where, seen["mixed"], seen["wrong_group"])
            assert seen["buckets"] >= 2 and seen["groups"] == [(1e-2, 0.1), (3e-3, 0.0)], (where, seen)
            # group 1 (biases, norms) at lr 0 without weight decay: only the matrices still move
            assert seen["moved_others"] == [] and seen["moved_matrices"] == seen["matrices"], (where, seen)


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_factory_receives_torch_style_groups_of_shards(world):
    for stage in STAGES:
        for rank, seen in enumerate(world.run(zero_api_checks.factory_receives_torch_groups, stage)):
            assert [g["options"] for g in seen["seen"]] == [{"weight_decay": 0.1}, {"weight_decay": 0.0}], seen
            assert [g["count"] for g in seen["seen"]] == seen["buckets"] and all(g["flat"] for g in seen["seen"])


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_torch_lambda_lr_works_on_the_zero_optimizer(world):
    for stage in STAGES:
        for rank, seen in enumerate(world.run(zero_api_checks.lambda_lr_matches_reference, stage, timeout=120)):
            assert seen["err"] <= REL, (stage, rank, seen["err"])
            assert all(a == b for a, b in seen["lrs"]) and seen["lrs"][-1][0] == pytest.approx(1e-2 / 7)


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_config_schedules_step_once_per_applied_update(world):
    steps = 7
    linear = [0.0, 0.0] + [1e-2 * min(c / 3, 1.0) for c in range(1, steps - 1)]  # WarmupLR, counts -1, 0, 1, ...
    cases = [({"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_max_lr": 1e-2, "warmup_type": "linear"}},
              linear),
             ({"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 3, "cos_min_ratio": 0.0,
                                                    "warmup_type": "linear"}},  # ratios of the configured lr
              [1e-2 * r for r in [0.0, 0.0, 1 / 3, 2 / 3] + [(1 + math.cos(math.pi * k / 5)) / 2 for k in (1, 2, 3)]])]
    for stage in (1, 3):
        for schedule, lrs in cases:
            for rank, seen in enumerate(world.run(zero_api_checks.config_schedule_matches_reference, stage, schedule,
                                                  lrs, steps, timeout=120)):
                where = f"stage {stage}, {schedule['type']}, rank {rank}"
                assert seen["used"] == pytest.approx(lrs), where
                assert seen["err"] <= REL, (where, seen["err"])
                assert seen["results"] == [[False, True]] * steps, where  # True at the accumulation boundary only
                assert seen["schedule_state"] == {"last_batch_iteration": steps - 1}, where


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_fp16_overflow_step_returns_false_and_holds_the_schedule(world):
    for rank, seen in enumerate(world.run(zero_api_checks.fp16_overflow_skips)):
        assert seen["results"] == [True, False, True, True], (rank, seen)
        assert (seen["skipped"], seen["applied"], seen["global_steps"]) == (1, 3, 4), (rank, seen)
        assert seen["counts"] == [0, 0, 1, 2], (rank, seen)  # the skipped step did not advance the schedule


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_steps_per_print_logs_on_rank_zero(world):
    lines = world.run(zero_api_checks.progress_lines, 2, 5)
    assert lines[1] == []
    assert [line.split(",")[0] for line in lines[0]] == ["[Rank 0] step=2", "[Rank 0] step=4"], lines[0]
    assert "skipped=0, lr=[0.1], mom=[0.9]" in lines[0][0], lines[0][0]


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_refusals_name_what_is_wrong(world):
    seen = dict((what, (kind, message)) for what, kind, message in world.run(zero_api_checks.refusals)[0])
    assert all(kind == "ZeroConfigError" for kind, _ in seen.values()), seen
    message = seen["factory and section"][1]
    assert "'adam'" in message and "AdamW" in message and "remove one" in message, message
    assert "'out.bias'" in seen["parameter twice"][1] and "groups 0 and 1" in seen["parameter twice"][1]
    assert "'out.bias'" in seen["parameter left out"][1] and "requires_grad=False" in seen["parameter left out"][1]
    assert "(2,)" in seen["foreign tensor"][1] and "not a parameter of the model" in seen["foreign tensor"][1]


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_state_dict_round_trip(world):
    for stage, precision in [(0, "fp32"), (1, "bf16"), (2, "fp32"), (3, "bf16")]:
        for rank, seen in enumerate(world.run(zero_api_checks.state_dict_round_trip, stage, precision)):
            where = f"stage {stage} {precision}, rank {rank}"
            assert seen["same"], where
            assert seen["counters"] == (3, 2), where
            assert seen["keys"] == ["param_groups", "state", "zero"], where
            assert seen["refused"].startswith("ZeroStateError") and "rank" in seen["refused"], (where, seen)


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_checkpoint_restores_buffers_frozen_parameters_schedule_and_client_state(world, tmp_path):
    for stage in STAGES:
        path = str(tmp_path / f"stage{stage}")
        for rank, seen in enumerate(world.run(zero_api_checks.checkpoint_restores_everything, path, stage,
                                              timeout=120)):
            where = f"stage {stage}, rank {rank}"
            assert seen["differed"] and seen["fresh_buffers"], where  # the second model really started elsewhere
            assert seen["loaded"] == seen["folder"], where
            state = seen["client_state"]
            assert (state["epoch"], state["note"], state["rng"].tolist()) == (7, "resume here", [0, 1, 2]), where
            assert seen["restored"]["buffers"] and seen["restored"]["frozen"], (where, seen["restored"])
            assert seen["restored"]["schedule"] == 2 and seen["restored"]["global_steps"] == 3, (where, seen)
            assert seen["same"], f"{where}: training after load differs from training on"


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True, ids=["gloo-2"])
def test_hugging_face_gpt2_trains_under_a_deepspeed_config_and_resumes(world, tmp_path):
    pytest.importorskip("transformers", reason="needs transformers: pip install 'zerocomm[test]'")
    for stage in (2, 3):
        runs = world.run(zero_api_checks.hugging_face_resume, str(tmp_path / f"stage{stage}"), stage, timeout=240)
        for rank, seen in enumerate(runs):
            where = f"stage {stage}, rank {rank}"
            assert all(math.isfinite(loss) for loss in seen["losses_a"]), where
            assert seen["losses_a"][-1] < seen["losses_a"][0], (where, seen["losses_a"])  # it learns
            assert seen["losses_b"] == seen["losses_a"], (where, seen["losses_a"], seen["losses_b"])
            assert seen["bitwise"], (where, seen["err"])
            assert seen["lr"][0] == seen["lr"][1] and seen["schedule"] == 5, (where, seen["lr"], seen["schedule"])
            assert [wd for _, wd in seen["groups"]] == [0.1, 0.0], (where, seen["groups"])


def test_steps_per_print_is_a_positive_int():
    with pytest.raises(ZeroConfigError, match="steps_per_print"):
        ZeroConfig(steps_per_print=0)
    assert ZeroConfig.from_deepspeed({"steps_per_print": 5}).steps_per_print == 5
    assert ZeroConfig.from_deepspeed({}).steps_per_print is None  # DeepSpeed's code default: no progress lines
