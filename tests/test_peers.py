"""The peers compute the same GEMV as the reference, on full-range data, writing every element of c."""

import pytest
import torch

from nvfp4lib.bench import peers
from nvfp4lib.contract import Shape
from nvfp4lib.formats import NVFP4Tensor, dequantize_nvfp4
from nvfp4lib.paths import PATHS
from nvfp4lib.problem import bytes_moved, generate_input
from nvfp4lib.reference import check, poison_

SHAPES = [Shape(128, 256, 1), Shape(256, 1536, 2), Shape(384, 512, 3)]


def _bf16(data):
    return peers.bf16_gemv(peers.prepare_bf16_weights(data), data)


@pytest.mark.parametrize("mode", ["full", "leaderboard"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("peer", [peers.eager_dequant_matmul, _bf16, peers.bf16_gemv_dequantizing],
                         ids=["eager", "bf16", "bf16-dequantizing"])
def test_peer_matches_reference(peer, shape, mode):
    data = generate_input(*shape, seed=sum(shape), mode=mode)
    c = poison_(data[6])
    out = peer(data)
    assert out is c, "a peer writes into the c it is given and returns it"
    result = check(out, data)
    assert result.ok, result.message


def test_bf16_weights_are_exact_and_four_times_the_bytes():
    shape = Shape(256, 1024, 2)
    data = generate_input(*shape, seed=3)
    prepared = peers.prepare_bf16_weights(data)
    assert prepared.weights.dtype == prepared.vector.dtype == torch.bfloat16
    assert tuple(prepared.weights.shape) == (2, 256, 1024) and tuple(prepared.vector.shape) == (2, 1024, 1)
    a, sfa = data[0], data[2]
    want = dequantize_nvfp4(NVFP4Tensor(a[:, :, 1], sfa[:, :, 1], 1.0))
    assert torch.equal(prepared.weights[1].float(), want), "every E2M1 x E4M3 product fits bf16 exactly"
    assert 3.5 < prepared.nbytes / bytes_moved(shape) < 4.0  # 16 bits per weight against 4.5


@pytest.mark.slow  # compiling on a CPU takes C++ compiler time
def test_compiled_matches_reference():
    for shape in (Shape(128, 256, 1), Shape(256, 512, 2)):
        data = generate_input(*shape, seed=7)
        c = poison_(data[6])
        assert peers.compiled_dequant_reduce(data) is c
        result = check(c, data)
        assert result.ok, result.message
    assert peers._compiled is not None, "the compiled function is built once and kept"


def test_compiled_falls_back_to_eager_on_cpu_with_a_note(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(peers, "compile_note", None)
    monkeypatch.setattr(peers, "_compiled_fn", lambda: broken)
    data = generate_input(128, 512, 2, seed=5)
    poison_(data[6])
    with pytest.warns(RuntimeWarning, match="running eagerly"):
        out = peers.compiled_dequant_reduce(data)
    assert "RuntimeError" in peers.compile_note
    result = check(out, data)
    assert result.ok, result.message
    poison_(data[6])
    assert check(peers.compiled_dequant_reduce(data), data).ok  # later calls: eager, no new warning


def test_peers_are_registered_in_the_bench_wing_not_in_the_core():
    """The peers are paths of kind "peer", each with a label and a summary, built from this module and
    registered here: the core's registry (what the dispatcher runs) holds only the package's paths."""
    registered = peers.PEERS
    assert {"peer_eager", "peer_compiled", "peer_bf16", "triton_nvfp4"} <= set(registered)
    assert all(path.kind == "peer" and path.label and path.summary for path in registered.values())
    assert not set(registered) & set(PATHS) and all(path.kind != "peer" for path in PATHS.values())
    assert list(peers.all_paths()) == list(PATHS) + list(registered)
    assert registered["peer_eager"].build() is peers.eager_dequant_matmul
    assert registered["peer_compiled"].build() is peers.compiled_dequant_reduce
    assert registered["peer_bf16"].build() is peers.bf16_gemv_dequantizing


def test_bf16_benchmark_call_dequantizes_once_outside_the_timed_call(monkeypatch):
    """The timed call of peer_bf16 reads weights prepared before it: calling it prepares nothing."""
    data = generate_input(128, 256, 2, seed=11)
    prepared = []
    real = peers.prepare_bf16_weights
    monkeypatch.setattr(peers, "prepare_bf16_weights", lambda d: prepared.append(1) or real(d))
    call = peers.PEERS["peer_bf16"].timed_call(data)
    assert len(prepared) == 1
    for _ in range(2):
        c = poison_(data[6])
        assert call() is c
        result = check(c, data)
        assert result.ok, result.message
    assert len(prepared) == 1


def test_a_peer_validates_a_set_of_tensors_once(monkeypatch):
    """Validation is remembered per set of tensors (a TupleCache), not repeated by every timed call."""
    seen = []
    real = peers.validate_gemv_input
    monkeypatch.setattr(peers, "validate_gemv_input", lambda data, **kw: seen.append(1) or real(data, **kw))
    data = generate_input(128, 256, 2, seed=21)
    for _ in range(3):
        assert check(peers.eager_dequant_matmul(data), data).ok
    assert len(seen) == 1
    peers.eager_dequant_matmul(generate_input(128, 256, 2, seed=22))
    assert len(seen) == 2
