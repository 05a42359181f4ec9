"""zerocomm.ops: local tensor kernels (reductions, chunk bounds, flattening, 1-bit packing,
block-wise int8/int4 quantization).

Nothing here communicates or imports ``zerocomm.comm``; the same kernels serve CPU and CUDA tensors.
"""
from .flatten import flatten_tensors, total_numel, unflatten_into, views_into
from .onebit import (
    ErrorFeedback,
    compress,
    decompress,
    onebit_padded_numel,
    pack_signs,
    pack_signs_numpy,
    unpack_signs,
    unpack_signs_numpy,
)
from .quantize import BlockFeedback, dequantize_blocks, quantize_blocks, quantized_nbytes
from .chunk import padded_numel, partition_bounds, segment_bounds
from .reduce import REDUCE_OPS, finalize_, op_admits, reduce_

__all__ = [
    "REDUCE_OPS", "op_admits", "reduce_", "finalize_",
    "partition_bounds", "segment_bounds", "padded_numel",
    "flatten_tensors", "views_into", "unflatten_into", "total_numel",
    "pack_signs", "unpack_signs", "pack_signs_numpy", "unpack_signs_numpy", "compress", "decompress",
    "onebit_padded_numel", "ErrorFeedback",
    "quantize_blocks", "dequantize_blocks", "quantized_nbytes", "BlockFeedback",
]
