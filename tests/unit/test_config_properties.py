"""serving.properties parsing, env precedence and entry-point resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from djl_handlers.config.properties import (
    ModelProperties,
    load_model_properties,
    parse_properties,
    read_serving_properties,
    resolve_entry_point,
)
from djl_handlers.errors import ConfigError


def write(model_dir: Path, text: str) -> Path:
    (model_dir / "serving.properties").write_text(text, encoding="utf-8")
    return model_dir


# -- parsing ---------------------------------------------------------------------------------


def test_parse_java_syntax_basics() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "   \n"
        "engine=Python\n"
        "option.model_id : gpt2\n"
        "  option.dtype   =   fp16   \n"
        "option.spaced value with blanks\n"
        "option.empty=\n"
        "option.eq=a=b:c\n"
    )
    props = parse_properties(text)
    assert props == {
        "engine": "Python",
        "option.model_id": "gpt2",
        "option.dtype": "fp16",
        "option.spaced": "value with blanks",
        "option.empty": "",
        "option.eq": "a=b:c",
    }


def test_parse_continuation_and_escapes() -> None:
    text = (
        "option.long=first, \\\n"
        "        second, \\\n"
        "   third\n"
        "option.tab=a\\tb\n"
        "option.uni=\\u00e9t\\u00e9\n"
        "key\\=with\\:seps=v\n"
        "option.backslash=C:\\\\dir\\\\\n"
        "# not a continuation \\\n"
        "option.after=yes\n"
    )
    props = parse_properties(text)
    assert props["option.long"] == "first, second, third"
    assert props["option.tab"] == "a\tb"
    assert props["option.uni"] == "été"
    assert props["key=with:seps"] == "v"
    assert props["option.backslash"] == "C:\\dir\\"
    assert props["option.after"] == "yes"


def test_later_key_wins_and_comment_inside_continuation_is_value() -> None:
    props = parse_properties("a=1\na=2\nb=x\\\n#y\n")
    assert props == {"a": "2", "b": "x#y"}


def test_read_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_serving_properties(tmp_path) == {}


def test_read_latin1_fallback_and_bom(tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_bytes(b"option.name=caf\xe9\n")
    assert read_serving_properties(tmp_path) == {"option.name": "café"}
    (tmp_path / "serving.properties").write_bytes("\ufeffengine=Python\n".encode())
    assert read_serving_properties(tmp_path) == {"engine": "Python"}


# -- precedence ------------------------------------------------------------------------------


def test_split_into_server_and_options(tmp_path: Path) -> None:
    write(tmp_path, "engine=Python\nbatch_size=4\noption.model_id=m\noption.rolling_batch=auto\n")
    props = load_model_properties(tmp_path, env={})
    assert props.server == {"engine": "Python", "batch_size": "4"}
    assert props.options == {"model_id": "m", "rolling_batch": "auto"}
    assert props.engine == "Python"
    assert props.model_dir == str(tmp_path)


def test_file_wins_over_option_env(tmp_path: Path) -> None:
    write(tmp_path, "option.rolling_batch=disable\n")
    env = {"OPTION_ROLLING_BATCH": "auto", "OPTION_MAX_ROLLING_BATCH_SIZE": "64"}
    props = load_model_properties(tmp_path, env=env)
    assert props.options["rolling_batch"] == "disable"
    assert props.options["max_rolling_batch_size"] == "64"


def test_option_env_special_names(tmp_path: Path) -> None:
    env = {
        "OPTION_ENTRYPOINT": "djl_handlers.vllm",
        "OPTION_ENGINE": "MPI",
        "OPTION_TRUST_REMOTE_CODE": "true",
        "OPTION_EMPTY": "",
        "OPTION_": "nothing",
    }
    props = load_model_properties(tmp_path, env=env)
    assert props.options["entryPoint"] == "djl_handlers.vllm"
    assert props.server["engine"] == "MPI"
    assert "engine" not in props.options
    assert props.options["trust_remote_code"] == "true"
    assert "empty" not in props.options
    assert "" not in props.options


def test_option_engine_env_does_not_override_file(tmp_path: Path) -> None:
    write(tmp_path, "engine=DeepSpeed\n")
    assert load_model_properties(tmp_path, env={"OPTION_ENGINE": "Python"}).engine == "DeepSpeed"


def test_hf_model_id_and_friends_only_when_absent(tmp_path: Path) -> None:
    env = {"HF_MODEL_ID": "env/model", "HF_TASK": "text-generation", "TENSOR_PARALLEL_DEGREE": "2",
           "HF_TRUST_REMOTE_CODE": "true"}
    props = load_model_properties(tmp_path, env=env)
    assert props.options["model_id"] == "env/model"
    assert props.options["task"] == "text-generation"
    assert props.options["tensor_parallel_degree"] == "2"
    assert props.options["trust_remote_code"] == "true"
    write(tmp_path, "option.model_id=file/model\n")
    assert load_model_properties(tmp_path, env=env).options["model_id"] == "file/model"


def test_option_model_id_env_beats_hf_model_id(tmp_path: Path) -> None:
    env = {"HF_MODEL_ID": "hf", "OPTION_MODEL_ID": "opt"}
    assert load_model_properties(tmp_path, env=env).options["model_id"] == "opt"


def test_serving_env_for_server_keys_only(tmp_path: Path) -> None:
    write(tmp_path, "max_batch_delay=5\n")
    env = {"SERVING_BATCH_SIZE": "8", "SERVING_MAX_BATCH_DELAY": "200", "SERVING_OPTS": "-Xmx1g",
           "SERVING_FEATURES": "vllm"}
    props = load_model_properties(tmp_path, env=env)
    assert props.server == {"batch_size": "8", "max_batch_delay": "5"}


def test_default_env_is_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTION_SOME_KEY", "v")
    assert load_model_properties(tmp_path).options["some_key"] == "v"


# -- entry point -----------------------------------------------------------------------------


def props_of(options: dict[str, str] | None = None, server: dict[str, str] | None = None) -> ModelProperties:
    return ModelProperties(model_dir="x", server=server or {}, options=options or {})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("djl_handlers.vllm", "djl_handlers.vllm"),
        ("djl_python.huggingface", "djl_handlers.huggingface"),
        ("djl_python.deepspeed", "djl_handlers.deepspeed"),
        ("djl_python.tensorrt_llm", "djl_handlers.tensorrt_llm"),
        ("djl_python.lmi_vllm.vllm_async_service", "djl_handlers.vllm"),
        ("my_pkg.handler", "my_pkg.handler"),
    ],
)
def test_explicit_entry_point_wins(tmp_path: Path, given: str, expected: str) -> None:
    (tmp_path / "model.py").write_text("")
    props = props_of({"entryPoint": given, "model_id": "m"}, {"engine": "DeepSpeed"})
    assert resolve_entry_point(tmp_path, props, {"DJL_ENTRY_POINT": "other"}) == expected


def test_unknown_djl_module_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="djl_python.transformers_neuronx") as err:
        resolve_entry_point(tmp_path, props_of({"entryPoint": "djl_python.transformers_neuronx"}), {})
    assert err.value.field == "entryPoint"


def test_env_entry_point_before_model_file(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("")
    env = {"DJL_ENTRY_POINT": "djl_python.huggingface"}
    assert resolve_entry_point(tmp_path, props_of(), env) == "djl_handlers.huggingface"


def test_model_file_before_engine(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("")
    props = props_of({"model_id": "m", "rolling_batch": "vllm"}, {"engine": "DeepSpeed"})
    assert resolve_entry_point(tmp_path, props, {}) == "model.py"


def test_dir_named_python_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "mymodel"
    model_dir.mkdir()
    (model_dir / "mymodel.py").write_text("")
    assert resolve_entry_point(model_dir, props_of(), {}) == "mymodel.py"


def test_resolution_order_after_model_file(tmp_path: Path) -> None:
    both = {"model_id": "m", "rolling_batch": "trtllm"}
    assert resolve_entry_point(tmp_path, props_of(both, {"engine": "DeepSpeed"}), {}) == "djl_handlers.deepspeed"
    assert resolve_entry_point(tmp_path, props_of(both), {}) == "djl_handlers.tensorrt_llm"
    feat = {"SERVING_FEATURES": "vllm,trtllm"}
    assert resolve_entry_point(tmp_path, props_of({"model_id": "m"}), feat) == "djl_handlers.tensorrt_llm"
    for rolling in ("vllm", "lmi-dist", "VLLM"):
        props = props_of({"model_id": "m", "rolling_batch": rolling})
        assert resolve_entry_point(tmp_path, props, {}) == "djl_handlers.vllm"
    props = props_of({"model_id": "m", "rolling_batch": "auto"})
    assert resolve_entry_point(tmp_path, props, {}) == "djl_handlers.huggingface"


def test_nothing_to_serve_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="option.entryPoint") as err:
        resolve_entry_point(tmp_path, props_of({"rolling_batch": "auto"}), {})
    assert err.value.field == "entryPoint"


def test_end_to_end_from_env_only(tmp_path: Path) -> None:
    env = {"HF_MODEL_ID": "gpt2", "OPTION_ROLLING_BATCH": "lmi-dist"}
    props = load_model_properties(tmp_path, env=env)
    assert resolve_entry_point(tmp_path, props, env) == "djl_handlers.vllm"
