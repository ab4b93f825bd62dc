"""The HF engine on other architectures than the embedded Llama (random-weight models of
djl_handlers/model/architectures.py, small shapes): which CPU kernel patches apply to each and why
the others fall back, each applied patch's result bit for bit against the module's own code on the
inputs a real forward gives it, and fp32 greedy output through the engine equal to ``generate()``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402

from djl_handlers.config.hf import HuggingFaceOptions  # noqa: E402
from djl_handlers.engines.hf.cpu import fused, linear, patches, rotary  # noqa: E402
from djl_handlers.engines.hf.cpu.norm import FusedRMSNorm  # noqa: E402
from djl_handlers.engines.hf.kv_budget import bytes_per_token  # noqa: E402
from djl_handlers.kernels import decode_attention, rms_norm, silu_mul  # noqa: E402
from djl_handlers.kernels import rotary as rotary_kernel  # noqa: E402
from djl_handlers.model.architectures import SHAPES, build_model_dir  # noqa: E402

pytest_plugins = ["conftest_models"]
pytestmark = pytest.mark.skipif(
    not (linear.available() and rms_norm.available() and rotary_kernel.available() and silu_mul.available()
         and decode_attention.available()), reason="a CPU kernel cannot be used here")

SMALL = ("llama-tiny", "qwen2-tiny", "phi-tiny")
# What each architecture's layers allow: patches that apply, and the words of each fallback's reason.
FALLBACKS: dict[str, dict[str, str]] = {
    "llama-tiny": {},
    "qwen2-tiny": {},
    "phi-tiny": {"silu_mul": "no MLP with a gate_proj/up_proj pair (activation: NewGELUActivation)",
                 "cpu_norm": "no RMSNorm module (the model normalises with LayerNorm)"},
}
PROMPTS = ("Hello there", "The capital of France is a city that", "x",
           "One two three four five six seven eight nine ten eleven twelve")
NEWS = [7, 5, 9, 6]


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {name: build_model_dir(root / name, name, source=embedded_dir) for name in SMALL}


def _load(folder: Path, dtype: Any = None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(folder))


def test_the_shapes_are_the_architectures_they_name(arch_dirs: dict[str, Path]) -> None:
    classes = {"llama-tiny": "LlamaForCausalLM", "qwen2-tiny": "Qwen2ForCausalLM", "phi-tiny": "PhiForCausalLM"}
    for name, folder in arch_dirs.items():
        model, tok = _load(folder)
        assert type(model).__name__ == classes[name] and len(tok) == model.config.vocab_size
    qwen, _ = _load(arch_dirs["qwen2-tiny"])
    attn = qwen.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.o_proj.bias is None
    assert qwen.config.num_attention_heads // qwen.config.num_key_value_heads == 4  # Qwen2.5's head ratio
    phi, _ = _load(arch_dirs["phi-tiny"])
    assert isinstance(phi.model.layers[0].input_layernorm, torch.nn.LayerNorm)
    assert phi.config.rope_parameters["partial_rotary_factor"] == 0.5  # rotary over half of each head


def test_a_folder_is_rebuilt_only_when_its_settings_change(tmp_path: Path, embedded_dir: Path) -> None:
    folder = build_model_dir(tmp_path / "m", "qwen2-tiny", source=embedded_dir)
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_model_dir(tmp_path / "m", "qwen2-tiny", source=embedded_dir) == folder
    assert weights.stat().st_mtime_ns == stamp
    first = _load(folder)[0].model.embed_tokens.weight.clone()
    build_model_dir(tmp_path / "m", "qwen2-tiny", seed=1, source=embedded_dir)
    assert not torch.equal(_load(folder)[0].model.embed_tokens.weight, first)
    again = build_model_dir(tmp_path / "n", "qwen2-tiny", seed=0, source=embedded_dir)
    assert torch.equal(_load(again)[0].model.embed_tokens.weight, first)  # fixed seed: the same weights


@pytest.mark.parametrize("name", SMALL)
def test_the_report_says_which_patch_applied_and_why_the_others_fell_back(
        arch_dirs: dict[str, Path], name: str, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = _load(arch_dirs[name])
    with caplog.at_level(logging.INFO, logger=patches.__name__):
        report = patches.apply(model, HuggingFaceOptions())
    try:
        assert list(report) == list(patches.PATCHES)
        for patch, text in report.items():
            want = FALLBACKS[name].get(patch)
            assert text == patches.FELL_BACK + want if want else text.startswith("applied: "), (patch, text)
        lines = [r.getMessage() for r in caplog.records if r.name == patches.__name__]
        assert lines == [f"CPU patch {patch}: {report[patch]}" for patch in patches.PATCHES]  # one line each
    finally:
        patches.revert(model)


def test_options_that_switch_a_patch_off_are_reported_as_off(arch_dirs: dict[str, Path]) -> None:
    model, _ = _load(arch_dirs["qwen2-tiny"])
    report = patches.apply(model, HuggingFaceOptions(cpu_linear="torch", cpu_norm="torch", cpu_attention="sdpa"))
    try:
        assert report["cpu_linear"] == "off: option.cpu_linear=torch"
        assert report["cpu_fuse_projections"] == report["silu_mul"] == (
            "off: needs prepacked linear layers (option.cpu_linear=auto, mkl or onednn)")
        assert report["cpu_norm"] == "off: option.cpu_norm=torch"
        assert report["cpu_attention"] == "off: option.cpu_attention=sdpa"
        assert report["cpu_rotary"].startswith("applied: ")
    finally:
        patches.revert(model)


def _recorded(model: Any, ids: Any) -> tuple[dict[Any, list[Any]], list[tuple[Any, ...]]]:
    """The inputs every RMSNorm module and every rotary call see during one forward of the plain model."""
    norms: dict[Any, list[Any]] = {}
    calls: list[tuple[Any, ...]] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: norms.setdefault(mod, []).append(args[0].clone()))
             for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    owners = rotary.modeling_modules(model)
    originals = [owner.apply_rotary_pos_emb for owner in owners]

    def recording(original: Any) -> Any:
        def call(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((q.clone(), k.clone(), cos.clone(), sin.clone()))
            return original(q, k, cos, sin, *args, **kwargs)
        return call

    for owner, original in zip(owners, originals, strict=True):
        owner.apply_rotary_pos_emb = recording(original)
    try:
        with torch.inference_mode():
            model(input_ids=ids)
    finally:
        for owner, original in zip(owners, originals, strict=True):
            owner.apply_rotary_pos_emb = original
        for hook in hooks:
            hook.remove()
    return norms, calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SMALL)
def test_each_applied_patch_gives_the_modules_own_bits_on_a_real_forwards_inputs(
        arch_dirs: dict[str, Path], name: str, dtype: Any) -> None:
    model, tok = _load(arch_dirs[name], dtype)
    ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog, twice")])
    norms, calls = _recorded(model, ids)
    assert bool(norms) == (name != "phi-tiny") and calls  # phi: LayerNorm only; every shape: rotary
    linear.prepack_linears(model)  # oneDNN: its per-column sums do not depend on the other columns
    with torch.inference_mode():
        unfused = model(input_ids=ids).logits
    # packs again, then fuses and patches the rest (MKL's column sums: tests/unit/test_hf_cpu_mkl_linear.py)
    report = patches.apply(model, HuggingFaceOptions(cpu_linear="onednn"))
    try:
        with torch.inference_mode():
            for module, inputs in norms.items():  # RMSNorm: the kernel against the module's own forward
                assert isinstance(module.__dict__.get("forward"), FusedRMSNorm)
                for x in inputs:
                    assert torch.equal(module(x), module.__dict__["forward"].original(x))
            fast = rotary.modeling_modules(model)[0].apply_rotary_pos_emb
            assert isinstance(fast, rotary.FastRotary)
            for q, k, cos, sin in calls:  # rotary: the kernel against the modeling module's function
                assert rotary_kernel.rotary(q, k, cos, sin) is not None
                for a, b in zip(fast(q, k, cos, sin), fast.original(q, k, cos, sin), strict=True):
                    assert torch.equal(a, b)
            groups = [m.__dict__["forward"] for m in model.modules() if isinstance(m.__dict__.get("forward"),
                                                                                 fused.FusedMember)]
            assert groups and report["cpu_fuse_projections"].startswith("applied: ")
            if name == "phi-tiny":  # no SiLU MLP: the projections alone, bitwise the unfused layers
                model.config._attn_implementation = "sdpa"
                assert torch.equal(model(input_ids=ids).logits, unfused)
    finally:
        patches.revert(model)


@pytest.mark.parametrize("name", SMALL)
def test_greedy_fp32_output_through_the_engine_equals_generate(arch_dirs: dict[str, Path], name: str) -> None:
    model, tok = _load(arch_dirs[name])
    prompts = [tok.encode(p) for p in PROMPTS]
    stock = generate_tokens(model, prompts, NEWS)  # the plain transformers model, torch's SDPA
    report = patches.apply(model, HuggingFaceOptions())
    try:
        got = engine_tokens(model, tok, prompts, NEWS)
        want = generate_tokens(model, prompts, NEWS)  # the same patched model, each request alone
        assert [got[i][: n] for i, n in enumerate(NEWS)] == want, report
        assert want == stock  # and, on these prompts, the plain model's tokens too
    finally:
        patches.revert(model)


@pytest.mark.parametrize("name", SMALL)
def test_kv_bytes_per_token_is_what_the_cache_holds(arch_dirs: dict[str, Path], name: str) -> None:
    from transformers import DynamicCache

    for dtype in (torch.float32, torch.bfloat16):
        model, _ = _load(arch_dirs[name], dtype)
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1, 5, 9, 14, 3]]), past_key_values=cache, use_cache=True)
        held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        assert held == 5 * bytes_per_token(model)


def test_benchmark_shapes_have_the_sizes_they_claim() -> None:
    from transformers import AutoModelForCausalLM

    sizes = {"qwen2-bench": (0.3e9, 0.5e9), "phi-bench": (0.3e9, 0.5e9), "llama-1b": (0.9e9, 1.3e9)}
    for name, (low, high) in sizes.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(SHAPES[name].config())
        count = sum(p.numel() for p in model.parameters())
        assert low < count < high, (name, count)
