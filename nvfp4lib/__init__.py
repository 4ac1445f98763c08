"""nvfp4lib: batched NVFP4 GEMV, from the number format up to the kernels.

Submodules are imported explicitly (``from nvfp4lib.formats import ...``) so that
importing the package stays cheap and never touches the GPU or the CuTe DSL.
"""

__version__ = "0.1.0"
