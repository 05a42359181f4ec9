"""ops/flatten.py's pack and unpacker: a list form's items packed into one flat buffer and copied back, by address
on the host, against torch's own ``cat`` and ``split`` (the reference), for every dtype, empty and uneven items, and
items that are not contiguous (which take torch's copies); and joined, a scatter's chunks as one buffer."""
import pytest
import torch

from zerocomm.ops.flatten import pack, unpacker
from zerocomm.comm.reduce_op import SUPPORTED_DTYPES

SIZES = ([3, 3, 3], [0, 5, 1, 0], [0, 0], [], [1])


def _items(sizes, dtype, strided=False):
    made = []
    for index, size in enumerate(sizes):
        base = (torch.arange(2 * size + index) % 7 + 1).to(dtype)
        made.append(base[index:index + 2 * size:2] if strided else base[index:index + size].clone())
    return made


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("sizes", SIZES, ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_pack_is_cat_and_the_unpacker_is_split(dtype, sizes, strided):
    items = _items(sizes, dtype, strided)
    flat = pack(items, dtype, torch.device("cpu"))
    expected = torch.cat([item.reshape(-1) for item in items]) if items else torch.empty(0, dtype=dtype)
    assert flat.dtype == dtype and torch.equal(flat, expected)

    outputs = [torch.zeros_like(item) for item in items]
    if strided:  # outputs the collective writes may be views with strides too: they are written in place
        outputs = [torch.zeros(2 * item.numel(), dtype=dtype)[::2] for item in items]
    source = (torch.arange(sum(sizes)) % 5 + 2).to(dtype)
    copy = unpacker(source, outputs)
    if sum(sizes) == 0:
        assert copy is None
        return
    copy()
    for piece, out in zip(source.split(list(sizes)), outputs):
        assert torch.equal(out, piece)


def test_joined_is_cat_of_the_chunks_and_a_tensor_as_it_is():
    from zerocomm.ops.flatten import joined
    chunks = [torch.arange(3.0), torch.arange(3.0, 5.0), torch.zeros(0)]
    assert torch.equal(joined(chunks), torch.cat(chunks))
    flat = torch.arange(4.0)
    assert joined(flat) is flat


def test_an_item_that_requires_grad_keeps_autograds_rules():
    """A leaf that requires grad is refused an in-place write, as torch's copy refuses it (not written by address)."""
    leaf = torch.zeros(2, requires_grad=True)
    copy = unpacker(torch.ones(2), [leaf])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        copy()
    assert torch.equal(leaf.detach(), torch.zeros(2))
