"""1-bit Adam (Tang et al. 2021): Adam whose momentum travels 1-bit compressed once the variance is frozen.

The optimizer does the data-parallel averaging itself, so the model is *not* wrapped in DDP:
every rank of ``group`` runs its own backward on its own batch and calls ``step()`` the same
number of times.

Schedule (``t`` counts ``step()`` calls from 1):

* warm-up, ``t <= freeze_step``: the gradients of each parameter group are flattened into one
  bucket and averaged with a full-precision ``all_reduce(AVG)``; then plain Adam updates both
  moments ``m`` and ``v``;
* compression, ``t > freeze_step``: ``v`` stays frozen at its value after step ``freeze_step``.
  Each rank folds its *local* gradient into ``m`` (``m = beta1 m + (1 - beta1) g_local``) and the
  group's momenta, flattened into one bucket, are averaged with ``compressed_all_reduce`` (about
  1/32 of the bytes); the bucket's ``ErrorFeedback`` keeps what the signs failed to carry and
  sends it with the next step, so the compression error does not accumulate.  Every rank
  decompresses the same bytes, so ``m`` and the parameters stay identical across ranks.

Update, both phases: ``p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)``.  As in
DeepSpeed's OnebitAdam, ``m_hat = m`` and ``v_hat = v`` (no bias correction) and the weight
decay is decoupled (AdamW-style, scaled by ``lr``), not added to the gradient.  With
``bias_correction=True`` (zerocomm's option) ``m_hat = m / (1 - beta1^t)`` and
``v_hat = v / (1 - beta2^min(t, freeze_step))``, which makes the warm-up exactly
``torch.optim.Adam`` (with ``weight_decay=0``) over averaged gradients.

[Note: options against DeepSpeed's OnebitAdam]
``lr``, ``betas``, ``eps``, ``weight_decay`` and ``freeze_step`` mean the same and have the same
defaults (``freeze_step=100000``: DeepSpeed's tutorial sets it to roughly 15-25 % of the total
steps).  ``comm_backend_name`` ("nccl", "mpi") has no counterpart: the backend is the one of
``group`` (``init_process_group("gloo" | "mpi" | "nccl")``), and ``algorithm=`` picks what runs
the collectives ("native", "ring", "tree", or the process default).  ``cuda_aware`` is accepted for
compatibility and changes nothing: CUDA tensors are packed on their device by torch and handed to
the group's backend as they are (no cupy, no host staging).  DeepSpeed's ``bias_correction`` is
accepted there but unused; here it is a real switch, off by default to keep DeepSpeed's update.
DeepSpeed's ``exp_avg_mask`` is not supported: a momentum that is exactly zero (e.g. embedding rows
that never receive gradients) is sent as +-scale like any other value.  ``amsgrad``,
``max_grad_norm`` and ``eps_inside_sqrt`` are not offered (DeepSpeed rejects or ignores them too).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch

from .. import comm as dist
from ..ops import ErrorFeedback, flatten_tensors, unflatten_into, views_into

__all__ = ["OneBitAdam"]

_STATE_KEY = "onebit"


class OneBitAdam(torch.optim.Optimizer):
    """Adam with a full-precision warm-up, then a frozen variance and a 1-bit-compressed momentum.

    Args:
        params: parameters or parameter groups, as for ``torch.optim.Adam``.  Within a group every
            parameter that requires grad must share one floating dtype and one device (the group
            is one bucket).  A parameter whose ``.grad`` is ``None`` counts as a zero gradient, so
            that every rank communicates the same buckets.
        lr, betas, eps, weight_decay: as DeepSpeed's OnebitAdam (see the module's note).
        freeze_step: number of full-precision warm-up steps; compression starts at step
            ``freeze_step + 1``.
        group: the zerocomm group whose ranks average (``None``: the default group).
        algorithm: ``algorithm=`` of every collective (``None``: the process default).
        cuda_aware: accepted for DeepSpeed compatibility; has no effect.
        bias_correction: apply Adam's bias corrections (off, as DeepSpeed's update).

    ``state_dict()`` adds an ``"onebit"`` entry (the step count and each group's error feedback)
    to torch's; the error tensors' size depends on the world size, so a checkpoint resumes on a
    group of the same size.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100000, *, group=None,
                 algorithm: Optional[str] = None, cuda_aware: bool = False, bias_correction: bool = False):
        if not (isinstance(lr, (int, float)) and lr >= 0.0):
            raise ValueError(f"OneBitAdam: lr must be a float >= 0, got {lr!r}")
        if not (len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"OneBitAdam: betas must be two floats in [0, 1), got {betas!r}")
        if not eps >= 0.0:
            raise ValueError(f"OneBitAdam: eps must be >= 0, got {eps!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"OneBitAdam: weight_decay must be >= 0, got {weight_decay!r}")
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 1:
            # the variance is frozen at its warm-up value: with no warm-up it would stay 0
            raise ValueError(f"OneBitAdam: freeze_step must be an int >= 1, got {freeze_step!r}")
        self.freeze_step = freeze_step
        self.comm_group = group
        self.algorithm = algorithm
        self.cuda_aware = bool(cuda_aware)
        self.bias_correction = bool(bias_correction)
        self.step_count = 0
        """``step()`` calls so far (all groups step together)."""
        self._feedback: list[ErrorFeedback] = []  # one per param group, grown by add_param_group
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        self._bucket(self.param_groups[index], index)  # fail early on mixed dtypes or devices
        self._feedback.append(ErrorFeedback(f"param group {index}"))

    @property
    def error_feedback(self) -> tuple[ErrorFeedback, ...]:
        """This rank's error-feedback state, one per param group (its bucket), in group order."""
        return tuple(self._feedback)

    @property
    def compressing(self) -> bool:
        """Whether the next ``step()`` sends the momentum 1-bit compressed."""
        return self.step_count + 1 > self.freeze_step

    @staticmethod
    def _bucket(group: dict, index: int) -> list[torch.Tensor]:
        params = [p for p in group["params"] if p.requires_grad]
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            found = sorted(f"{d} on {dev}" for d, dev in kinds)
            raise ValueError(f"OneBitAdam: param group {index} is one communication bucket, so it expects one "
                             f"dtype and device, but got {found}; split it into several param groups")
        if params and not params[0].dtype.is_floating_point:
            raise ValueError(f"OneBitAdam: param group {index} has {params[0].dtype} parameters; "
                             "only floating parameters can be optimized")
        return params

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        grads = []
        for p in params:
            if p.grad is not None and p.grad.is_sparse:
                raise ValueError("OneBitAdam does not support sparse gradients")
            grads.append(torch.zeros_like(p) if p.grad is None else p.grad)
        return grads

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter group; every rank of the group calls it.

        Warm-up: one ``all_reduce(AVG)`` per parameter group, launched for all groups before any
        is awaited.  Compression: one ``compressed_all_reduce`` per parameter group, likewise.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        compressing = self.compressing
        self.step_count += 1
        pending = []
        for index, group in enumerate(self.param_groups):
            params = self._bucket(group, index)
            if not params:
                continue
            grads = self._grads(params)
            beta1, beta2 = group["betas"]
            moments = [self._moments(p) for p in params]
            if compressing:
                # the local gradient goes into the momentum, and the momentum is what is averaged
                for (m, _), g in zip(moments, grads):
                    m.mul_(beta1).add_(g, alpha=1 - beta1)
                flat = flatten_tensors([m for m, _ in moments])
                work = dist.compressed_all_reduce(flat, self._feedback[index], group=self.comm_group,
                                                  async_op=True, algorithm=self.algorithm)
            else:
                flat = flatten_tensors(grads)
                work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.comm_group, async_op=True,
                                       algorithm=self.algorithm)
            pending.append((group, params, moments, flat, work))
        for group, params, moments, flat, work in pending:
            work.wait()
            beta1, beta2 = group["betas"]
            if compressing:
                unflatten_into(flat, [m for m, _ in moments])
            else:
                for (m, v), g in zip(moments, views_into(flat, params)):
                    m.mul_(beta1).add_(g, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            self._update(group, params, moments)
        return loss

    def _moments(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["exp_avg"], state["exp_avg_sq"]

    def _update(self, group: dict, params: list[torch.Tensor], moments) -> None:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        step_size, v_scale = lr, 1.0
        if self.bias_correction:
            step_size = lr / (1 - beta1 ** self.step_count)
            # v is frozen after freeze_step, and so is its correction
            v_scale = math.sqrt(1 - beta2 ** min(self.step_count, self.freeze_step))
        for p, (m, v) in zip(params, moments):
            if weight_decay:
                p.add_(p, alpha=-lr * weight_decay)
            denom = (v.sqrt() / v_scale).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)

    def state_dict(self) -> dict:
        """torch's optimizer state plus ``"onebit": {"step", "error_feedback": [per group]}``.

        As torch's, the tensors are shared with the optimizer, not copied.
        """
        state = super().state_dict()
        state[_STATE_KEY] = {"step": self.step_count,
                             "error_feedback": [feedback.state_dict() for feedback in self._feedback]}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore from ``state_dict()``; the error-feedback tensors are copied."""
        state_dict = dict(state_dict)
        extra = state_dict.pop(_STATE_KEY, None)
        if extra is None:
            raise ValueError(f"OneBitAdam.load_state_dict: no {_STATE_KEY!r} entry; this state dict was not "
                             "saved by OneBitAdam")
        feedback = extra["error_feedback"]
        if len(feedback) != len(self.param_groups):
            raise ValueError(f"OneBitAdam.load_state_dict: {len(feedback)} error-feedback states for "
                             f"{len(self.param_groups)} param groups")
        super().load_state_dict(state_dict)
        self.step_count = int(extra["step"])
        for own, saved in zip(self._feedback, feedback):
            own.load_state_dict(saved)
