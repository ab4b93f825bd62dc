"""JSON Schemas of the generation parameters, derived from the validators that check them.

``parameter_schema(name, engine)`` reads the validator ``generation.SPECS[name]`` (its kind and
its bounds) and the support table, so the schema a client reads (``/openapi.json``) and the check
a request meets cannot drift apart: a parameter the engine does not honour is described as
accepting only its default (or ``null``), as ``GenerationParameters.from_dict`` rules.
``structured_schema`` does the same for the structured-output keys. Nothing here imports an ML
library; nothing runs at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from djl_handlers.params import generation as gen
from djl_handlers.params.structured import FIELDS as STRUCTURED_FIELDS
from djl_handlers.params.structured import MAX_CONSTRAINT_CHARS, TGI_FIELD
from djl_handlers.params.support import SUPPORT, UNSUPPORTED, normalize_engine

__all__ = ["parameter_schema", "parameters_object_schema", "structured_schema"]

_NON_EMPTY = {"type": "string", "minLength": 1}


def _bounded(kind: str, keywords: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": kind}
    low, high = keywords.get("low"), keywords.get("high")
    if low is not None:
        schema["exclusiveMinimum" if keywords.get("low_open") else "minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return schema


def _validator_schema(validator: Callable[..., Any], engine: str, max_new_tokens: int) -> dict[str, Any]:
    """The schema of the values ``validator`` accepts (a ``generation`` validator or a partial of one)."""
    func = validator.func if isinstance(validator, partial) else validator
    keywords = dict(validator.keywords) if isinstance(validator, partial) else {}
    if func is gen._boolean:
        return {"type": "boolean"}
    if func is gen._integer:
        return _bounded("integer", keywords)
    if func is gen._number:
        return _bounded("number", keywords)
    if func is gen._top_p:  # 0 only where the engine's own default is 0 (see generation._top_p)
        return _bounded("number", {"low": 0.0, "high": 1.0, "low_open": engine != "tensorrt_llm"})
    if func is gen._max_new_tokens:
        return _bounded("integer", {"low": 1, "high": max_new_tokens})
    if func is gen._seed:
        return {"anyOf": [_bounded("integer", {"low": 0, "high": gen._MAX_SEED}),
                          {"type": "string", "pattern": f"^{gen._DIGITS.pattern}$"}]}
    if func is gen._strings:
        return {"anyOf": [_NON_EMPTY, {"type": "array", "items": _NON_EMPTY}]}
    if func is gen._early_stopping:
        return {"anyOf": [{"type": "boolean"}, {"enum": ["never"]}]}
    if func is gen._token_ids:
        return {"type": "array", "items": {"type": "integer", "minimum": 0}}
    raise ValueError(f"no schema for validator {func!r}")  # a new validator needs a line here


def parameter_schema(name: str, engine: str = "huggingface", *, max_new_tokens: int = 4096) -> dict[str, Any]:
    """The JSON Schema of parameter ``name`` (an LMI name) as ``engine`` accepts it; ``null`` is
    always accepted (it asks for the default). An unsupported parameter accepts only its default."""
    engine = normalize_engine(engine)
    validator = gen.SPECS[name]
    status = SUPPORT[engine][name]
    default = gen._DEFAULTS[name]
    if status == UNSUPPORTED:
        values = [None] if default is None else [None, list(default) if isinstance(default, tuple) else default]
        return {"enum": values, "description": f"not supported by engine {engine}: only the default"}
    schema = _validator_schema(validator, engine, max_new_tokens)
    described = {"description": f"{status} on engine {engine}; default {default!r}"}
    return {"anyOf": [schema, {"type": "null"}], **described}


def structured_schema(key: str) -> dict[str, Any]:
    """The JSON Schema of a structured-output key (``guided_*``, TGI's ``grammar``)."""
    text = {"type": "string", "minLength": 1, "maxLength": MAX_CONSTRAINT_CHARS, "pattern": "\\S"}
    if key == TGI_FIELD:
        kinds = {"type": "string", "enum": ["json", "json_schema", "regex"]}
        return {"anyOf": [{"type": "object", "required": ["type", "value"], "additionalProperties": False,
                           "properties": {"type": kinds, "value": {}}}, {"type": "null"}]}
    kind = STRUCTURED_FIELDS[key]
    value: dict[str, Any]
    if kind == "json":
        value = {"anyOf": [{"type": "object"}, {"const": True}, text]}
    elif kind == "json_object":
        value = {"type": "boolean"}
    elif kind == "choice":
        value = {"type": "array", "minItems": 1, "items": _NON_EMPTY}
    else:
        value = text
    return {"anyOf": [value, {"type": "null"}]}


def parameters_object_schema(engine: str = "huggingface", *, max_new_tokens: int = 4096,
                             extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The ``parameters`` object of the LMI schema: every known parameter, its alias ``stop``, the
    structured-output keys, ``stream``/``output_formatter`` and ``extra`` (a dialect's own keys)."""
    props: dict[str, Any] = {name: parameter_schema(name, engine, max_new_tokens=max_new_tokens)
                             for name in sorted(gen.SPECS)}
    for alias, name in gen.ALIASES.items():
        props[alias] = props[name]
    for key in sorted((*STRUCTURED_FIELDS, TGI_FIELD)):
        props[key] = structured_schema(key)
    props["stream"] = {"type": "boolean"}
    props["output_formatter"] = {"type": "string"}
    props.update({key: dict(value) for key, value in (extra or {}).items()})
    return {"type": "object", "properties": props, "additionalProperties": False}
