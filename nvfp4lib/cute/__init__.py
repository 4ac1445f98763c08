"""The CuTe DSL kernels: PTX instruction wrappers (`ptx`), the decode constants (`constants`), the
FP4/E4M3 decodes (`decode`) and the GEMV kernels with their host class (`gemv`). Part of the core."""
