"""Tiny random-weight vision-language models (LLaVA, Idefics3) with the SmolLM2 tokenizer, for tests.

``tiny_vlm_dir(path, arch)`` writes a folder that ``AutoProcessor`` and
``AutoModelForImageTextToText`` load offline, and that vLLM serves like a hub checkpoint: a real
architecture at toy sizes (a 2-layer vision tower of width 64, a 2-layer Llama of width 64 with heads
of width 32, the smallest vLLM's CPU attention runs), fp32 safetensors weights drawn at a fixed torch
seed, and the processor saved with ``save_pretrained`` (image processor, tokenizer, chat template). The
text is gibberish; the folders are for mechanics (image placeholders, pixel values reaching the vision
tower, greedy agreement between engines), not for quality.

The tokenizer is the embedded SmolLM2's with the architecture's image tokens added as special tokens;
the config's image token id is the added ``<image>``. The chat template (``chat_template.jinja``, read
by transformers' processor and tokenizer and by vLLM) renders SmolLM2's ``<|im_start|>role ...
<|im_end|>`` turns over plain string contents or OpenAI-style content lists, where each
``{"type": "image"}`` item renders the placeholder ``<image>`` once; the processor expands it:

* ``llava``: a CLIP vision tower (patch 14, the next-to-last layer's patch features) and a Llama; an
  image is ``(image_size / 14) ** 2`` tokens (576 at the default 336). The tower's weights are saved
  under ``vision_tower.vision_model.``, the layout of LLaVA checkpoints, which vLLM expects;
* ``idefics3``: a SigLIP-like tower on square tiles of ``image_size`` (default 112, patch 14, pixel
  shuffle 2: 16 tokens per tile) and a Llama; the image processor resizes the longest edge to two
  tiles and splits it, so a square image is 2x2 tiles plus the global view (80 ``<image>`` tokens
  between ``<fake_token_around_image>``, ``<row_i_col_j>`` and ``<global-img>`` markers).

No Qwen2-VL: its transformers 5 processor cannot be built or loaded without a video processor, which
needs torchvision, absent from this project's environments.

A marker file records how the folder was built; a folder with the same marker is reused.
torch, transformers and safetensors are imported inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ARCHS", "CHAT_TEMPLATE", "IMAGE_TOKEN", "tiny_vlm_dir"]

ARCHS = ("llava", "idefics3")
IMAGE_TOKEN = "<image>"  # what one image content item renders to, in both architectures
MARKER = "djl_handlers_tiny_vision.json"
VERSION = 1  # bump when the way a folder is built changes
BOS, EOS = 1, 2  # the SmolLM2 tokenizer's <|im_start|> and <|im_end|>
PATCH = 14
DEFAULT_IMAGE_SIZE = {"llava": 336, "idefics3": 112}
_IMAGE_SIZE_STEP = {"llava": PATCH, "idefics3": 2 * PATCH}  # Idefics3: whole patches, then 2x2 pixel shuffle
_ADDED_TOKENS = {
    "llava": (IMAGE_TOKEN,),
    "idefics3": ("<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>", "<global-img>",
                 *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))),
}
_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_TEXT: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                         "max_position_embeddings": 2048, "initializer_range": 0.1, "tie_word_embeddings": False,
                         "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS}
_VISION: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 2, "patch_size": PATCH}
# "small": a model where compute, not per-step overhead, dominates (benchmarks): a 6-layer text model of
# width 256 (4 heads of 64, 2 KV heads) and a 4-layer vision tower of width 256
_SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tiny": ({}, {}),
    "small": ({"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64},
              {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4}),
}
SIZES = tuple(_SIZES)
#: the Jinja chat template: SmolLM2's turns over string contents or lists of text and image items
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- elif item['type'] in ['image', 'image_url'] -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tiny_vlm_dir(path: str | Path, arch: str = "llava", *, seed: int = 0, image_size: int | None = None,
                 size: str = "tiny") -> Path:
    """Build (or reuse) the tiny vision-language model folder of ``arch`` at ``path`` and return it.

    Args:
        path: the folder to write; reused when it already holds this ``arch`` built with the same
            ``seed`` and ``image_size``.
        arch: ``llava`` or ``idefics3``.
        seed: torch seed for the random initialisation.
        image_size: the side of the square the vision tower sees: LLaVA's CLIP input (a multiple of
            14, default 336), Idefics3's tile (a multiple of 28, default 112).
        size: ``tiny`` (the toy widths above, for tests) or ``small`` (a 6-layer text model and a
            4-layer tower of width 256: compute outweighs per-step overhead, for benchmarks).

    Raises:
        ValueError: an unknown ``arch`` or an ``image_size`` the tower cannot cut into patches.
    """
    if size not in _SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    if arch not in ARCHS:
        raise ValueError(f"unknown vision-language arch {arch!r}; expected one of {', '.join(ARCHS)}")
    side = DEFAULT_IMAGE_SIZE[arch] if image_size is None else int(image_size)
    step = _IMAGE_SIZE_STEP[arch]
    if side < step or side % step:
        raise ValueError(f"image_size {side} for {arch} must be a positive multiple of {step}")
    out = Path(path)
    settings: dict[str, object] = {"arch": arch, "seed": seed, "image_size": side, "version": VERSION}
    if size != "tiny":
        settings["size"] = size
    if _marker(out) == settings:
        return out
    out.mkdir(parents=True, exist_ok=True)
    processor = _processor(arch, side)
    _save_model(out, _config(arch, side, processor.tokenizer, size), seed)
    processor.save_pretrained(str(out))
    (out / MARKER).write_text(json.dumps(settings) + "\n", encoding="utf-8")
    return out


def _marker(out: Path) -> dict[str, object] | None:
    try:
        data = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tokenizer(arch: str) -> Any:
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in _ADDED_TOKENS[arch]],
                         special_tokens=True)
    return tokenizer


def _processor(arch: str, size: int) -> Any:
    tokenizer = _tokenizer(arch)
    if arch == "llava":
        from transformers import CLIPImageProcessor, LlavaProcessor

        clip = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                  image_mean=_CLIP_MEAN, image_std=_CLIP_STD)
        # the CLS token is dropped ("default"): (size / 14) ** 2 tokens per image
        return LlavaProcessor(image_processor=clip, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                              patch_size=PATCH, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, image_token=IMAGE_TOKEN)
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    tiles = Idefics3ImageProcessor(size={"longest_edge": 2 * size}, max_image_size={"longest_edge": size})
    return Idefics3Processor(image_processor=tiles, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                             image_seq_len=(size // PATCH) ** 2 // 4)


def _config(arch: str, size: int, tokenizer: Any, preset: str = "tiny") -> Any:
    from transformers import LlamaConfig

    text_sizes, vision_sizes = _SIZES[preset]
    text = LlamaConfig(**{**_TEXT, **text_sizes}, vocab_size=len(tokenizer))
    vision = {**_VISION, **vision_sizes}
    image_id = int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    if arch == "llava":
        from transformers import CLIPVisionConfig, LlavaConfig

        return LlavaConfig(vision_config=CLIPVisionConfig(**vision, image_size=size, projection_dim=64),
                           text_config=text, image_token_index=image_id, image_seq_length=(size // PATCH) ** 2,
                           vision_feature_layer=-2, vision_feature_select_strategy="default",
                           tie_word_embeddings=False)
    from transformers import Idefics3Config, Idefics3VisionConfig

    # pad_token_id: a field of Idefics3Config in some transformers 5 releases, whose default (128002) is
    # outside this vocabulary
    pad: dict[str, Any] = {"pad_token_id": EOS}
    return Idefics3Config(vision_config=Idefics3VisionConfig(**vision, image_size=size), text_config=text,
                          image_token_id=image_id, scale_factor=2, tie_word_embeddings=False, **pad)


def _save_model(out: Path, config: Any, seed: int) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config).float().eval()
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    model.save_pretrained(str(out), safe_serialization=True)
    if config.model_type == "llava":
        _nest_clip_tower(out / "model.safetensors")


def _nest_clip_tower(weights: Path) -> None:
    """Write LLaVA's CLIP tower under ``vision_tower.vision_model.``, the layout of LLaVA checkpoints.

    transformers 5 flattens ``CLIPVisionModel`` (it drops ``vision_model.`` when loading) and saves the
    flat names; vLLM's LLaVA loader wants the nested ones, which transformers loads as well.
    """
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    flat, nested = "vision_tower.", "vision_tower.vision_model."
    renamed = {(nested + key[len(flat):] if key.startswith(flat) and not key.startswith(nested) else key): value
               for key, value in tensors.items()}
    save_file(renamed, str(weights), metadata={"format": "pt"})
