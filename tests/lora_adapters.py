"""Make small PEFT LoRA adapters for the test models (random but fixed weights, written to a tmp folder).

``make_adapter(model, folder, seed)`` wraps ``model`` with peft's ``LoraConfig(init_lora_weights=False)``
(both factors random, so the adapter changes the output), saves ``adapter_config.json`` +
``adapter_model.safetensors`` to ``folder`` and unwraps the model again (the base weights are untouched).
``merged_generate`` is the reference: ``generate()`` of one prompt on a copy of the base model with the
adapter merged into its weights (peft's ``merge_and_unload``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def make_adapter(model: Any, folder: Path, seed: int, rank: int = 4, alpha: int = 8,
                 targets: tuple[str, ...] = ATTENTION, std: float = 0.05) -> Path:
    """Save a random LoRA adapter for ``model`` into ``folder``; returns ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                        init_lora_weights=False, task_type="CAUSAL_LM")
    wrapped = get_peft_model(copy.deepcopy(model), config)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, std)
    wrapped.save_pretrained(str(folder))
    return folder


def merged_model(model: Any, folder: Optional[Path]) -> Any:
    """A copy of ``model`` with the adapter at ``folder`` merged in (``model`` itself when None)."""
    if folder is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(model), str(folder)).merge_and_unload().eval()


def merged_generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int,
                    folder: Optional[Path] = None) -> list[int]:
    """Greedy ``generate()`` token ids of ``prompt`` alone on ``model`` (+ merged adapter)."""
    import torch

    target = merged_model(model, folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return [int(t) for t in out[0, ids.shape[1]:]]
