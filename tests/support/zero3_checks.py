"""Rank-side checks for ZeRO stage 3: memory, traffic, the live-parameter bound, divergence.

(Equivalence with data-parallel training runs through ``zero_checks.equivalence_cases``.)
"""
from __future__ import annotations

import torch

from zerocomm.benchmarks.models import batch_for, build_model, loss_fn
from zerocomm.zero import ZeroConfig, initialize

from .dist import dist
from .zero_checks import adam, make_batch, make_model, loss_of


def _lm_stage3(**fields):
    model = build_model("lm", 0, n_layers=fields.pop("n_layers", 2))
    config = ZeroConfig(stage=3, stage3_param_persistence_threshold=100, **fields)
    return initialize(model, adam, config)


def _step(model, optimizer, step: int) -> None:
    x, y = batch_for(model, seed=0, rank=dist.get_rank(), step=step)
    loss_fn(model, model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def _sizes(optimizer) -> dict:
    persistent = sum(layout.padded_numel for layout, unit in zip(optimizer.layouts, optimizer.parameters.units)
                     if unit.persistent)
    root = sum(layout.padded_numel for layout, unit in zip(optimizer.layouts, optimizer.parameters.units)
               if unit.name == "" and not unit.persistent)
    return {"phi": sum(p.numel() for p in optimizer.params), "padded": sum(l.padded_numel for l in optimizer.layouts),
            "persistent": persistent, "root": root, "units": len(optimizer.layouts)}


def state_bytes(precision: str = "fp32") -> dict:
    """Model-state bytes between steps (after two steps), with the sizes needed for the formula."""
    model, optimizer = _lm_stage3(precision=precision, algorithm="native")
    for step in range(2):
        _step(model, optimizer, step)
    out = _sizes(optimizer)
    out["bytes"] = optimizer.model_state_bytes()
    out["spare_bytes"] = optimizer.gradients.spare_bytes()  # stage 3 frees its bucket buffers after each step
    optimizer.remove_hooks()
    return out


def traffic() -> dict:
    """Bytes sent per op in the second step (forward, backward, step, parameter refresh), ring."""
    model, optimizer = _lm_stage3(algorithm="ring")
    _step(model, optimizer, 0)
    with dist.count_bytes() as counter:
        _step(model, optimizer, 1)
        optimizer.synchronize()
    out = _sizes(optimizer)
    out["sent"] = {op: t.bytes_sent for op, t in counter.per_op.items()}
    out["measured"] = all(t.measured for t in counter.per_op.values())
    optimizer.remove_hooks()
    return out


def live_bound(max_live: int) -> dict:
    """Peak gathered elements over three steps of a 4-block LM with ``stage3_max_live_parameters=max_live``."""
    model, optimizer = _lm_stage3(n_layers=4, stage3_max_live_parameters=max_live, algorithm="native")
    for step in range(3):
        _step(model, optimizer, step)
    units = optimizer.parameters  # stage 3's part that gathers and releases units
    sizes = [layout.padded_numel for layout, unit in zip(optimizer.layouts, units.units) if not unit.persistent]
    out = {"peak": units.peak_live_numel, "prefetches": units.prefetches, "sizes": sizes,
           "root": sizes[0] if units.units[0].name == "" else 0, "live_now": units.live_numel}
    optimizer.remove_hooks()
    return out


def diverging_paths() -> tuple:
    """Rank 0 runs PathsModel's optional layer in its first forward, the others skip it (debug mode on).
    Returns the error each rank raised: (type name, message)."""
    rank = dist.get_rank()
    model = make_model("paths")
    model, optimizer = initialize(model, adam, ZeroConfig(stage=3, debug=True, stage3_param_persistence_threshold=0,
                                                          algorithm="native"))
    x, y = make_batch(model, seed=0, rank=rank, step=0)
    try:
        loss_of(model, x, y, 0 if rank == 0 else 1).backward()
        optimizer.step()
    except Exception as error:  # noqa: BLE001 - returned to the test
        result = (type(error).__name__, str(error))
    else:
        result = (None, "")
    optimizer.remove_hooks()
    return result


def gathered_write_back(stage: int = 3) -> dict:
    """``gathered_parameters(modifier_rank=1)``: rank 1 sets the output bias inside the block; every rank
    must then see its values (parameters and masters: one more step starts from them).  Stage 3 also
    discards changes made without a modifier rank."""
    rank = dist.get_rank()
    model = make_model("paths")
    model, optimizer = initialize(model, adam, ZeroConfig(stage=stage, stage3_param_persistence_threshold=0))
    with optimizer.gathered_parameters(modifier_rank=1):
        if rank == 1:
            with torch.no_grad():
                model.out.bias.fill_(0.5)
    with optimizer.gathered_parameters():
        seen = model.out.bias.detach().clone()
    out = {"seen": seen.tolist()}
    if stage == 3:
        with optimizer.gathered_parameters(modifier_rank=None):
            with torch.no_grad():
                model.out.bias.fill_(7.0)
        with optimizer.gathered_parameters():
            out["after_discard"] = model.out.bias.detach().tolist()
    x, y = make_batch(model, seed=0, rank=rank, step=0)
    loss_of(model, x, y, 0).backward()
    optimizer.step()
    with optimizer.gathered_parameters():
        out["moved_from_seen"] = float((model.out.bias.detach() - seen).abs().max())
    optimizer.remove_hooks()
    return out
