"""Turn the hardware markers into skips that say why (markers are declared in pyproject.toml).

A test marked `gpu`, `sm100` or `cute` is skipped, with the reason shown by `-ra`, when this machine
cannot run it; the probe is nvfp4lib.device.capabilities(), so there is one notion of what a machine can do.
Also one shared fixture, `clean_dispatch`: the dispatcher as a fresh process finds it.
"""

import pytest


def _missing(caps):
    """Reason to skip, per marker, on this machine (None: the marker's need is met)."""
    return {
        "gpu": None if caps.cuda else "needs a CUDA GPU",
        "sm100": None if caps.fp4_gemm else (f"needs Blackwell FP4 GEMM ({caps.fp4_gemm_reason}); "
                                             f"this machine: {caps.summary()}"),
        "cute": None if caps.cute_dsl else "needs the CuTe DSL: pip install -e '.[cute]'",
    }


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if any(item.get_closest_marker(m) for m in ("gpu", "sm100", "cute"))]
    if not marked:
        return
    from nvfp4lib.device import capabilities

    reasons = _missing(capabilities())
    for item in marked:
        reason = next((r for m, r in reasons.items() if r and item.get_closest_marker(m)), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def clean_dispatch(monkeypatch):
    """dispatch.DISPATCHER (behind custom_kernel) as a fresh process finds it: no NVFP4_PATH or
    NVFP4_CHECK_SCALES, no table."""
    from nvfp4lib import dispatch

    monkeypatch.delenv(dispatch.PATH_ENV_VAR, raising=False)
    monkeypatch.delenv(dispatch.CHECK_SCALES_ENV_VAR, raising=False)
    dispatch.set_table(None)
    yield
    dispatch.set_table(None)
