"""nvfp4lib: batched NVFP4 GEMV, from the number format up to the kernels.

``import nvfp4lib`` registers the GEMV as the PyTorch op ``torch.ops.nvfp4lib.gemv`` (`nvfp4lib.ops`;
``nvfp4lib.gemv`` is its Python entry point), as a torch extension package does. That import loads
PyTorch and the package's core modules only: it never touches the GPU or the CuTe DSL, which load
when a kernel is first built. Everything else is imported explicitly (``from nvfp4lib.formats import ...``).
"""

from nvfp4lib.version import __version__
from nvfp4lib.ops import gemv  # registers torch.ops.nvfp4lib.gemv

__all__ = ["__version__", "gemv"]
