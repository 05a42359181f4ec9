"""``import zerocomm.deepspeed as deepspeed``: DeepSpeed's training API on zerocomm (see
``zerocomm.integrations.deepspeed``): ``init_distributed``, ``add_config_arguments``, ``initialize`` and its
engine, ``zero.Init`` and ``zero.GatheredParameters``.  The real ``deepspeed`` package is never imported."""
from .integrations.deepspeed import (DeepSpeedEngine, PipelineModule, add_config_arguments, init_distributed,
                                     initialize, zero)

__all__ = ["init_distributed", "add_config_arguments", "initialize", "DeepSpeedEngine", "PipelineModule", "zero"]
