"""Image parts in OpenAI chat requests: what the parser reads (the template's content items, the
references named by their parts), what it refuses with a 400 naming the part, the per-prompt limit,
and ``djl-handlers check``'s multimodal section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.dialects.openai.request import chat_to_lmi
from djl_handlers.errors import InvalidRequest
from djl_handlers.media.records import ImageRef
from djl_handlers.media.refs import check_image_count

URL = "data:image/png;base64,iVBORw0KGgo="


def template(messages: list[dict[str, Any]], **_: Any) -> str:
    """A stand-in chat template that shows what it was given."""
    return json.dumps(messages)


def image(url: str = URL, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def test_image_parts_become_template_items_and_named_references() -> None:
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [image(), {"type": "text", "text": "What is this?"}, image("http://h/x.png",
                                                                                               detail="low")]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": "file:///m/y.png"}]},
    ]}
    req = chat_to_lmi(body, template)
    rendered = json.loads(req.prompt)
    assert rendered[1]["content"] == [{"type": "image"}, {"type": "text", "text": "What is this?"}, {"type": "image"}]
    assert rendered[2]["content"] == "A cat." and rendered[3]["content"] == [{"type": "image"}]
    assert req.media == (ImageRef(URL, "messages[1].content[0].image_url"),
                         ImageRef("http://h/x.png", "messages[1].content[2].image_url", "low"),
                         ImageRef("file:///m/y.png", "messages[3].content[0].image_url"))


def test_text_only_parts_stay_one_string() -> None:
    req = chat_to_lmi({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}]}, template)
    assert json.loads(req.prompt)[0]["content"] == "ab" and req.media == ()


@pytest.mark.parametrize(("content", "role", "field", "words"), [
    ([image("")], "user", "messages[0].content[0].image_url", "non-empty string"),
    ([image(detail="max")], "user", "messages[0].content[0].image_url.detail", "auto, low, high"),
    ([{"type": "input_audio", "input_audio": {}}], "user", "messages[0].content[0]", "'text' and 'image_url'"),
    ([{"text": "no type"}], "user", "messages[0].content[0]", "'type'"),
    ([{"type": "text", "text": 3}], "user", "messages[0].content[0]", "must be a string"),
    ([image()], "assistant", "messages[0].content[0].image_url", "user messages only"),
])
def test_bad_parts_name_the_part(content: list[Any], role: str, field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat_to_lmi({"messages": [{"role": role, "content": content}]}, template)
    assert caught.value.field == field and words in caught.value.message


def test_image_count_limit_names_the_first_extra_part() -> None:
    refs = [ImageRef(URL, f"messages[0].content[{i}].image_url") for i in range(3)]
    check_image_count(refs[:2], 2)
    with pytest.raises(InvalidRequest) as caught:
        check_image_count(refs, 2)
    assert caught.value.field == "messages[0].content[2].image_url" and "limit_mm_per_prompt" in caught.value.message
    with pytest.raises(InvalidRequest) as text_only:
        check_image_count(refs[:1], 0)
    assert text_only.value.field == "messages[0].content[0].image_url" and "text only" in text_only.value.message


def test_check_shows_whether_a_model_takes_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from djl_handlers.cli import main

    vlm = tmp_path / "vlm"
    vlm.mkdir()
    config = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vision_config": {},
              "text_config": {}, "image_token_id": 7}
    (vlm / "config.json").write_text(json.dumps(config))
    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={vlm}",
        'option.limit_mm_per_prompt={"image": 3}', "option.allowed_media_domains=images.example.com", ""]))
    assert main(["check", str(model)]) == 0
    shown = json.loads(capsys.readouterr().out)["multimodal"]
    assert shown["images"] is True and shown["modelType"] == "llava"
    assert shown["limitMmPerPrompt"] == {"image": 3} and shown["allowedMediaDomains"] == ["images.example.com"]
    assert shown["maxImagePixels"] > 0 and shown["allowedLocalMediaPath"] is None
