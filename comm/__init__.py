"""zerocomm.comm: a drop-in for ``torch.distributed``.

``import zerocomm.comm as dist`` gives torch.distributed's names, parameters,
defaults and return values over three backends (gloo, mpi, nccl).  Every
collective also takes zerocomm's keyword-only ``algorithm=`` ("native", "ring",
"tree", "recursive_doubling", "shm", "hierarchical", "auto"; 1-bit compression is
all_reduce's ``compression="onebit"``).  See docs/ for the capability matrix.
"""
from .api import (all_gather, all_gather_into_tensor, all_gather_single, reduce_scatter_single, all_reduce, all_to_all, all_to_all_single, barrier,
                  broadcast, compressed_all_reduce, count_bytes, gather, reduce, reduce_scatter, reduce_scatter_tensor, scatter)
from .errors import (CollectiveMismatchError, CommError, CommTimeoutError, InvalidArgumentError,
                     NotInitializedError, PeerError, UnsupportedError)
from .group import Group
from .objects import (all_gather_object, broadcast_object_list, gather_object, get_host_names,
                      scatter_object_list)
from .profiler import Profiler, profile
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .process_group import init_process_group
from .settings import configure, get_default_algorithm, set_default_algorithm, which_algorithm
from .world import (GroupMember, destroy_process_group, get_backend, get_global_rank, get_group_rank, get_rank,
                    get_world_size, group, is_available, is_initialized, new_group, new_subgroups,
                    new_subgroups_by_enumeration)
from .reduce_op import ReduceOp
from .shm_heap import shared_empty
from .work import Work
from . import compat as _compat
from .compat import *  # noqa: F401,F403  (the rest of torch.distributed's names; see compat.__all__)
from .compat import _rank_not_in_group  # noqa: F401  (private in torch too, but code written against torch uses it)
from . import c10d

c10d.register()  # torch code may now say init_process_group(backend="zerocomm")

#: torch's process group class: what ``new_group`` and ``group.WORLD`` return is one (``c10d.handle_of``).
ProcessGroup = c10d.td.ProcessGroup

__all__ = [
    # torch.distributed's surface
    "init_process_group", "destroy_process_group", "is_initialized", "is_available", "get_rank",
    "get_world_size", "get_backend", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "get_global_rank", "get_group_rank", "barrier", "broadcast",
    "scatter", "reduce", "all_reduce", "gather", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "P2POp",
    "batch_isend_irecv", "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "ReduceOp", "group", "GroupMember", "Work", "ProcessGroup",
    # zerocomm's additions
    "Group", "Profiler", "profile", "shared_empty", "compressed_all_reduce", "count_bytes", "get_host_names", "set_default_algorithm", "get_default_algorithm", "configure", "which_algorithm",
    "CommError", "CommTimeoutError", "CollectiveMismatchError", "UnsupportedError", "NotInitializedError",
    "InvalidArgumentError", "PeerError", "c10d",
] + _compat.__all__
