"""What a GEMV prepares for a set of input tensors, remembered for the next call on the same tensors, and the
keys that say when a set of tensors is the same: `memory_key` (the memory they are, what a CUDA graph replays)
and `TupleCache.key` (those tensor objects, as they are now)."""

from __future__ import annotations

import contextlib
import contextvars

import torch

_validated_once = contextvars.ContextVar("nvfp4lib_validated_once", default=False)


@contextlib.contextmanager
def validated_once():
    """Inside (this thread and asyncio task): the 7-tuple a GEMV gets was validated by its caller and is
    made for this call alone (the op's). No `TupleCache` keeps it (an entry never hit again, pinning
    its tensors), and a GEMV may skip its own validation (`is_validated_once`)."""
    token = _validated_once.set(True)
    try:
        yield
    finally:
        _validated_once.reset(token)


def is_validated_once() -> bool:
    """Whether the caller validated the tuple of this call (inside `validated_once`)."""
    return _validated_once.get()


def memory_key(data) -> tuple:
    """Per tensor: (data address, shape, strides, dtype, device), the memory a call reads and writes;
    not the tensor objects (a replayed CUDA graph reads the memory, whichever tensor now holds it) and
    not their values or version counters (c is written by every call)."""
    return tuple([(t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in data])


class TupleCache:
    """What was prepared for the last few inputs (validation, views, raw addresses), keyed on the tensors themselves.
    A GEMV called again on the same tensors skips that work. The key holds, for every tensor, all that the prepared
    data depends on: the object (its id), data address, shape, strides, dtype, device and whether it requires grad
    (validation refuses a c that does), and whether inference mode is on (validation refuses an inference c outside
    it). The container is not part of it, so a tuple and a list of the same tensors share an entry, and a list whose
    items are replaced, or a tensor re-pointed in place (``set_``, ``.data = ...``, ``as_strided_``), is prepared
    again. An entry holds its tensors, so their ids cannot be reused while it lives, and a hit means every remembered
    address is where each tensor's data is now. Values are not in the key (c is written by every call): nothing
    prepared here may depend on them. Per call, building the key reads 7 attributes of each tensor (id, data
    address, shape, strides, dtype, device, requires_grad: 49 reads for the 7-tuple) and the inference mode, then
    hashes that tuple for one dict lookup: a few microseconds of host time (about 10 on a slow CPU), no device
    work."""

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: dict[tuple, tuple] = {}

    @staticmethod
    def key(data) -> tuple:
        """The tensors' ids and `memory_key`, whether they require grad and whether inference mode is on."""
        return (tuple(map(id, data)), memory_key(data), tuple(t.requires_grad for t in data),
                torch.is_inference_mode_enabled())

    def get(self, data, make):
        """make(data) the first time these tensors are seen as they are now (always inside `validated_once`)."""
        if _validated_once.get():
            return make(data)
        try:
            key = self.key(data)
        except (TypeError, AttributeError):  # not a sequence of tensors: make() reports what is wrong
            return make(data)
        entry = self._entries.get(key)
        if entry is not None:
            return entry[1]
        value = make(data)
        if len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))  # the oldest
        self._entries[key] = (tuple(data), value)
        return value
