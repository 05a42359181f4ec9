"""Which blocking all_reduce calls may take the short path, decided once per cell.

``group.short_all_reduce`` runs a blocking SUM all_reduce of a dense CPU tensor straight from the
public function, skipping the checks and the call record, when an earlier call of the same cell
(group, requested algorithm, dtype) went through the full checks.  :func:`remember` is where
a cell is admitted, from the full path's first call; ``Group.short`` holds the answer and is
emptied when the configuration changes.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import select
from .algorithms import ALGORITHMS
from .group import CHECK_AGREE, CHECK_IN_FIRST_SYNC, CHECK_IN_SYNC, CHECK_OFF, CHECK_RIDES, WORLD, Group
from .topology import one_host, shares_memory


def remember(g: Group, requested: Optional[str], dtype: torch.dtype) -> None:
    """Let SUM all_reduce calls of ``dtype`` with ``algorithm=requested`` on ``g`` take the short path.

    Only where the full path would do nothing more than run the algorithm, with the default mismatch
    check (``short_all_reduce`` runs that check too): a CPU group, no debug fingerprint (debug all-gathers whole
    fingerprints), no selection logging, a cell some algorithm serves.  The rows are "auto"'s table in
    elements of ``dtype`` (one unbounded row for an explicit algorithm): ``(most elements, function,
    check, hash of the cell, cell, rider)``, where ``check`` says how ``short_all_reduce`` runs the mismatch
    check, as ``validate.cross_check`` would (``group.CHECK_*``: off; through ``Backend.agree``, the
    tensor of a native all_reduce or of an algorithm in ``Backend.ALGORITHMS_IN_CHECK`` riding in its
    messages; through ``agree`` alone; in an shm call's first
    sync; in a sync of the segment before the call), and ``rider`` is the backend's ``Backend.rider``
    for a riding row, or its ``check=False`` rider for a native row with the check off (the C short path
    runs either), else None.
    """
    from .validate import fingerprint_cell, _selection_logged, segment_checks  # validate imports this module first
    config = WORLD.config
    if config.debug or not g.on_cpu or _selection_logged():
        return
    choice = config.algorithm if requested is None else requested
    rule = select.rule(g.backend_type, g.size(), "all_reduce", dtype, "sum", choice,
                       shares_memory(g.communicator))  # as choose_algorithm reads it
    if rule.refusal is not None:
        return
    native = g.backend_type.NATIVE

    def row(max_numel: int, algorithm: str) -> tuple:
        function = native["all_reduce"] if algorithm == "native" else ALGORITHMS[("all_reduce", algorithm)]
        cell = fingerprint_cell("all_reduce", "sum", dtype, -1, algorithm)
        check = CHECK_OFF
        if config.check and g.size() > 1:
            backend = g.communicator
            if algorithm == "shm" and one_host(backend):
                check = CHECK_IN_FIRST_SYNC
            elif segment_checks(backend):
                check = CHECK_IN_SYNC
            else:
                rides = algorithm == "native" or algorithm in backend.ALGORITHMS_IN_CHECK
                check = CHECK_RIDES if rides else CHECK_AGREE
        rider = None
        if check == CHECK_RIDES:
            rider = g.communicator.rider(dtype, "sum", algorithm=algorithm)
        elif check == CHECK_OFF and algorithm == "native":  # nothing to check: the native call alone, in C
            rider = g.communicator.rider(dtype, "sum", check=False)
        if rider is not None:
            WORLD.rides = True
        return (max_numel, function, check, hash(cell), cell, rider)

    if rule.rows is None:
        rows = (row(select.UNBOUNDED, rule.algorithm),)
    else:
        rows = tuple(row(max_bytes // dtype.itemsize, algorithm) for max_bytes, algorithm in rule.rows)
    g.short_segment_bytes = config.segment_bytes
    g.short[(requested, dtype)] = rows
