"""The offloading optimizer-state parts alone, no ranks: against ``DeviceOptimizerState`` on the same tensors."""
import os

import pytest
import torch

from zerocomm.zero.offload import HostOptimizerState
from zerocomm.zero.offload_nvme import NvmeOptimizerState
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
    assert len(files) == 3 * (len(state.elementwise) + (dtype != torch.float32)), files
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
