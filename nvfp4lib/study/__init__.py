"""Teaching and verification models: bit-exact numpy models of the kernels' decodes, PTX
reading, quantization studies, and the generic CuTe kernels that led to the per-K one.

A wing: the core (nvfp4lib's top-level modules and nvfp4lib.cute) never imports it."""
