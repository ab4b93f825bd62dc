"""Read a PEFT LoRA adapter folder into per-module low-rank factors for the HF engine.

A PEFT adapter folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (or the older
``adapter_model.bin``) whose keys are ``base_model.model.<module>.lora_A.weight`` [r, in] and
``...lora_B.weight`` [out, r]. For every targeted ``nn.Linear`` PEFT computes
``base(x) + scale * B(A(x))`` with ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``; ``alpha_pattern`` overrides alpha per module). We keep ``A^T`` and ``scale * B^T``
on the base layer's device and dtype, so applying a row's adapter is two small matmuls.

We read the files ourselves (safetensors + json) instead of wrapping the model in ``peft``'s
``PeftModel``: the engine's forward, cache and hooks stay those of the plain transformers model,
and serving does not depend on peft. Variants that are not plain LoRA on linear layers (DoRA,
biases, ``modules_to_save``, embedding LoRA, ``target_parameters``...) are refused with a message
naming the key.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from djl_handlers.lora.registry import AdapterError, AdapterLimit

__all__ = ["LoraWeights", "load_lora_weights"]

_PREFIX = "base_model.model."
_UNSUPPORTED_FLAGS = ("use_dora", "use_qalora", "use_bdlora", "fan_in_fan_out")
_UNSUPPORTED_VALUES = ("modules_to_save", "layer_replication", "target_parameters", "alora_invocation_tokens",
                       "trainable_token_indices")


@dataclass
class LoraWeights:
    """One loaded adapter: ``layers[module name] = (A^T [in, r], scale * B^T [r, out])``."""

    name: str
    src: str
    rank: int
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Memory held by the factors."""
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.layers.values())


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise AdapterError(f"{str(folder)!r} has no adapter_config.json (not a PEFT adapter folder)", field="src")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{str(path)!r} is not valid JSON: {exc}", field="src") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{str(path)!r} must hold a JSON object", field="src")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterError(f"adapter type {peft_type!r} is not supported (only LoRA)", field="src")
    for key in _UNSUPPORTED_FLAGS:
        if config.get(key):
            raise AdapterError(f"adapter_config.json: {key}=true is not supported", field=key)
    for key in _UNSUPPORTED_VALUES:
        if config.get(key):
            raise AdapterError(f"adapter_config.json: {key} is not supported", field=key)
    if str(config.get("bias", "none")) != "none" or config.get("lora_bias"):
        raise AdapterError("adapter_config.json: LoRA biases are not supported (bias must be 'none')", field="bias")
    return config


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    safe = folder / "adapter_model.safetensors"
    if safe.is_file():
        from safetensors.torch import load_file

        return load_file(str(safe), device="cpu")
    binary = folder / "adapter_model.bin"
    if binary.is_file():
        loaded = torch.load(str(binary), map_location="cpu", weights_only=True)
        return dict(loaded)
    raise AdapterError(f"{str(folder)!r} has no adapter_model.safetensors or adapter_model.bin", field="src")


def _alpha(config: dict[str, Any], module: str) -> float:
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            return float(value)
    return float(config.get("lora_alpha", 8))


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        if "lora_embedding_" in name or "lora_magnitude" in name:
            raise AdapterError(f"adapter weight {key!r} is not supported (embedding LoRA / DoRA)", field="src")
        match = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", name)
        if match is None:
            raise AdapterError(f"adapter weight {key!r} is not a LoRA A/B matrix", field="src")
        pairs.setdefault(match.group(1), {})[match.group(2)] = value
    return pairs


def load_lora_weights(name: str, src: str, model: Any, max_rank: int) -> LoraWeights:
    """Load the adapter at ``src`` for ``model``; ``AdapterError`` (400) for a folder that does not fit
    the model, ``AdapterLimit`` (507) for a rank above ``max_rank``."""
    folder = Path(src)
    config = _config(folder)
    pairs = _pairs(_tensors(folder))
    if not pairs:
        raise AdapterError(f"adapter {name!r} at {src!r} holds no LoRA weights", field="src")
    weights = LoraWeights(name=name, src=src, rank=0)
    for module_name, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: {module_name} lacks lora_A or lora_B", field="src")
        try:
            base = model.get_submodule(module_name)
        except AttributeError:
            raise AdapterError(f"adapter {name!r} targets {module_name!r}, which this model does not have",
                               field="src") from None
        if not isinstance(base, torch.nn.Linear):
            raise AdapterError(f"adapter {name!r}: {module_name} is a {type(base).__name__}, not a linear layer",
                               field="src")
        a, b = pair["A"], pair["B"]
        rank = int(a.shape[0])
        if a.shape != (rank, base.in_features) or b.shape != (base.out_features, rank):
            raise AdapterError(
                f"adapter {name!r}: {module_name} factors {tuple(a.shape)}/{tuple(b.shape)} do not fit the layer "
                f"({base.in_features} -> {base.out_features}); was it trained for another model?", field="src")
        if rank > max_rank:
            raise AdapterLimit(f"adapter {name!r} has rank {rank} > option.max_lora_rank={max_rank}",
                               field="option.max_lora_rank")
        alpha = _alpha(config, module_name)
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        dtype, device = base.weight.dtype, base.weight.device
        a_t = a.t().to(device=device, dtype=dtype).contiguous()
        b_t = (b.float() * scale).t().to(device=device, dtype=dtype).contiguous()
        weights.layers[module_name] = (a_t, b_t)
        weights.rank = max(weights.rank, rank)
    return weights
