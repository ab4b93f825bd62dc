"""engines/hf/cpu/patches.py: the CPU kernel patches the options choose are applied together, and
``revert`` gives the plain transformers model back (same logits as before any patch)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.config.hf import HuggingFaceOptions  # noqa: E402
from djl_handlers.engines.hf.cpu import patches, rotary  # noqa: E402
from djl_handlers.engines.hf.cpu.fused import FusedMember  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import PackedLinear  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import available as onednn_available  # noqa: E402
from djl_handlers.engines.hf.cpu.norm import FusedRMSNorm  # noqa: E402
from djl_handlers.engines.hf.cpu.ragged_attention import ATTN_NAME  # noqa: E402
from djl_handlers.kernels import decode_attention, rms_norm  # noqa: E402
from djl_handlers.kernels import rotary as rotary_kernel  # noqa: E402

pytest_plugins = ["conftest_models"]

IDS = [[1, 5, 9, 14, 3, 7, 2, 11]]


def _forwards(model: Any) -> list[Any]:
    """The forwards set on module instances (what a patch replaces), by type."""
    return [type(m.__dict__["forward"]) for m in model.modules() if "forward" in m.__dict__]


def _rotary_modules(model: Any) -> list[Any]:
    return [sys.modules[type(m).__module__] for m in model.modules()
            if hasattr(sys.modules[type(m).__module__], "apply_rotary_pos_emb")]


def _logits(model: Any) -> Any:
    with torch.inference_mode():
        return model(input_ids=torch.tensor(IDS)).logits


@pytest.mark.skipif(not (onednn_available() and rms_norm.available() and rotary_kernel.available()
                         and decode_attention.available()), reason="a CPU kernel cannot be used here")
def test_the_default_options_apply_every_patch_and_revert_undoes_them(tiny_model: Any) -> None:
    model, _ = tiny_model
    before = _logits(model)
    assert _forwards(model) == [] and model.config._attn_implementation == "sdpa"
    patches.apply(model, HuggingFaceOptions())
    try:
        kinds = set(_forwards(model))
        assert {FusedMember, FusedRMSNorm} <= kinds  # q/k/v and gate/up fused over packed weights, norms fused
        assert model.config._attn_implementation == ATTN_NAME
        assert any(isinstance(m.apply_rotary_pos_emb, rotary.FastRotary) for m in _rotary_modules(model))
        assert torch.allclose(_logits(model), before, atol=1e-4)
    finally:
        patches.revert(model)
    assert _forwards(model) == [] and model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m.apply_rotary_pos_emb, rotary.FastRotary) for m in _rotary_modules(model))
    assert torch.equal(_logits(model), before)


def test_options_choose_the_patches(tiny_model: Any) -> None:
    model, _ = tiny_model
    options = HuggingFaceOptions(cpu_fuse_projections=False, cpu_attention="sdpa", cpu_norm="torch", cpu_rotary="torch")
    patches.apply(model, options)
    try:
        kinds = set(_forwards(model))
        assert kinds == ({PackedLinear} if onednn_available() else set())
        assert model.config._attn_implementation == "sdpa"
    finally:
        patches.revert(model)
    patches.apply(model, HuggingFaceOptions(cpu_linear="torch", cpu_attention="sdpa", cpu_norm="torch",
                                            cpu_rotary="torch"))
    assert _forwards(model) == []  # everything torch's: nothing patched


def test_a_model_off_the_cpu_is_left_alone() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.device("meta")))
    patches.apply(model, HuggingFaceOptions())
    assert _forwards(model) == []
