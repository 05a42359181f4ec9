"""Collective algorithms written once over :class:`~zerocomm.comm.transport.Transport`, and their registry.

``ALGORITHMS[(collective, algorithm)]`` is the function that runs ``collective`` with
``algorithm``; a missing cell (e.g. ``("gather", "ring")``) is not implemented, and the
selection layer turns its absence into an ``UnsupportedError`` that names an alternative.
"native" is each backend's own table (``Backend.NATIVE``), with the same signatures;
:func:`function_for` looks up either.  Every function takes the transport first, the
collective's flat buffers (validated by ``comm.validate``), then keyword-only ``tag``,
``deadline`` and ``segment_bytes``, and returns ``None``.  Signatures by collective:

=============== =====================================================================
all_reduce      ``f(t, tensor, op, *, ...)``
broadcast       ``f(t, tensor, root, *, ...)``
reduce          ``f(t, tensor, op, root, *, ...)``
all_gather      ``f(t, output, input, *, ...)``
gather          ``f(t, output_or_None, input, root, *, ...)``
scatter         ``f(t, output, input_or_None, root, *, ...)``
reduce_scatter  ``f(t, output, input, op, *, ...)``
all_to_all      ``f(t, output, input, out_counts, in_counts, *, ...)``
barrier         ``f(t, *, ...)``
=============== =====================================================================

``("all_reduce", "onebit")`` also takes ``state`` (the caller's error feedback) and
``inner`` (the algorithm of its two sub-collectives); it computes the mean with
compression error, so it is never chosen by "auto" and the exact-result suites leave it out.
"""
from __future__ import annotations

from typing import Callable

from .. import topology
from .compressed import all_reduce_onebit
from .hierarchical import (
    all_gather_hierarchical,
    all_reduce_hierarchical,
    broadcast_hierarchical,
    reduce_scatter_hierarchical,
)

from .ring import (
    all_gather_ring,
    all_reduce_ring,
    all_to_all_ring,
    broadcast_ring,
    reduce_ring,
    reduce_scatter_ring,
)
from .shm import (
    all_gather_shm,
    all_reduce_shm,
    all_to_all_shm,
    barrier_shm,
    broadcast_shm,
    gather_shm,
    reduce_scatter_shm,
    reduce_shm,
    scatter_shm,
)
from .tree import (
    all_gather_tree,
    all_reduce_recursive_doubling,
    all_reduce_tree,
    barrier_tree,
    broadcast_tree,
    gather_tree,
    reduce_scatter_tree,
    reduce_tree,
    scatter_tree,
)

# topology sits below the algorithms and imports none: the ring is handed to it here, for callers that pass no
# all_gather of their own to topology.hosts (shm.arena, below the algorithms too).
topology.use_all_gather(all_gather_ring)

#: Every collective an algorithm may serve, in the order tables list them.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)

ALGORITHMS: dict[tuple[str, str], Callable[..., None]] = {
    ("all_reduce", "ring"): all_reduce_ring,
    ("all_reduce", "tree"): all_reduce_tree,
    ("all_reduce", "recursive_doubling"): all_reduce_recursive_doubling,
    ("broadcast", "ring"): broadcast_ring,
    ("broadcast", "tree"): broadcast_tree,
    ("reduce", "ring"): reduce_ring,
    ("reduce", "tree"): reduce_tree,
    ("all_gather", "ring"): all_gather_ring,
    ("all_gather", "tree"): all_gather_tree,
    ("gather", "tree"): gather_tree,
    ("scatter", "tree"): scatter_tree,
    ("reduce_scatter", "ring"): reduce_scatter_ring,
    ("reduce_scatter", "tree"): reduce_scatter_tree,
    ("all_to_all", "ring"): all_to_all_ring,
    ("barrier", "tree"): barrier_tree,
    ("all_reduce", "onebit"): all_reduce_onebit,
    # Shared memory: every rank of the transport on one host (UnsupportedError otherwise).
    ("all_reduce", "shm"): all_reduce_shm,
    ("broadcast", "shm"): broadcast_shm,
    ("reduce", "shm"): reduce_shm,
    ("all_gather", "shm"): all_gather_shm,
    ("gather", "shm"): gather_shm,
    ("scatter", "shm"): scatter_shm,
    ("reduce_scatter", "shm"): reduce_scatter_shm,
    ("all_to_all", "shm"): all_to_all_shm,
    ("barrier", "shm"): barrier_shm,
    # Groups spanning hosts: shared memory (or ring) inside each host, bytes cross each link once.
    ("all_reduce", "hierarchical"): all_reduce_hierarchical,
    ("reduce_scatter", "hierarchical"): reduce_scatter_hierarchical,
    ("all_gather", "hierarchical"): all_gather_hierarchical,
    ("broadcast", "hierarchical"): broadcast_hierarchical,
}

#: Algorithms whose result carries compression error (not the exact reduction).
COMPRESSED = ("onebit",)

#: Every algorithm name, in the order tables list them: the backend's own, then zerocomm's.
ALGORITHM_NAMES = ("native",) + tuple(dict.fromkeys(name for _, name in ALGORITHMS))

#: What ``algorithm=`` accepts: a name above, or "auto" (the tuned table's choice).
ALGORITHM_CHOICES = ALGORITHM_NAMES + ("auto",)


def function_for(collective: str, algorithm: str, backend) -> Callable[..., None]:
    """The function that runs ``collective`` with ``algorithm`` on ``backend`` (its own table for "native")."""
    if algorithm == "native":
        return backend.NATIVE[collective]
    return ALGORITHMS[(collective, algorithm)]


def sub_algorithm(collective: str, inner: str) -> str:
    """The algorithm that runs ``collective`` (all_to_all or all_gather, ``compressed.SUB_COLLECTIVES``) for a
    compressed all_reduce over ``inner``: ``inner`` itself where the registry has it (or it is "native"), else
    "ring"."""
    return inner if inner == "native" or (collective, inner) in ALGORITHMS else "ring"


def algorithms_for(collective: str) -> list[str]:
    """The algorithm names registered for ``collective``, in registration order (``[]`` if none)."""
    return [algo for (coll, algo) in ALGORITHMS if coll == collective]


__all__ = ["ALGORITHMS", "ALGORITHM_CHOICES", "ALGORITHM_NAMES", "COLLECTIVES", "COMPRESSED", "algorithms_for",
           "function_for", "sub_algorithm"] + sorted({fn.__name__ for fn in ALGORITHMS.values()})
