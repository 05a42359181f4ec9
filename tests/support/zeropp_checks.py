"""Rank-side checks for ZeRO++ (zero/zeropp.py): each rank pretends to be on the host ``names[rank]``
(``ZEROCOMM_HOST``), trains the LM with ZeRO-3 with and without ZeRO++'s parts, and reports."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from zerocomm.ops.quantize import quantized_nbytes
from zerocomm.zero import ZeroConfig, ZeroConfigError, initialize
from zerocomm.zero.zeropp import HostLayout, UnitGathers, build_quantized_reduce_scatter

from .dist import dist
from .zero_checks import adam, make_batch, make_model, loss_of, max_relative_error, zero_run


@contextlib.contextmanager
def pretend_host(names: str):
    os.environ["ZEROCOMM_HOST"] = names[dist.get_rank()]
    try:
        yield
    finally:
        del os.environ["ZEROCOMM_HOST"]


def _summary(run: dict) -> dict:
    optimizer = run["optimizer"]
    gathers = getattr(optimizer.parameters, "gathers", None)
    gathers = gathers if isinstance(gathers, UnitGathers) else None  # stage 3's part
    quantized = getattr(optimizer.gradients, "reduce_scatter", None)
    out = {"losses": run["losses"], "params": run["params"],
           "gathered": dict(gathers.gathered_bytes) if gathers else {},
           "secondary_bytes": gathers.secondary_bytes() if gathers else 0, "state": optimizer.model_state_bytes(),
           "quantized_algorithm": gathers.quantized_algorithm if gathers else None,
           "sent": dict(getattr(quantized, "sent_bytes", {}))}
    out["expected_secondary"] = 0
    if gathers is not None and gathers.hpz_group is not None:
        def secondary(layout) -> int:  # qwZ keeps the codes of its 1/P of the chunks, hpZ alone the float32 values
            if gathers.quantize:
                return layout.world_size // gathers.hpz_size * quantized_nbytes(layout.chunk_numel, 8, gathers.block)
            return layout.padded_numel // gathers.hpz_size * 4
        out["expected_secondary"] = sum(secondary(layout)
                                        for layout, unit in zip(optimizer.layouts, optimizer.parameters.units)
                                        if not unit.persistent)
    optimizer.remove_hooks()
    return out


def against_plain(names: str, cases: list, steps: int = 8) -> list:
    """For each ``fields`` of ``cases``: (fields, the losses' largest relative difference, the parameters' largest
    absolute difference, what the ZeRO++ run reports), against plain ZeRO-3 on the same ranks and data."""
    with pretend_host(names):
        kwargs = dict(steps=steps, accum=1, clip=0.0, stage=3, algorithm="native", bucket_numel=20_000)
        plain = zero_run("lm", **kwargs)
        plain_state = plain["optimizer"].model_state_bytes()
        plain["optimizer"].remove_hooks()
        rows = []
        for fields in cases:
            run = zero_run("lm", **{**kwargs, **fields})  # fields may name another stage
            loss_err, _ = max_relative_error(run, plain)
            param_err = max(float((run["params"][n] - plain["params"][n]).abs().max()) for n in plain["params"])
            summary = _summary(run)
            rows.append((fields, loss_err, param_err, {"plain_state": plain_state,
                                                       **{k: v for k, v in summary.items()
                                                          if k not in ("losses", "params")}}))
        return rows


def hpz_refused(names: str, size: int) -> str:
    """The error a partition size that does not divide a host's ranks raises."""
    with pretend_host(names):
        try:
            initialize(make_model("lm", 0), adam, ZeroConfig(stage=3, zero_hpz_partition_size=size,
                                                             algorithm="native"))
        except ZeroConfigError as error:
            return str(error)
        return "no error"


# -- the quantized reduce-scatter against a numpy model of the hierarchy ---------------------------------

def _np_quantize(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Decoded values of x after block quantization, from the definition."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    blocks = -(-len(x) // block)
    padded = np.zeros(blocks * block, np.float32)
    padded[:len(x)] = x
    padded = padded.reshape(blocks, block)
    scales = (np.abs(padded).max(axis=1) / qmax).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))
    codes = np.clip(np.round(padded / safe[:, None]), -qmax, qmax)
    return (codes.astype(np.float32) * scales[:, None]).reshape(-1)[:len(x)]


def _np_hierarchical(buckets: list, hosts: list, bits: int, block: int) -> list:
    """Each rank's averaged chunk as qgZ computes it, from every rank's bucket (float32 throughout)."""
    n = len(buckets)
    c = len(buckets[0]) // n
    chunk = lambda r, i: buckets[r][i * c:(i + 1) * c]  # noqa: E731
    L = len(hosts[0])
    out = [None] * n
    partial = {}
    for h, ranks in enumerate(hosts):
        for l, me in enumerate(ranks):
            owners = [hr[l] for hr in hosts]
            total = np.concatenate([chunk(me, o) for o in owners]).astype(np.float32)
            for j in range(L):
                if j != l:  # each chunk is quantized in blocks of its own
                    total = total + np.concatenate([_np_quantize(chunk(ranks[j], o), bits, block) for o in owners])
            partial[me] = total.reshape(len(hosts), c)
    for h, ranks in enumerate(hosts):
        for l, me in enumerate(ranks):
            total = partial[me][h].copy()
            for hp, hr in enumerate(hosts):
                if hp != h:
                    total = total + _np_quantize(partial[hr[l]][h], bits, block)
            out[me] = total / np.float32(n)
    return out


def quantized_reduce_scatter(names: str, bits: int, block: int, chunk: int) -> dict:
    """qgZ's reduce-scatter of random buckets against the numpy model, and its distance from the exact average
    relative to the largest input magnitude."""
    with pretend_host(names):
        n, rank = dist.get_world_size(), dist.get_rank()
        config = ZeroConfig(stage=3, zero_quantized_gradients=True, quantized_gradient_bits=bits,
                            quantization_block=block, algorithm="native")
        op = build_quantized_reduce_scatter(config, rank=rank, world_size=n, group=None)
        hosts = [list(r) for r in HostLayout.learn(None).hosts]
        buckets = [torch.randn(n * chunk, generator=torch.Generator().manual_seed(100 + r)).mul_(
            torch.logspace(-2, 1, n * chunk)).numpy() for r in range(n)]
        outs = []
        works = []
        for k in range(2):  # two buckets in flight at once: the chains keep their order
            out = torch.empty(chunk)
            works.append(op(out, torch.from_numpy(buckets[rank] * (k + 1)), op=dist.ReduceOp.AVG, async_op=True))
            outs.append(out)
        for work in works:
            work.wait()
        model = _np_hierarchical(buckets, hosts, bits, block)
        exact = np.mean(np.stack(buckets), axis=0)[rank * chunk:(rank + 1) * chunk]
        got = outs[0].numpy()
        model2 = _np_hierarchical([b * 2 for b in buckets], hosts, bits, block)
        return {"vs_model": float(np.abs(got - model[rank]).max()),
                "vs_model_2": float(np.abs(outs[1].numpy() - model2[rank]).max()),
                "vs_exact": float(np.abs(got - exact).max() / np.abs(np.stack(buckets)).max()),
                "sent": dict(op.sent_bytes), "hosts": hosts}


# -- checkpoints ----------------------------------------------------------------------------------------

def _train(model, optimizer, steps: int, start: int = 0) -> list:
    losses = []
    for step in range(start, start + steps):
        x, y = make_batch(model, seed=0, rank=dist.get_rank(), step=step)
        loss = loss_of(model, x, y, step)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _masters(optimizer) -> list:
    return [t.detach().clone() for group in optimizer.param_groups for t in group["params"]]


def _state(optimizer) -> list:
    """This rank's optimizer state tensors (torch's state_dict order: parameter index, then key)."""
    state = optimizer.state_dict()["state"]
    return [torch.as_tensor(state[i][k]).clone() for i in sorted(state) for k in sorted(state[i])]


def checkpoint_round_trip(names: str, path: str, zeropp: dict) -> dict:
    """A ZeRO++ run's checkpoint loads into plain ZeRO-3 and a plain one into ZeRO++: the masters and the
    optimizer state come back equal, and training continues."""
    with pretend_host(names):
        out = {}
        for label, saver, loader in (("zeropp->plain", zeropp, {}), ("plain->zeropp", {}, zeropp)):
            model, optimizer = initialize(make_model("lm", 0), adam,
                                          ZeroConfig(stage=3, algorithm="native", **saver))
            _train(model, optimizer, 3)
            folder = optimizer.save(os.path.join(path, label))
            saved = _masters(optimizer)
            saved_state = _state(optimizer)
            optimizer.remove_hooks()
            model, optimizer = initialize(make_model("lm", 1), adam, ZeroConfig(stage=3, algorithm="native", **loader))
            optimizer.load(folder)
            loaded = _masters(optimizer)
            loaded_state = _state(optimizer)
            more = _train(model, optimizer, 2, start=3)
            optimizer.remove_hooks()
            out[label] = {"masters_equal": all(torch.equal(a, b) for a, b in zip(saved, loaded)) and
                          len(saved) == len(loaded),
                          "state_equal": len(saved_state) == len(loaded_state) > 0 and
                          all(torch.equal(a, b) for a, b in zip(saved_state, loaded_state)),
                          "finite": all(np.isfinite(more))}
        return out


# -- hpZ under qwZ: backward's weights are forward's ----------------------------------------------------

def backward_weights_equal_forward(names: str, steps: int = 2) -> dict:
    """With qwZ and hpZ, every unit backward gathers holds bit for bit what forward's gather gave it in the same
    step (the secondary shard keeps forward's codes; the own chunk is copied exactly both times)."""
    with pretend_host(names):
        seen: dict = {}
        original = UnitGathers.finished

        def recording(self, u, full, phase, persistent):
            seen.setdefault((self._step, u, phase), full.detach().clone())
            return original(self, u, full, phase, persistent)

        original_invalidate = UnitGathers.invalidate

        def next_step(self):
            self._step += 1
            return original_invalidate(self)

        UnitGathers.finished, UnitGathers.invalidate = recording, next_step
        UnitGathers._step = 0
        try:
            run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=3, algorithm="native", bucket_numel=20_000,
                           zero_quantized_weights=True, zero_hpz_partition_size=2)
        finally:
            UnitGathers.finished, UnitGathers.invalidate = original, original_invalidate
            del UnitGathers._step
        gathers = run["optimizer"].parameters.gathers
        run["optimizer"].remove_hooks()
        backward = [key for key in seen if key[2] == "backward"]
        return {"backward_units": len(backward), "secondary_gathered": gathers.gathered_bytes["secondary"],
                "equal": all(torch.equal(seen[key], seen[(key[0], key[1], "forward")]) for key in backward),
                "missing_forward": [key for key in backward if (key[0], key[1], "forward") not in seen]}
