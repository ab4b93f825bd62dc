"""Vision-language chat over HTTP: ``djl-handlers serve`` with a random-weight LLaVA-style model
(:mod:`djl_handlers.model.tiny_vision`), images generated here and sent as ``data:`` URLs, from a
server on 127.0.0.1 the operator allowed, and as ``file:`` URLs from the allowed folder.

Greedy fp32 answers equal transformers' ``generate()`` with the processor's inputs; usage counts the
image tokens; the openai client streams an image request; a URL to a host not allowed, a ``file:`` URL
outside the allowed folder, a 50-megapixel image, a truncated PNG and one image too many each get a
400 naming the part while text requests sent at the same time complete.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server_harness import ServerProcess

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.slow
NEW = 12
SLOW = 3.0


def png(seed: int, size: tuple[int, int] = (336, 336)) -> bytes:
    g = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def user(*urls: str, text: str = "What is in the picture?") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


class _Images(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/slow/"):  # a slow image host: answers after SLOW seconds
            time.sleep(SLOW)
        body = self.files.get(self.path.removeprefix("/slow"))
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    _Images.files = {"/one.png": png(1)}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from djl_handlers.model.tiny_vision import tiny_vlm_dir

    return tiny_vlm_dir(tmp_path_factory.mktemp("vlm-llava"), "llava")


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("allowed-media")
    (folder / "two.png").write_bytes(png(2))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, vlm: Path, media_dir: Path) -> Iterator[ServerProcess]:
    model = tmp_path_factory.mktemp("vision-server")
    (model / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={vlm}",
        "option.rolling_batch=scheduler", "option.dtype=fp32", 'option.limit_mm_per_prompt={"image": 2}',
        "option.allowed_media_domains=127.0.0.1", f"option.allowed_local_media_path={media_dir}", ""]))
    proc = ServerProcess(model, model / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def reference_model(vlm: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(vlm), local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(str(vlm), dtype=torch.float32, local_files_only=True)
    return model.eval(), processor


def reference(reference_model: tuple[Any, Any], images: list[bytes], text: str) -> tuple[str, int]:
    """transformers' greedy answer and the processor's prompt length."""
    model, processor = reference_model
    content: list[dict[str, Any]] = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    inputs = processor(text=[prompt], images=[pictures], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    n = int(inputs["input_ids"].shape[1])
    return processor.tokenizer.decode(out[0, n:], skip_special_tokens=True), n


def chat(server: ServerProcess, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
    payload = {"model": "m", "messages": messages, "max_tokens": NEW, "temperature": 0, "ignore_eos": True, **body}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        return http.post("/v1/chat/completions", json=payload)


def test_greedy_answer_and_usage_equal_transformers(server: ServerProcess, reference_model: tuple[Any, Any]) -> None:
    res = chat(server, [user(data_url(png(1)))])
    assert res.status_code == 200, res.text
    body = res.json()
    text, prompt_tokens = reference(reference_model, [png(1)], "What is in the picture?")
    assert body["choices"][0]["message"]["content"] == text
    assert body["usage"]["prompt_tokens"] == prompt_tokens > 576  # the image's tokens count


def test_dynamic_batching_answers_image_requests_too(tmp_path: Path, vlm: Path,
                                                     reference_model: tuple[Any, Any]) -> None:
    """``option.rolling_batch=auto`` becomes dynamic batching without SERVING_FEATURES (DJL 0.36's rule):
    its image prompts step through the engine's continuous batch, with the same answers."""
    (tmp_path / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={vlm}",
        "option.rolling_batch=auto", "option.dtype=fp32", "batch_size=2", ""]))
    proc = ServerProcess(tmp_path, tmp_path / "server.log")
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            image, text = pool.submit(chat, proc, [user(data_url(png(1)))]), pool.submit(
                chat, proc, [{"role": "user", "content": "Hello"}])
            res = image.result()
            assert res.status_code == 200 and text.result().status_code == 200, res.text
    finally:
        proc.stop()
    assert res.json()["choices"][0]["message"]["content"] == reference(reference_model, [png(1)],
                                                                       "What is in the picture?")[0]


def test_two_images_and_an_earlier_turn(server: ServerProcess, reference_model: tuple[Any, Any]) -> None:
    two = chat(server, [user(data_url(png(3)), data_url(png(4)), text="Compare them.")])
    assert two.status_code == 200, two.text
    assert two.json()["choices"][0]["message"]["content"] == reference(reference_model, [png(3), png(4)],
                                                                       "Compare them.")[0]
    turns = [user(data_url(png(3))), {"role": "assistant", "content": "A picture."},
             {"role": "user", "content": "And its colours?"}]
    res = chat(server, turns)
    assert res.status_code == 200, res.text
    assert res.json()["usage"]["prompt_tokens"] > 576


def test_remote_and_local_urls_the_operator_allowed(server: ServerProcess, image_host: str, media_dir: Path) -> None:
    by_data = chat(server, [user(data_url(png(1)))]).json()["choices"][0]["message"]["content"]
    remote = chat(server, [user(f"{image_host}/one.png")])
    assert remote.status_code == 200, remote.text
    assert remote.json()["choices"][0]["message"]["content"] == by_data
    local = chat(server, [user((media_dir / "two.png").as_uri())])
    assert local.status_code == 200, local.text
    assert local.json()["choices"][0]["message"]["content"] == chat(server, [user(data_url(png(2)))]).json()[
        "choices"][0]["message"]["content"]


def test_openai_client_streams_an_image_request(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [user(data_url(png(5)))]
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=NEW, temperature=0)
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=NEW, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def _big_png() -> bytes:
    out = io.BytesIO()
    Image.new("1", (7100, 7100)).save(out, format="PNG")  # 50.4 megapixels, a few kB compressed
    return out.getvalue()


def test_bad_images_get_400s_naming_the_part_while_text_requests_complete(server: ServerProcess,
                                                                        tmp_path: Path) -> None:
    outside = tmp_path / "secret.png"
    outside.write_bytes(png(6))
    good = data_url(png(1))
    cases = {
        "host": ([user("http://images.example.com/cat.png")], "messages[0].content[0].image_url"),
        "file": ([user(outside.as_uri())], "messages[0].content[0].image_url"),
        "pixels": ([user(data_url(_big_png()))], "messages[0].content[0].image_url"),
        "truncated": ([user(data_url(png(7)[:300]))], "messages[0].content[0].image_url"),
        "count": ([user(good, good, good)], "messages[0].content[2].image_url"),
        "role": ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": good}}]},
                  user(good)], "messages[0].content[0].image_url"),
        "type": ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
                 "messages[0].content[0]"),
    }
    text = [{"role": "user", "content": "Tell me a story."}]
    with ThreadPoolExecutor(max_workers=len(cases) + 3) as pool:
        texts = [pool.submit(chat, server, text) for _ in range(3)]
        bad = {name: pool.submit(chat, server, messages) for name, (messages, _) in cases.items()}
        for name, (_, part) in cases.items():
            res = bad[name].result()
            assert res.status_code == 400, (name, res.text)
            error = res.json()["error"]
            assert error["param"] == part and part in error["message"], (name, error)
        for future in texts:
            res = future.result()
            assert res.status_code == 200, res.text
            assert res.json()["usage"]["completion_tokens"] == NEW
    assert "max_image_pixels" in bad["pixels"].result().text
    assert "allowed_media_domains" in bad["host"].result().text
    assert json.loads(bad["count"].result().text)["error"]["message"].count("limit_mm_per_prompt") == 1


def test_tgi_inline_image_links(server: ServerProcess, reference_model: tuple[Any, Any]) -> None:
    """TGI's ``![](url)`` in ``inputs`` on a vision-language model: the image where the link stood."""
    model, processor = reference_model
    payload = {"inputs": f"![]({data_url(png(8))})What is this?",
               "parameters": {"max_new_tokens": NEW, "do_sample": False}}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        res = http.post("/generate", json=payload)
        bad = http.post("/generate", json={"inputs": "![](http://images.example.com/x.png)Hi",
                                           "parameters": {"max_new_tokens": 2}})
    assert res.status_code == 200, res.text
    inputs = processor(text=[processor.image_token + "What is this?"], images=[[Image.open(io.BytesIO(png(8)))
                                                                               .convert("RGB")]], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    want = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert res.json()[0]["generated_text"] == want  # TGI answers a list
    assert bad.status_code == 400 and "inputs.images[0]" in bad.text


def test_async_mode_fetches_off_the_engine_loop(tmp_path: Path, vlm: Path, image_host: str) -> None:
    """In async mode an image is fetched on a worker thread: a text request sent while a slow image
    host keeps an image request waiting completes first."""
    (tmp_path / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={vlm}",
        "option.async_mode=true", "option.dtype=fp32", "option.allowed_media_domains=127.0.0.1", ""]))
    proc = ServerProcess(tmp_path, tmp_path / "server.log")
    try:
        assert chat(proc, [{"role": "user", "content": "Warm up"}]).status_code == 200
        done: list[str] = []
        with ThreadPoolExecutor(max_workers=2) as pool:
            slow = pool.submit(lambda: (chat(proc, [user(f"{image_host}/slow/one.png")]), done.append("image"))[0])
            time.sleep(SLOW / 3)
            text = pool.submit(lambda: (chat(proc, [{"role": "user", "content": "Hi"}]), done.append("text"))[0])
            assert slow.result().status_code == 200 and text.result().status_code == 200
    finally:
        proc.stop()
    assert done == ["text", "image"]


def test_sync_rolling_mode_prepares_images_beside_the_batch(server: ServerProcess, image_host: str) -> None:
    """In sync rolling mode a request waits for its images off the step thread: a text request sent
    while a slow image host keeps an image request waiting completes first, and both answer."""
    done: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(lambda: (chat(server, [user(f"{image_host}/slow/one.png")]), done.append("image"))[0])
        time.sleep(SLOW / 3)
        text = pool.submit(lambda: (chat(server, [{"role": "user", "content": "Hi"}]), done.append("text"))[0])
        assert slow.result().status_code == 200 and text.result().status_code == 200
    assert done == ["text", "image"]
    assert slow.result().json()["choices"][0]["message"]["content"] == chat(server, [user(data_url(png(1)))]).json()[
        "choices"][0]["message"]["content"]
