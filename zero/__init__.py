"""zerocomm.zero: ZeRO stages 0-3 on zerocomm.comm's public API.

``initialize(model, optimizer=None, config=None, *, model_parameters=None, group=None) -> (model, optimizer)``;
see initialize.py for the training loop, config.py for the settings, deepspeed_config.py for what each
DeepSpeed config key does, optim_factory.py and schedulers.py for the config's optimizer and scheduler
sections, param_groups.py for parameter groups, param_source.py for ``param_source`` (a model whose
parameters do not hold their values, e.g. built under ``zerocomm.deepspeed.zero.Init``), torch_state.py for
``state_dict``, stages.py for the table of parts each stage is made of, parts.py for the parts' interfaces,
optimizer.py for the wrapper that composes them, offload.py / offload_nvme.py for optimizer state in host
memory or in files, checkpoint.py for ``optimizer.save`` / ``optimizer.load`` (any world size; the on-disk
format and its checksums in manifest.py, the ranks' agreement before anything changes in agreement.py) and
consolidation.py for ``consolidate`` (its command line: consolidate.py).
"""
from .config import ZeroConfig
from .errors import (CheckpointCorruptError, CheckpointError, CheckpointForeignError, CheckpointIncompatibleError,
                     CheckpointMissingShardError, CheckpointNotFoundError, CheckpointSaveError, ZeroConfigError,
                     ZeroError, ZeroStateError)
from .deepspeed_config import read_deepspeed_config
from .initialize import as_config, initialize
from .checkpoint import load_checkpoint, save_checkpoint
from .consolidation import consolidate
from .optim_factory import OptimizerConfig
from .optimizer import ZeroOptimizer
from .param_source import ParamSource
from .schedulers import OneCycle, SchedulerConfig, WarmupCosineLR, WarmupDecayLR, WarmupLR
from .stages import STAGES, Stage

__all__ = ["initialize", "as_config", "read_deepspeed_config", "ZeroConfig", "ZeroOptimizer", "Stage", "STAGES", "ZeroError", "ZeroConfigError",
           "ZeroStateError", "CheckpointError", "CheckpointNotFoundError", "CheckpointCorruptError",
           "CheckpointMissingShardError", "CheckpointForeignError", "CheckpointIncompatibleError", "CheckpointSaveError",
           "save_checkpoint", "load_checkpoint", "consolidate", "OptimizerConfig", "SchedulerConfig", "WarmupLR",
           "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "ParamSource"]
from .onebit_adam import OneBitAdam  # noqa: E402
__all__ += ["OneBitAdam"]
