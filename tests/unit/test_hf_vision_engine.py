"""Vision-language models on the HF engine's continuous batch: greedy fp32 answers to image prompts
equal transformers' ``generate()`` with the processor's inputs, with image and text rows in one batch,
a prompt prefilled in chunks, and the prefix cache on (the same image reuses its blocks; another image
with the same token ids never does). Random-weight models built at a fixed seed
(:mod:`djl_handlers.model.tiny_vision`), images generated here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.config.models import ServingConfig  # noqa: E402
from djl_handlers.engines.base import EngineRequest  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import InvalidRequest  # noqa: E402
from djl_handlers.media.images import image_digest  # noqa: E402
from djl_handlers.media.records import LoadedImage  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

NEW = 10
ARCHS = ("llava", "idefics3")


@pytest.fixture(scope="module", params=ARCHS)
def vlm_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    return tiny_vlm_dir(tmp_path_factory.mktemp(f"vlm-{request.param}"), request.param)


def engine_for(model_dir: Path, **options: str) -> HFEngine:
    props = {"model_id": str(model_dir), "dtype": "fp32", "rolling_batch": "auto", **options}
    return HFEngine.from_config(ServingConfig.from_properties(props))


@pytest.fixture(scope="module")
def engine(vlm_dir: Path) -> HFEngine:
    return engine_for(vlm_dir)


def picture(seed: int, size: tuple[int, int] = (336, 336)) -> LoadedImage:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels)
    return LoadedImage(image, image_digest(image), f"messages[0].content[{seed}].image_url")


def prompt_of(engine: HFEngine, images: int, text: str = "Describe the picture.") -> str:
    content: list[dict[str, Any]] = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    return str(engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def reference(engine: HFEngine, prompt: str, images: list[LoadedImage]) -> list[int]:
    """transformers' greedy generate() with the processor's inputs, one request alone."""
    assert engine.vision is not None
    inputs = engine.vision.processor(text=[prompt], images=[[i.image for i in images]], return_tensors="pt")
    with torch.inference_mode():
        out = engine.model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    return [int(t) for t in out[0, inputs["input_ids"].shape[1]:]]


def run(engine: HFEngine, requests: list[EngineRequest]) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.add_request(r)
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(out.token_id)
            if len(got[out.request_id]) == NEW:
                engine.release(out.request_id)
    return got


def image_request(engine: HFEngine, rid: int, prompt: str, images: list[LoadedImage]) -> EngineRequest:
    ids, media = engine.encode_media(prompt, images)
    return EngineRequest(rid, ids, GenerationParameters.from_dict({"max_new_tokens": NEW}), media=media)


def text_request(engine: HFEngine, rid: int, text: str) -> EngineRequest:
    ids = engine.tokenizer.encode(text)
    return EngineRequest(rid, ids, GenerationParameters.from_dict({"max_new_tokens": NEW}))


def test_image_and_text_rows_in_one_batch_equal_generate(engine: HFEngine) -> None:
    one, two = prompt_of(engine, 1), prompt_of(engine, 2, "Compare them.")
    a, b, c = picture(1), picture(2), picture(3, (600, 120))  # Idefics3: a wide image is fewer tiles
    got = run(engine, [image_request(engine, 1, one, [a]), image_request(engine, 2, two, [b, c]),
                       text_request(engine, 3, "A plain text prompt"), image_request(engine, 4, one, [b])])
    assert got[1] == reference(engine, one, [a])
    assert got[2] == reference(engine, two, [b, c])
    assert got[4] == reference(engine, one, [b])
    text_ids = engine.tokenizer.encode("A plain text prompt")
    with torch.inference_mode():
        alone = engine.model.generate(input_ids=torch.tensor([text_ids]), max_new_tokens=NEW, do_sample=False)
    assert got[3] == alone[0, len(text_ids):].tolist()
    assert got[1] != got[4]  # the same prompt with another image: the pixels reach the model


def test_image_tokens_follow_the_image_size_where_the_processor_tiles(engine: HFEngine) -> None:
    """Idefics3/SmolVLM split an image into tiles by its size (dynamic resolution); LLaVA resizes."""
    prompt = prompt_of(engine, 1)
    square = engine.encode_media(prompt, [picture(1)])[0]
    wide = engine.encode_media(prompt, [picture(1, (600, 120))])[0]
    if engine.vision is not None and engine.vision.model_type == "idefics3":
        assert len(wide) < len(square)
    else:
        assert len(wide) == len(square)


def test_usage_counts_image_tokens(engine: HFEngine) -> None:
    assert engine.vision is not None
    prompt = prompt_of(engine, 1)
    ids, media = engine.encode_media(prompt, [picture(5)])
    text_only = engine.tokenizer.encode(prompt)
    image_tokens = sum(1 for t in ids if t == engine.vision.image_token_id)
    assert image_tokens > 16 and len(ids) >= len(text_only) + image_tokens - 1
    assert sum(media.placeholder_counts or (image_tokens,)) == image_tokens


def test_chunked_prefill_of_an_image_prompt_equals_generate(vlm_dir: Path) -> None:
    small = engine_for(vlm_dir, max_prefill_tokens="32")  # the image's tokens span several chunks
    prompt = prompt_of(small, 1)
    image = picture(7)
    request = image_request(small, 1, prompt, [image])
    assert len(request.prompt_ids) > 64
    assert run(small, [request, text_request(small, 2, "Another one")])[1] == reference(small, prompt, [image])


def test_prefix_cache_reuses_the_same_image_never_another(vlm_dir: Path) -> None:
    cached = engine_for(vlm_dir, enable_prefix_caching="true")
    cache = cached.prefix_cache
    assert cache is not None
    prompt = prompt_of(cached, 1)
    first, other = picture(11), picture(12)
    want_first, want_other = reference(cached, prompt, [first]), reference(cached, prompt, [other])
    assert run(cached, [image_request(cached, 1, prompt, [first])])[1] == want_first
    before = cache.hits
    assert run(cached, [image_request(cached, 2, prompt, [other])])[2] == want_other
    ids = image_request(cached, 9, prompt, [other]).prompt_ids
    assert cached.vision is not None
    first_image_token = list(ids).index(cached.vision.image_token_id)
    assert cache.hits - before <= first_image_token  # at most the text before the image came from the cache
    before = cache.hits
    assert run(cached, [image_request(cached, 3, prompt, [first])])[3] == want_first
    assert cache.hits - before >= len(ids) - 2 * cache.block  # the same image and prompt: nearly all of it


def test_a_text_model_refuses_images(tmp_path: Path) -> None:
    from djl_handlers.model.tiny import tiny_model_dir

    text = engine_for(tiny_model_dir(tmp_path / "tiny"))
    with pytest.raises(InvalidRequest) as caught:
        text.encode_media("hi", [picture(1)])
    assert caught.value.field == "messages"
