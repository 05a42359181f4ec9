"""``deepspeed.zero`` for ``zerocomm.deepspeed``: ``Init`` (build a model already sharded) and ``GatheredParameters``.

[Note: how Init shards a model while it is built]
DeepSpeed shards each module's parameters as soon as the module's ``__init__`` returns: a parameter is created
full size (``nn.Linear`` makes ``Parameter(torch.empty(...))`` and then fills it in ``reset_parameters``), so
its values are final only when the module's constructor ends.  Inside ``with Init():`` the ``__init__`` of every
``nn.Module`` class (those that exist, and those defined inside the block, through ``__init_subclass__``) is
wrapped; when the outermost constructor of a module instance returns, each parameter it registered directly
is broadcast from rank 0 (so every rank holds the same values, whatever its random state), split into
``world_size`` equal chunks (the last one zero-padded), and this rank keeps its chunk while the parameter's own
storage is resized to zero bytes: the parameter keeps its shape, dtype and device, and holds no data.  A
model of K layers thus peaks at 1/N of the layers built so far plus the module being built.  The classes'
constructors are restored when the block ends.

``initialize`` (deepspeed.py) hands such a model to ``zerocomm.zero.initialize`` with ``InitSource`` as its
``param_source``: stage 3 asks for one unit's parameters at a time, each is all-gathered from its chunks into the
unit's buffer, this rank's slice of the unit is kept (in a shard tensor allocated for that unit) and the rest
freed, and the parameter's Init chunk is dropped.  So no rank ever holds the whole model: at most its shards
plus about two units.  Stages 0-2 keep every
parameter on every rank anyway; there each parameter is gathered whole.

A parameter whose values are needed while the model is built (a tied weight initialized by the parent, a
custom init after construction) is read or written inside ``GatheredParameters(param, modifier_rank=0)``, as
with DeepSpeed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import weakref
from typing import Iterable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .. import comm as dist
from ..zero import ZeroConfigError, ZeroStateError


@dataclasses.dataclass
class InitShard:
    """This rank's chunk of one parameter built under ``Init``."""

    values: torch.Tensor
    """1-D, ``chunk`` elements in the parameter's dtype (zero-padded past the parameter's end)."""
    chunk: int
    """Elements per rank: ceil(numel / world_size)."""
    group: object
    """The group the parameter is sharded over (None: the world)."""


_SHARDS: "WeakIdKeyDictionary[nn.Parameter, InitShard]" = WeakIdKeyDictionary()
"""(Keyed by identity: a tensor's ``==`` is elementwise.)  Every parameter built under an ``Init`` whose values have not been taken over by ``initialize`` yet."""

_ACTIVE: list = []
"""The ``Init`` blocks entered and not left (only the outermost one patches)."""


def is_init_sharded(param: torch.Tensor) -> bool:
    """True for a parameter made under ``Init`` whose values are still spread over the ranks' chunks."""
    return param in _SHARDS


def _world(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _shard_param(param: nn.Parameter, group, src: int = 0) -> None:
    """Keep this rank's chunk of ``param`` (rank ``src``'s values) and free the parameter's storage (see the note)."""
    rank, world = _world(group)
    numel = param.numel()
    chunk = max(1, math.ceil(numel / world))
    with torch.no_grad():
        flat = param.data.detach().reshape(-1)  # a view when the parameter is contiguous: no copy
        if world > 1:
            if not flat.is_contiguous():
                flat = flat.contiguous()
            dist.broadcast(flat, group=group, group_src=src)  # rank src's values replace this rank's own
        lo, hi = min(rank * chunk, numel), min((rank + 1) * chunk, numel)
        values = torch.zeros(chunk, dtype=param.dtype, device=param.device)
        values[:hi - lo] = flat[lo:hi]
        del flat
        data = param.data
        storage = data.untyped_storage()
        if data.storage_offset() == 0 and storage.nbytes() == numel * data.element_size():
            storage.resize_(0)  # its own storage: free it in place, the tensor keeps its shape
        else:  # a view of a larger tensor: give the parameter an empty tensor of its own
            empty = torch.empty(0, dtype=param.dtype, device=param.device)
            param.data = empty.as_strided(param.shape, _contiguous_strides(param.shape))
    _SHARDS[param] = InitShard(values=values, chunk=chunk, group=group)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def _gather_param(param: nn.Parameter, shard: InitShard, out: torch.Tensor) -> None:
    """The parameter's full values from every rank's chunk into ``out`` (shaped like the parameter)."""
    _, world = _world(shard.group)
    full = torch.empty(shard.chunk * world, dtype=shard.values.dtype, device=shard.values.device)
    if world > 1:
        dist.all_gather_into_tensor(full, shard.values, group=shard.group)
    else:
        full.copy_(shard.values)
    with torch.no_grad():
        out.copy_(full[:param.numel()].view(param.shape))


class InitSource:
    """The ``zerocomm.zero.ParamSource`` of a model built under ``Init``: each parameter's values are
    all-gathered from the ranks' chunks when ZeRO asks for them, and the chunk is dropped (ZeRO keeps the
    values from then on).  A parameter not built under Init is read from itself and broadcast from rank 0,
    as ZeRO does for an ordinary model."""

    def __init__(self, group=None):
        self.group = group

    def gather_into(self, params: Sequence[nn.Parameter], outs: Sequence[torch.Tensor]) -> None:
        for param, out in zip(params, outs):
            shard = _SHARDS.pop(param, None)
            if shard is not None:
                _gather_param(param, shard, out)
                continue
            values = param.detach().to(torch.float32).contiguous().clone()
            if dist.get_world_size(self.group) > 1:
                dist.broadcast(values, group=self.group, group_src=0)
            with torch.no_grad():
                out.copy_(values.view(out.shape))


def materialize_params(params: Iterable[nn.Parameter]) -> None:
    """Give each Init-sharded parameter of ``params`` its full values again (every rank calls it with the
    same parameters); used for what ZeRO does not shard (frozen parameters) and by stages 0-2."""
    for param in params:
        shard = _SHARDS.pop(param, None)
        if shard is None:
            continue
        values = torch.empty(param.shape, dtype=shard.values.dtype, device=shard.values.device)
        _gather_param(param, shard, values)
        param.data = values


def _subclasses() -> list:
    seen, stack = [nn.Module], [nn.Module]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.append(sub)
                stack.append(sub)
    return seen


class Init:
    """Inside ``with Init():`` every module's parameters are sharded across ``data_parallel_group`` as soon as
    the module is constructed (see the note at the top of this file); every rank of the group builds the same
    model in the same order.  ``deepspeed.initialize`` then sets up ZeRO-3 from the shards without gathering
    the model on any rank.

    Accepted as in DeepSpeed: ``module`` (shard an already built module's parameters now), ``data_parallel_group``,
    ``config_dict_or_path`` / ``config`` (read for nothing here: the stage and precision come from
    ``initialize``'s config), ``enabled`` (False: a no-op), ``mem_efficient_linear`` and ``pin_memory`` (hints;
    nothing changes), ``remote_device`` None or ``"none"``, ``dtype`` None or ``torch.float32`` (parameters are
    built in float32, the masters' precision; the config's bf16/fp16 sets the compute dtype at ``initialize``).
    Refused with ``ZeroConfigError``: ``remote_device`` "cpu"/"nvme" (use ``offload_param`` in the config),
    another ``dtype``, ``mpu``, ``zero_param_parallel_group`` (hpZ: use ``zero_hpz_partition_size``),
    ``zero_quantized_weights`` / ``zero_quantized_nontrainable_weights`` (use the config's keys),
    ``sequence_data_parallel_group`` and ``param_swapper``.
    """

    def __init__(self, module: Optional[nn.Module] = None, data_parallel_group=None, mem_efficient_linear: bool = True,
                 remote_device=None, pin_memory: bool = False, config_dict_or_path=None, config=None,
                 enabled: bool = True, dtype=None, mpu=None, zero_param_parallel_group=None,
                 zero_quantized_weights: bool = False, zero_quantized_nontrainable_weights: bool = False,
                 sequence_data_parallel_group=None, param_swapper=None):
        refused = {"mpu": mpu, "zero_param_parallel_group": zero_param_parallel_group,
                   "sequence_data_parallel_group": sequence_data_parallel_group, "param_swapper": param_swapper}
        for name, value in refused.items():
            if value is not None:
                raise ZeroConfigError(f"zero.Init({name}=...) is not supported by zerocomm.deepspeed: it shards over "
                                      f"one data-parallel group (data_parallel_group=, default: the world)")
        for name, value in (("zero_quantized_weights", zero_quantized_weights),
                            ("zero_quantized_nontrainable_weights", zero_quantized_nontrainable_weights)):
            if value:
                raise ZeroConfigError(f"zero.Init({name}=True) is not supported by zerocomm.deepspeed: set "
                                      f"zero_optimization.zero_quantized_weights in the config instead")
        if remote_device not in (None, "none"):
            raise ZeroConfigError(f"zero.Init(remote_device={remote_device!r}) is not supported by zerocomm.deepspeed: "
                                  f"shards are built beside the model; offload them with the config's "
                                  f"zero_optimization.offload_param")
        if dtype not in (None, torch.float32):
            raise ZeroConfigError(f"zero.Init(dtype={dtype}) is not supported by zerocomm.deepspeed: parameters are "
                                  f"built in float32 (the masters' precision); the config's bf16/fp16 section sets "
                                  f"the compute dtype at initialize")
        self.enabled = bool(enabled)
        self.group = data_parallel_group
        self.module = module
        self._patched: dict = {}  # class -> its own __init__ before patching
        self._building: set = set()  # id() of module instances whose constructor is running
        self._had_init_subclass = "__init_subclass__" in nn.Module.__dict__
        self._previous_init_subclass = nn.Module.__dict__.get("__init_subclass__")
        if self.enabled and module is not None:
            for sub in module.modules():
                self._shard_direct(sub)

    # -- the context ------------------------------------------------------------------------------
    def __enter__(self) -> "Init":
        if not self.enabled:
            return self
        if not dist.is_initialized():
            raise dist.NotInitializedError("zero.Init: the default process group is not initialized; call "
                                      "deepspeed.init_distributed() first")
        _ACTIVE.append(self)
        if len(_ACTIVE) > 1:
            return self  # nested: the outer block shards already
        for cls in _subclasses():
            self._patch(cls)
        outer = self

        def __init_subclass__(cls, **kwargs):
            super(nn.Module, cls).__init_subclass__(**kwargs)
            if _ACTIVE and _ACTIVE[0] is outer:
                outer._patch(cls)
        nn.Module.__init_subclass__ = classmethod(__init_subclass__)
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        _ACTIVE.remove(self)
        if _ACTIVE:
            return
        for cls, original in self._patched.items():
            cls.__init__ = original
        self._patched.clear()
        if self._had_init_subclass:
            nn.Module.__init_subclass__ = self._previous_init_subclass
        else:
            del nn.Module.__init_subclass__

    def _patch(self, cls) -> None:
        original = cls.__dict__.get("__init__")
        if not isinstance(original, types.FunctionType) or cls in self._patched:
            return
        self._patched[cls] = original
        building = self._building

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            if id(module) in building:  # a super().__init__ inside the instance's own constructor
                return original(module, *args, **kwargs)
            building.add(id(module))
            try:
                original(module, *args, **kwargs)
            finally:
                building.discard(id(module))
            self._shard_direct(module)
        cls.__init__ = __init__

    def _shard_direct(self, module: nn.Module) -> None:
        """Shard the parameters ``module`` registered itself (its children sharded theirs when they were built)."""
        for param in module.__dict__.get("_parameters", {}).values():
            if (param is not None and param not in _SHARDS and not isinstance(param, nn.parameter.UninitializedParameter)
                    and param.untyped_storage().nbytes() > 0):
                _shard_param(param, self.group)


class GatheredParameters:
    """``with GatheredParameters(params, modifier_rank=None):`` the full values of ``params`` (one parameter or an
    iterable) are readable inside the block; every rank of the group enters it with the same parameters.  With
    ``modifier_rank``, that rank's values at the end of the block become every rank's (broadcast, and written
    into the shards and ZeRO's float32 masters); without it, changes are discarded for sharded parameters.

    Works on parameters built under ``Init`` and not yet given to ``initialize`` (gathered from their chunks and
    re-sharded on exit), on the parameters of a model ``initialize`` returned (through the engine's
    ``ZeroOptimizer.gathered_parameters``: stage 3 gathers only the units holding them), and on plain
    parameters (nothing to gather; with ``modifier_rank`` the values are broadcast).  ``fwd_module`` is refused
    when set; ``enabled=False`` makes it a no-op.
    """

    def __init__(self, params, modifier_rank: Optional[int] = None, fwd_module=None, enabled: bool = True):
        if fwd_module is not None:
            raise ZeroConfigError("GatheredParameters(fwd_module=...) is not supported by zerocomm.deepspeed: the "
                                  "parameters are gathered for the block only")
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in (params or []) if p is not None]
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self):
        if not self.enabled or not self.params:
            return self
        self._stack = contextlib.ExitStack()
        init_params = [p for p in self.params if p in _SHARDS]
        by_owner: dict = {}
        plain = []
        for param in self.params:
            if param in _SHARDS:
                continue
            owner = _owner_of(param)
            if owner is None:
                plain.append(param)
            else:
                by_owner.setdefault(id(owner), (owner, []))[1].append(param)
        try:
            if init_params:
                self._stack.enter_context(_gathered_init(init_params, self.modifier_rank))
            for owner, params in by_owner.values():
                self._stack.enter_context(owner.gathered_parameters(self.modifier_rank, params=params))
            if plain and self.modifier_rank is not None:
                self._stack.callback(_broadcast_plain, plain, self.modifier_rank)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()


_OWNERS: "WeakIdKeyDictionary[nn.Parameter, weakref.ref]" = WeakIdKeyDictionary()
"""Parameter -> (a weak reference to) the ``ZeroOptimizer`` that manages it, for ``GatheredParameters``."""


def register_owner(optimizer) -> None:
    """Record ``optimizer`` (a ``ZeroOptimizer``) as the manager of its parameters."""
    ref = weakref.ref(optimizer)
    for param in optimizer.params:
        _OWNERS[param] = ref


def _owner_of(param):
    ref = _OWNERS.get(param)
    return ref() if ref is not None else None


def _broadcast_plain(params: Sequence[torch.Tensor], modifier_rank: int) -> None:
    if dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for param in params:
            dist.broadcast(param.data, group_src=modifier_rank)


@contextlib.contextmanager
def _gathered_init(params: Sequence[nn.Parameter], modifier_rank: Optional[int]) -> Iterator[None]:
    """Init-sharded ``params`` with their full values for the block; re-sharded after it (``modifier_rank``'s
    values when given, else the values from before the block)."""
    shards = [_SHARDS.pop(p) for p in params]
    for param, shard in zip(params, shards):
        values = torch.empty(param.shape, dtype=shard.values.dtype, device=shard.values.device)
        _gather_param(param, shard, values)
        param.data = values
    try:
        yield
    finally:
        for param, shard in zip(params, shards):
            if param in _SHARDS:
                raise ZeroStateError(f"GatheredParameters: parameter of shape {tuple(param.shape)} was sharded again "
                                     f"inside the block")
            if modifier_rank is None:
                _release(param)
                _SHARDS[param] = shard  # unchanged chunks
            else:
                _shard_param(param, shard.group, src=modifier_rank)


def _release(param: nn.Parameter) -> None:
    param.data.untyped_storage().resize_(0)


__all__ = ["Init", "GatheredParameters", "InitSource", "InitShard", "is_init_sharded", "materialize_params",
           "register_owner"]
