"""The configuration matrix of ``test_config_matrix.py`` (no tests here).

:data:`CONFIGS` are the model-directory configurations users write (serving.properties lines, or
``OPTION_*``/``SERVING_FEATURES`` variables) for the tiny model, each run on the DJL Serving releases
of :data:`RELEASES` it applies to; :data:`KINDS` are the requests each one gets.
:func:`djl_rolling_batch` says what the release's ``LmiConfigRecommender`` turns a configuration's
``option.rolling_batch`` (and ``option.async_mode``) into before the handler sees it — DJL 0.34's
rule set, or DJL 0.36's, where ``auto`` (or no value) with ``SERVING_FEATURES=vllm`` becomes
``rolling_batch=disable`` + ``option.async_mode=true`` — and :func:`djl_mode` the mode that follows;
``djl-handlers serve`` must run the same mode (its resolver is told the release with
``DJL_HANDLERS_DJL_RULES``). :func:`parse_body` and :func:`lmi_shape_problem` turn a reply into
what is compared and check it is an LMI answer or a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

PROMPT = "Deep learning is"
SECOND = "The capital of France is"
RELEASES: tuple[str, ...] = ("0.34", "0.36")  # DJL Serving releases (their LmiConfigRecommender rule sets)
RULES_ENV = "DJL_HANDLERS_DJL_RULES"  # tells our resolver which release's rules to apply
BASE = {
    "engine": "Python",
    "option.entryPoint": "djl_handlers.huggingface",
    "option.dtype": "fp32",
    "option.predict_timeout": "120",
    "minWorkers": "1",
    "maxWorkers": "1",
}


@dataclass(frozen=True)
class MatrixConfig:
    """One model directory: serving.properties lines (or none) plus environment variables."""

    id: str
    properties: Optional[Mapping[str, str]]  # None: no serving.properties at all (env only)
    env: Mapping[str, str] = field(default_factory=dict)
    model_id: bool = True  # False: the weights are in the model directory itself
    releases: tuple[str, ...] = RELEASES  # the DJL releases this configuration is run on

    def option(self, key: str) -> Optional[str]:
        """``option.<key>`` from the properties, else ``OPTION_<KEY>`` from the environment."""
        if self.properties is not None and f"option.{key}" in self.properties:
            return self.properties[f"option.{key}"]
        return self.env.get(f"OPTION_{key.upper()}")


def _props(**options: str) -> dict[str, str]:
    props = dict(BASE)
    for key, value in options.items():
        props[key if key in ("batch_size", "max_batch_delay") else f"option.{key}"] = value
    return props


CONFIGS: tuple[MatrixConfig, ...] = (
    MatrixConfig("no-rolling-batch", _props()),
    MatrixConfig("auto", _props(rolling_batch="auto", max_rolling_batch_size="4")),
    MatrixConfig("auto-no-model-id", _props(rolling_batch="auto"), model_id=False),
    MatrixConfig(
        "scheduler-batch1",
        _props(rolling_batch="scheduler", max_rolling_batch_size="4", batch_size="1", max_batch_delay="100"),
    ),
    MatrixConfig("disable-batch2", _props(rolling_batch="disable", batch_size="2", max_batch_delay="100")),
    MatrixConfig("scheduler-batch2", _props(rolling_batch="scheduler", batch_size="2", max_batch_delay="100")),
    MatrixConfig("enable-streaming", _props(rolling_batch="disable", enable_streaming="true")),
    MatrixConfig("jsonlines", _props(rolling_batch="scheduler", output_formatter="jsonlines")),
    MatrixConfig("tgi-compat", _props(rolling_batch="scheduler", tgi_compat="true")),
    MatrixConfig(
        "env-only",
        None,
        env={"OPTION_ENGINE": "Python", "OPTION_ENTRYPOINT": "djl_handlers.huggingface",
             "OPTION_ROLLING_BATCH": "scheduler", "OPTION_DTYPE": "fp32"},
    ),
    # DJL's async mode, chosen by the user: each request is handed to the handler alone and awaited
    MatrixConfig("async-mode", _props(async_mode="true", max_rolling_batch_size="4")),
    # the vllm feature without a rolling_batch: vllm (not installed here) on 0.34, async mode on 0.36
    MatrixConfig("vllm-feature", _props(), env={"SERVING_FEATURES": "vllm"}),
    MatrixConfig("vllm", _props(rolling_batch="vllm")),
    MatrixConfig("lmi-dist", _props(rolling_batch="lmi-dist")),
)


def djl_rolling_batch(config: MatrixConfig, release: str) -> tuple[str, bool]:
    """``(option.rolling_batch, async mode)`` after the release's LmiConfigRecommender (HF config readable).

    Every configuration here has a readable ``config.json`` (``option.model_id`` folder or the model
    directory) of a text-generation model, so the recommender runs: ``batch_size > 1`` → ``disable``;
    ``lmi-dist`` → ``vllm``; any other value than ``auto`` is kept; unset or ``auto`` → ``vllm`` when
    ``SERVING_FEATURES`` names vllm on 0.34, ``disable`` plus ``option.async_mode=true`` on 0.36, else
    ``disable``. ``option.async_mode=true`` written by the user stays.
    """
    props = config.properties or {}
    asked_async = (config.option("async_mode") or "").lower() == "true"
    if int(props.get("batch_size", "1")) > 1:
        return "disable", asked_async
    value = config.option("rolling_batch") or "auto"
    if value == "lmi-dist":
        return "vllm", asked_async
    if value != "auto":
        return value, asked_async
    if "vllm" in config.env.get("SERVING_FEATURES", ""):
        return ("vllm", asked_async) if release == "0.34" else ("disable", True)
    return "disable", asked_async


def djl_mode(config: MatrixConfig, release: str) -> str:
    """``async``, ``rolling``, ``dynamic`` or ``fails`` (vLLM is not installed here) on that DJL release."""
    value, is_async = djl_rolling_batch(config, release)
    if value == "vllm":
        return "fails"
    if is_async:
        return "async"
    return "dynamic" if value == "disable" else "rolling"


def cases(*, loads: bool) -> list[tuple[str, MatrixConfig]]:
    """``(release, configuration)`` pairs, release-major, that load (or, ``loads=False``, need vLLM)."""
    return [(release, config) for release in RELEASES for config in CONFIGS
            if release in config.releases and (djl_mode(config, release) != "fails") == loads]


def write_model_dir(config: MatrixConfig, model: Path, root: Path,
                    release: str = RELEASES[0]) -> tuple[Path, dict[str, str]]:
    """The configuration's model directory under ``root`` and the environment both servers get
    (``DJL_HANDLERS_DJL_RULES`` names the DJL release, for our resolver)."""
    target = root / release / config.id
    target.mkdir(parents=True)
    env = {**config.env, RULES_ENV: release}
    if config.properties is None:
        env["OPTION_MODEL_ID"] = str(model)
        return target, env
    props = dict(config.properties)
    if config.model_id:
        props["option.model_id"] = str(model)
    else:
        for item in model.iterdir():  # the weights live in the model directory itself
            (target / item.name).symlink_to(item)
    text = f"# configuration matrix cell {config.id}\n" + "".join(f"{k}={v}\n" for k, v in props.items())
    (target / "serving.properties").write_text(text, encoding="utf-8")
    return target, env


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Kind:
    """One request kind."""

    id: str
    body: bytes


def _json(payload: Any) -> bytes:
    return json.dumps(payload).encode("utf-8")


KINDS: tuple[Kind, ...] = (
    Kind("json", _json({"inputs": PROMPT, "parameters": {"max_new_tokens": 4}})),
    Kind("stream", _json({"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 3}})),
    Kind("details", _json({"inputs": PROMPT, "parameters": {"max_new_tokens": 3, "details": True}})),
    Kind("list-one", _json({"inputs": [PROMPT], "parameters": {"max_new_tokens": 3}})),
    Kind("list-two", _json({"inputs": [PROMPT, SECOND], "parameters": {"max_new_tokens": 3}})),
    Kind("bad-json", b'{"inputs": "Deep'),
    Kind("bad-parameter", _json({"inputs": PROMPT, "parameters": {"max_new_tokens": -1}})),
    Kind("unknown-parameter", _json({"inputs": PROMPT, "parameters": {"max_new_tokens": 2, "bogus": 1}})),
)


# --------------------------------------------------------------------------- replies
def media_type(content_type: Optional[str]) -> str:
    """The Content-Type without parameters (charset), lower-cased."""
    return (content_type or "").split(";")[0].strip().lower()


def parse_body(content_type: Optional[str], body: bytes) -> Any:
    """JSON, JSON lines, or SSE ``data:`` events (as JSON where they are); else the text."""
    text = body.decode("utf-8", errors="replace")
    kind = media_type(content_type)
    try:
        if kind == "application/json":
            return json.loads(text)
        if kind == "application/jsonlines":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if kind == "text/event-stream":
            events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
            return [json.loads(e) if e.startswith(("{", "[")) else e for e in events]
    except ValueError:
        return {"unparsable": text}
    return text


def without_random_seed(parsed: Any) -> Any:
    """``parsed`` without ``details.seed`` (TGI details report the seed each server drew at random)."""
    if isinstance(parsed, list):
        return [without_random_seed(x) for x in parsed]
    if isinstance(parsed, dict):
        return {k: (without_random_seed(v) if k != "details" else _drop_seed(v)) for k, v in parsed.items()}
    return parsed


def _drop_seed(details: Any) -> Any:
    return {k: v for k, v in details.items() if k != "seed"} if isinstance(details, dict) else details


def _generation(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("generated_text"), str)


def _error(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("error") or item.get("message"), str)


def _stream_line(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    token = item.get("token")
    if isinstance(token, dict):
        return isinstance(token.get("text"), str) and isinstance(token.get("id"), (int, list))
    return isinstance(item.get("outputs"), list) or _generation(item) or _error(item)


def lmi_shape_problem(status: int, content_type: Optional[str], parsed: Any) -> Optional[str]:
    """None when the reply is an LMI answer (json, list, jsonlines, SSE) or a clear error; else why not."""
    kind = media_type(content_type)
    if status >= 400:
        return None if _error(parsed) else f"{status} without an error message: {parsed!r:.200}"
    if status != 200:
        return f"unexpected status {status}"
    if kind == "application/json":
        if _generation(parsed) or _error(parsed):
            return None
        if isinstance(parsed, list) and parsed and all(_generation(x) or _error(x) for x in parsed):
            return None
        return f"not an LMI json body: {parsed!r:.200}"
    if kind in ("application/jsonlines", "text/event-stream"):
        lines = [x for x in parsed if x != "[DONE]"] if isinstance(parsed, list) else []
        if lines and all(_stream_line(x) for x in lines):
            return None
        return f"not an LMI stream: {parsed!r:.200}"
    return f"unexpected Content-Type {content_type!r}"
