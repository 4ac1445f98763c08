"""Scale layouts: plain <-> permuted 6-D <-> cuBLAS blocked, and the zero-copy view."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvfp4lib.contract import NVFP4InputError, scale_tile_counts
from nvfp4lib.layouts import (check_scale_copies, from_blocked, from_permuted, permuted_as_blocked,
                              permuted_as_blocked_batches, to_blocked, to_permuted)
from nvfp4lib.problem import generate_input

shapes = st.tuples(st.integers(1, 300), st.integers(1, 13), st.integers(1, 3), st.integers(0, 2**31))


def random_scales(mn, kb, l, seed, dtype=torch.float8_e4m3fn):
    """Plain [MN, KB, L] scales as the problem stores them: a view of contiguous (L, MN, KB); no zeros."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(1, 0x7F, (l, mn, kb), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).permute(1, 2, 0)


def as_bytes(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def test_scale_tile_counts():
    assert scale_tile_counts(128, 4) == (1, 1)
    assert scale_tile_counts(129, 5) == (2, 2)
    assert scale_tile_counts(7168, 16384 // 16) == (56, 256)


# No deadline and no too_slow health check: how fast this machine is must not decide a property.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_permuted_index_formula_and_round_trip(shape):
    mn, kb, l, seed = shape
    sf = random_scales(mn, kb, l, seed)
    sfp = to_permuted(sf)
    rest_m, rest_k = -(-mn // 128), -(-kb // 4)
    assert sfp.shape == (32, 4, rest_m, 4, rest_k, l) and sfp.dtype == sf.dtype
    # The documented storage: a view of a contiguous (L, rest_m, rest_k, 32, 4, 4) buffer.
    assert sfp.permute(5, 2, 4, 0, 1, 3).is_contiguous()
    i = torch.arange(rest_m * 128).view(-1, 1, 1)
    j = torch.arange(rest_k * 4).view(1, -1, 1)
    b = torch.arange(l).view(1, 1, -1)
    gathered = as_bytes(sfp)[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, b]
    assert torch.equal(gathered[:mn, :kb], as_bytes(sf))
    gathered[:mn, :kb] = 0
    assert not gathered.any(), "padding must be zero"
    back = from_permuted(sfp, mn, kb)
    assert back.dtype == sf.dtype and back.stride() == sf.stride()
    assert torch.equal(as_bytes(back), as_bytes(sf))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_blocked_byte_formula_and_round_trip(shape):
    mn, kb, _, seed = shape
    sf = random_scales(mn, kb, 1, seed)[:, :, 0]
    flat = to_blocked(sf)
    rest_m, rest_k = scale_tile_counts(mn, kb)
    assert flat.shape == (rest_m * rest_k * 512,) and flat.dtype == sf.dtype
    i = torch.arange(mn).view(-1, 1)
    j = torch.arange(kb).view(1, -1)
    tile = (i // 128) * rest_k + j // 4  # row-block major, then k-block
    offset = tile * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
    assert torch.equal(as_bytes(flat)[offset], as_bytes(sf))
    assert int(as_bytes(flat).count_nonzero()) == mn * kb  # everything else is padding
    assert torch.equal(as_bytes(from_blocked(flat, mn, kb)), as_bytes(sf))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_permuted_is_blocked_per_batch_without_copy(shape):
    mn, kb, l, seed = shape
    sf = random_scales(mn, kb, l, seed)
    sfp = to_permuted(sf)
    batches = permuted_as_blocked_batches(sfp)
    assert batches.data_ptr() == sfp.data_ptr() and batches.shape[0] == l
    for b in range(l):
        view = permuted_as_blocked(sfp, b)
        assert view.data_ptr() == sfp.data_ptr() + b * batches.shape[1]
        assert torch.equal(as_bytes(view), as_bytes(to_blocked(sf[:, :, b])))
        assert torch.equal(as_bytes(from_blocked(view, mn, kb)), as_bytes(sf[:, :, b]))


def test_permuted_as_blocked_shares_storage():
    sfp = to_permuted(random_scales(256, 8, 2, 0, dtype=torch.uint8))
    permuted_as_blocked(sfp, 1)[5] = 0
    assert sfp[0, 1, 0, 1, 0, 1] == 0  # byte 5 = 0 * 16 + 1 * 4 + 1: row 32, column 1
    assert permuted_as_blocked(sfp, 1)[5] == 0


def test_two_dimensional_input_means_one_batch():
    sf = random_scales(130, 6, 1, 0)
    assert torch.equal(as_bytes(to_permuted(sf[:, :, 0])), as_bytes(to_permuted(sf)))


def test_uint8_scales_are_accepted():
    sf = random_scales(64, 4, 2, 0, dtype=torch.uint8)
    sfp = to_permuted(sf)
    assert sfp.dtype == torch.uint8 and torch.equal(from_permuted(sfp, 64, 4), sf)


def test_permuted_as_blocked_rejects_other_storage():
    sfp = to_permuted(random_scales(256, 8, 2, 0))
    with pytest.raises(NVFP4InputError, match="^sfp: expected strides"):
        permuted_as_blocked(sfp.contiguous(), 0)
    with pytest.raises(NVFP4InputError, match="^sfp: expected shape"):
        permuted_as_blocked_batches(sfp[..., 0])


def test_layout_errors():
    sfp = to_permuted(random_scales(256, 8, 1, 0))
    with pytest.raises(NVFP4InputError, match="^sfp: expected rest_mn, rest_k"):
        from_permuted(sfp, 300, 8)
    with pytest.raises(NVFP4InputError, match="^flat: expected 1-D with 1024"):
        from_blocked(torch.zeros(512, dtype=torch.uint8), 256, 4)
    with pytest.raises(NVFP4InputError, match="^sf: expected uint8 or float8_e4m3fn"):
        to_permuted(torch.zeros(4, 4))
    with pytest.raises(NVFP4InputError, match="^sf2d: expected"):
        to_blocked(torch.zeros(4, 4, 1, dtype=torch.uint8))


@pytest.mark.parametrize("index", [True, False, 1.0, torch.tensor(1), "1", None])
def test_permuted_as_blocked_refuses_batch_indices_that_are_not_ints(index):
    """A bool indexes as a mask (True selects every batch); a float or tensor is no batch number."""
    sfp = to_permuted(random_scales(256, 8, 2, 0))
    with pytest.raises(NVFP4InputError, match=r"^l: expected an int batch index, got "):
        permuted_as_blocked(sfp, index)


def test_permuted_as_blocked_accepts_integer_types():
    sfp = to_permuted(random_scales(256, 8, 2, 0))
    for index in (1, np.int64(1), torch.tensor(1).item()):
        assert torch.equal(as_bytes(permuted_as_blocked(sfp, index)), as_bytes(permuted_as_blocked_batches(sfp)[1]))


# --------------------------------------------------------------------------- the two copies of the scales


def _with_scales(data, **changes):
    """The tuple with some scale tensors replaced by byte-edited clones: name -> (index, byte)."""
    replaced = {}
    for name, (index, byte) in changes.items():
        t = getattr(data, name).clone()
        t.view(torch.uint8)[index] = byte
        replaced[name] = t
    return data._replace(**replaced)


def test_check_scale_copies_passes_generated_inputs_including_padded_tiles():
    for m, k, l in ((128, 64, 1), (256, 512, 2), (200, 80, 3)):  # M = 200, K/16 = 5: padded atoms
        check_scale_copies(generate_input(m, k, l, seed=m + k + l, mode="full"))


@pytest.mark.parametrize("name, index, where", [
    ("sfa_permuted", (0, 0, 0, 0, 0, 0), r"\(row 0, scale block 0, batch 0\)"),
    ("sfa_permuted", (31, 3, 1, 3, 1, 1), r"\(row 255, scale block 7, batch 1\)"),
    ("sfb_permuted", (0, 0, 0, 2, 1, 1), r"\(row 0, scale block 6, batch 1\)"),
])
def test_check_scale_copies_names_the_copy_and_where_it_differs(name, index, where):
    data = generate_input(256, 128, 2, seed=4, mode="full")
    byte = int(getattr(data, name).view(torch.uint8)[index]) ^ 0x01
    with pytest.raises(NVFP4InputError, match=rf"^{name}: expected the same scales as {name[:3]}, but 1 of \d+ differ; "
                                              rf"first at {where}: {name} holds 0x{byte:02x} "):
        check_scale_copies(_with_scales(data, **{name: (index, byte)}))


def test_check_scale_copies_reads_only_what_the_gemv_uses():
    """sfb's rows 1..127 are filler, and the permuted tensors' padding beyond M or K/16 is never read."""
    data = generate_input(200, 80, 1, seed=5, mode="full")  # rest_m = 2 (56 padded rows), rest_k = 2 (3 padded cols)
    filler = _with_scales(data, sfb_permuted=((5, 0, 0, 0, 0, 0), 0x7E))  # row 5 of the padded vector
    padding = _with_scales(data, sfa_permuted=((31, 3, 1, 3, 1, 0), 0x7E))  # row 255, block 7: beyond M and K/16
    for ok in (filler, padding):
        check_scale_copies(ok)


def test_check_scale_copies_compares_bits_nan_included():
    data = generate_input(128, 64, 1, seed=6)
    nan_both = _with_scales(data, sfa=((3, 1, 0), 0x7F), sfa_permuted=((3, 0, 0, 1, 0, 0), 0x7F))
    check_scale_copies(nan_both)
    with pytest.raises(NVFP4InputError, match=r"^sfa_permuted: .*sfa_permuted holds 0xff \(nan\), sfa 0x7f \(nan\)"):
        check_scale_copies(_with_scales(nan_both, sfa_permuted=((3, 0, 0, 1, 0, 0), 0xFF)))


@pytest.mark.parametrize("bad, match", [
    ((1, 2, 3), r"^data: expected a 7-tuple"),
    (None, r"^data: expected a 7-tuple"),
])
def test_check_scale_copies_validates_the_tuple_first(bad, match):
    with pytest.raises(NVFP4InputError, match=match):
        check_scale_copies(bad)
    data = generate_input(128, 64, 1)
    with pytest.raises(NVFP4InputError, match=r"^sfa_permuted: expected shape"):
        check_scale_copies(data._replace(sfa_permuted=data.sfa_permuted[:16]))
