"""The one resolver: DJL's LmiConfigRecommender rules (0.34 and 0.36), table-driven, and its invariants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.resolve import (
    RULES_034,
    RULES_036,
    is_async_value,
    is_rolling_value,
    mode_of,
    recommend,
    resolve_model,
    rules_from_env,
)
from djl_handlers.errors import ConfigError

CAUSAL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
OLD = {"DJL_HANDLERS_DJL_RULES": "0.34"}


def _model(tmp_path: Path, props: str, config: dict[str, object] | None = None, *,
           config_in_model_id: bool = False) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        target = model
        if config_in_model_id:
            target = tmp_path / "weights"
            target.mkdir()
            props += f"\noption.model_id={target}\n"
        (target / "config.json").write_text(json.dumps(config))
    (model / "serving.properties").write_text("engine=Python\noption.entryPoint=djl_handlers.huggingface\n" + props)
    return model


# (serving.properties extra lines, config.json?, env) -> (effective rolling_batch, mode)
TABLE = [
    # no readable config.json: DJL leaves rolling_batch as written (absent stays absent)
    ("", None, {}, None, "dynamic"),
    ("option.rolling_batch=auto", None, {}, "auto", "rolling"),
    ("option.rolling_batch=scheduler", None, {}, "scheduler", "rolling"),
    ("option.rolling_batch=disable", None, {}, "disable", "dynamic"),
    ("batch_size=2\nmax_batch_delay=50", None, {}, None, "dynamic"),
    ("option.rolling_batch=lmi-dist", None, {}, "lmi-dist", "rolling"),
    # with a config.json (in the model dir or in option.model_id's folder)
    ("", CAUSAL, {}, "disable", "dynamic"),
    ("option.rolling_batch=auto", CAUSAL, {}, "disable", "dynamic"),
    ("option.rolling_batch=auto", CAUSAL, {"SERVING_FEATURES": "vllm,lmi-dist", **OLD}, "vllm", "rolling"),
    ("option.rolling_batch=auto", CAUSAL, {"SERVING_FEATURES": "trtllm", **OLD}, "trtllm", "rolling"),
    # DJL 0.35+ (the default rules): auto + the vllm/trtllm feature is async mode
    ("option.rolling_batch=auto", CAUSAL, {"SERVING_FEATURES": "vllm,lmi-dist"}, "disable", "async"),
    ("", CAUSAL, {"SERVING_FEATURES": "vllm"}, "disable", "async"),
    ("option.async_mode=false", CAUSAL, {"SERVING_FEATURES": "vllm"}, "disable", "async"),
    ("option.rolling_batch=auto", CAUSAL, {"SERVING_FEATURES": "trtllm"}, "disable", "async"),
    ("option.rolling_batch=auto", CAUSAL, {"SERVING_FEATURES": "tnx"}, "disable", "dynamic"),
    ("option.rolling_batch=auto\noption.max_rolling_batch_size=16", CAUSAL, {"SERVING_FEATURES": "tnx", **OLD},
     "vllm", "rolling"),
    ("option.rolling_batch=scheduler", CAUSAL, {"SERVING_FEATURES": "vllm"}, "scheduler", "rolling"),
    ("option.rolling_batch=disable\noption.async_mode=true", CAUSAL, {}, "disable", "async"),
    ("option.rolling_batch=scheduler", CAUSAL, {}, "scheduler", "rolling"),
    ("option.rolling_batch=lmi-dist", CAUSAL, {}, "vllm", "rolling"),
    ("option.rolling_batch=scheduler\nbatch_size=2", CAUSAL, {}, "disable", "dynamic"),
    ("option.rolling_batch=auto", {"architectures": ["BertModel"]}, {"SERVING_FEATURES": "vllm"},
     "disable", "dynamic"),
]


@pytest.mark.parametrize(("props", "config", "env", "rolling", "mode"), TABLE)
@pytest.mark.parametrize("in_model_id", [False, True])
def test_djl_rules(tmp_path: Path, props: str, config: dict[str, object] | None, env: dict[str, str],
                   rolling: str | None, mode: str, in_model_id: bool) -> None:
    model = _model(tmp_path, props, config, config_in_model_id=in_model_id)
    resolved = resolve_model(model, env)
    assert resolved.rolling_batch == rolling
    assert resolved.mode == mode
    assert (resolved.hf_config is not None) == (config is not None)
    assert resolved.rules == (RULES_034 if env.get("DJL_HANDLERS_DJL_RULES") == "0.34" else RULES_036)
    if rolling != resolved.written_rolling_batch:
        assert resolved.warnings and "rewrites option.rolling_batch" in resolved.warnings[0]
        if mode == "async":
            assert "async mode" in resolved.why() and resolved.rules in resolved.why()
        else:
            assert rolling is not None and rolling in resolved.why()


def test_handler_agrees_with_the_server_for_every_row(tmp_path: Path) -> None:
    """The worker builds its mode from the resolved options: the two sides cannot disagree."""
    for index, (props, config, env, _rolling, mode) in enumerate(TABLE):
        if "lmi-dist" in props and config is None:
            continue  # lmi-dist on the HF handler is served by vLLM: not loadable here, checked elsewhere
        (tmp_path / str(index)).mkdir()
        model = _model(tmp_path / str(index), props, config)
        resolved = resolve_model(model, env)
        if resolved.rolling_batch == "trtllm":  # the HF handler refuses it by name: a clear init error
            with pytest.raises(ConfigError, match="option.rolling_batch=trtllm"):
                ServingConfig.from_properties(resolved.options, resolved.server, engine="huggingface")
            continue
        handler_config = ServingConfig.from_properties(resolved.options, resolved.server, engine="huggingface")
        if is_async_value(resolved.options.get("async_mode")):
            assert mode == resolved.mode == "async"
            continue
        assert ("rolling" if handler_config.is_rolling else "dynamic") == mode == resolved.mode


def test_trtllm_defaults_and_mpi(tmp_path: Path) -> None:
    model = _model(tmp_path, "option.rolling_batch=auto", CAUSAL)
    props, changes, _ = recommend({"option.rolling_batch": "auto"}, model, {"SERVING_FEATURES": "trtllm"},
                                  RULES_034)
    assert props["option.rolling_batch"] == "trtllm" and props["option.mpi_mode"] == "true"
    assert props["option.max_num_tokens"] == "16384" and props["option.max_rolling_batch_size"] == "256"
    assert {c.key for c in changes} >= {"option.rolling_batch", "option.mpi_mode"}
    new, _, _ = recommend({"option.rolling_batch": "auto"}, model, {"SERVING_FEATURES": "trtllm"}, RULES_036)
    assert new["option.rolling_batch"] == "disable" and new["option.async_mode"] == "true"
    assert "option.mpi_mode" not in new and "option.max_num_tokens" not in new
    assert new["option.max_rolling_batch_size"] == "32"


def test_rule_set_names() -> None:
    assert rules_from_env({}) == RULES_036
    assert rules_from_env({"DJL_HANDLERS_DJL_RULES": "0.35"}) == RULES_036
    assert rules_from_env({"DJL_HANDLERS_DJL_RULES": "0.34"}) == RULES_034
    with pytest.raises(ConfigError, match="DJL_HANDLERS_DJL_RULES"):
        rules_from_env({"DJL_HANDLERS_DJL_RULES": "0.2"})


def test_no_config_trtllm_feature_only_sets_mpi(tmp_path: Path) -> None:
    props, changes, found = recommend({}, tmp_path, {"SERVING_FEATURES": "trtllm"})
    assert found is None and props == {"option.mpi_mode": "true"} and len(changes) == 1


def test_defaults_only_when_absent(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CAUSAL))
    props, _, _ = recommend({"option.rolling_batch": "scheduler", "option.max_rolling_batch_size": "4"},
                            tmp_path, {"TENSOR_PARALLEL_DEGREE": "2"})
    assert props["option.max_rolling_batch_size"] == "4"
    assert props["option.tensor_parallel_degree"] == "2" and props["option.pipeline_parallel_degree"] == "1"
    cpu, _, _ = recommend({"option.rolling_batch": "scheduler"}, tmp_path, {})
    assert "option.tensor_parallel_degree" not in cpu  # 'max' on a machine without GPUs: left unset


def test_env_only_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CAUSAL))
    env = {"OPTION_ENTRYPOINT": "djl_handlers.huggingface", "OPTION_ROLLING_BATCH": "scheduler"}
    resolved = resolve_model(tmp_path, env)
    assert resolved.entry_point == "djl_handlers.huggingface" and resolved.mode == "rolling"


def test_unreadable_config_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the model config"):
        recommend({}, tmp_path, {})


@settings(max_examples=200, deadline=None)
@given(
    rolling=st.sampled_from([None, "auto", "scheduler", "disable", "lmi-dist", "vllm", "trtllm", "deepspeed"]),
    batch=st.sampled_from([None, "1", "2", "8"]),
    features=st.sampled_from(["", "vllm", "trtllm", "tnx", "vllm,lmi-dist"]),
    has_config=st.booleans(),
    calls=st.integers(min_value=1, max_value=64),
    rules=st.sampled_from([RULES_034, RULES_036]),
)
def test_invariants(tmp_path_factory: pytest.TempPathFactory, rolling: str | None, batch: str | None,
                    features: str, has_config: bool, calls: int, rules: str) -> None:
    folder = tmp_path_factory.mktemp("m")
    if has_config:
        (folder / "config.json").write_text(json.dumps(CAUSAL))
    props = {}
    if rolling is not None:
        props["option.rolling_batch"] = rolling
    if batch is not None:
        props["batch_size"] = batch
    env = {"SERVING_FEATURES": features}
    once, _, _ = recommend(props, folder, env, rules)
    twice, again, _ = recommend(once, folder, env, rules)
    assert twice == once and again == []  # idempotent: Java's rewrite then ours changes nothing
    options = {k[len("option."):]: v for k, v in once.items() if k.startswith("option.")}
    mode = mode_of(options)
    # the handler's mode from the same options, whatever batch size a call carries
    per_call = dict(options, batch_size=str(calls))
    assert mode_of(per_call) == mode
    if is_async_value(options.get("async_mode")):
        assert mode == "async" and rules == RULES_036 and options.get("rolling_batch") == "disable"
        return
    assert mode == ("rolling" if is_rolling_value(options.get("rolling_batch")) else "dynamic")
    if has_config and batch in ("2", "8"):
        assert mode == "dynamic"


@pytest.mark.parametrize("rolling", ["scheduler", "vllm", "auto"])
def test_async_mode_beside_a_rolling_batch_is_a_clear_error(tmp_path: Path, rolling: str) -> None:
    """DJL's Java side would drive its rolling-batch loop against the async worker: refused by name
    (``auto`` without a readable config.json stays ``auto``, a rolling batch for DJL)."""
    model = _model(tmp_path, f"option.rolling_batch={rolling}\noption.async_mode=true")
    with pytest.raises(ConfigError, match="option.async_mode=true needs option.rolling_batch=disable"):
        resolve_model(model, {})
