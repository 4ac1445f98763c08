"""nvfp4lib: batched NVFP4 GEMV, from the number format up to the kernels.

Submodules are imported explicitly (``from nvfp4lib.formats import ...``) so that
importing the package stays cheap and never touches the GPU or the CuTe DSL.
The one exception, ``nvfp4lib.gemv`` (the GEMV as a PyTorch op), imports `nvfp4lib.ops`
when it is first read.
"""

from nvfp4lib.version import __version__


def __getattr__(name: str):
    if name == "gemv":
        from nvfp4lib.ops import gemv

        return gemv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), "gemv"])
