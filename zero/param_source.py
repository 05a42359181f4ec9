"""Initial parameter values that the parameters do not hold: ``initialize(..., param_source=...)``.

``ZeroOptimizer`` normally reads every managed parameter into one float32 buffer, broadcasts it from rank 0
and keeps what the stage needs.  A model built so that no rank ever holds it whole (``zerocomm.deepspeed.zero.Init``
builds one: each parameter keeps its shape but no storage, and each rank a slice of its values) cannot be read
that way.  A *parameter source* hands the values over a few parameters at a time instead:

* stage 3 asks for one unit's parameters at a time, writes this rank's chunk into its shard and frees the
  rest, so a rank holds its shards plus one unit while ZeRO is set up, never the model;
* stages 0-2 keep every parameter on every rank anyway: each parameter is materialized from the source
  (``param.data`` becomes its full values) and set-up continues as for an ordinary model.

The source's values are taken as they are on every rank: no broadcast from rank 0 follows, so a source must
give every rank the same values (Init broadcasts each parameter from rank 0 when it is made).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class ParamSource(Protocol):
    """Where the values of a model's parameters are, when the parameters do not hold them."""

    def gather_into(self, params: Sequence[nn.Parameter], outs: Sequence[torch.Tensor]) -> None:
        """Write the full values of ``params[i]`` into ``outs[i]`` (a float32 tensor shaped like the parameter,
        possibly a view of a larger buffer).  Every rank of the optimizer's group calls it with the same
        parameters in the same order (it may communicate); every rank must receive the same values.  A
        parameter the source holds nothing for is read from the parameter itself."""
        ...


def materialize(source: ParamSource, params: Sequence[nn.Parameter]) -> None:
    """Give each of ``params`` its full values from ``source`` (``param.data`` is replaced, in the parameter's
    dtype), one parameter at a time; every rank of the group calls it with the same parameters."""
    for param in params:
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        source.gather_into([param], [values])
        param.data = values if param.dtype == torch.float32 else values.to(param.dtype)


__all__ = ["ParamSource", "materialize"]
