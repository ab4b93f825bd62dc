"""The server's view of a model directory: DJL's model settings, resolved once.

``config.resolve.resolve_model`` (the one resolver, shared with the worker's init call and
``djl-handlers check``) gives the effective properties after DJL's rewrite (0.34's or 0.36's rules)
and the mode (``async``, ``rolling`` or ``dynamic``);
this module adds the server's limits:

* dynamic batching with ``batch_size`` (server key, or ``max_dynamic_batch_size``, or
  ``option.batch_size``) and ``max_batch_delay`` ms (default 100);
* ``job_queue_size`` (default 1000), ``option.max_rolling_batch_size`` (default 32),
  ``option.predict_timeout`` / env ``PREDICT_TIMEOUT`` (120 s), ``option.model_loading_timeout`` /
  env ``MODEL_LOADING_TIMEOUT`` (240 s), ``option.handler`` (default ``handle``),
  ``option.env=K=V,K2=V2`` (extra worker environment);
* the init call's properties: every option (prefix stripped) plus ``model_dir`` and ``handler``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from djl_handlers.config.resolve import ResolvedModel, resolve_model
from djl_handlers.errors import ConfigError

__all__ = ["ServerSettings", "load_settings"]


@dataclass
class ServerSettings:
    """Resolved settings of one model for the local server."""

    model_name: str
    model_dir: str
    entry_point: str
    options: dict[str, str]
    server: dict[str, str]
    rolling: bool
    batch_size: int = 1
    max_batch_delay_ms: float = 100.0
    job_queue_size: int = 1000
    max_rolling_batch_size: int = 32
    predict_timeout_s: float = 120.0
    loading_timeout_s: float = 240.0
    handler: str = "handle"
    worker_env: dict[str, str] = field(default_factory=dict)
    resolved: ResolvedModel | None = None
    async_mode: bool = False

    @property
    def mode(self) -> str:
        """``async``, ``rolling`` or ``dynamic``."""
        if self.async_mode:
            return "async"
        return "rolling" if self.rolling else "dynamic"

    def init_properties(self) -> dict[str, str]:
        """The init call's properties, as DJL's ``PyProcess`` sends them."""
        properties = dict(self.options)
        properties["model_dir"] = self.model_dir
        properties.setdefault("handler", self.handler)
        return properties

    def default_content_type(self) -> str | None:
        """DJL's rolling-batch default Content-Type from ``option.output_formatter``."""
        formatter = self.options.get("output_formatter")
        if formatter in (None, "", "json"):
            return "application/json"
        if formatter == "jsonlines":
            return "application/jsonlines"
        return None

    def describe(self) -> dict[str, object]:
        """A JSON-able summary (``djl-handlers check`` and ``/models/{name}``)."""
        return {
            "modelName": self.model_name, "modelDir": self.model_dir, "entryPoint": self.entry_point,
            "mode": self.mode, "batchSize": self.batch_size, "maxBatchDelayMillis": self.max_batch_delay_ms,
            "queueSize": self.job_queue_size, "maxRollingBatchSize": self.max_rolling_batch_size,
            "predictTimeoutSeconds": self.predict_timeout_s, "handler": self.handler,
            "options": dict(self.options), "server": dict(self.server),
            "rollingBatch": self.options.get("rolling_batch"),
            "modeReason": self.resolved.why() if self.resolved else None,
            "djlRewrites": [c.describe() for c in self.resolved.changes] if self.resolved else [],
            "modelConfig": self.resolved.hf_config if self.resolved else None,
            "djlRules": self.resolved.rules if self.resolved else None,
        }


def _number(value: str | None, default: float, key: str, minimum: float = 0) -> float:
    """Parse a numeric setting; the error names the key and the bad value."""
    if value is None or str(value).strip() == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r} is not a number", field=key) from None
    if number < minimum:
        raise ConfigError(f"{key}={value!r} must be >= {minimum:g}", field=key)
    return number


def _worker_env(raw: str | None) -> dict[str, str]:
    """``option.env=K=V,K2=V2`` → a dict."""
    result: dict[str, str] = {}
    for item in (raw or "").split(","):
        if "=" in item:
            key, value = item.split("=", 1)
            result[key.strip()] = value.strip()
    return result


def load_settings(model_dir: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> ServerSettings:
    """Read a model directory; :class:`ConfigError` with the key and value when something is wrong."""
    env = os.environ if env is None else env
    resolved = resolve_model(model_dir, env)
    path = Path(resolved.model_dir)
    entry_point = resolved.entry_point
    server, options = resolved.server, resolved.options
    batch_raw = server.get("batch_size") or server.get("max_dynamic_batch_size") or options.get("batch_size")
    batch_size = int(_number(batch_raw, 1, "batch_size", 1))
    return ServerSettings(
        model_name=path.name, model_dir=str(path), entry_point=entry_point, options=dict(options),
        server=dict(server), rolling=resolved.mode == "rolling", batch_size=batch_size,
        max_batch_delay_ms=_number(server.get("max_batch_delay"), 100.0, "max_batch_delay"),
        job_queue_size=int(_number(server.get("job_queue_size"), 1000, "job_queue_size", 1)),
        max_rolling_batch_size=int(_number(options.get("max_rolling_batch_size"), 32,
                                           "option.max_rolling_batch_size", 1)),
        predict_timeout_s=_number(options.get("predict_timeout", env.get("PREDICT_TIMEOUT")), 120.0,
                                  "option.predict_timeout", 1),
        loading_timeout_s=_number(options.get("model_loading_timeout", env.get("MODEL_LOADING_TIMEOUT")),
                                  240.0, "option.model_loading_timeout", 1),
        handler=options.get("handler") or "handle",
        worker_env=_worker_env(options.get("env")), resolved=resolved, async_mode=resolved.async_mode,
    )
