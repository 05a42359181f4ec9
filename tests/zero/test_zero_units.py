"""Local pieces of zerocomm.zero, no ranks needed: config, layout, buckets, loss scaler."""
import pytest
import torch

from zerocomm.zero import ZeroConfig, ZeroConfigError, ZeroStateError
from zerocomm.zero.gradients import BucketState, GradientBucket, ShardedGradients
from zerocomm.zero.partition import flat_numel, group_consecutive, layout_groups, plan_buckets, shard_numel
from zerocomm.zero.precision import LossScaler, clip_coefficient, sum_of_squares


# -- config -----------------------------------------------------------------------------------
def test_deepspeed_dict_maps_onto_fields():
    config = ZeroConfig.from_deepspeed({
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8,
                              "overlap_comm": False, "contiguous_gradients": True, "reduce_scatter": False},
        "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "hysteresis": 3},
        "bf16": {"enabled": False},
    })
    assert (config.stage, config.reduce_bucket_numel, config.allgather_bucket_numel) == (1, 500_000_000, 200_000_000)
    assert (config.overlap_comm, config.reduce_scatter) == (False, False)
    assert (config.gradient_accumulation_steps, config.gradient_clipping) == (4, 1.0)
    assert (config.precision, config.initial_scale_power, config.hysteresis) == ("fp16", 12, 3)
    assert config.dynamic_loss_scale


@pytest.mark.parametrize("config, words", [
    ({"zero_optimization": {"contiguous_gradients": False}}, ["contiguous_gradients", "always"]),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, ["fp16.enabled and bf16.enabled"]),
    ({"gradient_clipping": "auto"}, ["gradient_clipping", "'auto'", "TrainingArguments"]),
    ({"zero_optimization": {"stage": 5}}, ["stage", "5"]),
    ({"gradient_clipping": -1}, ["gradient_clipping", "-1"]),
    ({"zero_optimization": []}, ["zero_optimization must be a dict"]),
    ({"zero_optimization": {"stage": 2, "sub_group": 1}}, ["zero_optimization.sub_group", "sub_group_size"]),
])
def test_deepspeed_dict_errors_name_the_key(config, words):
    with pytest.raises(ZeroConfigError) as info:
        ZeroConfig.from_deepspeed(config)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("fields, words", [
    ({"stage": 4}, ["stage", "4"]),
    ({"precision": "fp8"}, ["precision", "fp8"]),
    ({"reduce_bucket_numel": 0}, ["reduce_bucket_numel", ">= 1", "0"]),
    ({"gradient_accumulation_steps": True}, ["gradient_accumulation_steps"]),
    ({"overlap_comm": 1}, ["overlap_comm", "bool"]),
    ({"algorithm": "fast"}, ["algorithm", "fast"]),
    ({"loss_scale": 128.0}, ["loss_scale", "fp16"]),
    ({"min_loss_scale": 0}, ["min_loss_scale"]),
    ({"keep_bucket_buffers": 1}, ["keep_bucket_buffers", "bool"]),
])
def test_config_fields_are_validated(fields, words):
    with pytest.raises(ZeroConfigError) as info:
        ZeroConfig(**fields)
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


# -- layout -----------------------------------------------------------------------------------
def test_buckets_are_padded_and_every_rank_owns_one_chunk_of_each():
    shapes = [("a", (10,)), ("b", (3, 4)), ("c", (30,)), ("d", (5,))]
    layouts = plan_buckets(shapes, bucket_numel=25, world_size=3, alignment=2)
    assert [[s.name for s in layout.slots] for layout in layouts] == [["a", "b"], ["c"], ["d"]]
    assert [layout.numel for layout in layouts] == [22, 30, 5]
    assert [layout.padded_numel for layout in layouts] == [24, 30, 6]  # multiples of 3 * 2
    assert [layout.offset for layout in layouts] == [0, 24, 54]
    assert [layout.shard_offset for layout in layouts] == [0, 8, 18]
    assert layouts[0].chunk_bounds(2) == (16, 24) and layouts[1].chunk_bounds(1) == (10, 20)
    assert [(s.offset, s.numel, s.index) for s in layouts[0].slots] == [(0, 10, 0), (10, 12, 1)]
    assert flat_numel(layouts) == 60 and shard_numel(layouts) == 20
    assert [[b.index for b in g] for g in group_consecutive(layouts, 54)] == [[0, 1], [2]]
    with pytest.raises(ValueError, match="rank must be in"):
        layouts[0].chunk_bounds(3)


def test_empty_parameter_and_bad_arguments():
    (layout,) = layout_groups([[("empty", (0,))]], world_size=4)
    assert layout.numel == 0 and layout.padded_numel == 4  # every rank still owns one element
    with pytest.raises(ValueError, match="group 0 is empty"):
        layout_groups([[]], world_size=2)
    with pytest.raises(ValueError, match="bucket_numel"):
        plan_buckets([("a", (1,))], bucket_numel=0, world_size=2)


# -- bucket -----------------------------------------------------------------------------------
class _Done:
    def __init__(self):
        self.waited = False

    def is_completed(self):
        return True

    def wait(self):
        self.waited = True


def _bucket(persistent=False):
    (layout,) = layout_groups([[("w", (2, 2)), ("b", (2,))]], world_size=2)
    launched = []

    def reduce(layout, buffer):
        launched.append(buffer.clone())
        return _Done()

    bucket = GradientBucket(layout, acquire=lambda l: torch.full((l.padded_numel,), 7.0), reduce=reduce,
                            persistent=persistent, rank=3)
    return bucket, launched


def test_bucket_fills_launches_and_releases():
    bucket, launched = _bucket()
    bucket.begin()
    assert bucket.add(1, torch.tensor([1.0, 2.0])) is False
    assert bucket.add(0, torch.ones(2, 2)) is True
    bucket.launch()
    assert launched[0].tolist() == [1, 1, 1, 1, 1, 2]
    bucket.wait()
    assert bucket.state is BucketState.REDUCED and bucket.buffer is None
    bucket.reset()
    bucket.begin()
    bucket.add(0, None)  # a parameter without gradient contributes zeros
    bucket.add(1, torch.zeros(2))
    bucket.launch()
    assert launched[1].tolist() == [0] * 6


def test_sharded_gradients_reuse_a_finished_buffer_and_free_it_at_the_end_of_the_step():
    from zerocomm.zero.stages import Reduction
    layouts = plan_buckets([("a", (10,)), ("b", (3,)), ("c", (9,))], bucket_numel=10, world_size=2, alignment=2)
    assert [layout.padded_numel for layout in layouts] == [12, 4, 12]
    grads = ShardedGradients(layouts, dtype=torch.float32, device=torch.device("cpu"),
                             reduction=Reduction.REDUCE_SCATTER, max_inflight=2, rank=0)
    first = grads.acquire(layouts[0])
    assert first.numel() == 12
    first.fill_(9.0)  # what the previous bucket left in the buffer
    grads.release(first)
    launched = []
    bucket = GradientBucket(layouts[1], acquire=grads.acquire, release=grads.release, persistent=False,
                            reduce=lambda layout, buffer: launched.append(buffer.clone()) or _Done())
    bucket.begin()
    bucket.add(0, torch.tensor([1.0, 2.0, 3.0]))
    assert bucket.buffer.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()  # no fresh memory
    bucket.launch()
    assert launched[0].tolist() == [1, 2, 3, 0]  # the reused buffer's padding is zeroed, not the old 9s
    shard_bytes = 4 * grads.shard.numel()
    assert grads.nbytes([bucket]) == shard_bytes + 4 * 12  # the whole buffer counts while in use
    assert grads.spare_bytes() == 0
    bucket.wait()
    # a spare is memory held, but a communication buffer: not a gradient
    assert bucket.buffer is None and grads.nbytes([bucket]) == shard_bytes and grads.spare_bytes() == 4 * 12
    for _ in range(3):  # never more spares than buffers in flight
        grads.release(torch.empty(12))
    assert grads.spare_bytes() == 2 * 4 * 12
    grads.end_step()
    assert first.untyped_storage().nbytes() == 0 and grads.spare_bytes() == 0  # the shard only
    assert grads.nbytes([bucket]) == shard_bytes


def test_sharded_gradients_that_keep_buffers_reuse_them_in_the_next_step():
    from zerocomm.zero.stages import Reduction
    layouts = plan_buckets([("a", (10,)), ("b", (3,))], bucket_numel=10, world_size=2, alignment=2)
    grads = ShardedGradients(layouts, dtype=torch.float32, device=torch.device("cpu"),
                             reduction=Reduction.REDUCE_SCATTER, max_inflight=2, rank=0, keep_buffers=True)
    first = grads.acquire(layouts[0])
    grads.release(first)
    grads.end_step()
    assert first.untyped_storage().nbytes() == 4 * 12 and grads.spare_bytes() == 4 * 12  # kept
    again = grads.acquire(layouts[1])  # the next step's first bucket takes it: no fresh memory
    assert again.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() and again.numel() == 4
    assert grads.spare_bytes() == 0


@pytest.mark.parametrize("stage, override, offload, kept", [
    (2, None, "none", True), (3, None, "none", False), (2, False, "none", False), (3, True, "none", True),
    (1, True, "none", False), (2, None, "cpu", False), (2, True, "cpu", True)])
def test_the_stage_table_says_which_stages_keep_bucket_buffers(stage, override, offload, kept):
    from zerocomm.zero.config import ZeroConfig
    from zerocomm.zero.stages import plan_for
    plan = plan_for(ZeroConfig(stage=stage, keep_bucket_buffers=override, offload_optimizer=offload))
    assert plan.keep_bucket_buffers is kept  # stage 1's gradients are one full buffer: nothing to keep or free


def test_bucket_misuse_raises_state_errors_naming_rank_bucket_and_parameter():
    bucket, _ = _bucket()
    with pytest.raises(ZeroStateError,
                       match=r"rank 3: bucket 0: gradient of 'w' arrived while the bucket is idle \(expected expecting"):
        bucket.add(0, torch.ones(2, 2))
    bucket.begin()
    bucket.add(0, torch.ones(2, 2))
    with pytest.raises(ZeroStateError, match="'w' arrived twice"):
        bucket.add(0, torch.ones(2, 2))
    with pytest.raises(ZeroStateError, match=r"launch while expecting gradients with gradients of \['b'\] missing"):
        bucket.launch()
    with pytest.raises(ZeroStateError, match="has shape"):
        bucket.add(1, torch.ones(3))
    bucket.add(1, torch.ones(2))
    bucket.launch()
    with pytest.raises(ZeroStateError, match="still in flight"):
        bucket.begin()
    with pytest.raises(ZeroStateError, match="in flight"):
        bucket.reset()


# -- precision --------------------------------------------------------------------------------
def test_dynamic_loss_scale_follows_hysteresis_and_window():
    scaler = LossScaler(ZeroConfig(precision="fp16", initial_scale_power=4, hysteresis=2, loss_scale_window=3,
                                   min_loss_scale=4.0))
    assert scaler.scale == 16.0
    scaler.update(overflow=True)
    assert scaler.scale == 16.0  # one unit of hysteresis used
    scaler.update(overflow=True)
    assert scaler.scale == 8.0
    scaler.update(overflow=True)
    scaler.update(overflow=True)
    assert scaler.scale == 4.0  # floor
    for _ in range(3):
        scaler.update(overflow=False)
    assert scaler.scale == 8.0 and scaler.overflows == 4
    state = scaler.state_dict()
    other = LossScaler(ZeroConfig(precision="fp16"))
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_static_loss_scale_never_moves():
    scaler = LossScaler(ZeroConfig(precision="fp16", loss_scale=64.0))
    scaler.update(overflow=True)
    for _ in range(2000):
        scaler.update(overflow=False)
    assert scaler.scale == 64.0


def test_norm_is_float64_and_independent_of_sharding():
    torch.manual_seed(0)
    grad = torch.randn(1_500_000) * 1e-3
    whole = float(sum_of_squares([grad]))
    shards = sum(float(sum_of_squares([piece])) for piece in grad.chunk(7))
    assert abs(whole - shards) <= 1e-12 * whole
    assert sum_of_squares([grad]).dtype == torch.float64
    assert clip_coefficient(2.0, 1.0) == pytest.approx(0.5) and clip_coefficient(0.5, 1.0) == 1.0
