"""vLLM's own serving benchmark (``vllm bench serve``, random dataset) as a client of
``djl-handlers serve`` on the embedded model (HF engine): every request succeeds.

The benchmark sends vLLM's extra request fields (``ignore_eos: true`` for the random dataset,
``repetition_penalty``, ``stream_options``), reads ``/v1/models`` when no model is named, and aligns
its prompts through ``/tokenize`` and ``/detokenize``. The ``vllm`` command of ``.venv-vllm`` cannot
read its own version, so the benchmark's ``main`` is called with its own argument parser, as the
command would. Bounded: a few short requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from integration.test_server_harness import ROOT, ServerProcess

pytestmark = pytest.mark.slow

PROMPTS, INPUT_LEN, OUTPUT_LEN = 6, 24, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    log = tmp_path_factory.mktemp("vllm-bench") / "server.log"
    proc = ServerProcess(ROOT / "serving.properties.examples" / "hf-rolling-batch", log)
    yield proc
    proc.stop()


def _bench(*argv: str) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result: dict[str, Any] = main(parser.parse_args(list(argv)))
    return result


def test_vllm_bench_serve_random_dataset_succeeds(server: ServerProcess, embedded_dir: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench(
        "--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--tokenizer", str(embedded_dir),  # no --model: the benchmark asks /v1/models
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(PROMPTS), "--max-concurrency", "3", "--seed", "7", "--disable-tqdm",
        "--temperature", "0",
    )
    printed = capsys.readouterr().out
    assert result["completed"] == PROMPTS, result.get("errors")
    assert result.get("failed", 0) == 0
    assert not any(result.get("errors", []))
    # ignore_eos was honoured: every request ran to its full length
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    assert "/tokenize unavailable" not in printed  # the prompts were aligned through our /tokenize
    with server.client() as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == server.name
