"""Rank-side checks of the torch-optimizer surface of ``ZeroOptimizer``: parameter groups, schedules, step's
result, progress lines, ``state_dict``, and checkpoints with buffers, frozen parameters and client state.

The reference is one plain model per rank trained by a plain torch optimizer on the *global* batch (every
rank's rows, in rank order): with equal rows per rank and a mean loss its gradient is the average of the
ranks' gradients, which is what ZeRO applies, so no communication enters the reference.
"""
from __future__ import annotations

import copy
import io
import logging
import os
import tempfile
import traceback

import torch
from torch import nn
from torch.nn import functional as F

from zerocomm.zero import ZeroConfig, ZeroConfigError, initialize

from .dist import dist

ROWS = 4
"""Rows of the batch each rank trains on per micro-step."""


class Net(nn.Module):
    """Blocks in a ModuleList (stage 3 units), a root with parameters of both groups, a LayerNorm, and
    optionally a BatchNorm (buffers) and a frozen layer."""

    def __init__(self, *, batch_norm: bool = False, frozen: bool = False):
        super().__init__()
        self.pre = nn.Linear(6, 6)
        self.pre.requires_grad_(not frozen)
        self.inp = nn.Linear(6, 16)
        self.norm = nn.BatchNorm1d(16) if batch_norm else nn.LayerNorm(16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(self.pre(x))))
        for layer in self.layers:
            h = F.gelu(layer(h))
        return self.out(h)


def make_net(seed: int, **kwargs) -> Net:
    torch.manual_seed(seed)
    return Net(**kwargs)


def global_batch(step: int, micro: int = 0, device="cpu"):
    generator = torch.Generator().manual_seed(1000 * step + micro)
    world = dist.get_world_size()
    x, y = torch.randn(world * ROWS, 6, generator=generator), torch.randn(world * ROWS, 3, generator=generator)
    return x.to(device), y.to(device)


def rank_rows(tensor):
    rank = dist.get_rank()
    return tensor[rank * ROWS:(rank + 1) * ROWS]


def split_groups(model, *, decay: float = 0.1, second_lr=None) -> list:
    """Hugging Face's recipe: weight decay on matrices, none on biases and norms (their own lr if given)."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    second = {"params": others, "weight_decay": 0.0}
    if second_lr is not None:
        second["lr"] = second_lr
    return [{"params": matrices, "weight_decay": decay}, second]


def rel_err(got: dict, want: dict) -> float:
    worst = 0.0
    for name, value in want.items():
        scale = max(float(value.abs().max()), 1e-12)
        worst = max(worst, float((got[name] - value).abs().max()) / scale)
    return worst


def gathered(model, optimizer) -> dict:
    with optimizer.gathered_parameters():
        return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def _zero_step(model, optimizer, step: int, accum: int = 1, device="cpu") -> list:
    results = []
    for micro in range(accum):
        x, y = global_batch(step, micro, device)
        out = model(rank_rows(x))
        F.mse_loss(out, rank_rows(y).to(out.dtype)).backward()  # bf16 models: the target in the output's dtype
        results.append(optimizer.step())
        optimizer.zero_grad()
    return results


def _reference_step(model, optimizer, step: int, accum: int = 1) -> None:
    for micro in range(accum):
        x, y = global_batch(step, micro)
        (F.mse_loss(model(x), y) / accum).backward()
    optimizer.step()
    optimizer.zero_grad()


# -- parameter groups ----------------------------------------------------------------------------------------
def groups_match_reference(stage: int, steps: int = 8) -> dict:
    """Two groups (decay / no decay with its own lr) from the config's AdamW section, against torch's AdamW on
    the same groups of the full model; then group 1's lr set to 0 freezes exactly group 1's parameters."""
    config = {"zero_optimization": {"stage": stage, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}
    model = make_net(0)
    model, optimizer = initialize(model, config=config, model_parameters=split_groups(model, second_lr=3e-3))
    reference = make_net(0)
    ref_opt = torch.optim.AdamW(split_groups(reference, second_lr=3e-3), lr=1e-2, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    layouts = [(layout.group, sorted({(names[id(optimizer.params[s.index])], optimizer.params[s.index].dim() >= 2)
                                      for s in layout.slots})) for layout in optimizer.layouts]
    mixed = [entry for entry in layouts if len({is_matrix for _, is_matrix in entry[1]}) > 1]
    wrong_group = [entry for entry in layouts if any(is_matrix != (entry[0] == 0) for _, is_matrix in entry[1])]
    for step in range(steps):
        _zero_step(model, optimizer, step)
        _reference_step(reference, ref_opt, step)
    err = rel_err(gathered(model, optimizer), dict(reference.named_parameters()))
    groups = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    before = gathered(model, optimizer)
    optimizer.param_groups[1]["lr"] = 0.0
    _zero_step(model, optimizer, steps)
    after = gathered(model, optimizer)
    moved = {name: bool((after[name] != before[name]).any()) for name in before}
    optimizer.remove_hooks()
    return {"err": err, "buckets": len(layouts), "mixed": mixed, "wrong_group": wrong_group,
            "groups": [(g["lr"], g["weight_decay"]) for g in groups],
            "torch": isinstance(optimizer, torch.optim.Optimizer),
            "moved_matrices": sorted(n for n, m in moved.items() if m and before[n].dim() >= 2),
            "moved_others": sorted(n for n, m in moved.items() if m and before[n].dim() < 2),
            "matrices": sorted(n for n in before if before[n].dim() >= 2)}


def factory_receives_torch_groups(stage: int) -> dict:
    """What a factory is handed: one dict per group, holding master shards and the group's options."""
    seen = []

    def factory(groups):
        seen.extend({"count": len(g["params"]), "options": {k: v for k, v in g.items() if k != "params"},
                     "flat": all(p.dim() == 1 and p.dtype == torch.float32 for p in g["params"])} for g in groups)
        return torch.optim.SGD(groups, lr=0.1)

    model = make_net(0)
    model, optimizer = initialize(model, factory, ZeroConfig(stage=stage, reduce_bucket_numel=300,
                                                             stage3_param_persistence_threshold=0),
                                  model_parameters=split_groups(model))
    buckets = [sum(1 for layout in optimizer.layouts if layout.group == g) for g in range(2)]
    optimizer.remove_hooks()
    return {"seen": seen, "buckets": buckets}


# -- schedules ------------------------------------------------------------------------------------------------
def lambda_lr_matches_reference(stage: int, steps: int = 6) -> dict:
    """torch's LambdaLR built on the ZeroOptimizer itself, against the same LambdaLR on torch's Adam."""
    rule = lambda step: 1.0 / (1 + step)  # noqa: E731
    model, optimizer = initialize(make_net(0), lambda groups: torch.optim.Adam(groups, lr=1e-2),
                                  ZeroConfig(stage=stage, stage3_param_persistence_threshold=0))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rule)
    reference = make_net(0)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    ref_schedule = torch.optim.lr_scheduler.LambdaLR(ref_opt, rule)
    lrs = []
    for step in range(steps):
        _zero_step(model, optimizer, step)
        schedule.step()
        _reference_step(reference, ref_opt, step)
        ref_schedule.step()
        lrs.append((optimizer.param_groups[0]["lr"], ref_opt.param_groups[0]["lr"]))
    err = rel_err(gathered(model, optimizer), dict(reference.named_parameters()))
    optimizer.remove_hooks()
    return {"err": err, "lrs": lrs}


def config_schedule_matches_reference(stage: int, schedule: dict, lrs: list, steps: int, accum: int = 2) -> dict:
    """The config's optimizer and ``schedule`` sections: the lr of each update is ``lrs[k]`` (closed form, from the
    test), and the parameters match torch's AdamW run with exactly those lrs; step() is True at the boundary only."""
    config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "gradient_accumulation_steps": accum,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}, "scheduler": schedule}
    model, optimizer = initialize(make_net(0), config=config)
    reference = make_net(0)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01)
    used, results = [], []
    for step in range(steps):
        used.append(optimizer.get_lr()[0])
        results.append(_zero_step(model, optimizer, step, accum))
        ref_opt.param_groups[0]["lr"] = lrs[step]
        _reference_step(reference, ref_opt, step, accum)
    err = rel_err(gathered(model, optimizer), dict(reference.named_parameters()))
    state = optimizer.lr_scheduler.state_dict()
    optimizer.remove_hooks()
    return {"err": err, "used": used, "results": results, "schedule_state": state}


def fp16_overflow_skips(steps: int = 4) -> dict:
    """An fp16 step whose loss is inf on one rank is skipped on every rank: step() False, skipped_steps counts it,
    the schedule does not advance; the steps around it return True."""
    config = {"zero_optimization": {"stage": 2}, "fp16": {"enabled": True, "initial_scale_power": 8},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-3,
                                                           "warmup_type": "linear"}}}
    model, optimizer = initialize(make_net(0), config=config)
    results, counts = [], []
    for step in range(steps):
        x, y = global_batch(step)
        loss = F.mse_loss(model(rank_rows(x)).float(), rank_rows(y))
        if step == 1 and dist.get_rank() == 1:
            loss = loss * float("inf")
        loss.backward()
        results.append(optimizer.step())
        optimizer.zero_grad()
        counts.append(optimizer.lr_scheduler.last_batch_iteration)
    out = {"results": results, "skipped": optimizer.skipped_steps, "applied": optimizer.step_count,
           "global_steps": optimizer.global_steps, "counts": counts}
    optimizer.remove_hooks()
    return out


def progress_lines(every: int, steps: int) -> list:
    """The INFO lines of the ``zerocomm.zero`` logger during ``steps`` steps with ``steps_per_print = every``."""
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("zerocomm.zero")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        config = {"zero_optimization": {"stage": 1}, "steps_per_print": every,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}
        model, optimizer = initialize(make_net(0), config=config)
        for step in range(steps):
            _zero_step(model, optimizer, step)
        optimizer.remove_hooks()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [line for line in records if "step=" in line]


def refusals() -> list:
    """(what, error type, message) for a factory together with a config optimizer section, and bad groups."""
    out = []
    model = make_net(0)

    def adam(groups):
        return torch.optim.Adam(groups)

    cases = {
        "factory and section": lambda: initialize(model, adam,
                                                  {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}),
        "no optimizer": lambda: initialize(model, None, ZeroConfig(stage=1)),
        "parameter twice": lambda: initialize(model, adam, ZeroConfig(stage=1), model_parameters=[
            {"params": list(model.parameters())}, {"params": [model.out.bias]}]),
        "parameter left out": lambda: initialize(model, adam, ZeroConfig(stage=1),
                                                 model_parameters=[model.out.weight]),
        "foreign tensor": lambda: initialize(model, adam, ZeroConfig(stage=1),
                                             model_parameters=list(model.parameters()) + [nn.Parameter(torch.ones(2))]),
    }
    for what, call in cases.items():
        try:
            call()
            out.append((what, None, ""))
        except ZeroConfigError as error:
            out.append((what, type(error).__name__, str(error)))
    return out


# -- state_dict and checkpoints -------------------------------------------------------------------------------
def state_dict_round_trip(stage: int, precision: str) -> dict:
    """A deep copy of state_dict() after 3 steps, loaded back after 2 more, then 2 steps again: the same
    parameters as the first 2 (bitwise), and load_state_dict on another rank's state_dict is refused."""
    config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "bf16": {"enabled": precision == "bf16"},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 1e-2}}}
    model, optimizer = initialize(make_net(0), config=config)
    for step in range(3):
        _zero_step(model, optimizer, step)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    snapshot = copy.deepcopy(optimizer.state_dict())
    for step in range(3, 5):
        _zero_step(model, optimizer, step)
    first = gathered(model, optimizer)
    optimizer.load_state_dict(snapshot)
    counters = (optimizer.step_count, optimizer.lr_scheduler.last_batch_iteration)
    for step in range(3, 5):
        _zero_step(model, optimizer, step)
    second = gathered(model, optimizer)
    buffer.seek(0)
    other = torch.load(buffer, weights_only=True)
    other["zero"]["rank"] = (dist.get_rank() + 1) % dist.get_world_size()
    try:
        optimizer.load_state_dict(other)
        refused = ""
    except Exception as error:  # noqa: BLE001 - the test asserts the type
        refused = f"{type(error).__name__}: {error}"
    optimizer.remove_hooks()
    return {"same": all(torch.equal(first[n], second[n]) for n in first), "counters": counters, "refused": refused,
            "keys": sorted(snapshot)}


def checkpoint_restores_everything(path: str, stage: int) -> dict:
    """Train a model with BatchNorm and a frozen layer 3 steps; save with client_state.  A second model from
    another seed (other frozen weights; its buffers untouched) loads it: buffers (rank 0's, on every rank),
    frozen weights, the schedule's count and the client state come back, and 2 more steps match the first
    model's (bitwise; on rank 0 the buffers too)."""
    config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 20, "warmup_num_steps": 4,
                                                                "warmup_max_lr": 1e-2}}}
    model, optimizer = initialize(make_net(0, batch_norm=True, frozen=True), config=config)
    for step in range(3):
        _zero_step(model, optimizer, step)
    folder = optimizer.save(path, client_state={"epoch": 7, "note": "resume here", "rng": torch.arange(3)})
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    for value in buffers.values():  # each rank's BatchNorm saw its own rows: a checkpoint keeps rank 0's, as DeepSpeed
        dist.broadcast(value, group_src=0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    for step in range(3, 5):
        _zero_step(model, optimizer, step)
    first = gathered(model, optimizer)
    first_buffers = {n: b.clone() for n, b in model.named_buffers()}
    optimizer.remove_hooks()

    other_model, other = initialize(make_net(1, batch_norm=True, frozen=True), config=config)
    differed = any(not torch.equal(p, frozen[n]) for n, p in other_model.named_parameters() if n in frozen)
    fresh_buffers = all(int(b.sum()) == 0 for n, b in other_model.named_buffers() if n.endswith("num_batches_tracked"))
    loaded, client_state = other.load(path)
    restored = {"buffers": all(torch.equal(b, buffers[n]) for n, b in other_model.named_buffers()),
                "frozen": all(torch.equal(p, frozen[n]) for n, p in other_model.named_parameters() if n in frozen),
                "schedule": other.lr_scheduler.last_batch_iteration, "lr": other.get_lr(),
                "global_steps": other.global_steps}
    for step in range(3, 5):
        _zero_step(other_model, other, step)
    second = gathered(other_model, other)
    same = all(torch.equal(first[n], second[n]) for n in first) and \
        (dist.get_rank() != 0 or all(torch.equal(b, first_buffers[n]) for n, b in other_model.named_buffers()))
    other.remove_hooks()
    return {"folder": str(folder), "loaded": str(loaded), "client_state": client_state, "restored": restored,
            "differed": differed, "fresh_buffers": fresh_buffers, "same": same,
            "lr_at_save": optimizer.get_lr()}


# -- a Hugging Face model -------------------------------------------------------------------------------------
HF_CONFIG = {
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                                      "warmup_num_steps": 3, "total_num_steps": 10,
                                                      "warmup_type": "linear"}},
    "gradient_clipping": 1.0, "steps_per_print": 2,
}


def _tiny_gpt2(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _hf_groups(model) -> list:
    """The Hugging Face Trainer's grouping: no weight decay on biases and LayerNorm weights."""
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or ".ln_" in n]
    decay = [p for p in model.parameters() if all(p is not q for q in no_decay)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _hf_steps(model, optimizer, steps: range) -> list:
    losses = []
    rank, accum = dist.get_rank(), optimizer.config.gradient_accumulation_steps
    for step in steps:
        for micro in range(accum):
            generator = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
            starts = torch.randint(0, 64, (2, 1), generator=generator)
            ids = (starts + torch.arange(12)) % 64  # counting sequences: learnable in a few steps
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
    return losses


def hugging_face_resume(path: str, stage: int, steps: int = 6, split: int = 3) -> dict:
    """A tiny GPT-2 (random init from its config) under ``HF_CONFIG``: ``steps`` steps uninterrupted (A); a second
    run saves after ``split`` steps, a third (another seed) loads that checkpoint and trains the rest (B)."""
    config = {**HF_CONFIG, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    model = _tiny_gpt2(0)
    model, optimizer = initialize(model, config=config, model_parameters=_hf_groups(model))
    losses_a = _hf_steps(model, optimizer, range(steps))
    params_a, lr_a = gathered(model, optimizer), optimizer.get_lr()
    optimizer.remove_hooks()

    model = _tiny_gpt2(0)
    model, optimizer = initialize(model, config=config, model_parameters=_hf_groups(model))
    losses_b = _hf_steps(model, optimizer, range(split))
    optimizer.save(path, client_state={"step": split})
    optimizer.remove_hooks()

    model = _tiny_gpt2(1)
    model, optimizer = initialize(model, config=config, model_parameters=_hf_groups(model))
    _, client_state = optimizer.load(path)
    losses_b += _hf_steps(model, optimizer, range(client_state["step"], steps))
    params_b, lr_b = gathered(model, optimizer), optimizer.get_lr()
    schedule = optimizer.lr_scheduler.last_batch_iteration
    groups = [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups]
    optimizer.remove_hooks()
    return {"losses_a": losses_a, "losses_b": losses_b, "lr": (lr_a, lr_b), "schedule": schedule, "groups": groups,
            "err": rel_err(params_b, params_a), "bitwise": all(torch.equal(params_a[n], params_b[n]) for n in params_a)}


# -- on a GPU (tests/zero/test_zero_api_cuda.py spawns this) --------------------------------------------------------
def device_resume(device, stage: int, precision: str, offload: str) -> list:
    """On ``device``: groups, the config's AdamW and WarmupDecayLR, a BatchNorm and a frozen layer; 3 steps, save
    with client_state, 2 more (A); a model from another seed loads and runs the same 2 (B).  Returns failures."""
    config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": {"device": offload}},
              "bf16": {"enabled": precision == "bf16"},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 20, "warmup_num_steps": 4,
                                                                "warmup_max_lr": 1e-2, "warmup_type": "linear"}}}
    where = f"stage {stage} {precision} offload {offload}"
    failures = []
    # ZeRO casts only the parameters it manages: a frozen layer and BatchNorm's statistics stay float32, which a
    # bf16 forward refuses; so buffers and frozen weights are checked in the fp32 cases
    extras = precision == "fp32"
    model = make_net(0, batch_norm=extras, frozen=extras).to(device)
    model, optimizer = initialize(model, config=config, model_parameters=split_groups(model))
    applied = [_zero_step(model, optimizer, step, device=device) for step in range(3)]
    path = os.path.join(tempfile.mkdtemp(), "ckpt")
    optimizer.save(path, client_state={"epoch": 3})
    for step in range(3, 5):
        _zero_step(model, optimizer, step, device=device)
    first, first_buffers = gathered(model, optimizer), {n: b.clone() for n, b in model.named_buffers()}
    lr_a = optimizer.get_lr()
    optimizer.remove_hooks()
    other_model = make_net(1, batch_norm=extras, frozen=extras).to(device)
    other_model, other = initialize(other_model, config=config, model_parameters=split_groups(other_model))
    _, client_state = other.load(path)
    for step in range(3, 5):
        _zero_step(other_model, other, step, device=device)
    second = gathered(other_model, other)
    if applied != [[True]] * 3:
        failures.append(f"{where}: step() returned {applied}")
    if client_state != {"epoch": 3}:
        failures.append(f"{where}: client_state {client_state}")
    if other.get_lr() != lr_a or other.lr_scheduler.last_batch_iteration != 4:
        failures.append(f"{where}: lr {other.get_lr()} vs {lr_a}, count {other.lr_scheduler.last_batch_iteration}")
    err = rel_err(second, first)
    if err > 1e-6:
        failures.append(f"{where}: parameters after resume differ by {err:.2e} relative")
    for name, value in other_model.named_buffers():
        if value.device != first_buffers[name].device or not torch.equal(value, first_buffers[name]):
            failures.append(f"{where}: buffer {name} differs after resume")
    other.remove_hooks()
    return failures


def device_rank_main(rank: int, n: int, store_path: str, queue, backend: str = "nccl") -> None:
    """Spawned rank: every (stage, precision, offload) case of ``device_resume`` on this rank's device."""
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        store = torch.distributed.FileStore(store_path, n)
        dist.init_process_group(backend, store=store, rank=rank, world_size=n)
        failures = []
        for stage, precision, offload in [(2, "fp32", "none"), (3, "bf16", "none"), (2, "bf16", "cpu"),
                                          (3, "fp32", "cpu")]:
            failures += device_resume(device, stage, precision, offload)
        dist.destroy_process_group()
        queue.put((rank, failures))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put((rank, [traceback.format_exc()]))
