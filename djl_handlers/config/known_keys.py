"""Every serving.properties key that something reads, in one table, and the warnings for the rest.

DJL passes every ``option.*`` key to the handler, so an unknown key cannot be an error; but a typo
(``option.dtpye=bf16``) must not pass in silence. ``key_warnings`` names each key that neither
djl_handlers nor DJL Serving 0.34 reads, with close matches ("did you mean"), and each engine
option that the chosen engine does not read. ``djl-handlers check`` prints the warnings and
``djl-handlers serve`` logs them at start-up.

Where the keys come from:

* ``engine_option_keys(engine)``: the option keys ``ServingConfig.from_properties`` looks up for
  that engine, *recorded* by running it on an empty map (so the table follows config/models.py);
* ``HANDLER_OPTION_KEYS``: options read elsewhere in djl_handlers (server settings, the service,
  the embedded model);
* ``DJL_OPTION_KEYS`` / ``DJL_SERVER_KEYS``: what DJL Serving 0.34's front end reads
  (``wlm/ModelInfo``, ``LmiConfigRecommender``, ``LmiUtils`` and the Python engine's ``PyModel``);
  ``<device>.minWorkers`` style keys are matched by pattern.

No ML library is imported; the recording runs on the first call, not at import time.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from djl_handlers.errors import ConfigError

__all__ = [
    "DJL_ENGINES",
    "DJL_OPTION_KEYS",
    "DJL_SERVER_KEYS",
    "HANDLER_OPTION_KEYS",
    "check_engine_value",
    "engine_option_keys",
    "key_warnings",
    "known_option_keys",
]

# Engines our handlers run under: DJL's Python engine, its MPI variant, and v0.27's DeepSpeed name.
DJL_ENGINES: tuple[str, ...] = ("Python", "MPI", "DeepSpeed")

# Top-level keys DJL Serving 0.34 reads (ModelInfo.configPerModelSettings/checkAvailableMemory,
# LmiConfigRecommender, the worker-count lookup) plus DJL's model-arguments names.
DJL_SERVER_KEYS: frozenset[str] = frozenset({
    "engine", "job_queue_size", "batch_size", "max_dynamic_batch_size", "max_batch_delay",
    "max_idle_time", "load_on_devices", "minWorkers", "maxWorkers", "required_memory_mb",
    "reserved_memory_mb", "log_request_metric", "metrics_aggregation", "retry_threshold",
    "translator", "translatorFactory", "batchifier", "blockFactory",
})
# ``gpu.minWorkers``, ``cpu.maxWorkers``, ``nc.minWorkers``, ``gpu.required_memory_mb`` ...
_DEVICE_SERVER_KEY = re.compile(r"(cpu|gpu|nc)\.(minWorkers|maxWorkers|required_memory_mb|reserved_memory_mb)")

# option.* keys DJL Serving 0.34 itself reads (PyModel.load, ModelInfo, LmiUtils, LmiConfigRecommender).
DJL_OPTION_KEYS: frozenset[str] = frozenset({
    "entryPoint", "pythonExecutable", "env", "handler", "predict_timeout", "model_loading_timeout",
    "parallel_loading", "tensor_parallel_degree", "pipeline_parallel_degree", "enable_venv",
    "mpi_mode", "async_mode", "model_id", "modelName", "rolling_batch", "max_rolling_batch_size",
    "max_num_tokens", "enable_lora", "enable_stateful_sessions", "speculative_draft_model",
    "trust_remote_code", "optimization", "is_peft_model", "quantize",
})

# option.* keys djl_handlers reads outside ServingConfig.
HANDLER_OPTION_KEYS: frozenset[str] = frozenset({
    "embedded_model",  # service.py: the converted SmolLM2 folder when model_id is unset
    "batch_size",  # server/settings.py: DJL's init call may carry it as an option
    "env", "handler", "predict_timeout", "model_loading_timeout",  # server/settings.py
})
_ENGINES: tuple[str, ...] = ("huggingface", "deepspeed", "tensorrt_llm", "vllm", "lmi-dist")


class _Recorder(dict[str, Any]):
    """An empty mapping that remembers every key looked up with ``get``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(str(key))
        if key == "rolling_batch":  # an unset value is refused by rolling-only engines (vllm)
            return "auto"
        return default


@cache
def engine_option_keys(engine: str) -> frozenset[str]:
    """The option keys (prefix stripped) ``ServingConfig.from_properties`` reads for ``engine``."""
    from djl_handlers.config.models import ServingConfig

    options, server = _Recorder(), _Recorder()
    ServingConfig.from_properties(options, server, engine)
    return frozenset(options.seen)


def known_option_keys(engine: str | None = None) -> frozenset[str]:
    """Every option key something reads: for ``engine``, or for any engine when ``None``."""
    engines = _ENGINES if engine is None else (engine,)
    keys: set[str] = set(DJL_OPTION_KEYS | HANDLER_OPTION_KEYS)
    for name in engines:
        keys |= engine_option_keys(name)
    return frozenset(keys)


def _suggest(key: str, candidates: Iterable[str], prefix: str = "") -> str:
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=3, cutoff=0.75)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"{prefix}{lowered[c]}" for c in close) + "?"


def _is_server_key(key: str) -> bool:
    return key in DJL_SERVER_KEYS or bool(_DEVICE_SERVER_KEY.fullmatch(key))


def key_warnings(options: Mapping[str, Any], server: Mapping[str, Any], engine: str | None = None) -> list[str]:
    """One warning per key nothing reads; ``engine`` is the handler's engine (``None``: any).

    ``options`` have the ``option.`` prefix stripped; ``server`` holds the other keys.
    """
    warnings: list[str] = []
    everything = known_option_keys(None)
    mine = known_option_keys(engine)
    for key in sorted(str(k) for k in options):
        if key in mine:
            continue
        if key in everything:
            readers = [e for e in _ENGINES if key in engine_option_keys(e)]
            warnings.append(f"option.{key} is read only by the {', '.join(readers)} engine(s), "
                            f"not by {engine}; it has no effect here")
            continue
        hint = _suggest(key, everything, "option.") or _suggest(key, DJL_SERVER_KEYS)
        warnings.append(f"option.{key} is not read by djl_handlers or DJL Serving{hint or ''}"
                        + ("" if hint else "; it is passed to the handler unchanged"))
    for key in sorted(str(k) for k in server):
        if _is_server_key(key):
            continue
        hint = _suggest(key, DJL_SERVER_KEYS) or _suggest(key, everything, "option.")
        warnings.append(f"{key} is not read by DJL Serving or djl_handlers{hint}"
                        + ("" if hint else " (model options start with 'option.')"))
    return warnings


def check_engine_value(server: Mapping[str, Any]) -> None:
    """``engine`` must name an engine our handlers run under (DJL fails to load any other)."""
    value = str(server.get("engine", "") or "").strip()
    if not value or value in DJL_ENGINES:
        return
    hint = _suggest(value, DJL_ENGINES)
    raise ConfigError(f"engine={value!r} is invalid; allowed: {', '.join(DJL_ENGINES)} "
                      f"(DJL Serving's engine names are case-sensitive){hint}", field="engine")
