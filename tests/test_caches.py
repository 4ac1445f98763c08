"""The per-input caches see what their contents depend on, so no call is served stale data.

`TupleCache` (validation, views, the CuTe kernel's raw addresses, a stream pool's batch views) is
keyed on the tensors, never on the container: a list refilled between calls, or a tensor
re-pointed in place, is prepared again, and an entry keeps its tensors alive. The transposed
`_scaled_mm` GEMV converts its scales on every call, so even writes that PyTorch's version
counter does not see (through ``.data``, numpy, another tensor over the same storage, a raw
pointer) give fresh results. Everything here runs on the CPU.
"""
import ctypes
import gc
import weakref

import pytest
import torch

from nvfp4lib import dispatch, scaled_mm
from nvfp4lib.caches import TupleCache
from nvfp4lib.contract import NAMES, NVFP4InputError, Shape, validate_gemv_input
from nvfp4lib.device import capabilities
from nvfp4lib.paths import PATHS
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import check, poison_

_seeds = iter(range(4000, 10**6))


def _fresh(shape: Shape) -> list:
    """New full-range data (a fresh seed each time) as a list, c poisoned with NaN."""
    data = list(generate_input(*shape, seed=next(_seeds), mode="full"))
    poison_(data[6])
    return data


def _assert_correct(out: torch.Tensor, data) -> None:
    assert out is data[6], "the result must be written into the c the input holds now"
    result = check(out, data)
    assert result.ok, result.message


# --------------------------------------------------------------- a list refilled between calls


@pytest.mark.parametrize("replaced", ["all", "scales"])
def test_custom_kernel_on_a_refilled_list(clean_dispatch, replaced):
    """The same list object, new tensors in it: the result comes from the tensors now in it."""
    shape = Shape(128, 256, 1)
    data = _fresh(shape)
    _assert_correct(dispatch.custom_kernel(data), data)
    new = _fresh(shape)
    items = range(7) if replaced == "all" else range(2, 6)  # sfa, sfb and both permuted forms
    for i in items:
        data[i] = new[i]
    poison_(data[6])
    _assert_correct(dispatch.custom_kernel(data), data)


@pytest.mark.parametrize("variant", [name for name in PATHS if name.startswith("scaled_mm_")])
def test_scaled_mm_variant_on_a_refilled_list(variant):
    why_not = PATHS[variant].unavailable(capabilities(), False)
    if why_not:
        pytest.skip(why_not)
    fn = PATHS[variant].build()
    shape = Shape(256, 512, 2)
    data = _fresh(shape)
    _assert_correct(fn(data), data)
    data[:] = _fresh(shape)
    _assert_correct(fn(data), data)


# --------------------------------------------------------------- TupleCache's key


class _Recorder:
    """make(data) for TupleCache: records each call and returns the tensors' layout as it is now."""

    def __init__(self):
        self.calls = 0

    def __call__(self, data):
        self.calls += 1
        return [(t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in data]


def test_same_tensors_hit_in_any_container_and_values_do_not_matter():
    cache, make = TupleCache(), _Recorder()
    data = generate_input(128, 256, 1, seed=next(_seeds))
    first = cache.get(data, make)
    assert cache.get(list(data), make) is first
    assert cache.get(tuple(list(data)), make) is first
    data[6].fill_(1.0)  # every call writes c, bumping its version counter: still the same entry
    assert cache.get(data, make) is first
    assert make.calls == 1


@pytest.mark.parametrize("index", range(7), ids=NAMES)
def test_a_replaced_item_is_prepared_again(index):
    cache, make = TupleCache(), _Recorder()
    data = list(generate_input(128, 256, 2, seed=next(_seeds)))
    cache.get(data, make)
    data[index] = data[index].clone()  # same values and layout, another tensor in other memory
    assert cache.get(data, make) == make(data)
    assert make.calls == 3


def _new_memory(t):
    other = t.clone()
    t.set_(other.untyped_storage(), other.storage_offset(), other.shape, other.stride())


def _new_dtype(t):
    t.data = t.data.view(torch.uint8)  # same address, shape and strides


def _new_strides(t):
    t.as_strided_(t.shape, (t.shape[1] * t.shape[2], t.shape[2], 1))  # same address and shape


def _new_shape(t):
    t.set_(t.untyped_storage(), t.storage_offset(), (t.shape[0] // 2, t.shape[1], t.shape[2]), t.stride())


@pytest.mark.parametrize("change", [_new_memory, _new_dtype, _new_strides, _new_shape],
                         ids=lambda f: f.__name__.lstrip("_"))
def test_a_tensor_changed_in_place_is_prepared_again(change):
    """The same tuple holding the same tensor objects, one of them re-pointed: a new entry."""
    cache, make = TupleCache(), _Recorder()
    data = generate_input(128, 256, 2, seed=next(_seeds))
    before = cache.get(data, make)
    change(data[0])
    after = cache.get(data, make)
    assert after == make(data) and after != before


def test_an_entry_keeps_its_tensors_alive():
    """Remembered raw addresses stay valid: the memory they point to cannot be freed and reused."""
    cache = TupleCache(max_entries=1)
    data = _fresh(Shape(128, 256, 1))
    cache.get(data, _Recorder())
    alive = [weakref.ref(t) for t in data]
    data[:] = _fresh(Shape(128, 256, 1))  # the list no longer holds the first tensors
    gc.collect()
    assert all(ref() is not None for ref in alive)
    cache.get(data, _Recorder())  # the only entry is now for the new tensors
    gc.collect()
    assert all(ref() is None for ref in alive)


@pytest.mark.parametrize("bad", [None, 7, [1, 2, 3, 4, 5, 6, 7], "abcdefg"])
def test_bad_input_gets_the_validators_error(bad):
    cache = TupleCache()
    with pytest.raises(NVFP4InputError, match="^data: expected a 7-tuple|^a: expected a torch.Tensor"):
        cache.get(bad, validate_gemv_input)
    assert cache._entries == {}


# --------------------------------------------------------------- the transposed GEMV's scales


def _through_data(sf, src):
    sf.data.view(torch.uint8).copy_(src)


def _through_numpy(sf, src):
    sf.view(torch.uint8).numpy()[...] = src.numpy()


def _through_storage_alias(sf, src):
    alias = torch.empty(0, dtype=torch.uint8).set_(sf.untyped_storage(), sf.storage_offset(), sf.shape,
                                                   sf.stride())
    alias.copy_(src)


def _through_raw_pointer(sf, src):
    # Both are permuted views of a contiguous (L, rows, K/16) buffer: copy the buffer's bytes.
    assert sf.stride() == src.stride() and sf.storage_offset() == src.storage_offset() == 0
    ctypes.memmove(sf.data_ptr(), src.data_ptr(), sf.numel())


def _through_a_view(sf, src):
    sf.view(torch.uint8).copy_(src)  # shares the version counter: the one route it sees


WRITES = [_through_data, _through_numpy, _through_storage_alias, _through_raw_pointer, _through_a_view]


@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize("which", ["sfa", "sfb"])
def test_transposed_reads_the_scales_as_they_are_now(which, write):
    shape = Shape(256, 512, 2)
    data = _fresh(shape)
    first = scaled_mm.gemv_scaled_mm_transposed(data).clone()
    _assert_correct(data[6], data)
    i = NAMES.index(which)
    new = generate_input(*shape, seed=next(_seeds), mode="full")
    sf, version = data[i], data[i]._version
    write(sf, new[i].view(torch.uint8))
    data[i + 2].copy_(new[i + 2])  # the permuted copy too, so the tuple stays consistent
    assert torch.equal(sf.view(torch.uint8), new[i].view(torch.uint8))
    if write is not _through_a_view:
        assert sf._version == version, "this write should be one the version counter cannot see"
    poison_(data[6])
    out = scaled_mm.gemv_scaled_mm_transposed(data)
    _assert_correct(out, data)
    assert not torch.equal(out, first)


# --------------------------------------------------------------- inference mode


def test_inference_mode_is_part_of_the_key():
    cache, make = TupleCache(), _Recorder()
    data = generate_input(128, 256, 1, seed=next(_seeds))
    first = cache.get(data, make)
    with torch.inference_mode():
        assert cache.get(data, make) is not first
        assert cache.get(data, make) is cache.get(data, make)
    assert cache.get(data, make) is first
    assert make.calls == 2


def test_an_inference_c_validated_inside_inference_mode_is_refused_outside():
    """An inference tensor may be written only inside inference mode: a call outside it is checked again, and
    refused naming c, rather than served the entry the call inside made."""
    with torch.inference_mode():
        data = _fresh(Shape(128, 256, 2))  # inference tensors, c among them
        _assert_correct(scaled_mm.gemv_scaled_mm_permuted(data), data)
    with pytest.raises(NVFP4InputError, match=r"c: expected a tensor that may be written here, got an inference "
                                              r"tensor outside torch\.inference_mode\(\)"):
        scaled_mm.gemv_scaled_mm_permuted(data)
