"""zerocomm.integrations: adapters that put zerocomm under other frameworks' own seams.

Each module imports its framework and is imported only by the user's code that uses that framework; this
package imports none of them.

* ``zerocomm.integrations.ray``: ``ZerocommConfig``, a Ray Train ``TorchConfig`` whose workers join zerocomm's
  world (torch's default group is then zerocomm's, backend ``"zerocomm"``), for ``TorchTrainer``.
* ``zerocomm.integrations.lightning``: ``ZeroStrategy``, a PyTorch Lightning strategy that trains with
  ``zerocomm.zero``'s stages 1-3 and saves and resumes their sharded state through Lightning's checkpoints.
* ``zerocomm.integrations.deepspeed`` (also ``zerocomm.deepspeed``): DeepSpeed's engine API (``initialize``,
  the engine, ``zero.Init``, ``zero.GatheredParameters``), so a DeepSpeed script runs with its import changed.
* ``zerocomm.integrations.transformers``: ``ZeroTrainer``, a Hugging Face ``Trainer`` whose optimizer is
  zerocomm's ZeRO (``zero_config``: a DeepSpeed config, ``"auto"`` values filled from the TrainingArguments).
"""
