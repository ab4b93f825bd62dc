"""The CPU kernel patches of an HF model, applied together (the loader calls :func:`apply`) and
reverted together (:func:`revert`), and the report of what each patch did to this model.

Each patch replaces a ``forward`` (or, for rotary embedding, a modeling module's function; for
attention, the model's attention implementation) and keeps what it replaced, so :func:`revert`
gives the plain transformers model back. Which patches run is ``option.cpu_*``
(:class:`~djl_handlers.config.hf.HuggingFaceOptions`); a model not on the CPU gets none.

A patch applies only where the model has the modules it replaces and its load-time check against
the module's own forward passes; elsewhere the model keeps its own code. :func:`apply` returns, per
patch, one line saying which (``applied: ...``, ``fell back: <why>``, or ``off: <option>``) and logs
it once at load (INFO; WARNING when a kernel cannot be built); the engine reports the same lines in
its stats (``cpu_patches``).
"""

from __future__ import annotations

import logging
from typing import Any

from djl_handlers.config.hf import HuggingFaceOptions
from djl_handlers.engines.hf.cpu import fused, int8, isa, linear, norm, ragged_attention, rotary
from djl_handlers.errors import ConfigError

__all__ = ["PATCHES", "apply", "revert", "use_ragged_attention"]

LOG = logging.getLogger(__name__)

#: The patches in the order they are applied, by the option that chooses each (``silu_mul`` comes
#: with ``cpu_fuse_projections``: an MLP over a fused gate/up pair).
PATCHES = ("cpu_linear", "cpu_fuse_projections", "silu_mul", "cpu_norm", "cpu_rotary", "cpu_attention")
FELL_BACK = "fell back: "


def _on_cpu(model: Any) -> bool:
    first = next(iter(model.parameters()), None)
    return first is not None and first.device.type == "cpu"


def apply(model: Any, options: HuggingFaceOptions) -> dict[str, str]:
    """Patch ``model`` (on the CPU) as ``options`` say: prepacked linear layers (``cpu_linear``) with fused
    projections (``cpu_fuse_projections``) and SiLU·mul, RMSNorm (``cpu_norm``), rotary embedding
    (``cpu_rotary``), ragged attention (``cpu_attention``). Returns one line per patch of
    :data:`PATCHES` (empty off the CPU), each also logged. A kernel that cannot be built here is
    reported and skipped, except ``cpu_attention=ragged`` (a ``ConfigError``)."""
    if not _on_cpu(model):
        return {}
    report = {
        "cpu_linear": _linear(model, options),
        **_projections(model, options),
        "cpu_norm": _norm(model, options),
        "cpu_rotary": _rotary(model, options),
        "cpu_attention": _attention(model, options),
    }
    for name in PATCHES:
        text = report[name]
        degraded = text.startswith(FELL_BACK) and "cannot be built" in text
        LOG.log(logging.WARNING if degraded else logging.INFO, "CPU patch %s: %s", name, text)
    return report


def revert(model: Any) -> None:
    """Undo every patch :func:`apply` may have made (those it did not make are left alone)."""
    ragged_attention.disable(model)
    rotary.disable(model)
    norm.unfuse_rms_norms(model)
    fused.unfuse_projections(model)
    linear.unpack_linears(model)


def _linear(model: Any, options: HuggingFaceOptions) -> str:
    if options.quantize == int8.NAME:
        count = int8.quantize_linears(model)
        return (f"applied: {count} nn.Linear layers as int8 (option.quantize={int8.NAME}: per-channel int8 "
                f"weights, per-row dynamic int8 activations, on {int8.backend()})")
    if options.cpu_linear == "torch":
        return f"off: option.cpu_linear={options.cpu_linear}"
    count = linear.prepack_linears(model, isa.fp32_library(options.cpu_linear))
    if count:
        dtype = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
        path = isa.linear_path(dtype)
        how = (f"; {path}: oneDNN's {dtype} path is missing here or measured slower than fp32, so each call "
               "computes in fp32") if path.startswith("fp32-over-") else ""
        return f"applied: {count} nn.Linear layers on prepacked weights ({_on_libraries(model, options)}{how})"
    if not linear.available():
        return FELL_BACK + "this torch has no oneDNN; torch's linear"
    return FELL_BACK + "no plain nn.Linear layer in fp32, bf16 or fp16 (quantized or custom layers keep their own)"


def _on_libraries(model: Any, options: HuggingFaceOptions) -> str:
    """Which library runs the packed weights and, under ``auto``, why, e.g. ``211 on MKL;
    option.cpu_linear=auto, MKL's fp32 GEMM measured 1.07x oneDNN's speed``."""
    speed = isa.features().mkl_speed if options.cpu_linear == "auto" else None
    why = f"; option.cpu_linear=auto, MKL's fp32 GEMM measured {speed}x oneDNN's speed" if speed else ""
    return linear.describe_libraries(model) + why


def _projections(model: Any, options: HuggingFaceOptions) -> dict[str, str]:
    """``cpu_fuse_projections`` and the SiLU·mul MLPs that come with it."""
    if options.quantize == int8.NAME:
        groups = int8.shared_groups(model)
        fused_text = (f"applied: {groups} q/k/v and gate/up groups, one int8 GEMM each" if groups
                      else FELL_BACK + "no sibling q/k/v or gate/up nn.Linear layers")
        int8.fuse_mlps(model)
        return {"cpu_fuse_projections": fused_text, "silu_mul": _silu_mul(model, int8.gate_up_pairs(model))}
    if options.cpu_linear == "torch" or not options.cpu_fuse_projections:
        why = ("off: option.cpu_fuse_projections=false" if options.cpu_linear != "torch"
               else "off: needs prepacked linear layers (option.cpu_linear=auto, mkl or onednn)")
        return {"cpu_fuse_projections": why, "silu_mul": why}
    candidates = fused.sibling_groups(model)
    groups = fused.fuse_projections(model, library=isa.fp32_library(options.cpu_linear))
    if not groups:
        if not linear.available():
            why = FELL_BACK + "this torch has no oneDNN"
        elif not candidates:
            why = FELL_BACK + ("no sibling nn.Linear layers named q_proj/k_proj/v_proj or gate_proj/up_proj "
                               "with one input size, dtype and bias presence")
        else:
            why = FELL_BACK + "the model's forward does not take the fused projections (checked at load)"
        return {"cpu_fuse_projections": why, "silu_mul": why}
    kinds = [len(group) for group in candidates]
    text = f"applied: {kinds.count(3)} q/k/v and {kinds.count(2)} gate/up groups, one prepacked GEMM each"
    return {"cpu_fuse_projections": text, "silu_mul": _silu_mul(model, kinds.count(2))}


def _silu_mul(model: Any, pairs: int) -> str:
    mlps = sum(isinstance(m.__dict__.get("forward"), fused.FusedMLP) for m in model.modules())
    if mlps:
        return f"applied: {mlps} SiLU MLPs as down_proj(silu_mul(gate_up(x)))"
    from djl_handlers.kernels import silu_mul as kernel

    if not kernel.available():
        return FELL_BACK + "the SiLU·mul kernel cannot be built here"
    if not pairs:
        acts = sorted({type(m.act_fn if hasattr(m, "act_fn") else m.activation_fn).__name__
                       for m in model.modules() if hasattr(m, "act_fn") or hasattr(m, "activation_fn")})
        return FELL_BACK + f"no MLP with a gate_proj/up_proj pair (activation: {', '.join(acts) or 'none found'})"
    return FELL_BACK + "the MLPs over a fused gate/up pair do not use SiLU or differ from their own forward"


def _norm(model: Any, options: HuggingFaceOptions) -> str:
    if options.cpu_norm != "fused":
        return f"off: option.cpu_norm={options.cpu_norm}"
    from djl_handlers.kernels import rms_norm as kernel

    count = norm.fuse_rms_norms(model)
    candidates = [type(m).__name__ for m in model.modules() if norm.candidate(m)]
    if count:
        kept = len(candidates) - count
        return f"applied: {count} RMSNorm modules" + (f" ({kept} kept their own forward)" if kept else "")
    if not kernel.available():
        return FELL_BACK + f"the RMSNorm kernel cannot be built here ({kernel.unavailable_reason()})"
    if kernel.lanes() is None:
        return FELL_BACK + "the RMSNorm kernel does not reproduce this torch's sums"
    if not candidates:
        norms = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Norm")})
        return FELL_BACK + f"no RMSNorm module (the model normalises with {', '.join(norms) or 'nothing named *Norm'})"
    return FELL_BACK + (f"{', '.join(sorted(set(candidates)))} does not give Llama's RMSNorm bit for bit "
                        "(or not in fp32/bf16); torch's forward kept")


def _rotary(model: Any, options: HuggingFaceOptions) -> str:
    if options.cpu_rotary != "fused":
        return f"off: option.cpu_rotary={options.cpu_rotary}"
    from djl_handlers.kernels import rotary as kernel

    count = rotary.enable(model)
    if count:
        return f"applied: apply_rotary_pos_emb of {count} modeling module(s), bitwise torch's"
    if not kernel.available():
        return FELL_BACK + f"the rotary kernel cannot be built here ({kernel.unavailable_reason()})"
    if not rotary.modeling_modules(model):
        return FELL_BACK + ("no attention calls apply_rotary_pos_emb with rotate_half "
                            "(no rotary embedding, or another formula)")
    return FELL_BACK + "apply_rotary_pos_emb differs from the kernel's on random inputs, or the dtype is not fp32/bf16"


def _attention(model: Any, options: HuggingFaceOptions) -> str:
    if options.cpu_attention == "sdpa":
        return "off: option.cpu_attention=sdpa"
    return use_ragged_attention(model, required=options.cpu_attention == "ragged")


def use_ragged_attention(model: Any, required: bool) -> str:
    """Switch a CPU model on SDPA to the ragged decode attention (``option.cpu_attention``) and
    say what happened; when its kernel cannot be built, raise if ``required``, else keep SDPA."""
    from djl_handlers.kernels.decode_attention import path, unavailable_reason

    if ragged_attention.enable(model):
        return f"applied: attention over each row's real tokens (ragged kernel, {path()} path)"
    why = unavailable_reason()
    if why is None:  # built, but the model does not use SDPA (eager, flash, ...): its choice stands
        return FELL_BACK + f"the model uses {model.config._attn_implementation!r} attention, not sdpa; kept"
    if required:
        raise ConfigError(f"option.cpu_attention=ragged needs its C kernel, which cannot be built here: {why}",
                          field="option.cpu_attention")
    return FELL_BACK + f"decode attention stays on torch's SDPA: the ragged kernel cannot be built here ({why})"
