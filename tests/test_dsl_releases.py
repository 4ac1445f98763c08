"""The default CuTe kernels under other CuTe DSL releases than the installed one.

Each release that `tools/dsl_matrix.py` installed into build/dsl/<release> (CI installs the oldest supported and
the newest; `make dsl-matrix` every minor release) compiles the default kernels in a process of its own, for
sm_90a and sm_100a, at a benchmark K and at a K the leaderboard tests. Each must compile and carry exactly the
work instructions (`study.ptx_reading.work_counts`: memory accesses, conversions, lookups, products, math,
reduction shuffles) that the installed release gives the same kernel.
"""

from __future__ import annotations

import pytest

from nvfp4lib.cute import gemv
from nvfp4lib.cute.ptx import DSL_PROBLEM
from nvfp4lib.device import MIN_CUTE_DSL, cute_dsl_version_problem
from nvfp4lib.study.ptx_reading import work_counts
from tools import dsl_matrix

KS = (2048, 4096)
INSTALLED = sorted(p.parent for p in (dsl_matrix.ROOT / "build" / "dsl").glob("*/.complete"))


@pytest.fixture(scope="module")
def installed_work():
    if DSL_PROBLEM is not None:
        pytest.skip(DSL_PROBLEM)
    return {(arch, k): work_counts(gemv.compile_ptx("fast", arch, gemv.default_config(k), k=k))
            for arch in dsl_matrix.ARCHS for k in KS}


@pytest.mark.cute
@pytest.mark.skipif(not INSTALLED, reason="no other CuTe DSL release installed: python tools/dsl_matrix.py "
                                          "--releases 4.3.4,4.8.1 --install-only (as .ci/run does)")
@pytest.mark.parametrize("folder", INSTALLED, ids=[p.name for p in INSTALLED])
def test_release_builds_the_same_work_instructions(folder, installed_work):
    result = dsl_matrix.run_release(folder, KS, dsl_matrix.ARCHS, timeout=600)
    assert "failed" not in result, result
    assert result["release"] == folder.name
    for row in result["rows"]:
        assert "error" not in row, row
        assert row["work"] == installed_work[row["arch"], row["k"]], (row["arch"], row["k"])
        assert row["frame_bytes"] == 0, row  # no spills, no local arrays


def test_version_gate_names_the_oldest_release():
    oldest = ".".join(map(str, MIN_CUTE_DSL))
    assert cute_dsl_version_problem(oldest) is None and cute_dsl_version_problem("4.8.1") is None
    problem = cute_dsl_version_problem("4.3.0")
    assert problem is not None and oldest in problem and "4.3.0" in problem
    assert cute_dsl_version_problem("4.2.1") is not None
