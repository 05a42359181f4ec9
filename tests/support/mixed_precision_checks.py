"""Rank-side mixed-precision checks: the same seeded model and data trained under ZeRO with ``bf16``/``fp16``
enabled and under torch's DDP with ``torch.autocast`` (on a ``new_group(backend="gloo")`` of torch's own gloo,
so the reference shares no code with zerocomm), returning each rank's loss per step for the test to compare.

Two models:

* ``bn_cnn``: a small CNN with BatchNorm (running statistics are buffers) whose first convolution is frozen
  (``requires_grad=False``): a ZeRO run casts both to the compute dtype, as DeepSpeed casts the whole module.
* ``lora_llama``: a tiny Llama built from a ``LlamaConfig`` (no download) with PEFT LoRA adapters on ``q_proj``
  and ``v_proj`` (the base frozen) and non-reentrant gradient checkpointing.

The reference keeps float32 parameters and runs the forward under ``torch.autocast`` (matmuls and convolutions in
the low dtype, batch norm and the loss in float32); fp16 adds torch's ``GradScaler``.  ZeRO runs the whole
forward in the low dtype and steps float32 masters.  So the losses differ by the low dtype's rounding, and the
test compares them within a tolerance that says so.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as td
from torch import nn
from torch.nn import functional as F

from zerocomm.zero import initialize

from .dist import dist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- the models and their data ------------------------------------------------------------------------

def bn_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    for param in model[0].parameters():  # a frozen layer: trained by nobody, cast like the buffers
        param.requires_grad_(False)
    return model


def cnn_batch(rank: int, step: int) -> tuple:
    """Rank ``rank``'s batch at ``step`` (two batches per rank, alternating): 16 images 3x8x8, labels from a fixed
    linear teacher so that the model can learn them."""
    generator = torch.Generator().manual_seed(1000 * rank + step % 2)
    images = torch.randn(16, 3, 8, 8, generator=generator)
    teacher = torch.randn(3 * 8 * 8, 4, generator=torch.Generator().manual_seed(7))
    return images, (images.flatten(1) @ teacher).argmax(1)


def cnn_loss(model, batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def lora_llama(seed: int = 0) -> nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attn_implementation="eager")
    base = LlamaForCausalLM(config)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights="gaussian"))
    model.train()
    return model


def llama_batch(rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2000 * rank + step % 2)
    return torch.randint(0, 64, (4, 16), generator=generator)


def llama_loss(model, tokens) -> torch.Tensor:
    return model(input_ids=tokens, labels=tokens).loss.float()


MODELS = {"bn_cnn": (bn_cnn, cnn_batch, cnn_loss), "lora_llama": (lora_llama, llama_batch, llama_loss)}


# -- the two runs -------------------------------------------------------------------------------------

def zero_losses(name: str, stage: int, precision: str, steps: int, lr: float) -> dict:
    """This rank's loss at each step under ZeRO ``stage`` with ``precision`` enabled (DeepSpeed config), and what
    the module holds afterwards."""
    make, batch, loss_fn = MODELS[name]
    model = make()
    config = {"zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}}}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    if precision == "fp16":
        config["fp16"].update(initial_scale_power=8, loss_scale_window=4)
    model, optimizer = initialize(model, config=config)
    rank, losses, applied = dist.get_rank(), [], 0
    for step in range(steps):
        loss = loss_fn(model, batch(rank, step))
        loss.backward()
        applied += bool(optimizer.step())
        optimizer.zero_grad()
        losses.append(loss.item())
    low = DTYPES[precision]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    return {"losses": losses, "applied": applied,
            "frozen_dtypes": sorted({str(p.dtype) for p in model.parameters() if id(p) not in trainable}),
            "buffer_dtypes": sorted({str(b.dtype) for b in model.buffers() if b.is_floating_point()}),
            "trainable_dtypes": sorted({str(p.dtype) for p in model.parameters() if id(p) in trainable}),
            "master_dtypes": sorted({str(m.dtype) for m in optimizer.master}),
            "master_elements": sum(m.numel() for m in optimizer.master),
            "trainable_elements": sum(p.numel() for p in model.parameters() if id(p) in trainable),
            "frozen_elements": sum(p.numel() for p in model.parameters() if id(p) not in trainable),
            "low": str(low)}


def ddp_autocast_losses(name: str, precision: str, steps: int, lr: float) -> dict:
    """This rank's loss at each step under torch's DDP over torch's own gloo, float32 parameters, the forward under
    ``torch.autocast(low dtype)`` (none for fp32; a ``GradScaler`` for fp16), AdamW on the trainable parameters."""
    from torch.nn.parallel import DistributedDataParallel

    make, batch, loss_fn = MODELS[name]
    model = DistributedDataParallel(make(), process_group=_gloo_group())
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    low = DTYPES[precision]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=4) if precision == "fp16" else None
    rank, losses = td.get_rank(), []
    for step in range(steps):
        with torch.autocast("cpu", dtype=low, enabled=precision != "fp32"):
            loss = loss_fn(model, batch(rank, step))
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses}


_GLOO = []


def _gloo_group():
    """This rank's group of torch's own gloo over the world, made at its first use and kept for the rank's life:
    destroying a gloo group while a peer may still be reading the last message of its last collective can leave
    that peer waiting."""
    if not _GLOO:
        _GLOO.append(td.new_group(backend="gloo"))
    return _GLOO[0]


def compare(name: str, stages: list, precision: str, steps: int, lr: float) -> dict:
    """The reference run, then a ZeRO run per stage, on this rank: ``{"reference": losses, "stages": {stage: the
    ZeRO run's summary, with "worst_relative", the largest relative difference of its loss from the reference's
    at a step}}``."""
    reference = ddp_autocast_losses(name, precision, steps, lr)["losses"]
    runs = {}
    for stage in stages:
        mine = zero_losses(name, stage, precision, steps, lr)
        mine["worst_relative"] = max(abs(a - b) / abs(b) for a, b in zip(mine["losses"], reference))
        mine["finite"] = all(math.isfinite(loss) for loss in mine["losses"])
        runs[stage] = mine
    return {"reference": reference, "stages": runs}
