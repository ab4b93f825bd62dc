"""``option.quantize=dynamic_int8`` served through DJL Serving's real front ends and ``djl-handlers serve``.

One model directory (the embedded model, fp32 weights quantized to int8 at load, greedy) is served
by DJL Serving 0.34 and 0.36 in sync rolling mode (``option.rolling_batch=scheduler``), by 0.36 in
async mode (``option.async_mode=true``) and by ``djl-handlers serve``. Each server must log the int8
layers and answer two concurrent prompts with the tokens and text of the in-process int8 engine
(which itself equals ``generate()`` of the int8 model, one prompt at a time): the same greedy text
on all of them, so the option reaches the loader through every front end. Each worker also logs the
OpenMP waiting it runs with: the worker's default on every front end, DJL's included, where the service
sets it in its own process before torch loads (djl_handlers/openmp.py). Both prompts' int8 texts
part from fp32's within these 8 tokens on the embedded model (measured on an AVX2 CPU), so a front
end that dropped the option would fail the comparison as well as the log check.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest_models import embedded_dir  # noqa: F401
from djl_server_fixture import (  # noqa: F401  (djl_server_fixture registers the fixture)
    DjlServerFactory,
    djl_server_fixture,
    requires_djl,
    requires_djl_036,
)
from test_server_harness import ServerProcess, greedy_replies

pytest.importorskip("torch")
pytestmark = [pytest.mark.djl, pytest.mark.slow]

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.quantize=dynamic_int8
option.predict_timeout=120
option.max_rolling_batch_size=4
minWorkers=1
maxWorkers=1
"""
MODES = {"sync": "option.rolling_batch=scheduler\n", "async": "option.async_mode=true\n"}
PROMPTS = ("The capital of France is", "Deep learning is")
NEW = 8
INT8_LOG = "as int8 (option.quantize=dynamic_int8"
OPENMP_LOG = "OpenMP waiting: GOMP_SPINCOUNT=20000"  # djl_handlers.openmp, unless the environment chose
Served = list[tuple[list[int], str]]  # per prompt: new token ids, generated text


def _int8_unavailable() -> str | None:
    from djl_handlers.engines.hf.cpu import int8

    return int8.unavailable_reason()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> dict[str, Path]:  # noqa: F811
    reason = _int8_unavailable()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("djl-int8")
    dirs = {}
    for mode, extra in MODES.items():
        folder = root / f"int8-{mode}"
        folder.mkdir()
        (folder / "serving.properties").write_text(PROPS.format(model=embedded_dir.resolve()) + extra,
                                                   encoding="utf-8")
        dirs[mode] = folder
    return dirs


@pytest.fixture(scope="module")
def reference(embedded_dir: Path) -> Served:  # noqa: F811
    """Greedy tokens and text of each prompt on the in-process int8 engine (equal to ``generate()``)."""
    from engine_runs import engine_tokens, generate_tokens

    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine

    props = {"model_id": str(embedded_dir), "dtype": "fp32", "rolling_batch": "scheduler", "quantize": "dynamic_int8"}
    engine = HFEngine.from_config(ServingConfig.from_properties(props, engine="huggingface"))
    assert "int8" in engine.cpu_patches["cpu_linear"], engine.cpu_patches
    tok = engine.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    got = engine_tokens(engine.model, tok, prompts, [NEW] * len(prompts))
    alone = generate_tokens(engine.model, prompts, [NEW] * len(prompts))
    tokens = [got[i][:NEW] for i in range(len(prompts))]
    for mine, theirs in zip(tokens, alone, strict=True):  # generate() holds eos off (min_new_tokens): compare
        end = next((j for j, t in enumerate(mine) if t in engine.eos_token_ids), NEW)  # up to an eos
        assert end >= 2 and mine[:end] == theirs[:end], (mine, theirs)
    return [(ids, tok.decode(ids, skip_special_tokens=True)) for ids in tokens]


def _ask(url: str) -> Served:
    """Both prompts at once; each reply's token ids and text."""
    return greedy_replies(url, PROMPTS, NEW)


Serve = Callable[[pytest.FixtureRequest, dict[str, Path], Path], tuple[Served, str]]


def _serve_djl(version: str, mode: str) -> Serve:
    def serve(request: pytest.FixtureRequest, dirs: dict[str, Path], _: Path) -> tuple[Served, str]:
        djl_server: DjlServerFactory = request.getfixturevalue("djl_server")  # one live DJL server per session
        server = djl_server(dirs[mode], version=version)
        settings = server.model_settings()
        assert settings.get("option.quantize") == "dynamic_int8", settings
        served = _ask(server.url)
        assert server.log_path is not None
        return served, server.log_path.read_text(encoding="utf-8", errors="replace")
    return serve


def _serve_ours(_: pytest.FixtureRequest, dirs: dict[str, Path], tmp: Path) -> tuple[Served, str]:
    server = ServerProcess(dirs["sync"], tmp / "server.log", env={"HF_HUB_OFFLINE": "1"}, start_timeout=300)
    try:
        served = _ask(server.url)
    finally:
        server.stop()
    return served, server.log_path.read_text(encoding="utf-8")


SERVERS = [
    pytest.param(_serve_ours, id="djl-handlers-serve"),
    pytest.param(_serve_djl("0.34", "sync"), id="djl-0.34-sync", marks=requires_djl),
    pytest.param(_serve_djl("0.36", "sync"), id="djl-0.36-sync", marks=requires_djl_036),
    pytest.param(_serve_djl("0.36", "async"), id="djl-0.36-async", marks=requires_djl_036),
]


@pytest.mark.parametrize("serve", SERVERS)
def test_int8_serves_the_in_process_int8_greedy_text(
    serve: Serve, request: pytest.FixtureRequest, model_dirs: dict[str, Path], reference: Served, tmp_path: Path,
) -> None:
    served, log = serve(request, model_dirs, tmp_path)
    assert INT8_LOG in log, log[-3000:]
    if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        assert OPENMP_LOG in log, log[-3000:]
    assert [ids for ids, _ in served] == [ids for ids, _ in reference], json.dumps([served, reference])
    assert [text for _, text in served] == [text for _, text in reference]
