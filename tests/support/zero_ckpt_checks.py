"""Rank-side checkpoint checks: exact resume, resharding N -> M, consolidation, bad input.

Resharding compares runs at different world sizes, so these checks train on a *global* batch per
step (12 sequences of the seeded LM, split evenly over the ranks) and compare the global mean loss:
with equal splits the averaged gradient is the same at every world size, up to float32 rounding.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from zerocomm.benchmarks.models import batch_for, build_model, loss_fn
from zerocomm.zero import CheckpointError, ZeroConfig, consolidate, initialize

from .dist import dist
from .zero_checks import adam, reference_run, zero_run

GLOBAL_BATCH = 12


def _config(stage: int, **fields) -> ZeroConfig:
    return ZeroConfig(stage=stage, reduce_bucket_numel=8000, allgather_bucket_numel=8000,
                      stage3_param_persistence_threshold=100, algorithm="native", **fields)


def _fresh(stage: int, **fields):
    return initialize(build_model("lm", 0), adam, _config(stage, **fields))


def _global_step(model, optimizer, step: int) -> float:
    """One step on this rank's rows of the step's global batch; returns the global mean loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = batch_for(model, seed=5, rank=0, step=step, batch_size=GLOBAL_BATCH)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    loss = loss_fn(model, model(x[rows]), y[rows])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().reshape(1).clone()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG, algorithm="native")
    return float(mean)


def _params(model, optimizer) -> dict:
    with optimizer.gathered_parameters():
        return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def exact_resume(path: str, stage: int, precision: str = "fp32") -> dict:
    """Train 3 steps, save, train 3 more (A); a fresh optimizer loads and trains the same 3 (B)."""
    model, optimizer = _fresh(stage, precision=precision)
    for step in range(3):
        _global_step(model, optimizer, step)
    folder = optimizer.save(path)
    losses_a = [_global_step(model, optimizer, step) for step in range(3, 6)]
    params_a = _params(model, optimizer)
    scale_a = optimizer.loss_scale
    optimizer.remove_hooks()
    model, optimizer = _fresh(stage, precision=precision)
    optimizer.load(path)
    resumed_at = optimizer.step_count
    losses_b = [_global_step(model, optimizer, step) for step in range(3, 6)]
    params_b = _params(model, optimizer)
    optimizer.remove_hooks()
    return {"folder": os.path.basename(folder), "resumed_at": resumed_at, "same_losses": losses_a == losses_b,
            "same_params": all(torch.equal(params_a[n], params_b[n]) for n in params_a),
            "same_scale": scale_a == optimizer.loss_scale}


def train_and_save(path: str, stage: int, steps: int) -> list:
    model, optimizer = _fresh(stage)
    losses = [_global_step(model, optimizer, step) for step in range(steps)]
    optimizer.save(path)
    optimizer.remove_hooks()
    return losses


def resume_elsewhere(path: str, stage: int, steps: int, more: int) -> dict:
    """Load a checkpoint written at another world size and train ``more`` steps; compare with an
    uninterrupted run at this world size."""
    model, optimizer = _fresh(stage)
    uninterrupted = [_global_step(model, optimizer, step) for step in range(steps + more)]
    params_u = _params(model, optimizer)
    optimizer.remove_hooks()
    model, optimizer = _fresh(stage)
    optimizer.load(path)
    resumed_at = optimizer.step_count
    resumed = [_global_step(model, optimizer, step) for step in range(steps, steps + more)]
    params_r = _params(model, optimizer)
    optimizer.remove_hooks()
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(resumed, uninterrupted[steps:]))
    param_err = max(float((params_r[n] - params_u[n]).abs().max() / params_u[n].abs().max()) for n in params_u)
    return {"resumed_at": resumed_at, "loss_err": loss_err, "param_err": param_err}


def consolidated_vs_reference(path: str, stage: int, steps: int = 5) -> dict:
    """Consolidate (on rank 0) a checkpoint of ``steps`` ZeRO steps; compare with the data-parallel
    reference's state_dict after the same steps, and load it into the plain model."""
    rank = dist.get_rank()
    ref = reference_run("lm", steps=steps, accum=1, clip=0.0)
    run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=stage, algorithm="native", bucket_numel=8000)
    run["optimizer"].save(path)
    run["optimizer"].remove_hooks()
    if rank != 0:
        return {}
    state = consolidate(path)
    plain = build_model("lm", 0)
    missing = plain.load_state_dict(state, strict=True)
    errors = {key: float((state[key] - ref["params"][key]).abs().max() / ref["params"][key].abs().max())
              for key in ref["params"]}
    return {"keys": sorted(state), "plain_keys": sorted(plain.state_dict()), "max_err": max(errors.values()),
            "load_result": str(missing), "tied": state["tok.weight"] is state["head.weight"]}


def bad_inputs(path: str) -> dict:
    """Every bad-input case: the error (type, message) and whether the model's parameters were left alone."""
    rank = dist.get_rank()
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    folder = Path(optimizer.save(path))
    before = _params(model, optimizer)
    results = {}

    def attempt(name, target_optimizer, where=path):
        try:
            target_optimizer.load(where)
        except CheckpointError as error:
            results[name] = (type(error).__name__, str(error))
        else:
            results[name] = (None, "")

    other_model, other = initialize(build_model("lm", 0, d_model=48, n_heads=2), adam, _config(2))
    attempt("another model", other)
    other.remove_hooks()
    _, stage1 = initialize(build_model("lm", 0), adam, _config(1))
    attempt("stage mismatch", stage1)
    stage1.remove_hooks()
    attempt("no checkpoint", optimizer, os.path.join(path, "nowhere"))
    shard = folder / "shard-00001.pt"
    dist.barrier()
    if rank == 0:
        shard.rename(folder / "moved-away")
    dist.barrier()
    attempt("missing shard", optimizer)
    dist.barrier()
    if rank == 0:
        (folder / "moved-away").rename(shard)
        with open(folder / "shard-00000.pt", "r+b") as handle:
            handle.truncate(100)
    dist.barrier()
    attempt("truncated shard", optimizer)
    after = _params(model, optimizer)
    results["untouched"] = all(torch.equal(before[n], after[n]) for n in before)
    optimizer.remove_hooks()
    return results


def interrupted_save(path: str) -> dict:
    """A crash mid-save leaves a temporary folder and the old ``latest``: loading reads the old checkpoint."""
    rank = dist.get_rank()
    model, optimizer = _fresh(2)
    _global_step(model, optimizer, 0)
    optimizer.save(path)
    saved = _params(model, optimizer)
    _global_step(model, optimizer, 1)
    dist.barrier()
    if rank == 0:  # what a crash after some ranks wrote their shards of step 2 leaves behind
        partial = Path(path) / "step-00000002.tmp-dead"
        partial.mkdir()
        (partial / "shard-00000.pt").write_bytes(b"partial")
    dist.barrier()
    optimizer.load(path)
    restored = _params(model, optimizer)
    optimizer.remove_hooks()
    return {"restored_step": optimizer.step_count,
            "restored": all(torch.equal(saved[n], restored[n]) for n in saved)}
