"""Mixed precision: dtypes, the fp16 loss scaler, and the global gradient norm.

[Note: why the global norm is float64 over shards]
torch's float32 norm of one large gradient and the same norm assembled from shards differ by
up to ~4e-4 relative (the summation order changes), and with clipping active Adam amplifies the
different clip factor to ~4e-3 in the loss within 20 steps.  So every stage computes the squared
norm of its own gradient elements in float64, sums those across ranks in float64, and takes the
square root: the result no longer depends on the sharding (to ~1e-16), and a data-parallel
reference that does the same on full gradients matches.

[Note: overflow detection rides on the norm]
The sum of squares is inf or nan exactly when some gradient element is, on some rank.  One
float64 all_reduce therefore gives both the global norm and the cross-rank overflow verdict; an
fp16 run without clipping still pays that one 8-byte collective per step, fp32 and bf16 runs
without clipping pay nothing.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch

from .. import comm as dist
from .config import ZeroConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(config: ZeroConfig) -> torch.dtype:
    """Dtype of the model's parameters, gradients and of the communication."""
    return DTYPES[config.precision]


def sum_of_squares(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Σ x² over every element, accumulated in float64: a 1-element float64 tensor on the tensors'
    device (CUDA gradients give a CUDA total that NCCL can reduce; no tensors give a CPU zero)."""
    tensors = list(tensors)
    total = torch.zeros(1, dtype=torch.float64, device=tensors[0].device if tensors else "cpu")
    present = [tensor.detach() for tensor in tensors if tensor.numel()]
    if present:
        # One multi-tensor kernel: each tensor's norm accumulated in float64, squared back (to ~1e-16 relative).
        norms = torch._foreach_norm(present, 2, dtype=torch.float64)
        total += torch.stack([norm.to(total.device) for norm in norms]).square().sum()
    return total


def global_sum_of_squares(local: Iterable[torch.Tensor], group=None, *, sharded: bool,
                          algorithm: Optional[str] = None, device=None, world_size: Optional[int] = None,
                          partial: Optional[torch.Tensor] = None) -> float:
    """The float64 sum of squares of every rank's ``local`` elements (``sharded``), or of this rank's
    alone when every rank holds the same full gradients.  Every rank of ``group`` calls it.  ``device``:
    where the total is reduced (the group's device; offloaded gradients are summed on the host).
    ``world_size``: the group's size, when the caller knows it (else it is asked).  ``partial``: this
    rank's sum already taken of elements no longer in memory (gradients streamed to files)."""
    total = sum_of_squares(local)
    if partial is not None:
        total += partial.to(total.device)
    if device is not None and total.device != device:
        total = total.to(device)
    if world_size is None:
        world_size = dist.get_world_size(group)
    if sharded and world_size > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group, algorithm=algorithm)
    return float(total.item())


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """torch's ``clip_grad_norm_`` factor: ``max_norm / (norm + 1e-6)``, at most 1."""
    return min(1.0, max_norm / (total_norm + 1e-6))


class LossScaler:
    """fp16 loss scale: static, or dynamic (DeepSpeed's rules).

    Dynamic: start at ``2**initial_scale_power``; an overflowing step is skipped and uses up one
    unit of ``hysteresis``; when none is left the scale halves (never below ``min_loss_scale``).
    After ``loss_scale_window`` steps without overflow the scale doubles and hysteresis refills.
    """

    def __init__(self, config: ZeroConfig):
        self.dynamic = config.dynamic_loss_scale
        self.scale = float(config.loss_scale) if not self.dynamic else float(2 ** config.initial_scale_power)
        self.window = config.loss_scale_window
        self.hysteresis = config.hysteresis
        self.min_scale = float(config.min_loss_scale)
        self._hysteresis_left = config.hysteresis
        self.consecutive = config.consecutive_hysteresis
        self._good_steps = 0
        self.overflows = 0
        """Steps skipped because some rank's gradients held inf or nan."""

    def update(self, overflow: bool) -> None:
        """Record one step's verdict (the same on every rank) and adjust the scale."""
        if overflow:
            self.overflows += 1
            self._good_steps = 0
            if self.dynamic:
                self._hysteresis_left -= 1
                if self._hysteresis_left <= 0:
                    self.scale = max(self.scale / 2.0, self.min_scale)
            return
        self._good_steps += 1
        if self.consecutive:
            self._hysteresis_left = self.hysteresis  # only overflows in a row count
        if self.dynamic and self._good_steps % self.window == 0:
            self.scale *= 2.0
            self._hysteresis_left = self.hysteresis

    def state_dict(self) -> dict:
        return {"scale": self.scale, "hysteresis_left": self._hysteresis_left, "good_steps": self._good_steps,
                "overflows": self.overflows}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self._hysteresis_left = int(state["hysteresis_left"])
        self._good_steps = int(state["good_steps"])
        self.overflows = int(state["overflows"])


class _ScaleGradient(torch.autograd.Function):
    """Identity in forward; multiplies the incoming gradient by the loss scale in backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def scale_outputs(output, scale: float):
    """``output`` (a tensor, or tuples/lists/dicts of them) with every floating tensor that requires
    grad passed through ``_ScaleGradient``: the user's ``loss.backward()`` then produces gradients
    multiplied by ``scale`` without the user scaling the loss."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad and output.is_floating_point():
            return _ScaleGradient.apply(output, scale)
        return output
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # a namedtuple
        return type(output)(*(scale_outputs(item, scale) for item in output))
    if isinstance(output, (tuple, list)):
        return type(output)(scale_outputs(item, scale) for item in output)
    if isinstance(output, dict):
        return type(output)((key, scale_outputs(value, scale)) for key, value in output.items())
    return output


def cast_module(model: torch.nn.Module, dtype: torch.dtype, managed: Iterable[torch.Tensor]) -> int:
    """Cast what ZeRO does not manage to ``dtype``, as DeepSpeed's ``module.bfloat16()`` / ``module.half()`` casts
    the whole module: every floating-point parameter not in ``managed`` (frozen ones, ``requires_grad=False``: they
    keep their ``Parameter`` object, so references to it stay valid) and every floating-point buffer (BatchNorm's
    running statistics).  Integer buffers (``num_batches_tracked``) stay as they are.  The managed (trainable)
    parameters are left alone: ZeRO keeps their float32 masters and makes them views of its flat buffer of ``dtype``
    itself.  Returns the number of tensors cast."""
    skip = {id(tensor) for tensor in managed}
    cast = 0
    with torch.no_grad():
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is not None and id(param) not in skip and param.is_floating_point() and param.dtype != dtype:
                    param.data = param.data.to(dtype)
                    skip.add(id(param))  # tied: once
                    cast += 1
            for name, buffer in module._buffers.items():
                if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                    module._buffers[name] = buffer.to(dtype)
                    cast += 1
    return cast


def cast_inputs(args, dtype: torch.dtype):
    """Floating-point tensors among ``args`` (nested tuples/lists/dicts) cast to ``dtype``."""
    if isinstance(args, torch.Tensor):
        return args.to(dtype) if args.is_floating_point() else args
    if isinstance(args, (tuple, list)):
        return type(args)(cast_inputs(item, dtype) for item in args)
    if isinstance(args, dict):
        return type(args)((key, cast_inputs(value, dtype)) for key, value in args.items())
    return args


def is_finite(value: float) -> bool:
    return math.isfinite(value)
