"""``option.speculative_config``: vLLM's speculative-decoding JSON, read once (the HF engine's typed
n-gram settings; the raw object that goes to vLLM unchanged).

vLLM's field names and defaults for its ``ngram`` method (``vllm/config/speculative.py``):
``num_speculative_tokens`` (required, > 0), ``prompt_lookup_max`` / ``prompt_lookup_min`` (>= 1; both
5 when neither is given, one given sets the other, min <= max). The HF engine serves ``ngram`` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError

__all__ = ["KEY", "NgramOptions", "read_ngram", "read_speculative_json"]

KEY = "speculative_config"
_LABEL = f"option.{KEY}"
_DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min/max when neither is given
_NGRAM_FIELDS = frozenset({"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"})


@dataclass(frozen=True)
class NgramOptions:
    """Prompt-lookup speculation: up to ``num_speculative_tokens`` candidates per row and step, taken
    after the longest n-gram (``prompt_lookup_min`` to ``prompt_lookup_max`` tokens) of a row's last
    tokens that occurs earlier in its own prompt and output."""

    num_speculative_tokens: int
    prompt_lookup_max: int = _DEFAULT_LOOKUP
    prompt_lookup_min: int = _DEFAULT_LOOKUP


def read_speculative_json(r: Reader) -> dict[str, Any] | None:
    """The option's JSON object as given (None when unset); a ``ConfigError`` naming the key when it is
    not a JSON object."""
    found = r.get(KEY)
    if found is None:
        return None
    try:
        value = json.loads(found[1])
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_LABEL} is not valid JSON ({exc.msg} at character {exc.pos}): {found[1]!r}",
                          field=_LABEL) from exc
    if not isinstance(value, dict):
        raise r.fail(*found, 'a JSON object such as {"method": "ngram", "num_speculative_tokens": 4}')
    return value


def _count(spec: dict[str, Any], name: str, default: int | None) -> int | None:
    value = spec.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{_LABEL}: {name}={value!r} is invalid; allowed: an integer >= 1", field=_LABEL)
    return value


def read_ngram(r: Reader) -> NgramOptions | None:
    """The HF engine's n-gram settings from ``option.speculative_config`` (None: off, the default; also
    when ``option.rolling_batch`` hands the model to vLLM, which reads the object itself)."""
    rolling = r.get("rolling_batch")
    if rolling is not None and rolling[1].lower() in ("vllm", "lmi-dist"):
        return None
    spec = read_speculative_json(r)
    if spec is None:
        return None
    method = spec.get("method", spec.get("model"))
    if method not in ("ngram", "[ngram]"):
        raise ConfigError(f"{_LABEL}: method={method!r} is not served by the HuggingFace engine, which serves "
                          'only "ngram" (prompt lookup, no draft model); use option.rolling_batch=vllm for '
                          "draft models", field=_LABEL)
    unknown = sorted(set(spec) - _NGRAM_FIELDS - {"model"})
    if unknown:
        raise ConfigError(f"{_LABEL}: {', '.join(unknown)} not read by the HuggingFace engine's ngram method; "
                          f"allowed fields: {', '.join(sorted(_NGRAM_FIELDS))}", field=_LABEL)
    k = _count(spec, "num_speculative_tokens", None)
    if k is None:
        raise ConfigError(f"{_LABEL}: num_speculative_tokens is required (an integer >= 1)", field=_LABEL)
    high, low = _count(spec, "prompt_lookup_max", None), _count(spec, "prompt_lookup_min", None)
    high, low = high or low or _DEFAULT_LOOKUP, low or high or _DEFAULT_LOOKUP
    if low > high:
        raise ConfigError(f"{_LABEL}: prompt_lookup_min={low} must be <= prompt_lookup_max={high}", field=_LABEL)
    return NgramOptions(k, high, low)
