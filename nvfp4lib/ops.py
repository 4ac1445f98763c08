"""The GEMV as a PyTorch operator, ``torch.ops.nvfp4lib.gemv``: the kernel for use inside models,
``torch.compile`` and CUDA graphs.

`custom_kernel(data)` has the leaderboard's contract: it writes into a ``c`` the caller hands it. A model
wants a function that returns a new tensor and that the compiler can see through without running it.
``gemv(a, b, sfa_permuted, sfb_permuted)`` (tensors of the leaderboard's 7-tuple, `nvfp4lib.contract`) is that
function, registered with ``torch.library.custom_op`` (it mutates no argument) and a fake implementation that
gives the output's shape, dtype, device and strides, so it compiles with ``torch.compile(fullgraph=True)`` and
is captured in a CUDA graph like any PyTorch op::

    import nvfp4lib  # registers torch.ops.nvfp4lib.gemv
    c = nvfp4lib.gemv(a, b, sfa_permuted, sfb_permuted)  # or torch.ops.nvfp4lib.gemv(...)
    # c: [M, 1, L] float16, a new tensor in the 7-tuple's layout

The path is chosen as for `custom_kernel`, by the same dispatcher (`dispatch.DISPATCHER`: the same choice for
the same device and shape, `force` and NVFP4_PATH included), and the result has the same bits. Some paths read
the plain scales ``sfa``/``sfb`` (the CuTe fast kernel, the GPU's default; `scaled_mm_reference`,
`scaled_mm_transposed`, the exact reference), others the permuted ones. So the op takes the permuted scales
and derives the plain ones (`layouts.from_permuted`; exact, with M a multiple of 128 and K of 64), one copy of
the scales per call (1/8 of A's bytes) that `custom_kernel`, handed both forms, does not pay. The four tensors
are validated once, here, and the 7-tuple, new on every call, goes to `Dispatcher.run_validated`.

Forward only: FP4 codes and E4M3 scales have no gradient, and no autograd formula is registered. Call the op
once per shape before capturing a CUDA graph: the first call chooses and builds the path
(the CuTe kernel is compiled then), which a capture must not do."""

import torch

from nvfp4lib.contract import (B_ROWS, BLOCK_SIZE, OP_NAMES, GemvInput, NVFP4InputError, plain_strides, require_tensor,
                               validate_op_input)
from nvfp4lib.dispatch import DISPATCHER
from nvfp4lib.layouts import from_permuted

OP_NAME = "nvfp4lib::gemv"
OUT_DTYPE = torch.float16


def new_output(a: torch.Tensor) -> torch.Tensor:
    """An uninitialised c for ``a``: [M, 1, L] float16 on a's device, viewing a contiguous (L, M, 1)."""
    m, _, l = a.shape
    return torch.empty_strided((m, 1, l), plain_strides(m, 1, l), dtype=OUT_DTYPE, device=a.device)


@torch.library.custom_op(OP_NAME, mutates_args=())
def gemv_op(a: torch.Tensor, b: torch.Tensor, sfa_permuted: torch.Tensor, sfb_permuted: torch.Tensor) -> torch.Tensor:
    """c[m, 0, l] = sum_k A[m, k, l] sfa[m, k // 16, l] B[0, k, l] sfb[0, k // 16, l], as a new tensor: the
    four tensors validated (errors naming the argument), the plain scales derived, run on a new c."""
    m, k, _ = validate_op_input(a, b, sfa_permuted, sfb_permuted)
    k_blocks, c = k // BLOCK_SIZE, new_output(a)
    DISPATCHER.run_validated(GemvInput(a, b, from_permuted(sfa_permuted, m, k_blocks),
                                       from_permuted(sfb_permuted, B_ROWS, k_blocks), sfa_permuted, sfb_permuted, c))
    return c  # every path writes the c of the tuple it is given


@gemv_op.register_fake
def _gemv_fake(a, b, sfa_permuted, sfb_permuted):
    # The checks that need no memory (dtypes, ranks, shapes, devices), so that torch.compile refuses
    # a bad input when it traces, naming the argument; strides and alignment are checked at run time.
    args = (a, b, sfa_permuted, sfb_permuted)
    try:
        validate_op_input(*args, check_storage=False)
    except NVFP4InputError as symbolic:
        if any(isinstance(size, torch.SymInt) for x in args for size in x.shape):
            # traced with symbolic sizes, the message would name a symbol ("got M = s33"): the same
            # checks again on tensors of this call's sizes raise it with the numbers
            try:
                sized = [_with_sizes_of_this_call(x) for x in args]
            except RuntimeError:  # a size with no value while tracing (data-dependent): the message as it is
                raise symbolic from None
            validate_op_input(*sized, check_storage=False)
        raise
    return new_output(a)


def _with_sizes_of_this_call(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor like `x` (dtype, device) whose sizes are the values its symbolic sizes have in
    the call being traced (inside the fake mode of a trace, so it holds no memory)."""
    return torch.empty([int(size) for size in x.shape], dtype=x.dtype, device=x.device)


def gemv(a: torch.Tensor, b: torch.Tensor, sfa_permuted: torch.Tensor, sfb_permuted: torch.Tensor) -> torch.Tensor:
    """``torch.ops.nvfp4lib.gemv(a, b, sfa_permuted, sfb_permuted)``: c = A @ B per batch, a new [M, 1, L]
    float16 tensor; a non-tensor argument refused here, naming it (PyTorch's parser would not)."""
    for name, x in zip(OP_NAMES, (a, b, sfa_permuted, sfb_permuted)):
        require_tensor(x, name)
    return torch.ops.nvfp4lib.gemv(a, b, sfa_permuted, sfb_permuted)
