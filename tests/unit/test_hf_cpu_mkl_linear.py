"""fp32 linear layers on MKL's packed sgemm (engines/hf/cpu/mkl_linear.py, ``option.cpu_linear=auto``/``mkl``).

These run again at the AVX2 level (tests/unit/test_cpu_isa.py caps MKL with ``MKL_ENABLE_INSTRUCTIONS``),
where MKL sums a 2- or 3-row remainder in another order and the row block must be found.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402

from djl_handlers.engines.hf.cpu import isa, mkl_linear  # noqa: E402
from djl_handlers.engines.hf.cpu import linear as packed_linear  # noqa: E402
from djl_handlers.engines.hf.cpu.fused import fuse_projections, unfuse_projections  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import PackedLinear, prepack_linears, unpack_linears  # noqa: E402
from djl_handlers.engines.hf.cpu.mkl_linear import MklPacked  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(not (mkl_linear.available() and packed_linear.available()),
                                reason="this torch has no MKL packed sgemm or no oneDNN")


def _weight(out: int, inp: int, seed: int = 0) -> Any:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 80), (5, 80), (2, 3, 80), (1, 1, 80), (37, 80), (0, 80)])
def test_the_packed_weight_computes_the_linear_layer(bias: bool, shape: tuple[int, ...]) -> None:
    weight, b = _weight(96, 80), (torch.randn(96) if bias else None)
    packed = MklPacked(weight, quantum=4)  # the values hold whatever the row block
    x = torch.randn(*shape)
    got = packed(x, b)
    expected = torch.nn.functional.linear(x, weight, b)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4)


# the embedded model's projections (q/k/v fused, o, gate/up fused, down) and a wider LM-head-like one
@pytest.mark.parametrize(("out", "inp"), [(96, 80), (960, 576), (576, 576), (3072, 576), (576, 1536), (8192, 576)])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(out: int, inp: int) -> None:
    """The exactness the engine relies on, with the row block :func:`row_quantum` found here (at the
    AVX2 level MKL splits the rows of small shapes between threads: those stay on oneDNN)."""
    packed = mkl_linear.pack(_weight(out, inp))
    if packed is None:
        pytest.skip("no row block keeps MKL's rows exact for this shape here: oneDNN runs it")
    x = torch.randn(70, inp)
    whole = packed(x, None)
    for rows in (*range(1, 12), 15, 16, 17, 31, 33, 69):
        assert torch.equal(packed(x[:rows], None), whole[:rows]), rows
    assert torch.equal(packed(x[5:6], None), whole[5:6])
    assert torch.equal(packed(x[:6].view(2, 3, inp), None), whole[:6].view(2, 3, out))
    unaligned = torch.empty(70 * inp + 1)[1:].view(70, inp)  # a view not on a 64-byte boundary
    unaligned.copy_(x)
    assert torch.equal(packed(unaligned[:7], None), whole[:7])


def test_the_row_block_is_found_by_checking_and_padding_reaches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    packed = MklPacked(_weight(64, 48))
    quantum = mkl_linear.row_quantum(packed)
    assert quantum is None or quantum in mkl_linear.QUANTA  # None: this shape stays on oneDNN here
    calls: list[int] = []
    real = torch.ops.mkl._mkl_linear

    class Ops:
        @staticmethod
        def _mkl_linear(x: Any, *args: Any) -> Any:
            calls.append(int(x.shape[0]))
            return real(x, *args)

    monkeypatch.setattr(torch.ops, "mkl", Ops)
    packed.quantum = 4
    assert packed(torch.randn(5, 48), None).shape == (5, 64)
    assert calls == [8]  # 5 rows run as 8: the last row repeated


def test_a_fused_weight_gives_each_members_columns_the_bits_of_its_own_gemm() -> None:
    """q/k/v (and gate/up) as one GEMM over the concatenated weight: each member's columns equal its
    own GEMM's bits, so fusing changes no value (the embedded model's shapes)."""
    members = [_weight(576, 576, 1), _weight(192, 576, 2), _weight(192, 576, 3)]
    parts = [mkl_linear.pack(w) for w in members]
    whole = mkl_linear.pack(torch.cat(members))
    if whole is None or any(p is None for p in parts):
        pytest.skip("MKL cannot run these shapes row-exactly here: oneDNN runs them")
    x = torch.randn(33, 576)
    got = whole(x, None).split([576, 192, 192], dim=-1)
    for part, column in zip(parts, got, strict=True):
        assert torch.equal(part(x, None), column)  # type: ignore[misc]


def test_a_shape_no_row_block_keeps_exact_stays_on_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight(960, 576)
    natural = mkl_linear.pack(weight)
    monkeypatch.setattr(mkl_linear, "_quanta", {})
    monkeypatch.setattr(mkl_linear, "_find_quantum", lambda packed: None)
    assert mkl_linear.pack(weight) is None
    assert isinstance(packed_linear.reorder(weight, "mkl"), torch.Tensor)  # oneDNN's blocked tensor
    monkeypatch.undo()
    assert isinstance(packed_linear.reorder(weight, "mkl"), MklPacked if natural else torch.Tensor)
    assert isinstance(packed_linear.reorder(weight, "onednn"), torch.Tensor)


def test_the_library_choice_per_option_and_measured_speed() -> None:
    found = isa.features()
    assert isa.fp32_library("onednn", found) == isa.fp32_library("torch", found) == "onednn"
    assert isa.fp32_library("mkl", found) == "mkl"
    for speed, library in ((1.2, "mkl"), (isa.MKL_MIN_SPEED, "mkl"), (0.9, "onednn"), (None, "onednn")):
        assert isa.fp32_library("auto", dataclasses.replace(found, mkl_speed=speed)) == library
    report = found.describe()["fp32Gemm"]
    assert report == {"library": isa.fp32_library("auto", found), "mklSpeedVsOnednn": found.mkl_speed}


def test_the_speed_probe_times_both_libraries_on_this_machine() -> None:
    speed = mkl_linear.probe_speed()
    assert speed is not None and 0.05 < speed < 20


def test_a_16_bit_weight_widened_to_fp32_goes_to_mkl_and_native_16_bit_stays_on_onednn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    weight = _weight(960, 576).to(torch.bfloat16)
    monkeypatch.setattr(isa, "linear_path", lambda name, found=None: "fp32-over-bf16")
    widened = packed_linear.reorder(weight, "mkl")
    if mkl_linear.pack(weight.float()) is None:
        pytest.skip("MKL cannot run this shape row-exactly here")
    assert isinstance(widened, MklPacked)
    x = torch.randn(3, 576).to(torch.bfloat16)
    got = packed_linear.run_packed(x, widened, None)
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.float(), weight.float())
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=5e-2 * float(want.abs().max()))
    monkeypatch.setattr(isa, "linear_path", lambda name, found=None: "onednn-bf16")
    if isa.probe_onednn("bfloat16"):
        assert isinstance(packed_linear.reorder(weight, "mkl"), torch.Tensor)


@pytest.mark.parametrize("fixture", ["tiny_model", pytest.param("real_model", marks=pytest.mark.slow)])
def test_engine_on_mkl_layers_equals_generate_alone(fixture: str, request: pytest.FixtureRequest) -> None:
    model, tok = request.getfixturevalue(fixture)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    assert prepack_linears(model, "mkl") > 0
    assert fuse_projections(model, library="mkl") > 0
    try:
        on_mkl = packed_linear.libraries(model)["mkl"]
        got = engine_tokens(model, tok, prompts, news)
        assert [got[i][:n] for i, n in enumerate(news)] == generate_tokens(model, prompts, news)
    finally:
        unfuse_projections(model)
        unpack_linears(model)
    if not on_mkl:  # every shape failed the row check here: the run above was oneDNN's
        pytest.skip("no weight of this model runs row-exactly on MKL here")


@pytest.mark.parametrize("value", ["auto", "mkl", "onednn"])
def test_the_hf_engine_reports_the_library_of_its_packed_layers(tiny_dir: Any, value: str) -> None:
    from djl_handlers.config.models import ServingConfig

    # unfused, so that the report's count (taken before fusing) is the layers' count
    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "cpu_linear": value,
               "cpu_fuse_projections": "false"}
    engine = HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))
    layers = [m for m in engine.model.modules() if type(m) is torch.nn.Linear]
    assert layers and all(isinstance(m.__dict__.get("forward"), PackedLinear) for m in layers)
    counts = packed_linear.libraries(engine.model)
    assert sum(counts.values()) > 0
    if isa.fp32_library(value) == "onednn":
        assert counts["mkl"] == 0
    text = engine.cpu_patches["cpu_linear"]
    assert text.startswith("applied: ")
    for name, label in (("mkl", "MKL"), ("onednn", "oneDNN")):  # e.g. "(9 on MKL, 2 on oneDNN ...)"
        assert (f"{counts[name]} on {label}" in text) == (counts[name] > 0), text
