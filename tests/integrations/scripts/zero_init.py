"""``deepspeed.zero.Init`` on 2 ranks: the bytes a rank allocates while it builds a model under Init and
``initialize`` takes it into ZeRO-3, against the same without Init; training from the Init-built model
against the ordinary one (stage 3 in float32 and bf16, and stage 2 where Init's parameters are gathered whole);
``GatheredParameters`` before and after ``initialize``; refusals that need a process group.

Memory is counted by torch's profiler (``profile_memory=True``): every allocation and free of this
thread's CPU tensors, in time order; the peak is the largest running sum over the window.

Launch: torchrun --nproc-per-node 2 zero_init.py OUT.json CHECKPOINT_FOLDER
"""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import zerocomm.comm as dist
import zerocomm.deepspeed as deepspeed
from zerocomm.zero import ZeroConfigError

out = sys.argv[1]
deepspeed.init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
LAYERS, WIDTH = 12, 1024


class Stack(torch.nn.Module):
    """``layers`` Linear + Tanh blocks; each Linear is a stage-3 unit (a child of an inner Sequential)."""

    def __init__(self, layers, width):
        super().__init__()
        modules = []
        for _ in range(layers):
            modules += [torch.nn.Linear(width, width), torch.nn.Tanh()]
        self.layers = torch.nn.Sequential(*modules)

    def forward(self, x):
        return self.layers(x)


def make(layers=LAYERS, width=WIDTH):
    torch.manual_seed(0)
    return Stack(layers, width)


def config(stage, bf16=False):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "bf16": {"enabled": bf16},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 2048}}


def allocated(prof) -> tuple[int, int]:
    """(peak, final) of the running sum of this thread's CPU allocations minus frees over the window."""
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, running)
    return peak, running


def build(stage, init, layers=LAYERS, width=WIDTH, edit=False, bf16=False):
    """(engine, {"build": peak bytes while the model is made, "held": bytes it holds then, "initialize": peak
    bytes, counted from before the model was made, while initialize sets ZeRO up, "end": bytes held after it})."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if init:
            with deepspeed.zero.Init():
                net = make(layers, width)
            if edit:  # a parameter written after construction: gathered, rank 0 writes, re-sharded
                with deepspeed.zero.GatheredParameters(net.layers[0].weight, modifier_rank=0):
                    with torch.no_grad():
                        net.layers[0].weight.mul_(0.5 if rank == 0 else 3.0)  # rank 1's write is discarded
        else:
            net = make(layers, width)
            if edit:
                with torch.no_grad():
                    net.layers[0].weight.mul_(0.5)
    build_peak, held = allocated(prof)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        engine, _, _, _ = deepspeed.initialize(model=net, config=config(stage, bf16))
    init_peak, init_final = allocated(prof)
    return engine, {"build": build_peak, "held": held, "initialize": held + init_peak, "end": held + init_final}


def train(engine, micro_steps=4, width=WIDTH):
    generator = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(micro_steps):
        x = torch.randn(4, width, generator=generator)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def full_params(engine):
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return [p.detach().clone() for p in engine.module.parameters()]


report = {"world": world}
total = sum(p.numel() * 4 for p in make().parameters())
unit = (WIDTH * WIDTH + WIDTH) * 4
report.update(total_bytes=total, unit_bytes=unit)

init_engine, report["init_bytes"] = build(3, init=True, edit=True)
plain_engine, report["plain_bytes"] = build(3, init=False, edit=True)
report["stage3_init_losses"] = train(init_engine)
report["stage3_plain_losses"] = train(plain_engine)
a, b = full_params(init_engine), full_params(plain_engine)
report["stage3_params_equal"] = all(torch.equal(x, y) for x, y in zip(a, b))
report["stage3_param_max_diff"] = max((x - y).abs().max().item() for x, y in zip(a, b))

# one unit only, then a write from rank 1 that every rank sees
layer = init_engine.module.layers[4]
with deepspeed.zero.GatheredParameters(layer.weight):
    report["subset_gather_equal"] = torch.equal(layer.weight.detach(), a[4])
with deepspeed.zero.GatheredParameters(layer.bias, modifier_rank=1):
    with torch.no_grad():
        layer.bias.fill_(float(rank + 1))
with deepspeed.zero.GatheredParameters(layer.bias):
    report["modifier_rank_1_bias"] = sorted(set(layer.bias.detach().tolist()))
del init_engine, plain_engine

small_init, _ = build(2, init=True, layers=3, width=64)
small_plain, _ = build(2, init=False, layers=3, width=64)
report["stage2_init_losses"] = train(small_init, width=64)
report["stage2_plain_losses"] = train(small_plain, width=64)

# bf16: the float32 masters come from the unit buffers as they are gathered, not from the rounded parameters
small_init, _ = build(3, init=True, layers=3, width=64, bf16=True)
small_plain, _ = build(3, init=False, layers=3, width=64, bf16=True)
report["bf16_init_losses"] = train(small_init, width=64)
report["bf16_plain_losses"] = train(small_plain, width=64)
report["bf16_masters_equal"] = all(torch.equal(a, b) for a, b in zip(small_init.optimizer.master,
                                                                     small_plain.optimizer.master))
# a checkpoint of the ordinary engine loads into the Init-built one (its shards live one tensor per unit)
folder = sys.argv[2]
train(small_plain, micro_steps=2, width=64)  # one step ahead of the Init-built engine: the load must change it
small_plain.save_checkpoint(folder)
small_init.load_checkpoint(folder)
report["bf16_loaded_masters_equal"] = all(torch.equal(a, b) for a, b in zip(small_init.optimizer.master,
                                                                            small_plain.optimizer.master))
report["bf16_after_load_losses"] = [train(small_init, micro_steps=2, width=64),
                                    train(small_plain, micro_steps=2, width=64)]

refusals = {}
try:
    deepspeed.initialize(model=make(2, 8), config={**config(3), "amp": {"enabled": True}})
except ZeroConfigError as error:
    refusals["amp"] = str(error)
try:
    small_plain.load_checkpoint("nowhere", load_module_only=True)
except ZeroConfigError as error:
    refusals["load_module_only"] = str(error)
try:
    scheduled = {**config(3), "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}}
    deepspeed.initialize(model=make(2, 8), config=scheduled,
                         lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1))
except ZeroConfigError as error:
    refusals["lr_scheduler"] = str(error)
report["refusals"] = refusals

if rank == 0:
    with open(out, "w") as f:
        json.dump(report, f)
