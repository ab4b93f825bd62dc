"""Images on the vLLM adapters without vLLM (``engines/external/vllm_media.py``): the engine keyword a
vision-language folder gets, the prompt ids the model's processor counts, and the prompt vLLM is sent.
The real engine runs in tests/vllm_cpu/test_vllm_cpu_vision.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.external.vllm_config import engine_args_kwargs  # noqa: E402
from djl_handlers.engines.external.vllm_media import (  # noqa: E402
    VllmImages,
    VllmMediaInputs,
    check_prompt_count,
    encode_with,
    image_prompt,
    tokenization_kwargs,
)
from djl_handlers.errors import InvalidRequest  # noqa: E402
from djl_handlers.media.images import image_digest  # noqa: E402
from djl_handlers.media.records import LoadedImage  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

PROMPT = "<|im_start|>user\n<image>What is in the picture?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> str:
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    return str(tiny_vlm_dir(tmp_path_factory.mktemp("vlm-llava"), "llava"))


@pytest.fixture(scope="module")
def images(llava: str) -> VllmImages:
    loaded = VllmImages.load(config(llava), llava)
    assert loaded is not None
    return loaded


def config(model: str, **options: str) -> ServingConfig:
    return ServingConfig.from_properties({"model_id": model, "rolling_batch": "vllm", **options}, engine="vllm")


def picture(shade: int) -> LoadedImage:
    image = Image.new("RGB", (300, 200), (shade, 255 - shade, 40))
    return LoadedImage(image, image_digest(image), "messages[0].content[0].image_url")


def test_a_vision_folder_gets_vllms_image_limit_and_a_text_folder_nothing(llava: str, tmp_path: Path) -> None:
    from djl_handlers.model.tiny import tiny_model_dir

    assert engine_args_kwargs(config(llava, limit_mm_per_prompt='{"image": 2}'))["limit_mm_per_prompt"] == {
        "image": 2}
    assert engine_args_kwargs(config(llava))["limit_mm_per_prompt"] == {"image": 8}  # our default
    text = str(tiny_model_dir(tmp_path / "text"))
    assert "limit_mm_per_prompt" not in engine_args_kwargs(config(text, limit_mm_per_prompt='{"image": 2}'))
    assert VllmImages.load(config(text), text) is None


def test_prompt_ids_are_the_processors_with_the_image_tokens(images: VllmImages) -> None:
    ids, media = images.encode(PROMPT, [picture(10)])
    processor_ids = images.processor(text=[PROMPT], images=[[picture(10).image]])["input_ids"][0]
    assert ids == [int(i) for i in processor_ids]
    assert isinstance(media, VllmMediaInputs) and media.tensors == {} and media.add_special_tokens is None
    assert images.image_token_id is not None
    assert media.placeholder_counts == (576,) == (ids.count(images.image_token_id),)
    assert len(ids) == len(images.processor.tokenizer.encode(PROMPT)) + 575
    _, kept = images.encode(PROMPT, [picture(10)], add_special_tokens=False)
    assert isinstance(kept, VllmMediaInputs) and kept.add_special_tokens is False


def test_a_prompt_without_placeholder_or_a_text_model_is_a_400(images: VllmImages) -> None:
    with pytest.raises(InvalidRequest) as caught:
        images.encode("<|im_start|>user\nNo image here<|im_end|>\n", [picture(10)])
    assert caught.value.field == "messages"
    with pytest.raises(InvalidRequest) as text_only:
        encode_with(None, PROMPT, [picture(10)], None)
    assert text_only.value.field == "messages"


def test_vllm_gets_the_text_the_images_and_their_pixel_digests(images: VllmImages) -> None:
    first, second = picture(10), picture(200)
    ids, media = images.encode(PROMPT, [first], add_special_tokens=True)
    request = EngineRequest(1, ids, GenerationParameters.from_dict({}), PROMPT, media=media)
    prompt = image_prompt(request)
    assert prompt["prompt"] == PROMPT and prompt["multi_modal_data"] == {"image": [first.image]}
    assert prompt["multi_modal_uuids"] == {"image": [first.digest.hex()]} != {"image": [second.digest.hex()]}
    assert tokenization_kwargs(request) == {"tokenization_kwargs": {"add_special_tokens": True}}
    _, default = images.encode(PROMPT, [first])
    assert tokenization_kwargs(EngineRequest(2, ids, request.params, PROMPT, media=default)) == {}


def test_a_count_vllm_disagrees_with_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    output: Any = SimpleNamespace(prompt_token_ids=[0] * 600)
    with caplog.at_level(logging.WARNING):
        check_prompt_count(7, 600, output)
        assert not caplog.records
        check_prompt_count(7, 591, output)
    assert "600" in caplog.text and "591" in caplog.text
