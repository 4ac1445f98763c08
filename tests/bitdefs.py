"""The two number formats written from their bit definitions, independent of nvfp4lib.

Tests compare the package against these; they share nothing with the code under test.
"""

import math


def e2m1_value(code: int) -> float:
    """E2M1: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = 0.5 * mantissa if exponent == 0 else 2.0 ** (exponent - 1) * (1 + 0.5 * mantissa)
    return math.copysign(magnitude, sign)


def e4m3_value(byte: int) -> float:
    """E4M3 (fn): sign bit 7, exponent bits 6..3 (bias 7), mantissa 2..0; S.1111.111 is NaN, no Inf."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 7
    if exponent == 0xF and mantissa == 7:
        return math.nan
    magnitude = mantissa / 8 * 2.0 ** -6 if exponent == 0 else 2.0 ** (exponent - 7) * (1 + mantissa / 8)
    return math.copysign(magnitude, sign)
