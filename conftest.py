"""Turn the hardware markers into skips that say why (markers are declared in pyproject.toml).

A test marked `gpu`, `sm100` or `cute` is skipped, with the reason shown by `-ra`, when this machine
cannot run it; the reason is nvfp4lib.device.missing's, so there is one notion of what a machine can do.
Also one shared fixture, `clean_dispatch`: the dispatcher as a fresh process finds it.
"""

import pytest


MARKER_NEEDS = {"gpu": "cuda", "sm100": "fp4_gemm", "cute": "cute_dsl"}  # marker -> a need of device.NEEDS


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if any(item.get_closest_marker(m) for m in MARKER_NEEDS)]
    if not marked:
        return
    from nvfp4lib.device import capabilities, missing

    reasons = {marker: missing(capabilities(), need) for marker, need in MARKER_NEEDS.items()}
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
