"""The constants of the CuTe kernels' FP4 decodes: plain integers and floats, no DSL needed.

The kernels trace them (`nvfp4lib.cute.decode`); the bit-exact numpy models of the decodes
(`nvfp4lib.study.decode_models`) import them from here, so a model always checks the numbers the kernels use.
"""

FP16X2_2_POW_14 = 0x74007400  # half2(16384, 16384): brings bit-trick values back to their true size
LUT_LO, LUT_HI = 0x03020100, 0x0C080604  # the lookup table: twice each E2M1 magnitude, 0, 1, 2, 3, 4, 6, 8, 12
SIGN_BITS = 0x88888888  # the sign bit of each of the 8 codes of a word
DECODE_FACTOR = {"hw": 1.0, "bitops": 16384.0, "lut": 0.25}
"""What a block sum is multiplied by to be the true dot product: the bit trick decodes A to its value
times 2^-14; the lookup decodes A and B to twice their values."""
