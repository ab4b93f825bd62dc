"""Sync rolling mode prepares a request's images on a pool thread: the request holds its place in
the batch with empty records while its neighbours decode, joins the engine once ready, and a refused
image (or a cancel) ends it alone. The fake engine with a byte tokenizer; its ``encode_media`` here
stands in for a model's processor (one placeholder token per image), the media layer is the real one."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from djl_handlers.config.media import MediaOptions
from djl_handlers.dialects.registry import get_formatter
from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.media.records import ImageRef, LoadedImage, MediaInputs
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.request.records import Request
from djl_handlers.scheduling.preparing import PreparingSlot
from djl_handlers.scheduling.rolling import RollingBatch

Image = pytest.importorskip("PIL.Image")


class ImageFakeEngine(FakeEngine):
    """The fake engine as a vision-language model: each image is one token (byte 0) before the text;
    ``gate`` holds the processor until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.media_options = MediaOptions()
        self.gate = threading.Event()

    def encode_media(self, prompt: str, images: Sequence[LoadedImage],
                     add_special_tokens: bool | None = None) -> tuple[list[int], MediaInputs]:
        assert self.gate.wait(10)
        return [0] * len(images) + self.tokenizer.encode(prompt), MediaInputs(images=tuple(images))


def png_url(valid: bool = True) -> str:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, format="PNG")
    data = out.getvalue() if valid else out.getvalue()[:40]
    return "data:image/png;base64," + base64.b64encode(data).decode()


def request(text: str, image: str | None = None, new: int = 5) -> Request:
    media = (ImageRef(image, "messages[0].content[0].image_url"),) if image else ()
    return Request(prompt=text, params=GenerationParameters.from_dict({"max_new_tokens": new}), media=media)


def batch_of(engine: FakeEngine) -> RollingBatch:
    return RollingBatch(engine, lambda r: get_formatter("json", stream=True))


def texts(records: list[tuple[dict[str, Any], str]]) -> list[str]:
    return [str(r["data"]) for r, _ in records]


def test_an_image_request_waits_beside_a_decoding_neighbour_then_joins() -> None:
    engine = ImageFakeEngine()
    batch = batch_of(engine)
    text = batch.add_request(request("hello"))
    waiting = batch.add_request(request("look", png_url()))
    assert isinstance(waiting, PreparingSlot)
    for _ in range(3):
        records = batch.step()
        assert records[1][0]["data"] == "" and not records[1][0]["last"]  # waiting: empty records
    assert text.output.tokens and batch.slots[1] is waiting and not waiting.finished
    engine.gate.set()
    waiting.future.result(timeout=10)
    records = batch.step()
    assert batch.slots[-1] is not waiting  # the real slot took its place
    shown = texts(records)
    while batch.slots:
        records = batch.step()
        shown += [str(r["data"]) for r, _ in records[-1:]]
    assert REPLY[:5] in "".join(shown)  # the image request answered too


def test_a_refused_image_ends_only_its_request() -> None:
    engine = ImageFakeEngine()
    engine.gate.set()
    batch = batch_of(engine)
    batch.add_request(request("hello", new=8))
    bad = batch.add_request(request("look", png_url(valid=False)))
    assert isinstance(bad, PreparingSlot)
    bad.future.exception(timeout=10)
    records = batch.step()
    assert records[1][0]["last"] and records[1][0]["code"] == 400
    assert "messages[0].content[0].image_url" in records[1][0]["error"]
    assert not records[0][0]["last"] and len(batch.slots) == 1


def test_a_cancelled_preparing_request_never_reaches_the_engine() -> None:
    engine = ImageFakeEngine()
    batch = batch_of(engine)
    waiting = batch.add_request(request("look", png_url()))
    batch.cancel(0)
    records = batch.step()
    assert records[0][0]["last"] and not batch.slots
    engine.gate.set()
    waiting.future.result(timeout=10)
    assert batch.step() == [] and not engine.has_unfinished()
