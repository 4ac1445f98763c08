"""Every way the GEMV 7-tuple can be wrong is reported, naming the argument."""

import re

import pytest
import torch

from nvfp4lib.problem import Shape, generate_input
from nvfp4lib.reference import reference_gemv
from nvfp4lib.validate import NVFP4InputError, validate_gemv_input


def replaced(data, index, tensor):
    data = list(data)
    data[index] = tensor
    return tuple(data)


@pytest.fixture
def data():
    return generate_input(256, 128, 2)


def test_valid_input_returns_shape(data):
    assert validate_gemv_input(data) == Shape(256, 128, 2)
    assert validate_gemv_input(list(data), device="cpu") == Shape(256, 128, 2)


def test_m_multiple_can_be_relaxed():
    odd = generate_input(200, 128, 1)
    with pytest.raises(NVFP4InputError, match="^a: expected M a multiple of 128, got M = 200"):
        validate_gemv_input(odd)
    assert validate_gemv_input(odd, need_m_multiple=None) == Shape(200, 128, 1)


@pytest.mark.parametrize("bad, match", [
    (lambda d: d[:6], r"^data: expected a 7-tuple .*got tuple of length 6"),
    (lambda d: d + (d[6],), r"^data: expected a 7-tuple .*got tuple of length 8"),
    (lambda d: None, r"^data: expected a 7-tuple .*got NoneType"),
    (lambda d: replaced(d, 1, None), r"^b: expected a torch.Tensor, got NoneType"),
])
def test_tuple_errors(data, bad, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(bad(data))


@pytest.mark.parametrize("index, convert, match", [
    (0, lambda t: t.view(torch.uint8), r"^a: expected dtype torch.float4_e2m1fn_x2, got torch.uint8"),
    (3, lambda t: t.float(), r"^sfb: expected dtype torch.float8_e4m3fn, got torch.float32"),
    (4, lambda t: t.view(torch.uint8), r"^sfa_permuted: expected dtype torch.float8_e4m3fn"),
    (6, lambda t: t.float(), r"^c: expected dtype torch.float16, got torch.float32"),
])
def test_wrong_dtype(data, index, convert, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, index, convert(data[index])))


@pytest.mark.parametrize("index, convert, match", [
    (0, lambda t: t[:, :, 0], r"^a: expected rank 3, got shape \(256, 64\)"),
    (6, lambda t: t[:, 0, :], r"^c: expected rank 3"),
    (5, lambda t: t[..., 0], r"^sfb_permuted: expected rank 6"),
])
def test_wrong_rank(data, index, convert, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, index, convert(data[index])))


def test_mismatched_k_between_a_and_b(data):
    other = generate_input(256, 256, 2)
    with pytest.raises(NVFP4InputError, match=r"^b: expected K/2 = 64 \(from a\)"):
        validate_gemv_input(replaced(data, 1, other[1]))


def test_mismatched_l_between_a_and_b(data):
    other = generate_input(256, 128, 1)
    with pytest.raises(NVFP4InputError, match=r"^b: expected L = 2 \(from a\)"):
        validate_gemv_input(replaced(data, 1, other[1]))


def test_k_not_multiple_of_64():
    with pytest.raises(NVFP4InputError, match="^a: expected K a multiple of 64, got K = 96"):
        validate_gemv_input(generate_input(128, 96, 1))


@pytest.mark.parametrize("index, source, match", [
    (2, (128, 128, 2), r"^sfa: expected shape \(256, 8, 2\), got \(128, 8, 2\)"),
    (4, (128, 128, 2), r"^sfa_permuted: expected shape \(32, 4, 2, 4, 2, 2\)"),
    (6, (128, 128, 2), r"^c: expected shape \(256, 1, 2\)"),
])
def test_inconsistent_shapes(data, index, source, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, index, generate_input(*source)[index]))


@pytest.mark.parametrize("index, name", [
    (0, "a"), (1, "b"), (2, "sfa"), (3, "sfb"), (4, "sfa_permuted"), (5, "sfb_permuted"), (6, "c")])
def test_wrong_strides(data, index, name):
    """Same shape and values, but contiguous in the logical order: a raw-pointer kernel would misread it."""
    made_contiguous = data[index].contiguous()
    with pytest.raises(NVFP4InputError, match=rf"^{name}: expected strides .*, got {re.escape(str(made_contiguous.stride()))}"):
        validate_gemv_input(replaced(data, index, made_contiguous))


def test_mixed_devices(data):
    with pytest.raises(NVFP4InputError, match="^data: expected all tensors on one device"):
        validate_gemv_input(replaced(data, 6, data[6].to("meta")))


def test_required_device(data):
    with pytest.raises(NVFP4InputError, match="^data: expected tensors on cuda, got cpu"):
        validate_gemv_input(data, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_valid_cuda_input():
    data = generate_input(256, 128, 2, device="cuda")
    assert validate_gemv_input(data, device="cuda") == Shape(256, 128, 2)
    with pytest.raises(NVFP4InputError, match="^data: expected all tensors on one device"):
        validate_gemv_input(replaced(data, 0, data[0].cpu()))


def zero_sized(data, dim: int):
    """The tuple with one of M (dim 0), K (dim 1) or L (dim 2) cut to zero wherever it appears."""
    data = list(data)
    for index in (0, 1, 2, 3, 6):  # a, b, sfa, sfb, c: [rows, K-ish, L]
        if dim == 0 and index in (1, 3):
            continue  # b and sfb keep their 128 rows
        if dim == 1 and index == 6:
            continue  # c has no K
        data[index] = data[index].narrow(dim, 0, 0)
    return tuple(data)


@pytest.mark.parametrize("dim, label", [(0, "M"), (1, "K"), (2, "L")])
@pytest.mark.parametrize("entry", [validate_gemv_input, reference_gemv])
def test_zero_sizes_are_refused_by_name(data, dim, label, entry):
    with pytest.raises(NVFP4InputError, match=rf"^a: expected M, K and L >= 1, got {label} = 0"):
        entry(zero_sized(data, dim))


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """All bytes of t's storage, as a flat uint8 tensor over the same memory."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def c_inside(t: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A float16 tensor with like's shape and strides whose bytes lie in t's storage from `offset`."""
    raw = bytes_of(t)[offset:offset + 2 * like.numel()]
    return raw.view(torch.float16).as_strided(like.shape, like.stride())


@pytest.mark.parametrize("index, name", [(0, "a"), (1, "b"), (2, "sfa"), (3, "sfb"), (4, "sfa_permuted"),
                                         (5, "sfb_permuted")])
def test_c_sharing_memory_with_an_input_is_refused(data, index, name):
    aliased = c_inside(data[index], 0, data[6])
    with pytest.raises(NVFP4InputError, match=rf"^c: expected memory of its own .*shares storage bytes with {name}$"):
        validate_gemv_input(replaced(data, 6, aliased))


def test_c_in_another_part_of_an_inputs_storage_is_refused(data):
    """Not the same elements, but the same allocation: refused all the same."""
    storage = bytes_of(data[0])
    aliased = c_inside(data[0], storage.numel() - 2 * data[6].numel(), data[6])
    with pytest.raises(NVFP4InputError, match=r"^c: .*shares storage bytes with a$"):
        validate_gemv_input(replaced(data, 6, aliased))
    with pytest.raises(NVFP4InputError, match=r"^c: .*shares storage bytes with a$"):
        reference_gemv(replaced(data, 6, aliased))


def test_c_with_memory_of_its_own_is_accepted(data):
    fresh = torch.empty_like(data[6].permute(2, 0, 1)).permute(1, 2, 0)
    assert validate_gemv_input(replaced(data, 6, fresh)) == Shape(256, 128, 2)
