"""The runtime of the exported one-file submissions: what a self-checked file runs at import.

Everything here is inlined into the CuTe and hybrid files by `nvfp4lib.leaderboard.export` (the
exporter itself stays out of them). At import such a file calls `choose_kernel` with its paths in
order, its own first, then the rest of `paths.FILE_FALLBACK_ORDER`, each given by the registry's
`unavailable` and `build` functions (inlined from `nvfp4lib.paths`; `paths.IN_A_FILE` where a file runs
a path otherwise: cuBLAS alone, never an emulation). The choice is `fallback.first_working`'s, the
function the dispatcher chooses with, so where a CuTe kernel or cuBLAS's FP4 GEMM runs, the file and
`dispatch.custom_kernel` run the same one; elsewhere the file runs the exact "exact" path, the
dispatcher the emulation. It is made once: the file's
``KERNEL`` is the chosen kernel itself, and a later call that raises (an input the kernel refuses,
say) leaves it chosen. When no path passes, ``KERNEL`` raises on every call, saying why."""

from __future__ import annotations

from typing import Callable

from nvfp4lib.device import capabilities
from nvfp4lib.fallback import first_working


def describe_kernel(name: str, kernel) -> str:
    """What a chosen path runs here, in words (an exported file's ``BACKEND``)."""
    if name.startswith("cute_"):
        call = "TVM-FFI call" if kernel.tvm_ffi else "plain call path, no apache-tvm-ffi"
        return f"CuTe DSL {name.removeprefix('cute_')!r} kernel for {kernel.arch} ({call})"
    return {"scaled_mm_permuted": "torch._scaled_mm on the permuted scales (cuBLAS's FP4 GEMM)",
            "exact": "the exact dequantize-and-matmul, in float64 (slow)"}.get(name, name)


NO_PATH = "no path passed its self-check"


def choose_kernel(paths: dict, fail=()) -> tuple[Callable, str]:
    """(``KERNEL``, ``BACKEND``) of an exported file: the first of `paths` (name -> (unavailable,
    build), in order) that `first_working` accepts on this machine's device, and what it runs. ``fail``
    names paths to fail on purpose (the exporter's --fail-path), to see the fallback work."""
    caps = capabilities()
    device = "cuda" if caps.cuda else "cpu"

    def build(name: str) -> Callable:
        if name in fail:
            raise RuntimeError("made to fail on purpose (exported with --fail-path)")
        return paths[name][1]()

    choice = first_working(list(paths), build, device, unavailable=lambda name: paths[name][0](caps, caps.cuda))
    if choice.name is None:  # every call raises, saying why
        reasons = "; ".join(str(item) for item in choice.passed_over)

        def no_path(data):
            raise RuntimeError(f"no GEMV path passed its self-check on this machine: {reasons}")
        return no_path, NO_PATH
    return choice.kernel, describe_kernel(choice.name, choice.kernel)
