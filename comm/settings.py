"""The initialized world's configuration (``CommConfig``): read and replace its fields, the default
algorithm, and which algorithm a call would run.  ``init_process_group`` reads it from the ``ZEROCOMM_*``
variables (``CommConfig.from_env``), ``destroy_process_group`` drops it with the world.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .config import CommConfig
from .errors import InvalidArgumentError
from .group import WORLD
from .reduce_op import op_name
from .validate import choose_algorithm
from .world import group_or_world


def set_default_algorithm(algorithm: str) -> None:
    """Default ``algorithm=`` of this world's calls ("native", "ring", "tree",
    "recursive_doubling", "shm", "hierarchical", "auto").

    Like :func:`configure`, it changes the initialized world's configuration; before
    ``init_process_group`` it raises (set ``ZEROCOMM_ALGORITHM`` instead, which init reads).
    """
    configure(algorithm=algorithm)


def get_default_algorithm() -> str:
    return WORLD.config.algorithm


def configure(**fields) -> CommConfig:
    """Replace fields of the world's ``CommConfig`` (``algorithm``, ``segment_bytes``, ``debug``, ...); return it.

    The configuration belongs to the initialized world: ``init_process_group`` reads it from the
    ``ZEROCOMM_*`` variables, this changes it, ``destroy_process_group`` drops it.  Called before
    init it raises ``NotInitializedError`` rather than being silently lost; ``configure()`` without arguments
    only reads (before init: the defaults the ``ZEROCOMM_*`` variables give).
    """
    if not fields:
        return WORLD.config  # reading is fine before init: the defaults the environment gives
    WORLD.require("configure")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(CommConfig)})
    if unknown:
        raise InvalidArgumentError(f"configure: unknown settings {unknown}; CommConfig has "
                                   f"{[f.name for f in dataclasses.fields(CommConfig)]}")
    WORLD.config = dataclasses.replace(WORLD.config, **fields)
    return WORLD.config


def which_algorithm(collective: str, tensor: torch.Tensor, op=None, group=None, *,
                    algorithm: Optional[str] = None) -> str:
    """The algorithm a call of ``collective`` on ``tensor`` would use (without running it); for "all_to_all", a
    call on ``tensor`` split evenly (with uneven splits, a call runs the table's choice for unbounded sizes)."""
    g = group_or_world(group, "which_algorithm")
    name = None if op is None else op_name(op, collective=collective, rank=g.my_global_rank)
    nbytes = tensor.numel() * tensor.element_size()
    return choose_algorithm(collective, g, tensor.dtype, name, nbytes, algorithm, "which_algorithm")[0]
