"""The tiny random vision-language models (LLaVA, Idefics3): they load offline with transformers' Auto
classes, the chat template renders image items as the placeholder, the processor expands it, the vision
tower changes the logits, generation is reproducible, and a folder is reused when built twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from djl_handlers.model import tiny_vision

pytest_plugins = ["conftest_models"]  # fixtures: embedded_dir

#: arch -> (image tokens for one 336x336 image, pixel_values shape for it)
EXPECTED = {"llava": (576, (1, 3, 336, 336)), "idefics3": (80, (1, 5, 3, 112, 112))}
QUESTION = "What is in this picture?"


def _images() -> list[Any]:
    """Two 336x336 RGB images with nothing in common: a red-green gradient and a blue checkerboard."""
    from PIL import Image

    ramp = np.linspace(0, 255, 336, dtype=np.float32)
    gradient = np.stack([np.tile(ramp, (336, 1)), np.tile(ramp[:, None], (1, 336)), np.zeros((336, 336))], -1)
    cells = ((np.arange(336)[:, None] // 42 + np.arange(336)[None, :] // 42) % 2).astype(np.float32) * 255
    checker = np.stack([np.zeros((336, 336)), cells / 2, cells], -1)
    return [Image.fromarray(a.astype(np.uint8), "RGB") for a in (gradient, checker)]


def _messages(*content: dict[str, str]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(content)}]


@pytest.fixture(scope="module", params=tiny_vision.ARCHS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          embedded_dir: Path) -> tuple[str, Path]:  # embedded_dir: skips when the embedded model is missing
    arch = str(request.param)
    return arch, tiny_vision.tiny_vlm_dir(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)


@pytest.fixture(scope="module")
def loaded(built: tuple[str, Path]) -> tuple[str, Path, Any, Any]:
    """(arch, folder, processor, model) loaded with the Auto classes, fp32."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.set_num_threads(min(2, torch.get_num_threads()))
    arch, folder = built
    processor = AutoProcessor.from_pretrained(str(folder))
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    return arch, folder, processor, model


def _inputs(processor: Any, image: Any) -> Any:
    text = processor.apply_chat_template(_messages({"type": "image"}, {"type": "text", "text": QUESTION}),
                                         add_generation_prompt=True, tokenize=False)
    return processor(text=text, images=[image], return_tensors="pt")


def test_config_names_the_added_image_token(loaded: tuple[str, Path, Any, Any]) -> None:
    arch, _, processor, model = loaded
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids(tiny_vision.IMAGE_TOKEN)
    assert image_id >= 49152  # added after SmolLM2's own vocabulary
    assert model.config.architectures == [{"llava": "LlavaForConditionalGeneration",
                                           "idefics3": "Idefics3ForConditionalGeneration"}[arch]]
    config_id = model.config.image_token_index if arch == "llava" else model.config.image_token_id
    assert config_id == image_id == processor.image_token_id
    assert model.config.text_config.vocab_size == len(tokenizer)
    assert tokenizer.tokenize(f"a{tiny_vision.IMAGE_TOKEN}b") == ["a", tiny_vision.IMAGE_TOKEN, "b"]
    if arch == "idefics3":
        assert {"<fake_token_around_image>", "<global-img>", "<row_2_col_2>"} <= set(tokenizer.get_vocab())


def test_chat_template_renders_content_lists_and_strings(loaded: tuple[str, Path, Any, Any]) -> None:
    _, folder, processor, _ = loaded
    assert (folder / "chat_template.jinja").read_text(encoding="utf-8") == tiny_vision.CHAT_TEMPLATE
    two = processor.apply_chat_template(
        _messages({"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "text", "text": " and "},
                  {"type": "image"}), add_generation_prompt=True, tokenize=False)
    assert two == "<|im_start|>user\nCompare <image> and <image><|im_end|>\n<|im_start|>assistant\n"
    plain = processor.apply_chat_template([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hi"}], tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert processor.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_processor_expands_the_placeholder(loaded: tuple[str, Path, Any, Any]) -> None:
    arch, _, processor, _ = loaded
    tokens, pixels = EXPECTED[arch]
    inputs = _inputs(processor, _images()[0])
    assert (inputs["input_ids"] == processor.image_token_id).sum().item() == tokens
    assert tuple(inputs["pixel_values"].shape) == pixels


def test_generation_is_reproducible_and_sees_the_image(loaded: tuple[str, Path, Any, Any]) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    _, folder, processor, model = loaded
    first, second = (_inputs(processor, image) for image in _images())
    again = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        runs = [m.generate(**first, max_new_tokens=8, min_new_tokens=8, do_sample=False) for m in (model, again)]
        logits = [model(**inputs).logits[0, -1] for inputs in (first, second)]
    assert runs[0].shape[1] == first["input_ids"].shape[1] + 8
    assert torch.equal(runs[0], runs[1])
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)


def test_weights_load_completely(built: tuple[str, Path]) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    arch, folder = built
    _, info = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32,
                                                          output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        assert all(weights.get_tensor(name).dtype == torch.float32 for name in names)
    if arch == "llava":  # the checkpoint layout vLLM loads
        tower = [name for name in names if name.startswith("vision_tower.")]
        assert tower and all(name.startswith("vision_tower.vision_model.") for name in tower)


def test_folder_is_reused_and_the_seed_matters(built: tuple[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    arch, folder = built
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert tiny_vision.tiny_vlm_dir(folder, arch) == folder
    assert weights.stat().st_mtime_ns == stamp
    other = load_file(str(tiny_vision.tiny_vlm_dir(tmp_path / "seed1", arch, seed=1) / "model.safetensors"))
    ours = load_file(str(weights))
    assert other.keys() == ours.keys()
    assert any(not bool((other[name] == ours[name]).all()) for name in ours if "norm" not in name)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="qwen2_vl"):
        tiny_vision.tiny_vlm_dir(tmp_path, "qwen2_vl")
    with pytest.raises(ValueError, match="multiple of 14"):
        tiny_vision.tiny_vlm_dir(tmp_path, "llava", image_size=100)
    with pytest.raises(ValueError, match="multiple of 28"):
        tiny_vision.tiny_vlm_dir(tmp_path, "idefics3", image_size=98)
    assert not any(tmp_path.iterdir())
