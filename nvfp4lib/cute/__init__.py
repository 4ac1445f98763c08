"""The CuTe DSL kernels: PTX instruction wrappers (`ptx`), the decode constants (`constants`), the
FP4/E4M3 decodes (`decode`), compiling and launching (`launch`), the per-K kernels (`whole_k`) and the
naive kernel with the host classes (`gemv`). Part of the core."""
