"""``djl-handlers check`` and ``generate`` (in process, no server) with the fake models."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_server_harness import MODELS, ROOT, cli_command, cli_env, copy_model

from djl_handlers.cli import default_model_dir, main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=cli_env(), cwd=str(ROOT),
                          timeout=120)


def test_check_prints_resolved_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(MODELS / "fake_rolling")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entryPoint"] == "model.py"
    assert report["mode"] == "rolling"
    assert report["maxRollingBatchSize"] == 4
    assert report["options"]["fake_flag"] == "on"


def test_check_builds_serving_config_for_our_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "serving.properties").write_text(
        "option.entryPoint=djl_handlers.huggingface\noption.model_id=/nowhere\noption.rolling_batch=auto\n")
    assert main(["check", str(tmp_path / "m")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["servingConfig"]["engine"] == "huggingface"


def test_check_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = copy_model(tmp_path, "fake_dynamic", "max_batch_delay=soon")
    assert main(["check", str(broken)]) == 1
    assert "max_batch_delay" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 1
    assert "entry" in capsys.readouterr().err.lower()
    bad_import = copy_model(tmp_path, "fake_failing")
    (bad_import / "model.py").write_text("import no_such_module_qq\n")
    assert main(["check", str(bad_import)]) == 1
    assert "no_such_module_qq" in capsys.readouterr().err


def test_generate_rolling_drives_steps_until_last() -> None:
    result = _run("generate", str(MODELS / "fake_rolling"), '{"inputs": "gen", "parameters": {"max_new_tokens": 3}}')
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line]
    assert [(line["prompt"], line["token"]) for line in lines] == [("gen", 0), ("gen", 1), ("gen", 2)]


def test_generate_rolling_error_exits_1() -> None:
    result = _run("generate", str(MODELS / "fake_rolling"), '{"inputs": "x", "parameters": {"fail_at": 0}}')
    assert result.returncode == 1
    assert result.stdout.strip() == '{"error":"fake failure at token 0","code":424}'


def test_generate_dynamic_and_streaming() -> None:
    echo = _run("generate", str(MODELS / "fake_dynamic"), '{"inputs": "e"}', "--stream")
    assert echo.returncode == 0, echo.stderr
    body = json.loads(echo.stdout)
    assert json.loads(body["content"]["data"]) == {"inputs": "e", "stream": True}
    assert body["init"]["fake_flag"] == "dyn"
    streamed = _run("generate", str(MODELS / "fake_streaming"), '{"inputs": "p q"}')
    assert [json.loads(line) for line in streamed.stdout.splitlines() if line] == [{"outputs": "p"}, {"outputs": "q"}]


def test_generate_init_failure() -> None:
    result = _run("generate", str(MODELS / "fake_failing"), "{}")
    assert result.returncode == 1
    assert "fake init failure" in result.stderr


def test_default_model_dir_is_the_rolling_example() -> None:
    assert default_model_dir().name == "hf-rolling-batch"
    assert default_model_dir().parent.name in ("serving.properties.examples", "examples")
