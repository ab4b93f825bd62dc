"""``option.kv_cache_dtype=float16`` served through ``djl-handlers serve`` and DJL Serving 0.36's real front
end in async mode.

One model directory (the tiny model, fp32 weights, a 16-bit KV cache, greedy) is served by both. Each
server must log the 16-bit cache and answer two concurrent prompts with the tokens of the in-process
engine built from the same options; ``djl-handlers serve`` also reports half of fp32's bytes per cached
token on ``/metrics``. So the option reaches the engine through both front ends, and a served row gets
the tokens it gets in process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from djl_server_fixture import (  # noqa: F401  (djl_server_fixture registers the fixture)
    DjlServerFactory,
    djl_server_fixture,
    requires_djl_036,
)
from test_server_harness import ServerProcess, greedy_replies

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow]

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.kv_cache_dtype=float16
option.predict_timeout=120
option.max_rolling_batch_size=4
minWorkers=1
maxWorkers=1
"""
MODES = {"sync": "option.rolling_batch=scheduler\n", "async": "option.async_mode=true\n"}
PROMPTS = ("The capital of France is", "Deep learning is")
NEW = 8
KV_LOG = "KV cache in float16 under the model's float32 (option.kv_cache_dtype)"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("kv16")
    dirs = {}
    for mode, extra in MODES.items():
        folder = root / f"kv16-{mode}"
        folder.mkdir()
        (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir.resolve()) + extra, encoding="utf-8")
        dirs[mode] = folder
    return dirs


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> tuple[list[list[int]], int]:  # noqa: F811
    """Greedy tokens of each prompt on the in-process engine with the same options, and its bytes per token."""
    from engine_runs import engine_tokens

    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine

    props = {"model_id": str(tiny_dir), "dtype": "fp32", "rolling_batch": "scheduler", "kv_cache_dtype": "float16"}
    engine = HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))
    fp32 = HFEngine.from_config(ServingConfig.from_properties({**props, "kv_cache_dtype": "auto"},
                                                              engine="huggingface"))
    assert engine.kv_bytes_per_token * 2 == fp32.kv_bytes_per_token
    tok = engine.tokenizer
    got = engine_tokens(engine.model, tok, [tok.encode(p) for p in PROMPTS], [NEW] * len(PROMPTS))
    return [got[i][:NEW] for i in range(len(PROMPTS))], engine.kv_bytes_per_token


def _ask(url: str) -> list[list[int]]:
    """Both prompts at once; each reply's token ids."""
    return [ids for ids, _ in greedy_replies(url, PROMPTS, NEW)]


def test_djl_handlers_serve_keeps_a_16_bit_cache(model_dirs: dict[str, Path], reference: tuple[list[list[int]], int],
                                                   tmp_path: Path) -> None:
    tokens, per_token = reference
    server = ServerProcess(model_dirs["sync"], tmp_path / "server.log", env={"HF_HUB_OFFLINE": "1"}, start_timeout=300)
    try:
        served = _ask(server.url)
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    assert served == tokens, json.dumps([served, tokens])
    assert KV_LOG in server.log_path.read_text(encoding="utf-8")
    found = re.search(r"^djl_handlers_kv_cache_bytes_per_token(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    assert found is not None and float(found.group(1)) == per_token, metrics[-2000:]


@pytest.mark.djl
@requires_djl_036
def test_djl_036_async_mode_keeps_a_16_bit_cache(request: pytest.FixtureRequest, model_dirs: dict[str, Path],
                                                 reference: tuple[list[list[int]], int]) -> None:
    djl_server: DjlServerFactory = request.getfixturevalue("djl_server")  # one live DJL server per session
    server = djl_server(model_dirs["async"], version="0.36")
    assert server.model_settings().get("option.kv_cache_dtype") == "float16"
    served = _ask(server.url)
    assert served == reference[0], json.dumps([served, reference[0]])
    assert server.log_path is not None
    assert KV_LOG in server.log_path.read_text(encoding="utf-8", errors="replace")
