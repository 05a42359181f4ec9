"""DeepSpeed's training API over zerocomm.zero: ``import zerocomm.deepspeed as deepspeed`` runs a DeepSpeed script.

The surface a DeepSpeed training script touches, with DeepSpeed's names and signatures:

* ``init_distributed(dist_backend=None, ...)``: ``zerocomm.comm.init_process_group``; a no-op when the default
  group exists already (as DeepSpeed's);
* ``add_config_arguments(parser)``: ``--deepspeed``, ``--deepspeed_config`` (and DeepSpeed's deprecated
  ``--deepscale``, ``--deepscale_config``);
* ``initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
  lr_scheduler=None, ..., config=None, config_params=None)`` -> ``(engine, optimizer, dataloader, lr_scheduler)``;
* the engine (``DeepSpeedEngine``): ``engine(x)``, ``backward(loss)``, ``step()``, ``save_checkpoint``,
  ``load_checkpoint``, the batch-size getters, ``global_steps``, ``module``, ...;
* ``zero.Init`` and ``zero.GatheredParameters`` (deepspeed_zero.py).

The engine is a thin adapter: ``zerocomm.zero.initialize`` builds the ``ZeroOptimizer`` (a
``torch.optim.Optimizer`` that owns the stage, the buckets, the accumulation boundary and the scheduler), and
the engine only maps DeepSpeed's calls onto it.  What zerocomm does not implement is refused by name with
``ZeroConfigError`` (a ``ValueError``) before anything is set up: ``mpu``, ``mesh_param``,
``dist_init_required=False`` without a process group, ``lr_kwargs``, the pipeline engine, and the checkpoint
options that would load or save only part of the state.  The real ``deepspeed`` package is never imported.

[Note: gradient accumulation]
DeepSpeed's ``engine.backward(loss)`` back-propagates ``loss / gradient_accumulation_steps`` so that the k
micro-batches of a step average.  ``ZeroOptimizer`` already divides the reduced gradients by k (its users call
``loss.backward()`` unscaled), so ``backward`` back-propagates ``loss`` as it is: the update is DeepSpeed's.
It returns ``loss / k``, as DeepSpeed's does.  ``scale_wrt_gas=False`` (DeepSpeed: sum the micro-batches)
back-propagates ``loss * k``.
"""
from __future__ import annotations

import argparse
import inspect
import logging
import os
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch import nn

from .. import comm as dist
from .. import zero as _zero
from ..zero import ZeroConfigError, read_deepspeed_config
from . import deepspeed_zero as zero

log = logging.getLogger("zerocomm.deepspeed")

LATEST = "latest"


# -- process group and command line ---------------------------------------------------------------------
def init_distributed(dist_backend: Optional[str] = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout=None, init_method: Optional[str] = None,
                     dist_init_required: Optional[bool] = None, config=None, rank: int = -1,
                     world_size: int = -1) -> None:
    """Join the default group with ``zerocomm.comm.init_process_group`` (every process calls it); a no-op when it
    exists.  ``dist_backend``: ``"gloo"``, ``"mpi"``, ``"nccl"`` or None (NCCL where every local rank has a GPU,
    else gloo; MPI under mpiexec).  ``auto_mpi_discovery``, ``distributed_port`` (the launcher's
    ``MASTER_PORT`` rules), ``verbose`` and ``config`` are accepted and unused; ``dist_init_required=False``
    joins nothing."""
    if dist.is_initialized() or dist_init_required is False:
        return
    dist.init_process_group(backend=dist_backend, init_method=init_method, timeout=timeout, rank=rank,
                            world_size=world_size)
    if verbose:
        log.info("initialized %s: rank %d of %d", dist.get_backend(), dist.get_rank(), dist.get_world_size())


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's ``--deepspeed`` (a flag) and ``--deepspeed_config`` (a JSON file), and the deprecated
    ``--deepscale`` / ``--deepscale_config``, in a "DeepSpeed" group; returns ``parser``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")
    return parser


# -- the config ---------------------------------------------------------------------------------------------
def _config_dict(args, config, config_params) -> dict:
    """The DeepSpeed config from ``config`` (dict or JSON path), ``config_params`` (its old name) or
    ``args.deepspeed_config`` (``args.deepscale_config``); two sources at once are refused, as in DeepSpeed."""
    if config is not None and config_params is not None:
        raise ZeroConfigError("initialize: pass the config as config= or config_params= (its old name), not both")
    config = config if config is not None else config_params
    from_args = None
    if args is not None:
        from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if from_args is not None and config is not None:
        raise ZeroConfigError(f"initialize: a config was given both in args.deepspeed_config ({from_args!r}) and as "
                              f"the config argument; give one")
    config = config if config is not None else from_args
    if config is None:
        raise ZeroConfigError("initialize: no DeepSpeed config: pass config= (a dict or a JSON file) or "
                              "args with --deepspeed_config")
    return read_deepspeed_config(config, "initialize: config")


def _batch_sizes(config: Mapping, accumulation: int, world_size: int) -> tuple[int, int]:
    """(train_batch_size, train_micro_batch_size_per_gpu) by DeepSpeed's rule (batch = micro x accumulation x
    world); zerocomm.zero has checked that the given ones agree."""
    batch, micro = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
    batch = None if batch in (None, "auto") else int(batch)
    micro = None if micro in (None, "auto") else int(micro)
    if micro is None and batch is None:
        raise ZeroConfigError("initialize: the config needs train_batch_size or train_micro_batch_size_per_gpu "
                              "(DeepSpeed requires one of them)")
    if micro is None:
        micro = batch // (accumulation * world_size)
    return micro * accumulation * world_size, micro


# -- initialize ------------------------------------------------------------------------------------------------
def _optimizer_factory(optimizer, model_parameters):
    """zerocomm.zero's optimizer factory (and the parameter groups) for DeepSpeed's ``optimizer`` argument:
    None (the config's section), a callable ``params -> Optimizer`` (DeepSpeed's form, zerocomm's too), or a
    torch optimizer built over the model's parameters (rebuilt, same class and options, over the shards)."""
    if optimizer is None:
        return None, model_parameters
    if isinstance(optimizer, torch.optim.Optimizer):
        if optimizer.state:
            raise ZeroConfigError(f"initialize: the {type(optimizer).__name__} passed has state already (it has "
                                  f"stepped); pass a fresh one or a callable params -> optimizer")
        cls = type(optimizer)
        # defaults can hold keys the constructor does not take (AdamW inherits Adam's decoupled_weight_decay)
        accepted = inspect.signature(cls.__init__).parameters
        defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
        groups = [{key: value for key, value in group.items()} for group in optimizer.param_groups]

        def factory(shard_groups):
            return cls(shard_groups, **defaults)
        factory.__name__ = cls.__name__
        return factory, groups
    if callable(optimizer):
        return optimizer, model_parameters
    raise ZeroConfigError(f"initialize: optimizer must be a torch.optim.Optimizer, a callable params -> optimizer "
                          f"or None (the config's optimizer section), got {type(optimizer).__name__}")


def _refuse(name: str, value, default=None, why: str = "") -> None:
    if value is not default:
        raise ZeroConfigError(f"initialize({name}=...) is not supported by zerocomm.deepspeed{': ' + why if why else ''}")


def initialize(args=None, model: Optional[nn.Module] = None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port: int = 29500, mpu=None,
               dist_init_required: Optional[bool] = None, collate_fn=None, config=None, mesh_param=None,
               config_params=None):
    """DeepSpeed's ``initialize``: returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    Every rank calls it.  ``config``: a DeepSpeed config dict or the path of a JSON file (or
    ``args.deepspeed_config`` when ``args`` is given; ``config_params`` is its old name).  The process group is
    joined if it is not yet (``dist_init_required`` None or True; False requires it).  ``model`` goes into
    ``zerocomm.zero.initialize`` with the config's stage; a model built under ``zero.Init`` enters stage 3 from
    its shards, never whole on a rank.  ``optimizer``: None (the config's ``optimizer`` section), a callable
    ``params -> torch.optim.Optimizer``, or a torch optimizer over the model's parameters (rebuilt over the
    shards with its class, groups and options).  ``training_data``: a ``torch.utils.data.Dataset``, returned as a
    ``DataLoader`` with a ``DistributedSampler`` and the config's micro-batch size (``collate_fn`` passed on), or
    None.  ``lr_scheduler``: the config's ``scheduler`` section, or one passed (an object with ``step``, or a
    callable ``optimizer -> scheduler``); the engine's ``step()`` advances it after each applied update.

    Refused (``ZeroConfigError``): ``mpu``, ``mesh_param``, a scheduler both passed and in the config,
    ``dist_init_required=False`` without a process group, and what ``zerocomm.zero`` refuses in the config.
    """
    if model is None:
        raise ZeroConfigError("initialize: model is required")
    _refuse("mpu", mpu, why="model (tensor/pipeline) parallelism is not implemented; ZeRO runs over the world")
    _refuse("mesh_param", mesh_param, why="device meshes (sequence/tensor parallel) are not implemented")
    ds_config = _config_dict(args, config, config_params)
    if dist_init_required is False and not dist.is_initialized():
        raise ZeroConfigError("initialize(dist_init_required=False) but the default process group is not "
                              "initialized: call deepspeed.init_distributed() first or leave dist_init_required None")
    init_distributed(distributed_port=distributed_port, verbose=False)
    world_size = dist.get_world_size()
    zero_config = _zero.as_config(ds_config, world_size=world_size, model=model)
    if lr_scheduler is not None and zero_config.scheduler is not None:
        raise ZeroConfigError(f"initialize: a lr_scheduler was passed and the config has a scheduler section "
                              f"({zero_config.scheduler.type}); give one")
    batch, micro = _batch_sizes(ds_config, zero_config.gradient_accumulation_steps, world_size)
    factory, parameters = _optimizer_factory(optimizer, model_parameters)

    managed = {id(p) for p in model.parameters() if p.requires_grad}
    zero.materialize_params([p for p in model.parameters() if id(p) not in managed])  # frozen: ZeRO keeps them whole
    init_built = any(zero.is_init_sharded(p) for p in model.parameters())
    source = zero.InitSource() if init_built else None
    model, zero_optimizer = _zero.initialize(model, factory, zero_config, model_parameters=parameters,
                                             param_source=source)
    zero.register_owner(zero_optimizer)
    if lr_scheduler is not None:
        if not hasattr(lr_scheduler, "step") and callable(lr_scheduler):
            lr_scheduler = lr_scheduler(zero_optimizer)
        zero_optimizer.lr_scheduler = lr_scheduler  # stepped after each applied update, and checkpointed

    dataloader = None
    if training_data is not None:
        dataloader = _dataloader(training_data, micro, collate_fn)
    engine = DeepSpeedEngine(model, zero_optimizer, config=ds_config, train_batch_size=batch, micro_batch_size=micro,
                             dataloader=dataloader, args=args)
    return engine, zero_optimizer, dataloader, zero_optimizer.lr_scheduler


def _dataloader(dataset, micro_batch: int, collate_fn):
    """DeepSpeed's training loader: a ``DistributedSampler`` over the world (shuffled, seed 0, as torch's
    default) and the micro-batch size."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    return DataLoader(dataset, batch_size=micro_batch, sampler=sampler, collate_fn=collate_fn)


# -- the engine -----------------------------------------------------------------------------------------------
class DeepSpeedEngine(nn.Module):
    """What ``initialize`` returns first: the model (``engine(x)`` runs its forward) and DeepSpeed's training
    calls mapped onto the ``ZeroOptimizer`` (``engine.optimizer``).  Every rank calls ``backward``, ``step``,
    ``save_checkpoint`` and ``load_checkpoint`` the same number of times."""

    def __init__(self, module: nn.Module, optimizer, *, config: dict, train_batch_size: int, micro_batch_size: int,
                 dataloader=None, args=None):
        super().__init__()
        self.module = module
        self.optimizer = optimizer
        self.config = config
        """The DeepSpeed config dict as given."""
        self.training_dataloader = dataloader
        self._train_batch_size, self._micro_batch_size = train_batch_size, micro_batch_size
        self.micro_steps = 0
        """``step()`` calls so far (one per micro-batch)."""
        local = getattr(args, "local_rank", None) if args is not None else None
        self.local_rank = int(local) if local is not None and int(local) >= 0 else int(os.environ.get("LOCAL_RANK", 0))
        """The rank on this host (``--local_rank``, else ``LOCAL_RANK``, else 0)."""
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._step_applied = False

    # -- forward / backward / step --------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Back-propagate ``loss`` (see the note on gradient accumulation); returns the loss scaled as DeepSpeed's
        (``loss / gradient_accumulation_steps`` with ``scale_wrt_gas``)."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"rank {self.global_rank}: engine.backward takes a scalar loss tensor, got "
                            f"{type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}")
        steps = self.gradient_accumulation_steps()
        (loss if scale_wrt_gas else loss * steps).backward(retain_graph=retain_graph)
        return loss.detach() / steps if scale_wrt_gas else loss.detach()

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the current micro-step (the next ``step()``) ends a gradient-accumulation cycle."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def step(self, lr_kwargs=None) -> None:
        """At a gradient-accumulation boundary: step the optimizer (which advances the scheduler after an applied
        update) and clear the gradients; before it: count the micro-step.  Every rank calls it after each
        ``backward``."""
        if lr_kwargs is not None:
            raise ZeroConfigError("engine.step(lr_kwargs=...) is not supported by zerocomm.deepspeed: the scheduler "
                                  "steps without arguments")
        if self.is_gradient_accumulation_boundary():
            self._step_applied = self.optimizer.step()
            self.optimizer.zero_grad()
        self.micro_steps += 1

    def was_step_applied(self) -> bool:
        """Whether the last boundary step updated the parameters (False when fp16 skipped it for overflow)."""
        return self._step_applied

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    # -- what DeepSpeed's engine tells ------------------------------------------------------------------
    @property
    def global_steps(self) -> int:
        """Optimizer steps at accumulation boundaries (applied or skipped), as DeepSpeed counts them."""
        return self.optimizer.global_steps

    @property
    def global_samples(self) -> int:
        return self.global_steps * self._train_batch_size

    @property
    def lr_scheduler(self):
        return self.optimizer.lr_scheduler

    @property
    def device(self) -> torch.device:
        return self.optimizer.device

    def train_batch_size(self) -> int:
        return self._train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._micro_batch_size

    def gradient_accumulation_steps(self) -> int:
        return self.optimizer.config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.optimizer.stage

    def get_lr(self) -> list:
        return self.optimizer.get_lr()

    def get_global_grad_norm(self) -> Optional[float]:
        return self.optimizer.last_grad_norm

    # -- checkpoints ------------------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state: Optional[dict] = None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        """Write a checkpoint to ``save_dir/tag`` (``tag`` default ``global_step{N}``) and, with ``save_latest``,
        ``save_dir/latest`` holding the tag, as DeepSpeed lays them out; every rank calls it with the same tag.
        Inside ``save_dir/tag`` is a zerocomm.zero checkpoint (any world size loads it; ``zerocomm-consolidate``
        reads it).  ``client_state`` (rank 0's) comes back from ``load_checkpoint``.  Returns True."""
        if exclude_frozen_parameters:
            raise ZeroConfigError("save_checkpoint(exclude_frozen_parameters=True) is not supported by "
                                  "zerocomm.deepspeed: frozen parameters are saved with the model")
        tag = f"global_step{self.global_steps}" if tag is None else str(tag)
        if not tag or "/" in tag or tag in (".", ".."):
            raise ValueError(f"rank {self.global_rank}: save_checkpoint: tag must be a plain folder name, got {tag!r}")
        root = Path(save_dir)
        self.optimizer.save(root / tag, client_state=dict(client_state or {}))
        if save_latest and self.global_rank == 0:
            tmp = root / f".{LATEST}.tmp-{os.getpid()}"
            tmp.write_text(tag)
            os.replace(tmp, root / LATEST)  # atomic: a reader sees the old tag or the new one
        dist.barrier()  # no rank reads `latest` before rank 0 has written it
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False,
                        custom_load_fn=None):
        """Restore ``load_dir/tag`` (``tag`` None: the one ``load_dir/latest`` names); returns ``(path,
        client_state)``, or ``(None, None)`` with a warning when ``tag`` is None and there is no ``latest`` file,
        as DeepSpeed does.  Every rank calls it.  Model, optimizer and scheduler state are loaded together: the
        options that would load only part of them are refused."""
        for name, value, default in (("load_module_strict", load_module_strict, True),
                                     ("load_optimizer_states", load_optimizer_states, True),
                                     ("load_lr_scheduler_states", load_lr_scheduler_states, True),
                                     ("load_module_only", load_module_only, False),
                                     ("custom_load_fn", custom_load_fn, None)):
            if value != default:
                raise ZeroConfigError(f"load_checkpoint({name}={value!r}) is not supported by zerocomm.deepspeed: a "
                                      f"checkpoint loads the model, optimizer and scheduler state together")
        root = Path(load_dir)
        if tag is None:
            latest = root / LATEST
            if not latest.is_file():
                log.warning("Unable to find latest file at %s, if trying to load latest checkpoint please ensure this "
                            "file exists or pass an explicit checkpoint tag when loading a checkpoint.", latest)
                return None, None
            tag = latest.read_text().strip()
        path, client_state = self.optimizer.load(root / str(tag))
        return path, client_state if client_state is not None else {}


class PipelineModule(nn.Module):
    """DeepSpeed's pipeline-parallel model: refused, naming what is missing."""

    def __init__(self, *args, **kwargs):
        raise ZeroConfigError("deepspeed.PipelineModule / the pipeline engine is not supported by zerocomm.deepspeed: "
                              "ZeRO data parallelism only")


__all__ = ["init_distributed", "add_config_arguments", "initialize", "DeepSpeedEngine", "PipelineModule", "zero"]
