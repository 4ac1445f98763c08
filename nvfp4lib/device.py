"""What this machine can run, found by probing (never by guessing from a GPU name).

Notebooks and tests branch on these facts: the real FP4 GEMM only exists on sm_100+, hardware E2M1 conversion
likewise, and the CuTe DSL may or may not be installed."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
import subprocess
import sys
from dataclasses import dataclass

import torch

from nvfp4lib.messages import describe_error
from nvfp4lib.version import __version__  # the package's, for environment_report


@dataclass(frozen=True)
class Capabilities:
    cuda: bool
    name: str
    sm: tuple[int, int] | None
    fp4_gemm: bool
    cute_dsl: bool
    cute_dsl_version: str | None
    hw_e2m1: bool
    cute_arch: str | None
    fp4_gemm_reason: str | None = None  # why fp4_gemm is False (the probe's exception, if it ran)

    def summary(self) -> str:
        gpu = f"{self.name} (sm_{self.sm[0]}{self.sm[1]})" if self.cuda else "no CUDA GPU (CPU only)"
        dsl = f"CuTe DSL {self.cute_dsl_version}" if self.cute_dsl else "no CuTe DSL"
        return (f"{gpu}; FP4 GEMM: {'yes' if self.fp4_gemm else 'no'}; "
                f"hardware E2M1: {'yes' if self.hw_e2m1 else 'no'}; {dsl}")


def _fp4_gemm_reason(cuda: bool, sm: tuple[int, int] | None) -> str | None:
    """Why this machine has no FP4 GEMM (None: it has one). Where it could, one tiny FP4 torch._scaled_mm is run:
    cuBLAS refuses it below sm_100; on sm_100 a PyTorch build without FP4 cuBLAS fails here too, and the exception
    is kept so that whoever skips or falls back can say why."""
    if not cuda:
        return "no CUDA GPU"
    if sm[0] < 10:
        return f"sm_{sm[0]}{sm[1]}: FP4 GEMM needs sm_100 or newer"
    try:
        a = torch.zeros(128, 32, dtype=torch.uint8, device="cuda").view(torch.float4_e2m1fn_x2)  # A, and B as a.t()
        scale = torch.ones(128 * 4, device="cuda").to(torch.float8_e4m3fn)  # one 128x4 tile (K = 64)
        torch._scaled_mm(a, a.t(), scale, scale, out_dtype=torch.float16)
        torch.cuda.synchronize()
        return None
    except Exception as err:  # noqa: BLE001 - any failure means "not usable here"; the reason is kept
        return f"the FP4 torch._scaled_mm probe raised {describe_error(err, 400)}"


MIN_CUTE_DSL = (4, 3, 4)
"""The oldest CuTe DSL release the kernels are built and checked with (`make dsl-matrix`: 4.3.4-4.8): 4.2 has no
``cute.runtime.make_fake_stream`` to compile without a GPU, 4.3.0 no ``--dump-dir`` to keep the PTX."""


def installed_cute_dsl_version(cutlass) -> str:
    """The version of the imported ``cutlass`` module: its ``__version__``, which 4.3 lacks, else the installed
    distribution's."""
    version = getattr(cutlass, "__version__", None)
    if version:
        return str(version)
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cute_dsl_version_problem(version: str) -> str | None:
    """Why a CuTe DSL of this version cannot build the kernels (None: it can, or it has no number:
    a source build, which compiling will judge)."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if found and found < MIN_CUTE_DSL:
        oldest = ".".join(map(str, MIN_CUTE_DSL))
        return (f"nvidia-cutlass-dsl {version} is older than the oldest release these kernels are built and checked "
                f"with ({oldest}); pip install 'nvidia-cutlass-dsl>={oldest}'")
    return None


def tvm_ffi_problem() -> str | None:
    """Why the CuTe kernels are called through the DSL's plain call path rather than TVM-FFI (None: TVM-FFI): both
    the DSL release's compile option and the apache-tvm-ffi package are needed. Probed at each call, not cached."""
    try:
        from cutlass.base_dsl.compiler import EnableTVMFFI  # noqa: F401 - the option's presence is the probe
    except ImportError:
        return "this CuTe DSL release has no TVM-FFI compile option"
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return "apache-tvm-ffi is not installed"
    return None


def _probe_cute_dsl() -> str | None:
    """The installed CuTe DSL's version, where it is new enough for the kernels (else None)."""
    try:
        import cutlass
    except ImportError:
        return None
    version = installed_cute_dsl_version(cutlass)
    return None if cute_dsl_version_problem(version) else version


def cute_arch(sm: tuple[int, int] | None = None) -> str | None:
    """The CuTe DSL target of compute capability `sm`, by default this GPU's ("sm_100a", "sm_90a", else "sm_XY";
    None without a GPU): what a kernel compiles for, found without the probes of `capabilities`."""
    sm = sm or (tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None)
    return None if sm is None else {(10, 0): "sm_100a", (9, 0): "sm_90a"}.get(sm, f"sm_{sm[0]}{sm[1]}")


@functools.cache
def capabilities() -> Capabilities:
    cuda = torch.cuda.is_available()
    sm = tuple(torch.cuda.get_device_capability()) if cuda else None
    name = torch.cuda.get_device_name() if cuda else "cpu"
    version = _probe_cute_dsl()
    fp4_reason = _fp4_gemm_reason(cuda, sm)
    return Capabilities(cuda=cuda, name=name, sm=sm, fp4_gemm=fp4_reason is None, cute_dsl=version is not None,
                        cute_dsl_version=version, hw_e2m1=bool(sm and sm[0] >= 10), cute_arch=cute_arch(sm),
                        fp4_gemm_reason=fp4_reason)


NO_CUDA = "needs a CUDA GPU"


def lacks_cuda(caps: Capabilities) -> str | None:
    """Why there is no GPU to run on (None: there is)."""
    return None if caps.cuda else NO_CUDA


def lacks_cute_dsl(caps: Capabilities) -> str | None:
    """Why the CuTe kernels cannot be built here (None: they can): no CuTe DSL, or one older than MIN_CUTE_DSL."""
    return None if caps.cute_dsl else (f"needs the CuTe DSL (nvidia-cutlass-dsl {'.'.join(map(str, MIN_CUTE_DSL))} "
                                       "or newer): pip install -e '.[cute]'")


def lacks_fp4_gemm(caps: Capabilities) -> str | None:
    """Why cuBLAS's FP4 GEMM cannot run here (None: it can), with the probe's reason and the machine."""
    return None if caps.fp4_gemm else (f"needs Blackwell FP4 GEMM ({caps.fp4_gemm_reason}); "
                                       f"this machine: {caps.summary()}")


NEEDS = {"cuda": lacks_cuda, "cute_dsl": lacks_cute_dsl, "fp4_gemm": lacks_fp4_gemm}
"""What a piece of code can need of a machine -> why `Capabilities` say it is missing (None: present): `missing`
asks them; a path asks its one need's function (an exported file then carries no other)."""


def missing(caps: Capabilities, *needs: str) -> str | None:
    """Why a machine with `caps` cannot run what needs all of `needs` (keys of NEEDS): the reason of
    the first one missing, or None. The one answer to "why can't this run here": the peers, the
    streaming reads and the test markers ask it, the paths the one need's function of NEEDS."""
    for need in needs:
        if need not in NEEDS:
            raise ValueError(f"need: expected one of {tuple(NEEDS)}, got {need!r}")
        reason = NEEDS[need](caps)
        if reason is not None:
            return reason
    return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def environment_report() -> dict:
    """Versions and hardware that a result depends on, for the top of every notebook."""
    caps = capabilities()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "driver": _driver_version() if caps.cuda else None,
        "gpu": caps.name if caps.cuda else None,
        "sm": f"{caps.sm[0]}.{caps.sm[1]}" if caps.sm else None,
        "fp4_gemm": caps.fp4_gemm,
        "cute_dsl": caps.cute_dsl_version,
        "cute_arch": caps.cute_arch,
        "cute_calls": (("TVM-FFI" if (why := tvm_ffi_problem()) is None else f"plain call path ({why})")
                       if caps.cute_dsl else None),
        "nvfp4lib": __version__,
    }


def print_environment() -> None:
    for key, value in environment_report().items():
        print(f"{key:>13}: {value}")
    print(f"{'summary':>13}: {capabilities().summary()}")
