"""The one configuration resolver: a model directory → the configuration DJL Serving would run.

``resolve_model(model_dir, env)`` reads ``serving.properties`` + ``OPTION_*``/``SERVING_*``/
``HF_MODEL_ID``/``TENSOR_PARALLEL_DEGREE`` environment variables (``config.properties``), then
applies the rewrite DJL Serving 0.34's front end makes before the handler sees the properties
(``wlm/.../LmiUtils.configureLmiModel`` → ``LmiConfigRecommender.configure``), and derives the
batching mode exactly as DJL's Java side does. The local server, ``djl-handlers check`` and
``djl-handlers generate`` call it; the worker receives its output as the init call's properties,
and the handler derives its mode from those properties with :func:`mode_of` — so the two sides
can never disagree.

DJL's rules (0.34), in order:

1. The recommender runs only when a Hugging Face ``config.json`` (or ``params.json``) can be read:
   in the model directory itself, or in the local folder ``option.model_id`` names. (A hub id would
   be fetched by DJL; djl_handlers never contacts a hub, so a hub id counts as "no config".)
   Without one, ``option.rolling_batch`` reaches the handler unchanged (absent stays absent), and
   ``SERVING_FEATURES`` containing ``trtllm`` sets ``option.mpi_mode=true``.
2. With a config: ``batch_size > 1`` → ``rolling_batch=disable``; ``lmi-dist`` → ``vllm`` (and
   ``mpi_mode=false``); any other explicit value than ``auto`` is kept; ``auto`` (or absent) →
   ``disable`` for an architecture that is not text generation (``*ForCausalLM``,
   ``*LMHeadModel``, ``*ForConditionalGeneration``), else ``vllm``/``trtllm`` when
   ``SERVING_FEATURES`` names them (``tnx`` too), else ``disable``.
3. ``trtllm`` sets ``option.mpi_mode=true``; ``option.pipeline_parallel_degree`` defaults to env
   ``PIPELINE_PARALLEL_DEGREE`` or 1; ``option.tensor_parallel_degree`` defaults to env
   ``TENSOR_PARALLEL_DEGREE`` (``max`` = number of GPUs, unset on a CPU-only machine);
   ``option.max_rolling_batch_size`` defaults to 256 for vllm/trtllm, else 32 (trtllm also
   ``option.max_num_tokens=16384``); ``option.enable_lora=true`` → ``maxWorkers=1``, and so does
   ``option.enable_stateful_sessions=true`` (DJL also sets ``load_on_devices=0`` then, GPU 0, which
   we do not: on a CPU-only machine DJL cannot load such a model).
4. The mode: async when ``option.async_mode`` is true (DJL's ``PyModel``: each request goes to the
   handler alone and is awaited); else rolling batch exactly when ``option.rolling_batch`` is present
   and not ``disable`` (DJL's ``PyPredictor``); otherwise dynamic batching with ``batch_size`` (or
   ``max_dynamic_batch_size``) and ``max_batch_delay``. Never the number of requests in a call.

DJL 0.35 and 0.36 changed rule 2 (``RULES_036``, the default): ``auto`` with ``SERVING_FEATURES``
naming ``vllm`` or ``trtllm`` becomes ``disable`` **and** ``option.async_mode=true`` (set
unconditionally, over an explicit ``false``); ``tnx`` is no longer special; ``mpi_mode=true`` comes
only from an explicit ``rolling_batch=trtllm``; ``max_rolling_batch_size`` then defaults to 32 and
``max_num_tokens`` is not set. ``DJL_HANDLERS_DJL_RULES=0.34`` (or ``0.36``) picks the rule set.

No ML library is imported; nothing runs at import time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from djl_handlers.errors import ConfigError

__all__ = ["Change", "RULES_034", "RULES_036", "DEFAULT_RULES", "ResolvedModel", "is_async_value", "mode_of",
           "recommend", "resolve_model", "is_rolling_value", "rules_from_env"]

TEXT_GENERATION_SUFFIXES: tuple[str, ...] = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
HF_CONFIG_FILES: tuple[str, ...] = ("config.json", "params.json")
RULES_034 = "0.34"
RULES_036 = "0.36"
DEFAULT_RULES = RULES_036  # the newest DJL Serving release
RULES_ENV = "DJL_HANDLERS_DJL_RULES"
_RULE_ALIASES = {"0.34": RULES_034, "0.35": RULES_036, "0.36": RULES_036}


def rules_from_env(env: Mapping[str, str] | None = None) -> str:
    """The DJL rule set ``DJL_HANDLERS_DJL_RULES`` names (``0.34``, or ``0.35``/``0.36`` = the
    new rules); the newest by default."""
    env = os.environ if env is None else env
    raw = (env.get(RULES_ENV) or "").strip()
    if not raw:
        return DEFAULT_RULES
    rules = _RULE_ALIASES.get(raw)
    if rules is None:
        raise ConfigError(f"{RULES_ENV}={raw!r}: expected one of {sorted(_RULE_ALIASES)}", field=RULES_ENV)
    return rules


@dataclass(frozen=True)
class Change:
    """One property DJL's front end rewrites, and the rule that fired."""

    key: str
    before: str | None
    after: str
    rule: str

    def describe(self) -> str:
        before = "(unset)" if self.before is None else repr(self.before)
        return f"{self.key}: {before} -> {self.after!r} ({self.rule})"


def is_rolling_value(value: str | None) -> bool:
    """DJL's ``PyPredictor`` rule: rolling batch iff ``rolling_batch`` is set and not ``disable``."""
    word = (value or "").strip().lower()
    return word not in ("", "disable", "false")


def is_async_value(value: object) -> bool:
    """DJL's ``PyModel`` rule: async mode iff ``async_mode`` parses as true (``Boolean.parseBoolean``)."""
    return isinstance(value, str) and value.strip().lower() == "true"


def check_async_mode(options: Mapping[str, object]) -> None:
    """``ConfigError`` for ``async_mode=true`` beside a rolling batch: DJL's Java side would then drive its
    rolling-batch loop against the async worker (its ``PyProcess`` checks the rolling batch first), which
    never answers; async mode needs ``option.rolling_batch=disable``."""
    rolling = options.get("rolling_batch")
    if is_async_value(options.get("async_mode")) and is_rolling_value(rolling if isinstance(rolling, str) else None):
        raise ConfigError(f"option.async_mode=true needs option.rolling_batch=disable, got {rolling!r}: DJL Serving "
                          "would run its rolling-batch loop against the async handler", field="option.rolling_batch")


def _check_sessions(options: Mapping[str, str]) -> None:
    """``option.enable_stateful_sessions=true`` needs async mode (config/sessions.py)."""
    from djl_handlers.config.reader import Reader
    from djl_handlers.config.sessions import check_sessions_mode, read_session_options

    check_sessions_mode(read_session_options(Reader(options, {})), is_async_value(options.get("async_mode")))


def mode_of(options: Mapping[str, object]) -> str:
    """``async``, ``rolling`` or ``dynamic`` from the (already resolved) option map — the handler's rule."""
    if is_async_value(options.get("async_mode")):
        return "async"
    value = options.get("rolling_batch")
    return "rolling" if is_rolling_value(value if isinstance(value, str) else None) else "dynamic"


def find_hf_config(model_dir: Path, model_id: str | None) -> Path | None:
    """The ``config.json``/``params.json`` DJL would read, or None (never looks at a hub)."""
    for name in HF_CONFIG_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    if not model_id or "://" in model_id:
        return None
    folder = Path(model_id)
    if not folder.is_absolute():
        folder = model_dir / folder if (model_dir / folder).is_dir() else folder
    if folder.is_dir():
        for name in HF_CONFIG_FILES:
            if (folder / name).is_file():
                return folder / name
    return None


def _architectures(config_file: Path) -> list[str]:
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(f"cannot read the model config {str(config_file)!r} (DJL fails to load such a "
                          "model: 'Invalid huggingface model id')", field="option.model_id") from None
    if not isinstance(data, dict):
        return []
    archs = data.get("architectures") or []
    return [str(a) for a in archs] if isinstance(archs, list) else []


def _int(props: Mapping[str, str], key: str, default: int) -> int:
    raw = str(props.get(key, "")).strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer", field=key) from None


class _Recorder:
    def __init__(self, props: dict[str, str]) -> None:
        self.props = props
        self.changes: list[Change] = []

    def set(self, key: str, value: str, rule: str) -> None:
        before = self.props.get(key)
        if before != value:
            self.changes.append(Change(key, before, value, rule))
        self.props[key] = value

    def default(self, key: str, value: str, rule: str) -> None:
        if key not in self.props:
            self.set(key, value, rule)


def _rolling_rule(rec: _Recorder, archs: list[str], features: str, rules: str) -> None:
    props = rec.props
    if _int(props, "batch_size", 1) > 1:
        rec.set("option.rolling_batch", "disable", "batch_size > 1 means dynamic batching")
        return
    rolling = props.get("option.rolling_batch", "auto")
    if rolling == "lmi-dist":
        rec.set("option.rolling_batch", "vllm", "lmi-dist was removed in DJL 0.33; DJL serves it with vllm")
        rec.set("option.mpi_mode", "false", "lmi-dist rewritten to vllm")
        return
    if rolling != "auto":
        return
    if not any(a.endswith(s) for a in archs for s in TEXT_GENERATION_SUFFIXES):
        value, rule = "disable", f"architectures {archs} are not text generation"
    elif rules == RULES_036 and ("vllm" in features or "trtllm" in features):
        engine = "vllm" if "vllm" in features else "trtllm"
        rec.set("option.rolling_batch", "disable", f"SERVING_FEATURES names {engine}: DJL 0.35+ serves it in "
                "async mode")
        rec.set("option.async_mode", "true", f"SERVING_FEATURES names {engine} (DJL 0.35+)")
        return
    elif "tnx" in features and rules == RULES_034:
        big = _int(props, "option.max_rolling_batch_size", 1) >= 12
        value, rule = ("vllm" if big else "tnx"), "SERVING_FEATURES names tnx"
    elif "vllm" in features:
        value, rule = "vllm", "SERVING_FEATURES names vllm"
    elif "trtllm" in features:
        value, rule = "trtllm", "SERVING_FEATURES names trtllm"
    else:
        named = "vllm/trtllm/tnx" if rules == RULES_034 else "vllm/trtllm"
        value, rule = "disable", f"auto without SERVING_FEATURES naming {named} (DJL {rules}'s LmiConfigRecommender)"
    rec.set("option.rolling_batch", value, rule)


def recommend(props: Mapping[str, str], model_dir: str | Path, env: Mapping[str, str] | None = None,
              rules: str | None = None) -> tuple[dict[str, str], list[Change], str | None]:
    """Apply DJL's ``configureLmiModel`` (rule set ``rules``, default from the env) to full-key properties.

    Returns ``(new properties, changes, config file read or None)``.
    """
    env = os.environ if env is None else env
    rules = rules or rules_from_env(env)
    rec = _Recorder(dict(props))
    features = env.get("SERVING_FEATURES", "") or ""
    config_file = find_hf_config(Path(model_dir), rec.props.get("option.model_id"))
    if config_file is None:
        if "trtllm" in features:
            rec.set("option.mpi_mode", "true", "SERVING_FEATURES names trtllm (no model config found)")
        return rec.props, rec.changes, None
    _rolling_rule(rec, _architectures(config_file), features, rules)
    if rec.props.get("option.rolling_batch") == "trtllm":
        rec.set("option.mpi_mode", "true", "rolling_batch=trtllm runs under MPI")
    rec.default("option.pipeline_parallel_degree", env.get("PIPELINE_PARALLEL_DEGREE") or "1",
                "DJL default (env PIPELINE_PARALLEL_DEGREE or 1)")
    tp = env.get("TENSOR_PARALLEL_DEGREE") or "max"
    if tp != "max":
        rec.default("option.tensor_parallel_degree", tp, "env TENSOR_PARALLEL_DEGREE")
    rolling = rec.props.get("option.rolling_batch")
    if rolling == "trtllm":
        rec.default("option.max_num_tokens", "16384", "DJL default for trtllm")
    rec.default("option.max_rolling_batch_size", "256" if rolling in ("vllm", "trtllm") else "32",
                f"DJL default for rolling_batch={rolling}")
    if str(rec.props.get("option.enable_lora", "")).lower() == "true":
        rec.set("maxWorkers", "1", "option.enable_lora=true allows one worker")
    if str(rec.props.get("option.enable_stateful_sessions", "")).lower() == "true":  # sessions live in one worker
        rec.set("maxWorkers", "1", "option.enable_stateful_sessions=true allows one worker")
    return rec.props, rec.changes, str(config_file)


@dataclass(frozen=True)
class ResolvedModel:
    """Everything the server, the worker's init call and ``check`` need, resolved once."""

    model_name: str
    model_dir: str
    entry_point: str
    server: dict[str, str]
    options: dict[str, str]
    written_rolling_batch: str | None
    changes: tuple[Change, ...] = ()
    hf_config: str | None = None
    warnings: tuple[str, ...] = field(default=())
    rules: str = DEFAULT_RULES

    @property
    def rolling_batch(self) -> str | None:
        """The effective ``option.rolling_batch`` (None when unset)."""
        return self.options.get("rolling_batch")

    @property
    def mode(self) -> str:
        """``async``, ``rolling`` or ``dynamic``."""
        return mode_of(self.options)

    @property
    def async_mode(self) -> bool:
        """True when DJL's Python engine would run this model in async mode."""
        return self.mode == "async"

    def why(self) -> str:
        """One sentence: why this mode (naming the DJL rule set applied)."""
        value = self.rolling_batch
        rewrite = next((c for c in self.changes if c.key == "option.rolling_batch"), None)
        if self.async_mode:
            made = next((c for c in self.changes if c.key == "option.async_mode"), None)
            if made is not None:
                return (f"option.rolling_batch={self.written_rolling_batch or '(unset)'} with {made.rule}: "
                        f"DJL {self.rules}'s rules choose async mode (option.async_mode=true)")
            return ("option.async_mode=true: async mode (each request is awaited alone; the handler runs its "
                    "engine loop)")
        if rewrite is not None:
            return (f"option.rolling_batch={self.written_rolling_batch or '(unset)'} became "
                    f"{rewrite.after!r} as DJL {self.rules} does: {rewrite.rule}")
        if value is None:
            return ("option.rolling_batch is unset" + ("" if self.hf_config else
                    " and no model config.json is readable, so DJL leaves it unset") +
                    ": dynamic batching")
        if not is_rolling_value(value):
            return f"option.rolling_batch={value}: dynamic batching"
        return f"option.rolling_batch={value}: rolling batch"


def _warnings(written: str | None, changes: list[Change], rules: str) -> list[str]:
    out = []
    for change in changes:
        if change.key == "option.rolling_batch":
            out.append(f"DJL Serving {rules} rewrites option.rolling_batch={written or '(unset)'} to "
                       f"{change.after!r} ({change.rule}); djl-handlers serve does the same. "
                       "Set option.rolling_batch explicitly (e.g. scheduler) to choose the mode.")
        elif change.key == "option.async_mode":
            out.append(f"DJL Serving {rules} sets option.async_mode=true ({change.rule}); "
                       "djl-handlers serve does the same.")
    return out


def resolve_model(model_dir: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> ResolvedModel:
    """serving.properties + env → the effective configuration (see the module docstring)."""
    from djl_handlers.config.properties import (
        ModelProperties,
        apply_env,
        read_serving_properties,
        resolve_entry_point,
        split_properties,
    )

    env = os.environ if env is None else env
    rules = rules_from_env(env)
    path = Path(model_dir).resolve()
    if not path.is_dir():
        raise ConfigError(f"model directory {str(model_dir)!r} does not exist", field="model_dir")
    props = apply_env(read_serving_properties(path), env)
    written = props.get("option.rolling_batch")
    props, changes, config_file = recommend(props, path, env, rules)
    server, options = split_properties(props)
    check_async_mode(options)
    _check_sessions(options)
    entry_point = resolve_entry_point(path, ModelProperties(str(path), server, options), env)
    return ResolvedModel(
        model_name=path.name, model_dir=str(path), entry_point=entry_point, server=server,
        options=options, written_rolling_batch=written, changes=tuple(changes), hf_config=config_file,
        warnings=tuple(_warnings(written, changes, rules)), rules=rules,
    )
