"""``option.cpu_linear=onednn``: prepacked oneDNN linear layers (engines/hf/cpu/linear.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402

from djl_handlers.engines.hf.cpu import linear as packed_linear  # noqa: E402
from djl_handlers.engines.hf.cpu.fused import FusedMember  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import PackedLinear, prepack_linears, unpack_linears  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN")


def _linear(dtype: Any, bias: bool = False, out: int = 96, inp: int = 80) -> Any:
    torch.manual_seed(0)
    return torch.nn.Linear(inp, out, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 80), (5, 80), (2, 3, 80), (1, 1, 80), (37, 80)])
def test_packed_linear_computes_the_linear_layer(dtype: Any, bias: bool, shape: tuple[int, ...]) -> None:
    layer = _linear(dtype, bias)
    x = torch.randn(*shape).to(dtype)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    got = PackedLinear(layer)(x)
    assert got.shape == expected.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize(("out", "inp"), [(96, 80), (80, 384), (576, 1536)])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(out: int, inp: int) -> None:
    """The exactness the engine relies on (fp32): a row's result does not depend on its batch."""
    packed = PackedLinear(_linear(torch.float32, out=out, inp=inp))
    x = torch.randn(70, inp)
    whole = packed(x)
    for rows in (1, 2, 3, 16, 33):
        assert torch.equal(packed(x[:rows]), whole[:rows])
    assert torch.equal(packed(x[5:6]), whole[5:6])
    assert torch.equal(packed(x[:6].view(2, 3, inp)), whole[:6].view(2, 3, out))


def test_in_place_weight_change_is_packed_again_and_other_dtypes_go_to_torch() -> None:
    layer = _linear(torch.float32)
    packed = PackedLinear(layer)
    x = torch.randn(4, 80)
    with torch.no_grad():
        layer.weight.mul_(2)
    assert torch.allclose(packed(x), torch.nn.functional.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="same dtype"):  # not the layer's dtype: torch's own linear decides
        packed(x.to(torch.float64))


def test_prepack_and_unpack_touch_plain_linear_layers_only() -> None:
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Custom(8, 8), torch.nn.Linear(8, 4).double())
    assert prepack_linears(model) == 1  # the subclass and the float64 layer keep their forward
    assert isinstance(model[0].forward, PackedLinear) and "forward" not in model[1].__dict__
    x = torch.randn(3, 8)
    assert torch.allclose(model[1](model[0](x)).double() @ torch.zeros(8, 1, dtype=torch.float64),
                          torch.zeros(3, 1, dtype=torch.float64))
    assert unpack_linears(model) == 1 and "forward" not in model[0].__dict__


@pytest.mark.parametrize("fixture", ["tiny_model", pytest.param("real_model", marks=pytest.mark.slow)])
def test_engine_with_packed_layers_equals_generate_alone(fixture: str, request: pytest.FixtureRequest) -> None:
    model, tok = request.getfixturevalue(fixture)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    assert prepack_linears(model) > 0
    try:
        got = engine_tokens(model, tok, prompts, news)
        assert [got[i][:n] for i, n in enumerate(news)] == generate_tokens(model, prompts, news)
    finally:
        unpack_linears(model)



@pytest.mark.parametrize(("value", "packed"), [(None, True), ("onednn", True), ("torch", False)])
def test_the_hf_engine_packs_by_default_on_the_cpu(tiny_dir: Any, value: str | None, packed: bool) -> None:
    from djl_handlers.config.models import ServingConfig

    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", **({"cpu_linear": value} if value else {})}
    engine = HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))
    layers = [m for m in engine.model.modules() if type(m) is torch.nn.Linear]
    # q/k/v and gate/up are fused by default (option.cpu_fuse_projections): a FusedMember over packed weights
    kinds = (PackedLinear, FusedMember)
    assert layers and all(isinstance(m.__dict__.get("forward"), kinds) == packed for m in layers)
