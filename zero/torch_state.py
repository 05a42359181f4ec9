"""``ZeroOptimizer.state_dict`` / ``load_state_dict``: one rank's state, as torch optimizers hand it around.

A torch optimizer's ``state_dict`` is ``{"state": ..., "param_groups": ...}``; a ``ZeroOptimizer``'s is the
same for the torch optimizer over this rank's master shards, plus ``"zero"``: what the shards alone do not
say (the float32 masters, which in mixed precision are not the model's parameters; the step counters; the
fp16 loss scaler; the ``lr_scheduler``'s state) and whose shards these are (rank, world size, stage, and the
element count of each master).  So ``torch.save(optimizer.state_dict(), f"rank{r}.pt")`` and
``load_state_dict`` on the same rank of a group of the same size restore training exactly; a checkpoint
that must load at another world size is ``optimizer.save``'s (checkpoint.py).
"""
from __future__ import annotations

import torch

from .errors import ZeroStateError


def rank_state(optimizer) -> dict:
    """This rank's ``state_dict`` (see the module docstring)."""
    optimizer.synchronize()
    inner = optimizer.optimizer.state_dict()
    zero = {"rank": optimizer.rank, "world_size": optimizer.world_size, "stage": optimizer.stage,
            "masters": [master.detach() for master in optimizer.master],
            "step_count": optimizer.step_count, "skipped_steps": optimizer.skipped_steps,
            "global_steps": optimizer.global_steps,
            "scaler": optimizer.scaler.state_dict() if optimizer.scaler is not None else None,
            "lr_scheduler": optimizer.lr_scheduler.state_dict() if optimizer.lr_scheduler is not None else None}
    return {**inner, "zero": zero}


def load_rank_state(optimizer, state_dict: dict) -> None:
    """Restore ``rank_state``'s result on the rank that wrote it; raises ``ZeroStateError`` naming what differs
    before anything changes."""
    rank = optimizer.rank
    zero = state_dict.get("zero") if isinstance(state_dict, dict) else None
    if zero is None:
        raise ZeroStateError(f"rank {rank}: load_state_dict needs a ZeroOptimizer state_dict (with its 'zero' "
                             f"entry), got keys {sorted(state_dict) if isinstance(state_dict, dict) else state_dict!r}")
    here = (optimizer.rank, optimizer.world_size, optimizer.stage)
    theirs = (zero["rank"], zero["world_size"], zero["stage"])
    if here != theirs:
        raise ZeroStateError(f"rank {rank}: the state_dict holds the shards of rank {theirs[0]} of {theirs[1]} at "
                             f"stage {theirs[2]}, this optimizer is rank {here[0]} of {here[1]} at stage {here[2]}; "
                             f"a state_dict loads on its own rank only: use optimizer.save()/load() to reshard")
    shapes = [tuple(m.shape) for m in optimizer.master]
    given = [tuple(m.shape) for m in zero["masters"]]
    if shapes != given:
        raise ZeroStateError(f"rank {rank}: the state_dict's master shards have shapes {given}, this optimizer's "
                             f"{shapes}: another model or bucket layout")
    if not optimizer.at_step_boundary:
        raise ZeroStateError(f"rank {rank}: load_state_dict() inside a gradient-accumulation cycle; load between "
                             f"optimizer.step() and the next backward")
    optimizer.synchronize()
    optimizer.optimizer.load_state_dict({key: value for key, value in state_dict.items() if key != "zero"})
    with torch.no_grad():
        for master, values in zip(optimizer.master, zero["masters"]):
            master.copy_(values)
    optimizer.step_count, optimizer.skipped_steps = zero["step_count"], zero["skipped_steps"]
    optimizer.global_steps = zero["global_steps"]
    if optimizer.scaler is not None and zero["scaler"] is not None:
        optimizer.scaler.load_state_dict(zero["scaler"])
    if optimizer.lr_scheduler is not None and zero["lr_scheduler"] is not None:
        optimizer.lr_scheduler.load_state_dict(zero["lr_scheduler"])
    optimizer.refresh_parameters()
