"""Rank-side ZeRO checks: a data-parallel reference and ZeRO runs of the same seeded model and data.

Functions here run inside the ranks of a pool (``world.run(fn, ...)``); each compares on the rank
and returns small summaries (max relative errors, byte counts, flags) for the test to assert.

The reference is the simplest exact data-parallel training: every rank backpropagates its own
micro-batches (loss / k per micro-batch), all-reduces (AVG, zerocomm's native algorithm) the
flattened gradients, clips with the float64 global norm when asked — the same definition as
zerocomm.zero — and applies the same optimizer to its full parameters.
"""
from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn
from torch.nn import functional as F

from zerocomm.benchmarks.models import batch_for, build_model, loss_fn
from zerocomm.ops import flatten_tensors, unflatten_into
from zerocomm.zero import ZeroConfig, initialize

from .dist import dist

LR = 3e-3


def adam(params):
    return torch.optim.Adam(params, lr=LR)


class PathsModel(nn.Module):
    """Real code paths for stage 3: a layer called twice per forward, a weight tied across two units,
    a layer skipped on odd steps (on every rank alike), ``forward(x, step)``."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.out = nn.Linear(16, 4)
        self.layers[2].weight = self.layers[0].weight

    def forward(self, x, step=0):
        h = F.gelu(self.inp(x))
        h = F.gelu(self.layers[0](h))
        h = F.gelu(self.layers[1](F.gelu(self.layers[1](h))))
        if step % 2 == 0:
            h = F.gelu(self.layers[2](h))
        return self.out(h)


def make_model(name: str, seed: int = 0) -> nn.Module:
    if name == "paths":
        torch.manual_seed(seed)
        return PathsModel()
    return build_model(name, seed)


def make_batch(model, *, seed: int, rank: int, step: int, micro: int = 0):
    if isinstance(model, PathsModel):
        generator = torch.Generator().manual_seed((seed * 1009 + rank) * 10_007 + step * 101 + micro)
        return torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)
    return batch_for(model, seed=seed, rank=rank, step=step, micro=micro)


def loss_of(model, x, y, step: int) -> torch.Tensor:
    if isinstance(model, PathsModel):
        return F.mse_loss(model(x, step), y)
    return loss_fn(model, model(x), y)


def evaluate(model, step: int) -> float:
    """A no_grad evaluation on a fixed batch (stage 3 gathers and releases without a backward)."""
    with torch.no_grad():
        x, y = make_batch(model, seed=99, rank=0, step=0)
        return loss_of(model, x, y, step).item()


def reference_run(model_name: str, *, steps: int, accum: int, clip: float, seed: int = 0,
                  evaluation: bool = False) -> dict:
    """Losses ``[step][micro]`` (plus the evaluation loss with ``evaluation``) and final parameters
    ``{name: tensor}`` of data-parallel training.  A parameter that got no gradient counts as a zero
    gradient (as in DDP's buckets and every flat-buffer optimizer), so Adam's momentum still moves it."""
    rank = dist.get_rank()
    model = make_model(model_name, seed)
    optimizer = adam(model.parameters())
    params = list(dict.fromkeys(model.parameters()))
    losses = []
    for step in range(steps):
        row = []
        for micro in range(accum):
            x, y = make_batch(model, seed=seed, rank=rank, step=step, micro=micro)
            loss = loss_of(model, x, y, step)
            (loss / accum).backward()
            row.append(loss.item())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = flatten_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.AVG, algorithm="native")
        unflatten_into(flat, grads)
        if clip:
            sumsq = sum(float(torch.sum(g.double() ** 2)) for g in grads)
            coefficient = min(1.0, clip / (math.sqrt(sumsq) + 1e-6))
            if coefficient < 1.0:
                for g in grads:
                    g.mul_(coefficient)
        for p, g in zip(params, grads):
            p.grad = g
        optimizer.step()
        optimizer.zero_grad()
        if evaluation:
            row.append(evaluate(model, step))
        losses.append(row)
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def zero_run(model_name: str, *, steps: int, accum: int, clip: float, stage: int, algorithm: str,
             seed: int = 0, precision: str = "fp32", bucket_numel: int = 3000, evaluation: bool = False,
             **overrides) -> dict:
    """The same training through ``zerocomm.zero.initialize`` with the plain per-micro-batch loop."""
    rank = dist.get_rank()
    model = make_model(model_name, seed)
    # Stage 3: the LM keeps LayerNorm parameters and biases persistent; PathsModel keeps none, so its
    # skipped layer is a unit of its own.
    overrides.setdefault("stage3_param_persistence_threshold", 0 if model_name == "paths" else 100)
    config = ZeroConfig(stage=stage, gradient_accumulation_steps=accum, gradient_clipping=clip,
                        algorithm=algorithm, precision=precision, reduce_bucket_numel=bucket_numel,
                        allgather_bucket_numel=bucket_numel, **overrides)
    model, optimizer = initialize(model, adam, config)
    losses = []
    for step in range(steps):
        row = []
        for micro in range(accum):
            x, y = make_batch(model, seed=seed, rank=rank, step=step, micro=micro)
            loss = loss_of(model, x, y, step)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            row.append(loss.item())
        if evaluation:
            row.append(evaluate(model, step))
        losses.append(row)
    with optimizer.gathered_parameters():
        params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "optimizer": optimizer, "model": model, "params": params}


def max_relative_error(a: dict, b: dict) -> tuple[float, float]:
    """(losses, parameters): the largest relative difference of ``a`` from the reference ``b``."""
    loss_err = max(abs(x - y) / max(abs(y), 1e-12) for ra, rb in zip(a["losses"], b["losses"])
                   for x, y in zip(ra, rb))
    param_err = max(float((a["params"][n] - b["params"][n]).abs().max() / b["params"][n].abs().max().clamp_min(1e-12))
                    for n in b["params"])
    return loss_err, param_err


def equivalence_runs(cases: list, diagonal: bool = False) -> list:
    """The ``(case index, stage, algorithm)`` runs of ``equivalence_cases``, in order: every stage with
    every algorithm of each case; or with ``diagonal``, the first case's j-th stage with its j-th
    algorithm (the first case is the algorithm sweep), and in case ``i > 0`` every other stage, the
    j-th where ``j + i // 2`` is even, with algorithm ``(i + j // 2) % len(algorithms)`` (so
    consecutive cases start on alternate stages, and a case's algorithms take turns)."""
    runs = []
    for index, (_, _, _, stages, algorithms, *_) in enumerate(cases):
        for j, stage in enumerate(stages):
            if not diagonal:
                runs += [(index, stage, algorithm) for algorithm in algorithms]
            elif index == 0:
                runs.append((index, stage, algorithms[j % len(algorithms)]))
            elif (j + index // 2) % 2 == 0:
                runs.append((index, stage, algorithms[(index + j // 2) % len(algorithms)]))
    return runs


def equivalence_cases(cases: list, steps: int = 20, bucket_numel: int = 8000, diagonal: bool = False) -> list:
    """For each ``(model, accum, clip, stages, algorithms[, ZeroConfig overrides])`` case: the errors of
    its ZeRO runs (``equivalence_runs``) against one reference.
    Returns ``[(case_id, stage, algorithm, loss_err, param_err)]``."""
    out = []
    runs = equivalence_runs(cases, diagonal)
    for index, (model_name, accum, clip, _, _, *more) in enumerate(cases):
        overrides = more[0] if more else {}
        evaluation = model_name == "paths"
        ref = reference_run(model_name, steps=steps, accum=accum, clip=clip, evaluation=evaluation)
        for _, stage, algorithm in (run for run in runs if run[0] == index):
            run = zero_run(model_name, steps=steps, accum=accum, clip=clip, stage=stage, algorithm=algorithm,
                           bucket_numel=bucket_numel, evaluation=evaluation, **overrides)
            run["optimizer"].remove_hooks()
            out.append(((model_name, accum, clip, tuple(sorted(overrides.items()))), stage, algorithm)
                       + max_relative_error(run, ref))
    return out


def padded_size(optimizer) -> int:
    """Φ as laid out: every bucket's padded element count."""
    return sum(layout.padded_numel for layout in optimizer.layouts)


def collectives_of_one_step(stages) -> dict:
    """For each stage: {op: calls} of the collectives one training step of the LM issues after a first step
    (``count_bytes``' records, which see every call issued while counting)."""
    import zerocomm.comm as zdist
    out = {}
    for stage in stages:
        model, optimizer = initialize(build_model("lm", 0), adam, ZeroConfig(stage=stage, algorithm="native"))
        x, y = batch_for(model, seed=0, rank=dist.get_rank(), step=0)
        for counted in (False, True):
            with zdist.count_bytes() if counted else contextlib.nullcontext() as counter:
                loss_fn(model, model(x), y).backward()
                optimizer.step()
                optimizer.synchronize()
        optimizer.remove_hooks()
        out[stage] = {op: entry.calls for op, entry in counter.per_op.items() if entry.calls}
    return out


def state_bytes_cases(cases: list, steps: int = 2) -> list:
    """For each ``(stage, precision)``: (stage, precision, Φ, Φ padded, buckets, model_state_bytes, bucket
    buffers kept between steps as (bytes, bytes of the largest bucket, max_inflight_buckets)) after ``steps``
    steps of the LM."""
    out = []
    for stage, precision in cases:
        run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=stage, algorithm="native", precision=precision)
        optimizer = run["optimizer"]
        optimizer.remove_hooks()
        phi = sum(p.numel() for p in optimizer.params)
        spares = getattr(optimizer.gradients, "spare_bytes", lambda: 0)()
        largest = max(layout.padded_numel for layout in optimizer.layouts) * optimizer.params[0].element_size()
        out.append((stage, precision, phi, padded_size(optimizer), len(optimizer.layouts),
                    optimizer.model_state_bytes(), (spares, largest, optimizer.config.max_inflight_buckets)))
    return out


def traffic_cases(cases: list) -> list:
    """For each ``(stage, accum, reduce_scatter)``: bytes this rank sent per op in one micro-step that is
    not a boundary (None when accum is 1) and in one boundary micro-step through the parameter gather,
    with algorithm="ring" (measured message by message).  Returns (case, Φ padded, non-boundary, boundary)."""
    rank = dist.get_rank()
    out = []
    for stage, accum, reduce_scatter in cases:
        model = build_model("lm", 0)
        config = ZeroConfig(stage=stage, gradient_accumulation_steps=accum, algorithm="ring",
                            reduce_bucket_numel=8000, allgather_bucket_numel=8000, reduce_scatter=reduce_scatter)
        model, optimizer = initialize(model, adam, config)

        def micro_step(step, micro):
            x, y = batch_for(model, seed=0, rank=rank, step=step, micro=micro)
            loss_fn(model, model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

        quiet = None
        for micro in range(accum - 1):
            with dist.count_bytes() as counter:
                micro_step(0, micro)
            quiet = {op: t.bytes_sent for op, t in counter.per_op.items()}
        with dist.count_bytes() as counter:
            micro_step(0, accum - 1)
            optimizer.synchronize()
        loud = {op: (t.bytes_sent, t.calls, t.measured) for op, t in counter.per_op.items()}
        optimizer.remove_hooks()
        out.append(((stage, accum, reduce_scatter), padded_size(optimizer), quiet, loud))
    return out


def overlap_cases(cases: list) -> list:
    """For each ``(stage, overlap_comm)``: the boundary backward's timeline, as
    (first launch time, last gradient time, backward end time, number of launches)."""
    rank = dist.get_rank()
    out = []
    for stage, overlap in cases:
        model = build_model("lm", 0, n_layers=4)
        config = ZeroConfig(stage=stage, overlap_comm=overlap, reduce_bucket_numel=4000, algorithm="native")
        model, optimizer = initialize(model, adam, config)
        x, y = batch_for(model, seed=0, rank=rank, step=0)
        loss_fn(model, model(x), y).backward()
        timeline = optimizer.timeline
        optimizer.step()
        optimizer.synchronize()
        optimizer.remove_hooks()
        out.append(((stage, overlap), min(t for _, t in timeline.launches), timeline.last_grad_s,
                    timeline.backward_end_s, len(timeline.launches), len(optimizer.layouts)))
    return out


def overflow_case(stage: int, bad_rank: int, bad_step: int, steps: int = 4) -> dict:
    """fp16 with dynamic scaling (hysteresis 1): ``bad_rank`` alone turns its loss into inf at ``bad_step``.
    Returns what every rank saw: skipped steps, scales before/after, whether parameters moved per step."""
    rank = dist.get_rank()
    model = build_model("mlp", 0)
    config = ZeroConfig(stage=stage, precision="fp16", hysteresis=1, initial_scale_power=8, algorithm="native")
    model, optimizer = initialize(model, adam, config)
    scales, moved = [], []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        x, y = batch_for(model, seed=0, rank=rank, step=step)
        loss = loss_fn(model, model(x), y)
        if rank == bad_rank and step == bad_step:
            loss = loss * float("inf")
        loss.backward()
        optimizer.step()
        optimizer.synchronize()
        optimizer.zero_grad()
        scales.append(optimizer.loss_scale)
        moved.append(any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())))
    optimizer.remove_hooks()
    return {"skipped": optimizer.skipped_steps, "steps": optimizer.step_count, "scales": scales, "moved": moved}


def mixed_precision_case(stage: int, precision: str, steps: int = 10) -> tuple[list, list]:
    """(reference fp32 losses, ``precision`` losses) per step on rank 0's first micro-batch (LM)."""
    ref = reference_run("lm", steps=steps, accum=1, clip=0.0)
    run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=stage, algorithm="native", precision=precision)
    run["optimizer"].remove_hooks()
    return [r[0] for r in ref["losses"]], [r[0] for r in run["losses"]]


def state_error_case() -> tuple:
    """A second boundary backward before step(): the error's type and message."""
    rank = dist.get_rank()
    model = build_model("mlp", 0)
    model, optimizer = initialize(model, adam, ZeroConfig(stage=2))
    x, y = batch_for(model, seed=0, rank=rank, step=0)
    loss_fn(model, model(x), y).backward()
    try:
        loss_fn(model, model(x), y).backward()
    except Exception as error:  # noqa: BLE001 - returned to the test
        result = (type(error).__name__, str(error))
    else:
        result = (None, "")
    optimizer.step()  # consume the first backward so every rank leaves in step
    optimizer.remove_hooks()
    return result


def overlap_trace(stage: int, path: str = "", **fields) -> dict:
    """Two measured steps of a 4-block LM under ``dist.profile()``, forward / backward / step marked as spans.

    Returns, per collective kind, when each call was in flight, (issued, end) — issued by the caller, so a
    call issued during backward counts even when its thread only ran it later — the spans, and ``"embedding"``: when
    the token embedding (the first module of the forward) started computing in each step, all relative to
    the first span's start (seconds); with ``path`` rank 0 also writes the Chrome trace there."""
    rank = dist.get_rank()
    model = build_model("lm", 0, d_model=64, n_heads=2, n_layers=4)
    config = ZeroConfig(stage=stage, reduce_bucket_numel=20_000, allgather_bucket_numel=20_000, algorithm="ring",
                        stage3_param_persistence_threshold=100, **fields)
    model, optimizer = initialize(model, adam, config)
    starts = []
    # Registered after initialize, so it runs after ZeRO's own pre-hook on the module (the wait for its bucket).
    model.tok.register_forward_pre_hook(lambda module, args: starts.append(time.perf_counter()))

    def one_step(step, prof=None):
        x, y = batch_for(model, seed=0, rank=rank, step=step)
        spans = prof.span if prof is not None else (lambda name: contextlib.nullcontext())
        with spans("forward"):
            loss = loss_fn(model, model(x), y)
        with spans("backward"):
            loss.backward()
        with spans("step"):
            optimizer.step()
            optimizer.zero_grad()

    one_step(0)  # stage 3 records its units' order in the first forward
    with dist.profile() as prof:
        for step in (1, 2):
            one_step(step, prof)
        optimizer.synchronize()
    optimizer.remove_hooks()
    if path and rank == 0:
        prof.export_chrome_trace(path)
    origin = prof.spans[0][1]
    out = {"spans": [(name, start - origin, end - origin) for name, start, end, _ in prof.spans],
           "embedding": [t - origin for t in starts[-2:]]}
    for record in prof.records:
        out.setdefault(record.op, []).append((record.issued_s - origin, record.end_s - origin))
    return out


def step_algorithm_cases() -> dict:
    """Which algorithm the step's collectives get for several configurations (every rank on this host), and
    whether a default ZeRO-2 step's collectives ran with it: ``{label: algorithm}`` plus ``"ran"``."""
    from zerocomm.zero.optimizer import step_algorithm

    model = build_model("mlp", 0)
    device = next(model.parameters()).device
    n = dist.get_world_size()
    seen = {label: step_algorithm(ZeroConfig(**fields), None, n, device)
            for label, fields in [("default", {}), ("auto", {"algorithm": "auto"}), ("ring", {"algorithm": "ring"}),
                                  ("off", {"shared_memory": False}), ("off auto", {"algorithm": "auto",
                                                                                   "shared_memory": False})]}
    seen["meta device"] = step_algorithm(ZeroConfig(), None, n, torch.device("meta"))
    previous = dist.get_default_algorithm()
    dist.set_default_algorithm("ring")
    try:
        seen["process default ring"] = step_algorithm(ZeroConfig(), None, n, device)
    finally:
        dist.set_default_algorithm(previous)
    model, optimizer = initialize(model, adam, ZeroConfig(stage=2))
    x, y = batch_for(model, seed=0, rank=dist.get_rank(), step=0)
    loss_fn(model, model(x), y).backward()  # the first shm call maps the segment (its name is sent once)
    optimizer.step()
    with dist.count_bytes() as counter:  # then shm moves nothing over the backend: no bytes counted as sent
        loss_fn(model, model(x), y).backward()
        optimizer.step()
        optimizer.synchronize()
    seen["optimizer"] = optimizer.step_algorithm
    seen["ran"] = sorted(counter.per_op)
    seen["sent"] = counter.bytes_sent
    optimizer.remove_hooks()
    return seen


def state_dict_after_step(stage: int) -> dict:
    """Right after ``step()`` (its parameter all_gather still in flight), ``model.state_dict()`` and a submodule's
    ``state_dict()`` wait for it: what they return equals the parameters after ``optimizer.synchronize()``."""
    rank = dist.get_rank()
    model = build_model("lm", 0, d_model=32, n_heads=2, n_layers=2)
    config = ZeroConfig(stage=stage, reduce_bucket_numel=5_000, allgather_bucket_numel=5_000)
    model, optimizer = initialize(model, adam, config)
    out = {}
    for label, take in (("root", lambda: model.state_dict()), ("submodule", lambda: model.tok.state_dict())):
        x, y = batch_for(model, seed=0, rank=rank, step=len(out))
        loss_fn(model, model(x), y).backward()
        optimizer.step()
        in_flight_before = optimizer.parameters._in_flight
        taken = {name: t.clone() for name, t in take().items()}
        in_flight_after = optimizer.parameters._in_flight
        optimizer.synchronize()
        current = take()
        out[label] = (in_flight_before, in_flight_after, all(torch.equal(taken[k], current[k]) for k in current))
    optimizer.remove_hooks()
    return out
