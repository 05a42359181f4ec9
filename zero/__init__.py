"""zerocomm.zero: ZeRO stages 0-3 on zerocomm.comm's public API.

``initialize(model, optimizer_factory, config, group=None) -> (model, optimizer)``; see
initialize.py for the training loop, config.py for the settings, deepspeed_config.py for what each
DeepSpeed config key does, stages.py for the table of parts each stage is made of, optimizer.py for the
wrapper that composes them, offload.py / offload_nvme.py for optimizer state in host memory or in files,
checkpoint.py for ``optimizer.save`` / ``optimizer.load`` (any world size) and consolidation.py for ``consolidate`` (its command line: consolidate.py).
"""
from .config import ZeroConfig
from .errors import CheckpointError, ZeroConfigError, ZeroError, ZeroStateError
from .initialize import as_config, initialize
from .checkpoint import load_checkpoint, save_checkpoint
from .consolidation import consolidate
from .optimizer import ZeroOptimizer
from .stages import STAGES, Stage

__all__ = ["initialize", "as_config", "ZeroConfig", "ZeroOptimizer", "Stage", "STAGES", "ZeroError", "ZeroConfigError",
           "ZeroStateError", "CheckpointError", "save_checkpoint", "load_checkpoint", "consolidate"]
from .onebit_adam import OneBitAdam  # noqa: E402
__all__ += ["OneBitAdam"]
