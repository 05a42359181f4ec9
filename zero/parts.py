"""The interfaces of ZeRO's parts: what ``ZeroOptimizer`` (optimizer.py) calls on each kind, and what each declares.

``ZeroOptimizer`` is composed of three parts, whose classes a stage's row in ``STAGES`` names (stages.py), and
stage 3's parameters part keeps its shard in a fourth:

=================  ==========================================================  ==================================
interface          what it holds                                               implementations
=================  ==========================================================  ==================================
``GradientsPart``  gradient buckets, their collective, the reduced elements    ``FullGradients``, ``ShardedGradients``
                                                                               (gradients.py)
``ParametersPart`` the parameters' storage, which elements this rank updates,  ``ReplicatedParameters`` (replicated.py),
                   what is gathered before use and after the step              ``ShardedParameters`` (sharded.py)
``OptimizerState`` float32 masters of those elements and the torch optimizer   ``DeviceOptimizerState``
                                                                               (optimizer_state.py),
                                                                               ``HostOptimizerState`` (offload.py),
                                                                               ``NvmeOptimizerState`` (offload_nvme.py)
``ParamStore``     where stage 3's parameter shard lives                       ``MemoryShards``, ``UnitShards``,
                                                                               ``HostShards``, ``FileShards``
                                                                               (offload_param.py)
=================  ==========================================================  ==================================

They are abstract base classes, as FSDP2's ``_fsdp_api.py`` declares its collectives: each implementation
subclasses its interface, so a missing method is a ``TypeError`` when the part is built, not an
``AttributeError`` in the middle of a step.

[Note: capabilities are declared, not probed]
Where one implementation of a kind can do more than another, the interface declares it as a class attribute
with a default, and the implementation that can overrides it: ``OptimizerState.takes_reduced_buckets`` (the
wrapper hands each bucket's reduced elements over as soon as they are final: ``gradient_ready`` of
``BucketTakingState``), ``OptimizerState.streams_gradients`` (the gradients part may forget a chunk once handed
over), ``OptimizerState.streamed_sum_of_squares`` (None: the norm is taken from ``set_gradients``' tensors),
``GradientsPart.transient_buffers``, ``ParametersPart.reads_source_by_unit``, ``ParametersPart.store`` (None: no
store) and ``ParamStore.in_files`` (then it is a ``FileParamStore``, whose ``path(u)`` names unit u's file).  The
wrapper reads them once, at construction, never with ``hasattr``; none of them costs a call on the step's path.

Units and names used throughout: a *layout* is a ``partition.BucketLayout`` (bucket = unit in stage 3); element
counts are of the tensor's own dtype; bytes are bytes.  ``where`` names the memory the parameters' device is:
``"device"`` for an accelerator, ``"host"`` for the CPU.  A *placement* is ``{"device": bytes, "host": bytes,
"disk": bytes}``: where a part's bytes live.
"""
from __future__ import annotations

import abc
import enum
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable, ClassVar, Optional, Sequence

import torch
from torch import nn

from .config import ZeroConfig
from .partition import BucketLayout

# ``GradientBucket`` (gradients.py) and ``StagePlan`` (stages.py) appear in annotations by name only: those modules
# import this one.

#: ``{"device": bytes, "host": bytes, "disk": bytes}``.
Placement = dict

#: ``reduce_scatter(out, bucket, op=ReduceOp.AVG, group=..., async_op=True, algorithm=...) -> Work``: the collective
#: a ``ShardedGradients`` reduce-scatters a bucket with; ``zerocomm.comm.reduce_scatter_tensor``, or ZeRO++'s qgZ
#: (``zeropp.QuantizedReduceScatter``, same signature).  ``bucket``: 1-D, ``world_size * out.numel()`` elements.
ReduceScatter = Callable[..., object]

#: ``build(param_shards, full32, factory, rank, config, *, device=None, param_store=None) -> OptimizerState``: how
#: ``stages.STATE_PARTS`` builds the part for one ``StatePlacement`` (see ``OptimizerState.build``).
StateFactory = Callable[..., "OptimizerState"]


class Reduction(enum.Enum):
    """The collective that averages a filled gradient bucket across ranks."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"


def empty_placement() -> Placement:
    return {"device": 0, "host": 0, "disk": 0}


class GradientsPart(abc.ABC):
    """Where a bucket's gradients are copied, which collective reduces them, where this rank's reduced elements are.

    The part builds its buckets (``gradients.GradientBucket``, one per layout) and gives them its own buffers and
    collective; the wrapper adds gradients to them, launches, waits and resets them.
    """

    buckets: list
    """``GradientBucket`` per layout, in layout order (built by the constructor)."""

    transient_buffers: ClassVar[bool] = False
    """A bucket's buffer lives only while the bucket is reduced (False: it is a view of a buffer kept between
    steps).  Only then does ``StagePlan.keep_bucket_buffers`` (keep the freed buffers for the next step) apply."""

    @classmethod
    @abc.abstractmethod
    def build(cls, layouts: Sequence[BucketLayout], *, plan: StagePlan, config: ZeroConfig,
              parameters: ParametersPart, state: OptimizerState, dtype: torch.dtype, rank: int, world_size: int,
              group, on_reduced: Optional[Callable[[BucketLayout], None]]) -> GradientsPart:
        """The part for ``plan``'s row.  ``parameters.owned`` says which elements this rank updates and
        ``parameters.device`` where the buffers go; ``on_reduced(layout)`` is called when a bucket's reduction has
        been waited for (None: nothing to do then).  Every rank of ``group`` calls it together (qgZ creates
        groups)."""

    @abc.abstractmethod
    def reduced(self, layout: BucketLayout) -> Optional[torch.Tensor]:
        """This rank's reduced elements of ``layout``: 1-D, ``hi - lo`` elements of ``parameters.owned(layout)``,
        the compute dtype, averaged over ranks; None when a part that hands chunks over once already did."""

    @abc.abstractmethod
    def end_step(self) -> None:
        """The step consumed the reduced gradients: forget in-flight bookkeeping, free what is not kept."""

    @abc.abstractmethod
    def nbytes(self, buckets: Sequence[GradientBucket]) -> int:
        """Bytes of gradients held now (``buckets``: whose buffers count while they hold a bucket)."""


class ParamStore(abc.ABC):
    """This rank's stage-3 parameter shard, one chunk per unit ``u`` (= its bucket index); elements of the
    parameters' dtype."""

    in_files: ClassVar[bool] = False
    """The shards are files (a ``FileParamStore``): an optimizer state in files steps them in place."""

    @abc.abstractmethod
    def shard(self, u: int) -> torch.Tensor:
        """Unit ``u``'s chunk (1-D) as code outside the gather path sees it; writes to it reach the store."""

    @abc.abstractmethod
    def fetch(self, u: int) -> torch.Tensor:
        """Unit ``u``'s chunk as the all_gather's input, on the parameters' device."""

    @abc.abstractmethod
    def read_ahead(self, u: int) -> None:
        """Start reading unit ``u``'s chunk for a ``fetch`` soon (nothing to do for memory)."""

    @abc.abstractmethod
    def write(self, u: int, values: torch.Tensor, start: int) -> None:
        """Elements ``start:start + values.numel()`` of unit ``u``'s chunk (rounded to the store's dtype)."""

    @abc.abstractmethod
    def invalidate(self) -> None:
        """The shards changed (the step, a modifier's write): drop reads started before."""

    @abc.abstractmethod
    def placement(self, where: str) -> Placement:
        """Bytes of the shards by where they live (memory beside the parameters counts under ``where``)."""


class FileParamStore(ParamStore):
    """A ``ParamStore`` whose shards are files, one per unit."""

    in_files: ClassVar[bool] = True

    @abc.abstractmethod
    def path(self, u: int) -> Path:
        """Unit ``u``'s file: ``numel`` elements of the store's dtype, no header."""


class ParametersPart(abc.ABC):
    """Where the parameters live, which elements this rank's optimizer updates, what is gathered before use and
    after the step."""

    device: torch.device
    """The parameters' device: where ZeRO's collectives run."""
    layouts: list
    """The buckets (``BucketLayout``), in layout order."""
    store: Optional[ParamStore] = None
    """Where this rank's parameter shard lives, for a part that keeps only a shard (None: the parameters hold every
    element)."""

    reads_source_by_unit: ClassVar[bool] = False
    """Built from a ``ParamSource`` one unit at a time (``build(..., source=)``); False: the wrapper materializes the
    source into the parameters before ``plan``."""

    @staticmethod
    @abc.abstractmethod
    def plan(model: nn.Module, named: list, config: ZeroConfig, world_size: int,
             param_groups: Optional[Sequence[int]] = None) -> tuple:
        """``(named parameters in layout order, layouts, units)``: ``named`` is ``[(name, parameter)]`` in
        gradient-ready order, ``param_groups`` each one's group; ``units`` is one ``units.UnitPlan`` per layout for
        a part that gathers units, else None."""

    @classmethod
    @abc.abstractmethod
    def build(cls, params: Sequence[nn.Parameter], layouts: Sequence[BucketLayout], units: Optional[list],
              full32: Optional[torch.Tensor], *, plan: StagePlan, config: ZeroConfig, dtype: torch.dtype, rank: int,
              group, source=None) -> ParametersPart:
        """The part for ``plan``'s row over ``params`` (in layout order) and what ``plan`` returned.  ``full32``:
        the flat float32 values of every bucket, padded, equal on every rank (None when ``source`` gives them, for a
        part that ``reads_source_by_unit``).  Every rank of ``group`` calls it together."""

    @abc.abstractmethod
    def owned(self, layout: BucketLayout) -> tuple[int, int]:
        """The bucket-relative half-open element range this rank's optimizer updates."""

    @abc.abstractmethod
    def shard(self, layout: BucketLayout) -> torch.Tensor:
        """The elements of ``owned(layout)`` in the parameters' own storage (1-D, the compute dtype)."""

    @abc.abstractmethod
    def initial_masters(self, full32: Optional[torch.Tensor]) -> list:
        """Per layout, the ``owned`` elements in float32 that the masters start from (mixed precision only);
        taken from ``full32`` (what ``build`` got), or kept from the source read unit by unit."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of parameters in memory (device or host)."""

    @abc.abstractmethod
    def placement(self, where: str) -> Placement:
        """Bytes of parameters by where they live."""

    @abc.abstractmethod
    def install(self, model: nn.Module) -> list:
        """Register the part's module hooks on ``model``; returns their handles."""

    @abc.abstractmethod
    def before_reduce(self, bucket_index: int) -> None:
        """Bucket ``bucket_index`` is about to launch its reduction (every rank, in one order)."""

    @abc.abstractmethod
    def after_reduce_launch(self, bucket_index: int) -> None:
        """Bucket ``bucket_index``'s reduction was launched: its parameters are not needed in this backward."""

    @abc.abstractmethod
    def after_backward(self) -> None:
        """The boundary backward is over."""

    @abc.abstractmethod
    def after_step(self) -> None:
        """The optimizer wrote the updated shards: gather what must be gathered (every rank calls it)."""

    @abc.abstractmethod
    def wait_all(self) -> None:
        """Wait for every gather in flight (a no-op when none is)."""

    @abc.abstractmethod
    def gathered(self, modifier_rank: Optional[int], optimizer_state: OptimizerState,
                 units: Optional[Sequence[int]] = None) -> AbstractContextManager:
        """A block inside which the full parameters are readable (every rank enters it); with ``modifier_rank``
        that rank's values at the end become everyone's and the masters'.  ``units``: only these units' (bucket
        indices; a part that holds every parameter ignores it)."""


class OptimizerState(abc.ABC):
    """This rank's float32 masters (one flat tensor per bucket: its ``owned`` elements) and the torch optimizer
    over them."""

    masters: list
    """Per bucket, the float32 master (an ``nn.Parameter``, 1-D) whose ``.grad`` the optimizer reads."""
    optimizer: torch.optim.Optimizer
    aliased: bool
    """The masters are the parameters' own storage (float32 parameters kept in memory)."""

    takes_reduced_buckets: ClassVar[bool] = False
    """A ``BucketTakingState``: hand it each bucket's reduced elements (``gradient_ready``) as soon as they are
    final, before ``set_gradients``."""
    streams_gradients: ClassVar[bool] = False
    """It keeps no reduced gradient in memory after ``gradient_ready``: the gradients part may forget each reduced
    chunk once handed over (``ShardedGradients(keep_shard=False)``)."""
    streamed_sum_of_squares: Optional[torch.Tensor] = None
    """Σ g² (float64, 1 element) of this step's scaled gradients, for a state whose ``set_gradients`` returns no
    tensors to take the norm of (None: take it from those tensors)."""

    @classmethod
    @abc.abstractmethod
    def build(cls, param_shards: Sequence[torch.Tensor], full32: Optional[Sequence[torch.Tensor]], factory, rank: int,
              config: ZeroConfig, *, device: Optional[torch.device] = None,
              param_store: Optional[ParamStore] = None) -> OptimizerState:
        """The part for ``param_shards`` (per bucket, ``ParametersPart.shard``), ``full32`` (the same elements in
        float32, None for float32 parameters), ``factory`` (masters -> torch optimizer) and ``config``.
        ``device``: the parameters' device (the shards' by default); ``param_store``: stage 3's store."""

    @abc.abstractmethod
    def set_gradients(self, grads: Sequence[Optional[torch.Tensor]], factor: float) -> list:
        """Give every master its gradient (``grads``: per bucket, ``GradientsPart.reduced``) times ``factor``;
        returns the tensors the global norm is taken from (empty when ``streamed_sum_of_squares`` gives it)."""

    @abc.abstractmethod
    def scale_gradients(self, coefficient: float) -> None:
        """Multiply this step's gradients by ``coefficient`` (clipping)."""

    @abc.abstractmethod
    def step(self) -> None:
        """Run the optimizer over every master."""

    @abc.abstractmethod
    def write_back(self, param_shards: Sequence[torch.Tensor]) -> None:
        """Put the updated masters into the parameters' storage (rounded to its dtype)."""

    @abc.abstractmethod
    def read_from(self, param_shards: Sequence[torch.Tensor]) -> None:
        """The masters take the parameters' values (set from outside: a modifier rank, a checkpoint)."""

    @abc.abstractmethod
    def clear_gradients(self) -> None:
        """The step is over: drop this step's gradients."""

    @abc.abstractmethod
    def nbytes(self, param_storages: set) -> int:
        """Bytes in memory of masters, gradients and optimizer state, leaving out storages in ``param_storages``
        (``untyped_storage().data_ptr()`` of the parameter shards: masters that are the parameters)."""

    @abc.abstractmethod
    def placement(self, where: str) -> Placement:
        """Bytes of masters, gradient copies and optimizer state by where they live."""

    def gradient_placement(self) -> Placement:
        """Bytes of reduced gradients this state keeps outside the gradients part (files), by where they live."""
        return empty_placement()


class BucketTakingState(OptimizerState):
    """An ``OptimizerState`` that takes each bucket's reduced elements as soon as they are final."""

    takes_reduced_buckets: ClassVar[bool] = True

    @abc.abstractmethod
    def gradient_ready(self, index: int, grad: torch.Tensor, factor: float) -> None:
        """Bucket ``index``'s reduced elements ``grad`` (``GradientsPart.reduced``) are final: start moving them
        (to the host, to a file); ``factor`` is what ``set_gradients`` would multiply them by."""


__all__ = ["GradientsPart", "ParametersPart", "OptimizerState", "BucketTakingState", "ParamStore", "FileParamStore",
           "Reduction", "ReduceScatter", "StateFactory", "Placement", "empty_placement"]
