"""LoRA adapter plumbing without a model: DJL's adapter calls, the registry, request selection.

The engine here is a recording stub (the HF engine's LoRA is tested in
tests/integration/test_lora_hf.py, the HTTP API in tests/integration/test_server_lora.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from djl_handlers.dialects.dispatch import parse_request
from djl_handlers.errors import InvalidRequest
from djl_handlers.io import Input
from djl_handlers.lora.management import AdapterManager
from djl_handlers.lora.registry import AdapterError, AdapterNotFound, AdapterRegistry, spec_from_input
from djl_handlers.lora.selection import openai_adapter, select_adapters
from djl_handlers.request.parser import ParserSettings


def _call(handler: str, name: str, src: Optional[str] = None, alias: Optional[str] = None, **options: str) -> Any:
    """An Input shaped like DJL's PyAdapter: properties handler/name/alias/src, options as content."""
    props = {"handler": handler, "name": name}
    if alias is not None:
        props["alias"] = alias
    if src is not None:
        props["src"] = src
    return Input.from_parts(props, [(k, v.encode()) for k, v in options.items()])


def _request(body: dict[str, Any], **props: str) -> Any:
    return Input.from_parts({"Content-Type": "application/json", **props}, [("data", json.dumps(body).encode())])


class StubEngine:
    name = "stub"

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}
        self.unloaded: list[str] = []

    def load_adapter(self, spec: Any) -> None:
        if "broken" in spec.name:
            raise ValueError("cannot parse adapter_model.safetensors")
        self.loaded[spec.name] = spec

    def unload_adapter(self, name: str) -> None:
        self.unloaded.append(name)
        self.loaded.pop(name, None)


@pytest.fixture
def folder(tmp_path: Path) -> str:
    (tmp_path / "a").mkdir()
    return str(tmp_path / "a")


def test_spec_reads_djl_properties_and_options(folder: str) -> None:
    spec = spec_from_input(_call("register_adapter", "n", folder, alias="al", preload="false", pin="false"))
    assert (spec.name, spec.alias, spec.src, spec.preload, spec.pin) == ("n", "al", folder, False, False)
    assert spec.label == "al"


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"src": "/no/such/dir"}, "src", "not a local folder"),
    ({"src": None}, "src", "required"),
    ({"pin": "true", "preload": "false"}, "pin", "pinned"),
    ({"preload": "maybe"}, "preload", "boolean"),
])
def test_spec_errors_name_the_field(folder: str, kwargs: dict[str, Any], field: str, words: str) -> None:
    args = {"src": folder, **kwargs}
    src = args.pop("src")
    with pytest.raises(AdapterError) as info:
        spec_from_input(_call("register_adapter", "n", src, **args))
    assert info.value.field == field and words in info.value.message


def test_register_duplicate_unregister_flow(folder: str) -> None:
    engine, running = StubEngine(), []
    manager = AdapterManager(engine, lambda: running)
    out = manager.register(_call("register_adapter", "a", folder))
    assert (out.code, out.message) == (200, "Adapter a registered")
    assert "a" in manager.registry and "a" in engine.loaded
    # same name and src again (DJL replays registrations on a restarted worker): accepted
    assert manager.register(_call("register_adapter", "a", folder)).code == 200
    other = str(Path(folder).parent)
    dup = manager.register(_call("register_adapter", "a", other))
    assert dup.code == 400 and "already registered" in dup.message
    missing = manager.unregister(_call("unregister_adapter", "zzz", alias="my-alias"))
    assert missing.code == 404 and "my-alias" in missing.message
    out = manager.unregister(_call("unregister_adapter", "a"))
    assert (out.code, out.message) == (200, "Adapter a unregistered")
    assert engine.unloaded == ["a"] and "a" not in manager.registry


def test_engine_failure_leaves_nothing_registered(folder: str) -> None:
    manager = AdapterManager(StubEngine(), list)
    out = manager.register(_call("register_adapter", "broken", folder))
    assert out.code == 400 and "cannot load adapter" in out.message and "safetensors" in out.message
    assert "broken" not in manager.registry


def test_unregister_while_running_defers_the_unload(folder: str) -> None:
    engine = StubEngine()
    running: list[Optional[str]] = ["a", None]
    manager = AdapterManager(engine, lambda: running)
    manager.register(_call("register_adapter", "a", folder))
    assert manager.unregister(_call("unregister_adapter", "a")).code == 200
    assert "a" not in manager.registry and engine.unloaded == []  # new requests: 404; running: go on
    with pytest.raises(AdapterNotFound):
        manager.registry.check(["a"])
    again = manager.register(_call("register_adapter", "a", folder))
    assert again.code == 400 and "still use it" in again.message
    manager.retire_unused()
    assert engine.unloaded == []
    running.clear()
    manager.retire_unused()
    assert engine.unloaded == ["a"] and not manager.registry.retiring


def test_update_preload_and_refusals(folder: str) -> None:
    engine = StubEngine()
    manager = AdapterManager(engine, list)
    manager.register(_call("register_adapter", "a", folder, pin="true"))
    out = manager.update(_call("update_adapter", "a", folder, preload="true", pin="false"))
    assert out.code == 400 and "unpinning" in out.message
    out = manager.update(_call("update_adapter", "a", str(Path(folder).parent), pin="true"))
    assert out.code == 400 and "changing src" in out.message
    out = manager.update(_call("update_adapter", "b", folder))
    assert out.code == 404
    out = manager.update(_call("update_adapter", "a", folder, alias="new", pin="true"))
    assert (out.code, out.message) == (200, "Adapter new updated")
    assert manager.registry.require("a").alias == "new"


def test_engine_without_lora_support_is_a_config_error() -> None:
    from djl_handlers.errors import ConfigError

    with pytest.raises(ConfigError, match="does not support LoRA"):
        AdapterManager(object(), list)


# -- request selection ----------------------------------------------------------------------------
def _registry(*names: str) -> AdapterRegistry:
    from djl_handlers.lora.registry import AdapterSpec

    registry = AdapterRegistry()
    for name in names:
        registry.add(AdapterSpec(name, "/x"))
    return registry


def test_body_string_and_list_and_base_rows() -> None:
    reg = _registry("a", "b")
    item = _request({})
    assert select_adapters("a", item, 1, reg) == ("a",)
    assert select_adapters(["a", "", "b"], item, 3, reg) == ("a", None, "b")
    assert select_adapters("b", item, 2, reg) == ("b", "b")  # one name for every prompt
    assert select_adapters(None, item, 1, reg) == ()
    assert select_adapters(["", None], item, 2, reg) == ()


@pytest.mark.parametrize(("value", "prompts", "words"), [
    (["a", "b"], 3, "2 entries but inputs has 3"), (5, 1, "string"), ([1], 1, "adapters[0]")])
def test_malformed_selection_is_400(value: Any, prompts: int, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        select_adapters(value, _request({}), prompts, _registry("a", "b"))
    assert info.value.status == 400 and words in info.value.message and info.value.field == "adapters"


def test_unknown_adapter_is_404_naming_it() -> None:
    with pytest.raises(AdapterNotFound) as info:
        select_adapters(["a", "ghost"], _request({}), 2, _registry("a"))
    assert info.value.status == 404 and "'ghost'" in info.value.message
    with pytest.raises(AdapterNotFound, match="not enabled"):
        select_adapters("a", _request({}), 1, None)


def test_sagemaker_header_wins_and_alias_names_it() -> None:
    reg = _registry("a", "b")
    item = _request({}, **{"X-Amzn-SageMaker-Adapter-Identifier": "b"})
    assert select_adapters("a", item, 1, reg) == ("b",)
    item = _request({}, **{"X-Amzn-SageMaker-Adapter-Identifier": "zz", "X-Amzn-SageMaker-Adapter-Alias": "nice"})
    with pytest.raises(AdapterNotFound, match="'nice'"):
        select_adapters(None, item, 1, reg)


def test_openai_model_selects_adapter() -> None:
    reg = _registry("a")
    assert openai_adapter("tiny:a", reg) == "a"
    assert openai_adapter("a", reg) == "a"
    assert openai_adapter("tiny", reg) is None
    assert openai_adapter("llama3:8b", None) is None  # without LoRA a colon is part of the name
    with pytest.raises(AdapterNotFound, match="'nope'"):
        openai_adapter("tiny:nope", reg)


def test_parser_carries_adapters_into_the_request() -> None:
    reg = _registry("a", "b")
    rolling = ParserSettings(adapters=reg)
    req = parse_request(_request({"inputs": "hi", "adapters": "a"}), rolling)
    assert req.adapters == ("a",) and req.adapter_of(0) == "a"
    dynamic = ParserSettings(rolling_batch=False, adapters=reg)
    req = parse_request(_request({"inputs": ["x", "y"], "adapters": ["b", None]}), dynamic)
    assert req.adapters == ("b", None) and req.adapter_of(1) is None
    chat = parse_request(_request({"prompt": "hi", "model": "m:b"}), rolling)
    assert chat.adapters == ("b",) and chat.response_options.model == "b"
    tgi = parse_request(_request({"inputs": "x", "parameters": {"adapter_id": "a"}}, **{"X-Djl-Handlers-Api": "tgi"}),
                        rolling)
    assert tgi.adapters == ("a",)
