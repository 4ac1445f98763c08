"""The CuTe modules without the DSL, and the decode's constants against the format they encode.

The arithmetic of the decodes is checked bit for bit through its models (tests/test_decode_models.py),
which share these constants; the kernels' PTX in tests/test_cute.py."""

import subprocess
import sys
import textwrap

import numpy as np

from nvfp4lib.cute import constants
from nvfp4lib.formats import E2M1_VALUES


def test_cute_modules_import_without_the_dsl():
    """With `cutlass` unimportable, the CuTe modules still import, and compiling says why it cannot."""
    script = textwrap.dedent("""
        import sys
        sys.modules["cutlass"] = None  # any import of the DSL now raises ImportError
        from nvfp4lib.bench import cute_bench
        from nvfp4lib.cute import decode as cute_decode
        from nvfp4lib.cute import gemv as cute_gemv
        from nvfp4lib.cute import ptx as cute_ptx
        from nvfp4lib.study import decode_models
        assert cute_ptx.cute is None and cute_gemv.cute is None
        assert cute_ptx.DSL_PROBLEM.startswith("the CuTe DSL could not be imported (ModuleNotFoundError"), \\
            cute_ptx.DSL_PROBLEM
        try:
            cute_gemv.compile_ptx("fast", "sm_100a", k=2048)
        except RuntimeError as err:
            assert "could not be imported" in str(err)
        else:
            raise AssertionError("compiled without the DSL")
        print("imported")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stdout + proc.stderr


def test_lookup_table_holds_twice_each_magnitude():
    table = [(constants.LUT_LO | constants.LUT_HI << 32) >> (8 * i) & 0xFF for i in range(8)]
    assert table == [2 * v for v in E2M1_VALUES[:8]] == [0, 1, 2, 3, 4, 6, 8, 12]
    assert all(byte < 0x80 for byte in table)  # so prmt's sign-replicate flag yields 0 for negative codes


def test_constants_say_what_their_names_say():
    assert constants.SIGN_BITS == sum(8 << (4 * i) for i in range(8))  # bit 3 of every code of a word
    two14 = np.float16(2.0**14).view(np.uint16)
    assert constants.FP16X2_2_POW_14 == int(two14) | int(two14) << 16
    # the bit trick decodes A to v * 2^-14 (B to v); the lookup decodes both to 2v
    assert constants.DECODE_FACTOR == {"hw": 1.0, "bitops": 2.0**14, "lut": 1 / (2 * 2)}
