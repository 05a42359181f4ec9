"""zerocomm: collective communication for PyTorch, with ZeRO built on top.

Subpackages: ``zerocomm.comm`` (a drop-in for ``torch.distributed``),
``zerocomm.zero`` (ZeRO stages 1-3) and ``zerocomm.ops`` (local tensor kernels).
"""
__version__ = "0.1.0"
