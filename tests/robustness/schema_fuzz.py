"""A schema-driven fuzzer: schemathesis reads a live server's ``/openapi.json`` and sends every
operation generated cases — bodies, query, path and header values valid per the schema
(``positive``) and invalid ones (``negative``) — then checks each answer:

* no 5xx but the documented engine failure 507 (out of memory), and an answer within the timeout
  (no hang);
* the status, content type and JSON body conform to the description (schemathesis' own checks);
  negative cases are refused (4xx);
* every 4xx is in the route's dialect error shape (OpenAI's ``{"error": {...}}`` on ``/v1/*``,
  ``/tokenize``, ``/detokenize``; TGI's ``{"error", "error_type"}`` on TGI routes; DJL's bodies
  elsewhere) and its message names what was wrong: a key or value of the request, or the part
  (body, Content-Type, path) that was.

No test here: ``test_schema_fuzz.py`` runs it (bounded in examples per operation and time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

from djl_handlers.server.access import dialect_of_path

ALLOWED_5XX = frozenset({507})  # the engine ran out of memory (documented in docs/server.md)
# parts of a request an error may name instead of a key or value (DJL's own "LoRA is not enabled.")
_PARTS = ("body", "content-type", "json", "path", "model", "adapter", "lora", "parameters", "inputs", "prompt",
          "messages")


@dataclass
class FuzzReport:
    """What one run found: ``findings`` (each a one-line description) and what it sent."""

    findings: list[str] = field(default_factory=list)
    cases: int = 0
    unsatisfiable: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    def add(self, text: str) -> None:
        if text not in self.findings:
            self.findings.append(text)


def _words(value: Any, depth: int = 0) -> Iterator[str]:
    """The keys and short string values of a request part (two levels deep)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield str(key)
            if depth < 2:
                yield from _words(sub, depth + 1)
    elif isinstance(value, list) and depth < 2:
        for sub in value[:8]:
            yield from _words(sub, depth + 1)
    elif isinstance(value, str) and 0 < len(value) <= 40:
        yield value


def error_message(path: str, body: Any) -> str | None:
    """The error text of a 4xx body in the dialect of ``path``, or None when the shape is wrong
    (``/tokenize`` answers in its body's dialect: TGI's for ``inputs``, else vLLM's)."""
    dialect = dialect_of_path(path)
    if path == "/tokenize" and isinstance(body, dict) and "error_type" in body:
        dialect = "tgi"
    if not isinstance(body, dict):
        return None
    if dialect != "djl" and {"code", "type", "message"} <= set(body):  # the front end's own (413, 503)
        return str(body["message"])
    if dialect == "openai":
        error = body.get("error")
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
        return error["message"] if ok else None
    if dialect == "tgi":
        ok = isinstance(body.get("error_type"), str) and isinstance(body.get("error"), str)
        return str(body["error"]) if ok else None
    for key in ("error", "message"):  # DJL's front end, the handler's error body, a rolling-batch record
        if isinstance(body.get(key), str) and body[key]:
            return str(body[key])
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):  # an OpenAI body sent to /invocations
        return str(error["message"])
    return None


def _names_the_problem(message: str, case: Any, fields: frozenset[str]) -> bool:
    """The message names a key or value the request sent, a field of the route (a missing one),
    or the part of the request that was wrong."""
    text = message.lower()
    words = [*_words(case.body), *_words(case.query or {}), *_words(case.path_parameters or {}),
             *_words(case.headers or {}), *fields]
    named = any(w.lower() in text for w in words if w.strip()) or any(part in text for part in _PARTS)
    return named or ("" in words and ("''" in text or '""' in text))  # an empty key, quoted


def _field_names(schema: Any, depth: int = 0) -> Iterator[str]:
    """Property names in a (raw, resolved-enough) request schema, a few levels deep."""
    if depth > 4:
        return
    if isinstance(schema, dict):
        for key, sub in schema.items():
            if key == "properties" and isinstance(sub, dict):
                yield from sub
            yield from _field_names(sub, depth + 1)
    elif isinstance(schema, list):
        for sub in schema:
            yield from _field_names(sub, depth + 1)


def _route_fields(raw: dict[str, Any], path: str, method: str) -> frozenset[str]:
    operation = raw.get("paths", {}).get(path, {}).get(method.lower(), {})
    names = set(_field_names(operation.get("requestBody", {})))
    names.update(p["name"] for p in operation.get("parameters", []) if isinstance(p, dict) and "name" in p)
    return frozenset(names)


def _check(case: Any, response: Any, mode: GenerationMode, report: FuzzReport, fields: frozenset[str]) -> None:
    label = f"{case.method} {case.path}"
    status = response.status_code
    report.statuses[status] = report.statuses.get(status, 0) + 1
    if status >= 500 and status not in ALLOWED_5XX:
        report.add(f"{label}: {status} for {_short(case.body, 2000)}: {_short(response.text)}")
        return
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    if mode == GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)
    try:
        case.validate_response(response, checks=checks)
    except FailureGroup as group:  # every failed check of this response
        for failure in group.exceptions:
            report.add(f"{label} [{mode.value}]: {getattr(failure, 'title', type(failure).__name__)}: "
                       f"{_short(str(failure), 300)}")
    if 400 <= status < 500 and status != 401:
        try:
            body = response.json()
        except ValueError:
            body = None
        message = error_message(case.path, body)
        if message is None:
            report.add(f"{label}: {status} not in the route's error shape: {_short(response.text)}")
        elif not _names_the_problem(message, case, fields):
            report.add(f"{label}: {status} message names nothing of the request: {message!r} for "
                       f"{_short(case.body)}")


def _short(value: Any, limit: int = 160) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fuzz(base_url: str, *, examples: int, budget_s: float, request_timeout_s: float = 60.0,
         modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
         skip: frozenset[str] = frozenset(), only: frozenset[str] | None = None) -> FuzzReport:
    """Fuzz every operation of the server at ``base_url``: at most ``examples`` cases per
    operation and mode, derandomised (the same cases every run), stopping after ``budget_s``;
    ``skip``/``only``: operation labels (``POST /v1/completions``) to leave out / to run alone."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    report = FuzzReport()
    deadline = time.monotonic() + budget_s
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in skip or (only is not None and operation.label not in only):
            continue
        for mode in modes:
            if time.monotonic() > deadline:
                report.add(f"time budget of {budget_s:.0f} s spent before {operation.label} [{mode.value}]")
                return report
            fields = _route_fields(schema.raw_schema, operation.path, operation.method)
            _fuzz_operation(operation, mode, base_url, examples, request_timeout_s, report, fields)
    return report


def _fuzz_operation(operation: Any, mode: GenerationMode, base_url: str, examples: int, timeout_s: float,
                    report: FuzzReport, fields: frozenset[str]) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        report.cases += 1
        try:
            response = case.call(base_url=base_url, timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a timeout or a dropped connection is a finding
            report.add(f"{case.method} {case.path}: no answer ({type(exc).__name__}) for {_short(case.body, 2000)}")
            return
        _check(case, response, mode, report, fields)

    try:
        run()
    except Unsatisfiable:  # nothing to generate, e.g. no invalid variant of an operation without inputs
        report.unsatisfiable.append(f"{operation.label} [{mode.value}]")
