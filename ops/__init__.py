"""zerocomm package."""
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
from .chunk import padded_numel, partition_bounds, segment_bounds
from .reduce import REDUCE_OPS, finalize_, op_admits, reduce_
