"""The offloading optimizer-state parts alone, no ranks: against ``DeviceOptimizerState`` on the same tensors."""
import os

import pytest
import torch

from zerocomm.zero.offload import HostOptimizerState
from zerocomm.zero.offload_nvme import NvmeOptimizerState
from zerocomm.zero.offload_param import FileShards, MemoryShards
from zerocomm.zero.optimizer_state import DeviceOptimizerState

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


def _shards(dtype, sizes=(1000, 37, 513)):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(n, generator=generator).to(dtype) for n in sizes]


def _run(make_state, dtype, steps=4):
    """Drive a state as the wrapper does: gradients, step, write back; returns the parameter shards."""
    params = _shards(dtype)
    full32 = None if dtype == torch.float32 else [p.float() for p in params]
    state = make_state(params, full32)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        grads = [torch.randn(p.numel(), generator=generator).to(dtype) for p in params]
        state.set_gradients(grads, 0.5)
        if step == 2:
            state.scale_gradients(0.25)  # clipping
        state.step()
        state.write_back(params)
        state.clear_gradients()
    return params, state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("piece, slots", [(100, 2), (999, 3), (4096, 4)])
def test_nvme_state_steps_like_the_device_state(tmp_path, name, dtype, piece, slots):
    factory = OPTIMIZERS[name]
    want, _ = _run(lambda p, f: DeviceOptimizerState(p, f, factory, 0), dtype)
    got, state = _run(lambda p, f: NvmeOptimizerState(p, f, factory, 0, folder=tmp_path, buffer_count=slots,
                                                      piece_numel=piece), dtype)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    files = os.listdir(state.files.folder)
    assert len(files) == 3 * (len(state.elementwise) + 1 + (dtype != torch.float32)), files  # + the gradient
    # between steps the optimizer's state dict holds the files' contents, shaped like the masters
    packed = state.optimizer.state_dict()["state"]
    assert all(packed[i][k].shape == state.masters[i].shape for i in packed for k in state.elementwise)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_state_copies_and_steps_like_the_device_state(dtype):
    factory = OPTIMIZERS["adam"]
    want, _ = _run(lambda p, f: DeviceOptimizerState(p, f, factory, 0), dtype)
    got, state = _run(lambda p, f: HostOptimizerState(p, f, factory, 0), dtype)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    numel = sum(m.numel() for m in state.masters)
    assert state.to_host_bytes == 4 * numel * dtype.itemsize  # 4 steps, each copies the gradient shard to the host
    assert state.to_device_bytes == 4 * numel * dtype.itemsize  # and the updated shard back


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clip", [False, True])
def test_streamed_gradients_step_like_gradients_in_memory(tmp_path, dtype, clip):
    """Gradients handed over by ``gradient_ready`` (and then dropped by the caller) give the same parameters and
    the same sum of squares as gradients given to ``set_gradients``."""
    factory = OPTIMIZERS["adam"]
    want, _ = _run(lambda p, f: DeviceOptimizerState(p, f, factory, 0), dtype)
    params = _shards(dtype)
    full32 = None if dtype == torch.float32 else [p.float() for p in params]
    state = NvmeOptimizerState(params, full32, factory, 0, folder=tmp_path, buffer_count=2, piece_numel=300,
                               needs_norm=clip)
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        grads = [torch.randn(p.numel(), generator=generator).to(dtype) for p in params]
        expected = sum(float(g.float().mul(0.5).double().square().sum()) for g in grads)
        for bucket in (2, 0, 1):  # out of order, as reductions may finish
            state.gradient_ready(bucket, grads[bucket].clone(), 0.5)
        grads = None  # the gradients part forgets its chunks
        assert state.set_gradients([None, None, None], 0.5) == []
        if clip:
            assert float(state.streamed_sum_of_squares) == pytest.approx(expected, rel=1e-12)
        if step == 2:
            state.scale_gradients(0.25)
        state.step()
        state.write_back(params)
        state.clear_gradients()
    for a, b in zip(params, want):
        assert torch.equal(a, b)
    assert state.gradient_placement()["disk"] == 4 * sum(p.numel() for p in params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_in_files_step_like_parameters_in_memory(tmp_path, dtype):
    """``offload_param: nvme``: the NVMe state steps parameter pieces read from a ``FileShards`` store (fp32: the
    parameter file is the master file) and leaves the same values as the device state over tensors."""
    factory = OPTIMIZERS["adam"]
    want, _ = _run(lambda p, f: DeviceOptimizerState(p, f, factory, 0), dtype)
    initial = _shards(dtype)
    store = FileShards([p.numel() for p in initial], dtype=dtype, folder=tmp_path, rank=0)
    for u, values in enumerate(initial):
        store.write(u, values, 0)
    full32 = None if dtype == torch.float32 else [p.float() for p in initial]
    shards = [store.shard(u) for u in range(len(initial))]
    state = NvmeOptimizerState(shards, full32, factory, 0, folder=tmp_path, buffer_count=2, piece_numel=128,
                               param_store=store)
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        grads = [torch.randn(p.numel(), generator=generator).to(dtype) for p in initial]
        state.set_gradients(grads, 0.5)
        if step == 2:
            state.scale_gradients(0.25)
        state.step()
        state.write_back(shards)
        state.clear_gradients()
        store.invalidate()
    for u, values in enumerate(want):
        store.read_ahead(u)
        assert torch.equal(store.fetch(u), values)  # the files hold the updated parameters
        assert torch.equal(store.shard(u), values)  # and so does a mapping of them
    assert store.placement("host") == {"device": 0, "host": 0, "disk": sum(p.numel() for p in want) * dtype.itemsize}
    folder = store.folder
    del state, store, shards
    import gc
    gc.collect()
    assert not folder.exists(), "the parameter folder outlived its store"


def test_memory_store_is_a_flat_tensor():
    store = MemoryShards([3, 5], dtype=torch.float32, device=torch.device("cpu"))
    store.write(1, torch.arange(5.0), 0)
    assert torch.equal(store.fetch(1), torch.arange(5.0)) and store.fetch(1).data_ptr() == store.flat[3:].data_ptr()
    assert store.placement("host") == {"device": 0, "host": 32, "disk": 0}
