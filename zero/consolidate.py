"""Command line of checkpoint consolidation (``consolidation.py`` does the work)::

    python -m zerocomm.zero.consolidate CHECKPOINT_DIR OUT.pt            # torch.save
    python -m zerocomm.zero.consolidate CHECKPOINT_DIR OUT.safetensors   # safetensors format
    zerocomm-consolidate CHECKPOINT_DIR OUT.pt                           # the same, installed as a script
    zerocomm-consolidate --check CHECKPOINT_DIR                          # verify every shard, write nothing

Kept apart from ``consolidation.py``, which ``zerocomm.zero`` imports: running a module with ``-m``
that its package has already imported makes Python warn (``RuntimeWarning: ... found in
sys.modules``).
"""
import sys

from .consolidation import main

if __name__ == "__main__":
    sys.exit(main())
