"""The package's ways to compute the GEMV, under one naming scheme, and the one fallback order.

A path is one way to compute ``c`` from the leaderboard's 7-tuple. `PATHS` holds the package's own: the CuTe
kernels, the torch._scaled_mm variants and the exact reference. They are what the dispatcher can run
(``dispatch.force("cute_fast")``, ``NVFP4_PATH``), what the calibration table records and what the exporter
writes (``python -m nvfp4lib.leaderboard.export --path cute_fast``). The peers a benchmark measures them
against (eager PyTorch, torch.compile, bf16 weights, Triton) are registered in the bench wing, under the same
scheme (``nvfp4lib.bench.peers.all_paths``). Names are lowercase words joined by "_", the family first
(``cute_``, ``scaled_mm_``, ``peer_``, ``triton_``).

`FALLBACK_ORDER` is the one "best path for this machine" policy, of the dispatcher and of the exported
``hybrid`` file alike."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from nvfp4lib.contract import first_tensor
from nvfp4lib.device import Capabilities, lacks_cute_dsl, lacks_fp4_gemm
from nvfp4lib.fallback import exact_gemv
from nvfp4lib.graphs import GraphedGemv
from nvfp4lib.reference import reference_gemv
from nvfp4lib.scaled_mm import (functional_unavailable_reason, gemv_cublas_permuted, gemv_scaled_mm_functional,
                                gemv_scaled_mm_permuted, gemv_scaled_mm_reference, gemv_scaled_mm_transposed)
from nvfp4lib.streams import run_batches, shared_pool

SCALED_MM_POOL_STREAMS = 4  # streams of "scaled_mm_streams"
TRANSPOSED_STREAMS = 2  # streams of "scaled_mm_transposed": batches overlap, host cost stays small


# ---------------------------------------------------------------------------------------------
# Why a path cannot run here (plain functions: the exported files inline the ones they use)


def cute_unavailable(caps: Capabilities, on_cuda: bool) -> str | None:
    """Why the CuTe kernels cannot run on these inputs here (None: they can)."""
    if not on_cuda or not caps.cuda:
        return "the CuTe kernel needs the inputs on a CUDA GPU"
    return lacks_cute_dsl(caps)


def runs_anywhere(caps: Capabilities, on_cuda: bool) -> str | None:
    """Paths built on PyTorch alone run on every device."""
    return None


def needs_fp4_gemm(caps: Capabilities, on_cuda: bool) -> str | None:
    """Why torch._scaled_mm cannot run on cuBLAS here (None: it can): it needs its FP4 GEMM, inputs on the GPU."""
    return lacks_fp4_gemm(caps) if on_cuda else "cuBLAS's FP4 GEMM needs the inputs on a CUDA GPU"


def functional_unavailable(caps: Capabilities, on_cuda: bool) -> str | None:
    return functional_unavailable_reason()


def fp4_gemm_emulated(caps: Capabilities) -> str | None:
    """Said of the torch._scaled_mm paths where cuBLAS has no FP4 GEMM: they run as its emulation."""
    if caps.fp4_gemm:
        return None
    return "FP4 torch._scaled_mm needs Blackwell (sm_100+); here it runs as its emulation (fp32 sums, like cuBLAS)"


# ---------------------------------------------------------------------------------------------
# How paths are built


def _cute_fast() -> Callable:
    """The per-K kernels of `cute.gemv.default_config`, those of the benchmark K compiled now."""
    from nvfp4lib.cute.gemv import PER_K_DEFAULTS, CuteRunner, default_config  # the DSL may be absent

    return CuteRunner(default_config, tuple(PER_K_DEFAULTS))


def _cute_fast_unchecked() -> Callable:
    """`_cute_fast`'s kernels called with nothing checked (`cute.gemv.CuteLaunch`): a standalone file's."""
    from nvfp4lib.cute.gemv import PER_K_DEFAULTS, CuteLaunch, default_config

    return CuteLaunch(default_config, tuple(PER_K_DEFAULTS))


def _cute_naive() -> Callable:
    from nvfp4lib.cute.gemv import CuteRunner, NaiveConfig

    return CuteRunner(NaiveConfig())


def _scaled_mm_permuted() -> Callable:
    """A named builder (not a lambda): the exported files inline it, as they inline `_cute_fast`."""
    return gemv_scaled_mm_permuted


def _scaled_mm_cublas() -> Callable:
    """`_scaled_mm_permuted` on cuBLAS alone (`IN_A_FILE`)."""
    return gemv_cublas_permuted


def _exact() -> Callable:
    """`fallback.exact_gemv`, an exported file's last resort (`IN_A_FILE`)."""
    return exact_gemv


def _reference_into_c(data):
    """The exact reference, rounded to fp16 and written into c (slow; a yardstick)."""
    exact = reference_gemv(data)  # validates data
    return data[6].copy_(exact)


def _scaled_mm_streams() -> Callable:
    def run(data):
        return run_batches(gemv_scaled_mm_permuted, data, shared_pool(first_tensor(data).device,
                                                                      SCALED_MM_POOL_STREAMS))

    return run


@dataclass(frozen=True)
class GemvPath:
    """One way to compute the GEMV: ``path.build()`` gives ``fn(data) -> c`` (writes data's c)."""

    name: str
    label: str  # short, for tables and figure legends
    summary: str  # one line: what it does
    build: Callable[[], Callable]  # called once per process: may compile kernels, make streams
    unavailable: Callable[[Capabilities, bool], str | None] = runs_anywhere  # why not here, or None
    kind: str = "nvfp4lib"  # "nvfp4lib" (ours), "yardstick", or "peer" (what a user would run instead)
    exportable: bool = False  # `python -m nvfp4lib.leaderboard.export --path NAME` writes it as one file
    emulated: Callable[[Capabilities], str | None] | None = None  # says when it runs as an emulation here
    describe: Callable | None = None  # data -> a note for the benchmark's CSV (e.g. a fallback taken)
    timed_call: Callable | None = None  # data -> the zero-argument call a benchmark times, after untimed
    # preparation a user would do once (None: the built callable on data, prepared by nothing; peers use it)
    unchecked: Callable[[], Callable] | None = None  # its kernel alone, no input validation (export --standalone)

    def why_not_timed(self, caps: Capabilities, on_cuda: bool) -> str | None:
        """Why a benchmark leaves this path out here: it cannot run, or it would time an emulation."""
        return self.unavailable(caps, on_cuda) or (self.emulated(caps) if self.emulated else None)


PATHS: dict[str, GemvPath] = {p.name: p for p in (
    GemvPath("cute_fast", "CuTe fast", "CuTe DSL per-K kernel: one kernel compiled per K, a few rows per block "
             "with the whole of their K, every load in flight before the first block sum; all L batches in one "
             "launch", _cute_fast, cute_unavailable, exportable=True, unchecked=_cute_fast_unchecked),
    GemvPath("cute_naive", "CuTe naive", "CuTe DSL naive kernel: one thread per row",
             _cute_naive, cute_unavailable, exportable=True),
    GemvPath("cute_fast_graph", "CuTe fast, graph", "the CuTe fast kernel replayed from a CUDA graph "
             "(captured per set of tensors)", lambda: GraphedGemv(_cute_fast()), cute_unavailable),
    GemvPath("scaled_mm_reference", "_scaled_mm reference", "torch._scaled_mm per batch, as the leaderboard's "
             "reference: plain scales converted every call", lambda: gemv_scaled_mm_reference,
             exportable=True, emulated=fp4_gemm_emulated),
    GemvPath("scaled_mm_permuted", "_scaled_mm permuted", "torch._scaled_mm per batch on views of the permuted "
             "scales, which already are the blocked buffers (cuBLAS FP4 GEMM on Blackwell, elsewhere its "
             "emulation: exact products summed in fp32, like cuBLAS)", _scaled_mm_permuted, exportable=True,
             emulated=fp4_gemm_emulated),
    GemvPath("scaled_mm_transposed", "_scaled_mm transposed", "torch._scaled_mm as B @ A.T, scales converted "
             f"for all batches at once, batches on {TRANSPOSED_STREAMS} CUDA streams",
             lambda: functools.partial(gemv_scaled_mm_transposed, streams=TRANSPOSED_STREAMS),
             exportable=True, emulated=fp4_gemm_emulated),
    GemvPath("scaled_mm_functional", "_scaled_mm functional", "the permuted path through the public "
             "torch.nn.functional.scaled_mm, recipe named", lambda: gemv_scaled_mm_functional,
             functional_unavailable, emulated=fp4_gemm_emulated),
    GemvPath("scaled_mm_streams", "_scaled_mm permuted, streams", f"the permuted path with batches spread over "
             f"{SCALED_MM_POOL_STREAMS} CUDA streams", _scaled_mm_streams, emulated=fp4_gemm_emulated),
    GemvPath("scaled_mm_graph", "_scaled_mm permuted, graph", "the permuted path replayed from a CUDA graph "
             "(captured per set of tensors)", lambda: GraphedGemv(gemv_scaled_mm_permuted),
             emulated=fp4_gemm_emulated),
    GemvPath("reference", "exact reference", "the exact integer reference, rounded to fp16 (slow)",
             lambda: _reference_into_c, kind="yardstick"),
)}
"""The package's paths, by name (the peers are in nvfp4lib.bench.peers)."""

FALLBACK_ORDER = ("cute_fast", "scaled_mm_permuted")
"""The paths tried in order where nothing is forced or measured, by the dispatcher and the exported
files alike (`fallback.first_working`). "scaled_mm_permuted" runs everywhere (cuBLAS FP4 on Blackwell,
its emulation elsewhere), so it is last. Both sum in fp32; only the path "reference" is exact."""


FILE_FALLBACK_ORDER = FALLBACK_ORDER + ("exact",)
"""The paths an exported file tries after its own: `FALLBACK_ORDER`, then "exact", which runs anywhere."""
IN_A_FILE = {"scaled_mm_permuted": (needs_fp4_gemm, _scaled_mm_cublas), "exact": (runs_anywhere, _exact)}
"""(unavailable, build) of the paths an exported file runs otherwise than `PATHS` does: torch._scaled_mm on cuBLAS
alone, since a submission runs no emulation, and "exact", the dequantize-and-matmul its self-check compares with
(the dispatcher ends with the emulation instead)."""


def check_name(name: str, source: str) -> str:
    """`name` if it is a path, else an error that names `source` and lists the paths."""
    if name not in PATHS:
        raise ValueError(f"{source}: unknown path {name!r}; expected one of {', '.join(PATHS)}")
    return name


def fallback_paths(caps: Capabilities, on_cuda: bool, after: str | None = None) -> list[str]:
    """The paths of FALLBACK_ORDER that can run here, best first; with `after`, only those behind it."""
    order = FALLBACK_ORDER[FALLBACK_ORDER.index(after) + 1:] if after is not None else FALLBACK_ORDER
    return [name for name in order if PATHS[name].unavailable(caps, on_cuda) is None]
