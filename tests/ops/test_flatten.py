"""Flat buffers: layout, padding, casting, views and copies back, and the errors' wording."""
import random

import pytest
import torch

from zerocomm.ops.flatten import as_chunks, flatten_tensors, joined, total_numel, unflatten_into, views_into

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LENGTHS = [0, 1, 7, 8, 9, 1023]


def _ints(shape, start, dtype):
    """Integer-valued tensor (exact in every float dtype up to 256) starting at ``start``."""
    n = torch.Size(shape).numel()
    return (torch.arange(n, dtype=torch.float64) % 251 + start).to(dtype).reshape(shape)


def test_total_numel_mixes_tensors_shapes_and_lengths():
    assert total_numel([torch.zeros(2, 3), (4,), torch.Size([2, 2]), 5, ()]) == 6 + 4 + 4 + 5 + 1
    assert total_numel([]) == 0
    with pytest.raises(ValueError, match="-1"):
        total_numel([(2, -1)])
    with pytest.raises(TypeError, match="str"):
        total_numel(["abc"])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_round_trip_exact(dtype, n):
    tensors = [_ints((n,), 1, dtype), _ints((3, 2), 2, dtype), _ints((), 3, dtype), _ints((n, 1), 4, dtype)]
    flat = flatten_tensors(tensors)
    assert flat.dim() == 1 and flat.is_contiguous() and flat.dtype == dtype
    assert flat.numel() == total_numel(tensors) == 2 * n + 7
    for v, t in zip(views_into(flat, [t.shape for t in tensors]), tensors):
        assert v.shape == t.shape and torch.equal(v, t)
    targets = [torch.empty_like(t) for t in tensors]
    unflatten_into(flat, targets)
    for a, t in zip(targets, tensors):
        assert torch.equal(a, t)


@pytest.mark.parametrize("multiple", [1, 2, 8, 24, 1000])
def test_padding_is_zero_and_rounds_up(multiple):
    tensors = [_ints((5,), 1, torch.float32), _ints((2, 2), 1, torch.float32)]
    flat = flatten_tensors(tensors, pad_to_multiple=multiple)
    assert flat.numel() % multiple == 0
    assert flat.numel() - 9 < multiple and flat.numel() >= 9
    assert torch.all(flat[9:] == 0)
    assert torch.equal(flat[:5], tensors[0])


def test_empty_list_gives_empty_buffer_only_with_dtype():
    flat = flatten_tensors([], dtype=torch.float16, pad_to_multiple=4)
    assert flat.shape == (0,) and flat.dtype == torch.float16
    with pytest.raises(ValueError, match="uniform dtype"):
        flatten_tensors([])


def test_cast_and_result_is_a_copy():
    a = torch.tensor([1.5, -2.0], dtype=torch.float32)
    b = torch.tensor([3, 4], dtype=torch.int64)
    flat = flatten_tensors([a, b], dtype=torch.float64)
    assert flat.dtype == torch.float64 and flat.tolist() == [1.5, -2.0, 3.0, 4.0]
    flat[0] = 99
    assert a[0] == 1.5


def test_mixed_dtypes_need_dtype():
    with pytest.raises(ValueError, match=r"uniform dtype.*float32.*float64|uniform dtype.*float64.*float32"):
        flatten_tensors([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def test_non_contiguous_inputs_keep_logical_order():
    base = torch.arange(12.0).reshape(3, 4)
    t = base.t()  # non-contiguous (4, 3)
    flat = flatten_tensors([t])
    assert torch.equal(flat, t.reshape(-1))
    target = torch.empty(3, 4).t()  # a non-contiguous target too
    unflatten_into(flat, [target])
    assert torch.equal(target, t)


def test_requires_grad_inputs_and_leaf_targets():
    p = torch.nn.Parameter(torch.ones(3))
    flat = flatten_tensors([p * 2])
    assert not flat.requires_grad
    unflatten_into(torch.tensor([7.0, 8.0, 9.0]), [p])
    assert p.tolist() == [7.0, 8.0, 9.0]


def test_views_share_memory_and_ignore_padding():
    flat = torch.zeros(10)
    a, b = views_into(flat, [(2, 2), 3])
    a.fill_(1)
    b.fill_(2)
    assert flat.tolist() == [1, 1, 1, 1, 2, 2, 2, 0, 0, 0]


def test_too_small_names_expected_and_actual():
    with pytest.raises(ValueError, match="need 12 elements, but flat has only 10"):
        views_into(torch.zeros(10), [(3, 4)])
    with pytest.raises(ValueError, match="need 11 elements, but flat has only 10"):
        unflatten_into(torch.zeros(10), [torch.zeros(5), torch.zeros(6)])
    with pytest.raises(ValueError, match=r"1-D, got shape \(2, 5\)"):
        views_into(torch.zeros(2, 5), [3])


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_bad_pad_to_multiple(bad):
    with pytest.raises(ValueError, match="pad_to_multiple"):
        flatten_tensors([torch.zeros(1)], pad_to_multiple=bad)


@pytest.mark.parametrize("seed", range(40))
def test_round_trip_random_layouts(seed):
    rng = random.Random(seed)
    shapes = [[rng.randint(0, 5) for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(0, 6))]
    multiple = rng.randint(1, 17)
    tensors = [_ints(s, i, torch.float32) for i, s in enumerate(shapes)]
    flat = flatten_tensors(tensors, dtype=torch.float32, pad_to_multiple=multiple)
    total = total_numel(shapes)
    assert flat.numel() % multiple == 0 and 0 <= flat.numel() - total < multiple
    assert torch.all(flat[total:] == 0)
    for v, t in zip(views_into(flat, shapes), tensors):
        assert torch.equal(v, t)


def test_joined_and_as_chunks_of_a_scatter_input():
    """A scatter's root input as either form: a flat tensor or its chunks (the list form's items, not joined)."""
    chunks = (torch.arange(3.0), torch.arange(3.0, 6.0), torch.arange(6.0, 9.0))
    flat = torch.arange(9.0)
    assert torch.equal(joined(chunks), flat) and joined(flat) is flat  # a tensor is not copied
    assert [c.data_ptr() for c in as_chunks(chunks, 3)] == [c.data_ptr() for c in chunks]  # the items as they lie
    views = as_chunks(flat, 3)
    assert [v.tolist() for v in views] == [c.tolist() for c in chunks]
    assert views[1].data_ptr() == flat.data_ptr() + 3 * flat.element_size()  # views, not copies
    assert joined([torch.zeros(0), torch.zeros(0)]).numel() == 0
