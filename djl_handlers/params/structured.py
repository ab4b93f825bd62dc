"""Structured output: the request fields that constrain what a request may generate.

One request carries at most one constraint, ``StructuredOutput``, built here from any dialect's
spelling (all inside ``parameters``):

======================== ======================== =========================================
field                    kind                     value
======================== ======================== =========================================
``guided_json``          ``json``                 a JSON Schema (object, or a string of one)
``guided_regex``         ``regex``                a regular expression (whole output)
``guided_choice``        ``choice``               a list of strings (output is one of them)
``guided_grammar``       ``grammar``              an EBNF grammar (GBNF/xgrammar syntax)
``guided_json_object``   ``json_object``          ``true``: any JSON object
``grammar`` (TGI)        ``json`` / ``regex``     ``{"type": "json"|"regex", "value": ...}``
======================== ======================== =========================================

OpenAI's ``response_format`` and forced tool calls are turned into ``guided_json`` /
``guided_json_object`` by :mod:`djl_handlers.dialects.openai.request`. Checks here are structural (types,
JSON well-formedness, the JSON Schema ``type`` keywords); each engine compiles the constraint when
the request is added and answers 400 with the compiler's own message when it cannot. Nothing here
imports an ML library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from djl_handlers.errors import InvalidParameter

KINDS = ("json", "regex", "choice", "grammar", "json_object")
# request key -> constraint kind (``grammar`` is TGI's object form, handled separately)
FIELDS: Mapping[str, str] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_json_object": "json_object",
}
TGI_FIELD = "grammar"
KEYS: frozenset[str] = frozenset((*FIELDS, TGI_FIELD))
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_CONSTRAINT_CHARS = 1 << 20  # 1 MiB of schema/regex/grammar text


@dataclass(frozen=True)
class StructuredOutput:
    """A validated constraint. ``value``: the schema as canonical JSON text (``json``), the
    pattern (``regex``), the grammar (``grammar``), the choices (``choice``), None
    (``json_object``). ``source`` is the request field it came from (for error messages).
    Equal constraints compare and hash equal (engines cache compiled grammars by it)."""

    kind: str
    value: Union[str, tuple[str, ...], None] = None
    source: str = field(default="", compare=False)

    @property
    def schema(self) -> Any:
        """The JSON Schema as a Python object (``json`` only)."""
        return json.loads(self.value) if self.kind == "json" and isinstance(self.value, str) else None

    def describe(self) -> str:
        """``parameters.<source>`` for error messages."""
        return f"parameters.{self.source or 'guided_' + self.kind}"


def extract(data: Mapping[str, Any]) -> tuple[Optional[StructuredOutput], dict[str, Any]]:
    """Split the structured-output keys off a ``parameters`` object.

    Returns ``(constraint or None, the remaining parameters)``. Raises ``InvalidParameter``
    (``field`` = the key) for a malformed value or when more than one constraint is given.
    A ``null`` value or ``guided_json_object: false`` asks for nothing.
    """
    rest: dict[str, Any] = {}
    found: list[StructuredOutput] = []
    for key, value in data.items():
        if key not in KEYS:
            rest[key] = value
            continue
        if value is None:
            continue
        parsed = _parse_tgi(value) if key == TGI_FIELD else _parse(key, FIELDS[key], value)
        if parsed is not None:
            found.append(parsed)
    if len(found) > 1:
        names = ", ".join(f"parameters.{c.source}" for c in found)
        raise InvalidParameter(f"give at most one structured-output constraint, got {names}", field=found[1].source)
    return (found[0] if found else None), rest


def _parse(key: str, kind: str, value: Any) -> Optional[StructuredOutput]:
    if kind == "json":
        return StructuredOutput("json", schema_text(value, key), key)
    if kind == "json_object":
        if not isinstance(value, bool):
            raise InvalidParameter(f"parameters.{key} must be true or false, got {_short(value)}", field=key)
        return StructuredOutput("json_object", None, key) if value else None
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidParameter(
                f"parameters.{key} must be a non-empty list of non-empty strings, got {_short(value)}", field=key
            )
        return StructuredOutput("choice", tuple(value), key)
    if not isinstance(value, str) or not value.strip():
        what = "regular expression" if kind == "regex" else "EBNF grammar"
        raise InvalidParameter(f"parameters.{key} must be a non-empty string (an {what}), got {_short(value)}",
                               field=key)
    _check_size(value, key)
    return StructuredOutput(kind, value, key)


def _parse_tgi(value: Any) -> StructuredOutput:
    """TGI's ``{"type": "json"|"regex", "value": ...}`` (``json_schema`` accepted for ``json``)."""
    key = TGI_FIELD
    if not isinstance(value, Mapping) or set(value) - {"type", "value"} or "value" not in value:
        raise InvalidParameter(
            f'parameters.grammar must be {{"type": "json" or "regex", "value": ...}}, got {_short(value)}', field=key
        )
    kind = value.get("type")
    if kind in ("json", "json_schema"):
        return StructuredOutput("json", schema_text(value["value"], "grammar.value"), key)
    if kind == "regex":
        parsed = _parse("grammar.value", "regex", value["value"])
        assert parsed is not None
        return StructuredOutput("regex", parsed.value, key)
    raise InvalidParameter(f'parameters.grammar.type must be "json" or "regex", got {_short(kind)}', field=key)


def schema_text(value: Any, key: str) -> str:
    """Canonical JSON text of a JSON Schema given as an object (or ``true``) or a string of one."""
    schema = value
    if isinstance(value, str):
        _check_size(value, key)
        try:
            schema = json.loads(value)
        except ValueError as exc:
            raise InvalidParameter(f"parameters.{key} is not valid JSON: {exc}", field=key.split(".")[0]) from None
    if not isinstance(schema, (dict, bool)) or schema is False:
        raise InvalidParameter(
            f"parameters.{key} must be a JSON Schema object, got {_short(value)}", field=key.split(".")[0]
        )
    check_schema(schema, key)
    # key order kept: properties are generated in schema order (equal schemas share one grammar)
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    _check_size(text, key)
    return text


def check_schema(schema: Any, key: str, path: str = "") -> None:
    """Reject the mistakes a schema compiler reports least clearly: a ``type`` that is not a JSON
    type, ``properties``/``items``/``required`` of the wrong shape. Recurses into sub-schemas."""
    if isinstance(schema, bool):
        return
    where = f"parameters.{key}{path}"
    field_name = key.split(".")[0]
    if not isinstance(schema, dict):
        raise InvalidParameter(f"{where} must be a schema object, got {_short(schema)}", field=field_name)
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else ([] if kinds is None else [kinds]):
        if kind not in _JSON_TYPES:
            raise InvalidParameter(
                f"{where}.type {_short(kind)} is not a JSON Schema type (one of {sorted(_JSON_TYPES)})",
                field=field_name,
            )
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise InvalidParameter(f"{where}.required must be a list of property names", field=field_name)
    for sub_path, sub in _children(schema, where, field_name):
        check_schema(sub, key, path + sub_path)


def _children(schema: dict[str, Any], where: str, field_name: str) -> list[tuple[str, Any]]:
    """``(path suffix, sub-schema)`` of the keywords that hold schemas."""
    out: list[tuple[str, Any]] = []
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise InvalidParameter(f"{where}.properties must be an object", field=field_name)
        out += [(f".properties.{name}", sub) for name, sub in props.items()]
    out += [(f".{name}", schema[name]) for name in ("items", "additionalProperties", "not")
            if isinstance(schema.get(name), (dict, bool))]
    for name in ("anyOf", "oneOf", "allOf"):
        subs = schema.get(name)
        if subs is not None:
            if not isinstance(subs, list) or not subs:
                raise InvalidParameter(f"{where}.{name} must be a non-empty list of schemas", field=field_name)
            out += [(f".{name}[{i}]", sub) for i, sub in enumerate(subs)]
    return out


def _check_size(text: str, key: str) -> None:
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InvalidParameter(
            f"parameters.{key} is too long ({len(text)} characters; at most {MAX_CONSTRAINT_CHARS})",
            field=key.split(".")[0],
        )


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex (ECMAScript syntax, as xgrammar/TensorRT-LLM read it) matching exactly one choice."""
    special = set("\\^$.|?*+()[]{}/")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"
