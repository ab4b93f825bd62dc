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
        f"option.entryPoint=djl_handlers.huggingface\noption.model_id={tmp_path}\noption.rolling_batch=auto\n")
    assert main(["check", str(tmp_path / "m")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["servingConfig"]["engine"] == "huggingface"
    assert report["warnings"] == []


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


def _hf_dir(tmp_path: Path, *lines: str) -> Path:
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    text = "\n".join(["option.entryPoint=djl_handlers.huggingface", f"option.model_id={tmp_path}", *lines])
    (model / "serving.properties").write_text(text + "\n", encoding="utf-8")
    return model


def test_check_warns_about_every_key_nothing_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _hf_dir(tmp_path, "engine=Python", "option.dtpye=bf16", "option.max_rolling_batchsize=4",
                    "option.rolling_bach=disable", "batchsize=4", "option.pythonExecutable=python3", "minWorkers=1")
    assert main(["check", str(model)]) == 0
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if line.startswith("djl-handlers: warning: ")]
    assert len(warned) == 4, captured.err
    typos = [("option.dtpye", "option.dtype"), ("option.max_rolling_batchsize", "option.max_rolling_batch_size"),
             ("option.rolling_bach", "option.rolling_batch"), ("batchsize", "batch_size")]
    for typo, meant in typos:
        assert any(line.split("warning: ")[1].startswith(typo + " ") and f"did you mean {meant}" in line
                   for line in warned), (typo, warned)
    assert len(json.loads(captured.out)["warnings"]) == 4


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("engine=Pyhton", "engine='Pyhton' is invalid"),
        ("option.output_formatter=jsonl", "unknown output_formatter 'jsonl'"),
        ("option.model_id=/no/such/weights", "option.model_id='/no/such/weights': no such folder"),
        ("option.embedded_model=tinyllama", "option.embedded_model='tinyllama' is invalid"),
    ],
)
def test_check_fails_on_what_init_would_reject(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
                                               message: str) -> None:
    model = _hf_dir(tmp_path)
    with open(model / "serving.properties", "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    if line.startswith("option.embedded_model"):
        (model / "serving.properties").write_text(
            "option.entryPoint=djl_handlers.huggingface\n" + line + "\n", encoding="utf-8")
    assert main(["check", str(model)]) == 1
    assert message in capsys.readouterr().err


def test_check_model_py_without_handle_falls_back_like_djl(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.py").write_text("def output_formatter(out):\n    return ''\n", encoding="utf-8")
    (model / "serving.properties").write_text("engine=Python\n", encoding="utf-8")
    assert main(["check", str(model)]) == 1
    err = capsys.readouterr().err
    assert "has no function 'handle', and nothing to fall back to" in err and "option.model_id" in err
    (model / "serving.properties").write_text(f"engine=Python\noption.model_id={tmp_path}\n", encoding="utf-8")
    assert main(["check", str(model)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["entryPoint"], report["recommendedEntryPoint"]) == ("model.py", "djl_handlers.huggingface")
    assert report["servingConfig"]["engine"] == "huggingface"


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


def test_a_config_the_engine_cannot_load_fails_in_a_sentence(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An encoder-decoder folder on the generation engine: check says what and why in a sentence; the
    full list of loadable classes (hundreds) only with --verbose. A vision-language folder loads (its
    own class): check shows it takes images."""
    transformers = pytest.importorskip("transformers")
    vision = tmp_path / "llava"
    transformers.LlavaConfig().save_pretrained(str(vision))
    assert main(["check", str(_hf_dir(vision, "option.rolling_batch=scheduler"))]) == 0
    assert '"images": true' in capsys.readouterr().out
    transformers.T5Config().save_pretrained(str(tmp_path))
    model = _hf_dir(tmp_path, "option.rolling_batch=scheduler")
    assert main(["check", str(model)]) == 1
    short = capsys.readouterr().err
    assert "T5Config" in short and "causal LM" in short and "--verbose" in short
    assert len(short) < 500 and "LlamaConfig" not in short
    assert main(["check", "--verbose", str(model)]) == 1
    full = capsys.readouterr().err
    assert "LlamaConfig" in full and full.count("Config,") > 50


def test_the_loader_shortens_transformers_list_of_classes(tmp_path: Path) -> None:
    from djl_handlers.engines.hf.loader import short_reason

    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    listed = ValueError("Unrecognized configuration class <class 'transformers.models.bert.configuration_bert."
                        "BertConfig'> for this kind of AutoModel: AutoModelForCausalLM.\nModel type should be one of "
                        + ", ".join(f"Model{i}Config" for i in range(250)))
    text = short_reason(listed, str(tmp_path))
    assert text.startswith("its config is BertConfig (model_type 'bert')") and "option.task" in text
    assert "Model7Config" not in text and len(text) < 400
    assert short_reason(OSError("no such file"), str(tmp_path)) == "no such file"
