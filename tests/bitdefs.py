"""The two number formats written from their bit definitions, independent of nvfp4lib.

Tests compare the package against these; they share nothing with the code under test. Rounding
is written here with exact fractions, so it is the definition, not another floating-point path.
"""

import math
from fractions import Fraction

import numpy as np


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


def nearest_index(value: Fraction, magnitudes) -> int:
    """Index of the magnitude (increasing, exact) nearest to |value|, a tie going to the even index
    (the code whose last mantissa bit is 0), saturating at the last one."""
    mag = min(abs(value), magnitudes[-1])
    return min(range(len(magnitudes)), key=lambda i: (abs(magnitudes[i] - mag), i % 2))


E2M1_MAGNITUDES = [Fraction(e2m1_value(c)) for c in range(8)]
E4M3_MAGNITUDES = [Fraction(e4m3_value(b)) for b in range(0x7F)]  # 0x7F is NaN


def round_to_float32(value: Fraction) -> float:
    """The float32 nearest to an exact value (ties to the even bit pattern), as a Python float."""
    guess = np.float32(float(value))  # float() rounds once; the cast to float32 may then be one off
    neighbours = (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf)))
    best = min(neighbours, key=lambda f: (abs(Fraction(float(f)) - value), int(np.float32(f).view(np.int32)) & 1))
    return float(best)
