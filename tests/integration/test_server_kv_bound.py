"""``djl-handlers serve`` with ``option.kv_cache_memory_bytes`` (tiny random Llama, fp32, greedy): a
request that could never fit the KV bound gets a 507 naming the option while its neighbours answer;
concurrent requests beyond the bound wait their turn and answer as each would alone; ``/metrics``
shows the bytes per cached token and the bound."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess
from test_server_observability import scrape, total

pytestmark = pytest.mark.slow

PER_TOKEN = 2 * 2 * 2 * 16 * 4  # the tiny model: 2 layers x keys and values x 2 KV heads x 16 dims x fp32
BOUND = 200 * PER_TOKEN  # 200 cached tokens: two of the requests below at once, not three
PROPS = f"""engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={{model}}
option.dtype=fp32
option.rolling_batch=scheduler
option.max_rolling_batch_size=8
option.kv_cache_memory_bytes={BOUND}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    root = tmp_path_factory.mktemp("kv-bound")
    folder = root / "model"
    folder.mkdir()
    (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir))
    started = ServerProcess(folder, root / "server.log")
    try:
        yield started
    finally:
        started.stop()


def _post(server: ServerProcess, body: dict[str, Any]) -> tuple[int, Any]:
    with server.client() as client:
        response = client.post("/invocations", json=body)
    return response.status_code, response.json()


def _body(prompt: str, new: int) -> dict[str, Any]:
    return {"inputs": prompt, "parameters": {"max_new_tokens": new, "do_sample": False, "details": True}}


def test_a_request_that_can_never_fit_gets_507_naming_the_option(server: ServerProcess) -> None:
    status, body = _post(server, _body("Deep learning is", 400))
    assert status == 507, body
    assert "option.kv_cache_memory_bytes" in str(body) and "lower max_new_tokens" in str(body)
    status, body = _post(server, _body("Deep learning is", 8))  # a neighbour that fits answers
    assert status == 200 and body["details"]["generated_tokens"] == 8


def test_requests_beyond_the_bound_wait_and_answer_as_alone(server: ServerProcess) -> None:
    prompts = ["Deep learning is", "The capital of France is", "Hello there", "One two three", "Paris"]
    alone = [_post(server, _body(p, 80))[1]["generated_text"] for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: _post(server, _body(p, 80)), prompts))
    assert [status for status, _ in together] == [200] * len(prompts)
    assert [body["generated_text"] for _, body in together] == alone


def test_metrics_show_bytes_per_token_and_the_bound(server: ServerProcess) -> None:
    assert _post(server, _body("Hello", 4))[0] == 200
    seen = scrape(server)
    assert total(seen, "kv_cache_bytes_per_token") == PER_TOKEN
    assert total(seen, "kv_cache_max_bytes") == BOUND
