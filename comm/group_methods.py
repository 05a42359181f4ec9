"""The methods of torch's ``ProcessGroup`` object that user code calls on a group, for zerocomm's ``Group``.

DDP communication hooks and torch's own examples call collectives on the group object itself —
``process_group.allreduce([bucket.buffer()]).get_future()`` — and ``monitored_barrier`` exists
as a method too.  ``Group`` inherits these from :class:`ProcessGroupMethods`; each one is the
module-level zerocomm collective with ``async_op=True`` (so it returns a ``Work``), taking torch's
argument forms: a list holding one tensor (zerocomm moves one CPU or one CUDA tensor per rank)
and torch's option structs or a ``ReduceOp``.  ``rank`` and ``name`` stay zerocomm's attributes
(torch's are methods): use ``get_rank(group)``.  User code rarely holds a ``Group``: ``new_group`` and
``group.WORLD`` return its torch ``ProcessGroup`` (``c10d.handle_of``), whose methods are torch's; these
serve code that holds the plain group (``handle.zerocomm_group``).
"""
from __future__ import annotations


def _one(tensors, what: str, group):
    if not isinstance(tensors, (list, tuple)):
        return tensors
    if len(tensors) != 1:
        from .errors import UnsupportedError
        raise UnsupportedError(f"rank {group.my_global_rank}: {what}: zerocomm takes one tensor per rank, got "
                               f"{len(tensors)}")
    return tensors[0]


def _reduce_op(opts):
    from .reduce_op import ReduceOp
    if opts is None:
        return ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


class ProcessGroupMethods:
    """torch ``ProcessGroup``'s collective methods on a zerocomm ``Group`` (see the module's docstring)."""

    def allreduce(self, tensors, opts=None):
        """All-reduce ``tensors[0]`` in place; ``opts`` is an ``AllreduceOptions`` or a ``ReduceOp``."""
        from .api import all_reduce
        return all_reduce(_one(tensors, "allreduce", self), _reduce_op(opts), self, True)

    def broadcast(self, tensors, opts=None):
        """Broadcast ``tensors[0]`` from group rank ``opts.rootRank`` (0 without ``opts``; an int is a rank)."""
        from .api import broadcast
        root = getattr(opts, "rootRank", opts) or 0
        return broadcast(_one(tensors, "broadcast", self), group=self, async_op=True, group_src=root)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[0][r]`` ← rank r's ``input_tensors[0]``."""
        from .api import all_gather
        outputs = output_tensors[0] if output_tensors and isinstance(output_tensors[0], (list, tuple)) \
            else output_tensors
        return all_gather(list(outputs), _one(input_tensors, "allgather", self), self, True)

    def barrier(self, opts=None):
        """A barrier over the group; ``opts.timeout`` bounds it."""
        from .api import barrier
        timeout = getattr(opts, "timeout", None)
        return barrier(self, True, timeout=timeout if timeout is not None and timeout.total_seconds() > 0 else None)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """``zerocomm.comm.monitored_barrier`` on this group (blocking, as torch's)."""
        from .compat import monitored_barrier
        monitored_barrier(self, timeout, wait_all_ranks)

    def getBackendName(self) -> str:  # noqa: N802  (torch's name)
        """The transport's name ("gloo", "mpi", "nccl"), as ``get_backend(group)`` says."""
        return self.backend


