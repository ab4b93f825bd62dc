"""LMI v0.27 rolling-batch formatters (``json``, ``jsonlines``, ``none``) and the shared helpers
(the ``Formatter`` base class and the error accessors live in ``base.py``).

Every formatter is called once per scheduler step with the request's ``RequestOutput`` (after
``new_tokens``/``tokens`` are updated; ``finished``/``finish_reason`` set on the last call) and
returns the text to append to the HTTP body, ``""`` for nothing. Formatters keep no state: all
they need is in the ``RequestOutput``, so one instance serves every request.

JSON is written like DJL v0.27's Python formatters: ``json.dumps(obj, ensure_ascii=False)`` with
the default ``", "``/``": "`` separators. Non-finite log-probs are written as absent/null, never as
the invalid ``-Infinity``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, Optional

from djl_handlers.formatting.base import (  # noqa: F401 - re-exported for the dialect modules
    DEFAULT_ERROR_CODE,
    SAMPLES_FINAL,
    Formatter,
    error_code,
    error_message,
    is_error,
)
from djl_handlers.request.records import RequestOutput, Token
from djl_handlers.request.sequences import best_first

# Carries the closing fields when the final step produced no token (e.g. a trimmed stop
# sequence) or failed: id -1 and ``special`` as DJL's own error token, no text.
PLACEHOLDER_TOKEN = Token(id=-1, text="", log_prob=None, special=True)


# --------------------------------------------------------------------------- shared helpers


def dumps(obj: Any) -> str:
    """DJL v0.27 style JSON: ``ensure_ascii=False``, default separators."""
    return json.dumps(obj, ensure_ascii=False)


def dumps_compact(obj: Any) -> str:
    """Compact JSON as TGI (serde) and OpenAI servers (pydantic) write it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def finite(value: Optional[float]) -> Optional[float]:
    """``value`` when it is a finite number, else None (JSON has no infinities)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def lmi_token(token: Token) -> dict[str, Any]:
    """LMI v0.27 token object ``{"id": [int], "text", "log_prob"}``.

    As in v0.27, ``log_prob`` is left out when unknown and ``special_token: true`` is added only
    for special tokens. Unlike v0.27, ``text`` is always present (v0.27 dropped empty text) and a
    log-prob of exactly 0.0 is kept (v0.27 dropped it as falsy).
    """
    out: dict[str, Any] = {"id": [token.id], "text": token.text}
    log_prob = finite(token.log_prob)
    if log_prob is not None:
        out["log_prob"] = log_prob
    if token.special:
        out["special_token"] = True
    return out


def lmi_prefill_token(token: Token) -> dict[str, Any]:
    """A ``details.prefill`` entry: the LMI token object with ``log_prob`` always present (null
    for the first prompt token, which has no log-prob, as LMI v0.29+ and TGI write it)."""
    out: dict[str, Any] = {"id": [token.id], "text": token.text, "log_prob": finite(token.log_prob)}
    if token.special:
        out["special_token"] = True
    return out


def wants_prefill(out: RequestOutput) -> bool:
    """True when the client asked for ``parameters.decoder_input_details``."""
    return bool(getattr(out.request.params, "decoder_input_details", False))


def wants_top_tokens(out: RequestOutput) -> bool:
    """True when the client asked for ``parameters.top_n_tokens`` > 0."""
    return bool(getattr(out.request.params, "top_n_tokens", 0))


def finish_reason(out: RequestOutput) -> Optional[str]:
    """LMI finish reason: ``error`` for a failed request, else what the scheduler recorded."""
    return "error" if is_error(out) else out.finish_reason


def inputs_of(out: RequestOutput) -> Any:
    """``details.inputs``: what the client sent as ``inputs``, else the prompt."""
    req = out.request
    return req.inputs if req.inputs is not None else req.prompt


def wants_details(out: RequestOutput) -> bool:
    """True when the client asked for ``parameters.details``."""
    return bool(getattr(out.request.params, "details", False))


def first_new_index(out: RequestOutput) -> int:
    """Position in ``out.tokens`` of the first token added by this step."""
    return len(out.tokens) - len(out.new_tokens)


def step_events(out: RequestOutput) -> Iterator[tuple[int, Token, bool]]:
    """``(index, token, closing)`` for each line a streaming formatter writes this step.

    One event per new token; ``closing`` is True on the event that ends the response (the last
    new token of the finishing step). A finishing step without new tokens yields one closing
    event carrying ``PLACEHOLDER_TOKEN`` so the closing fields are never lost.
    """
    start = first_new_index(out)
    count = len(out.new_tokens)
    for offset, token in enumerate(out.new_tokens):
        yield start + offset, token, out.finished and offset == count - 1
    if out.finished and count == 0:
        yield len(out.tokens), PLACEHOLDER_TOKEN, True


def lmi_details(out: RequestOutput, *, include_tokens: bool) -> dict[str, Any]:
    """``details`` object: finish_reason, generated_tokens, inputs[, tokens][, prefill][, top_tokens].

    ``prefill`` (with ``decoder_input_details``) and ``top_tokens`` (with ``top_n_tokens``, one
    list per generated token) as LMI v0.29+ adds them, in the stream's closing details too.
    """
    details: dict[str, Any] = {
        "finish_reason": finish_reason(out),
        "generated_tokens": len(out.tokens),
        "inputs": inputs_of(out),
    }
    if include_tokens:
        details["tokens"] = [lmi_token(t) for t in out.tokens]
    if wants_prefill(out):
        details["prefill"] = [lmi_prefill_token(t) for t in out.prefill]
    if wants_top_tokens(out):
        details["top_tokens"] = [[lmi_token(t) for t in top] for top in out.top_tokens]
    return details


# --------------------------------------------------------------------------- formatters


def best_of_sequence(seq: RequestOutput) -> dict[str, Any]:
    """One entry of ``details.best_of_sequences`` (LMI v0.29+'s ``BestOfSequence``): ``finish_reason``,
    ``generated_tokens``, ``tokens``[, ``prefill``][, ``top_tokens``], ``generated_text``."""
    entry = {k: v for k, v in lmi_details(seq, include_tokens=True).items() if k != "inputs"}
    entry["generated_text"] = seq.full_text
    return entry


class JsonFormatter(Formatter):
    """``json``: nothing until finished, then one object ``{"generated_text"[, "details"]}``.

    On failure: ``{"generated_text": null, "error", "code", "details"}`` with
    ``details.finish_reason == "error"`` (details always present so clients can detect it).

    Several samples (``n``/``best_of`` > 1), as LMI v0.29+: ``generated_text`` and ``details`` are the
    sample with the highest cumulative log-probability, the other returned samples are
    ``details.best_of_sequences``; ``details`` is then always written (as DJL's code does).
    """

    name = "json"
    content_type = "application/json"
    samples = SAMPLES_FINAL

    def __call__(self, out: RequestOutput) -> str:
        if not out.finished:
            return ""
        if is_error(out):
            return dumps(
                {
                    "generated_text": None,
                    "error": error_message(out),
                    "code": error_code(out),
                    "details": lmi_details(out, include_tokens=True),
                }
            )
        if out.sequences:
            best, others = best_first(out)
            details = lmi_details(best, include_tokens=True)
            if others:
                details["best_of_sequences"] = [best_of_sequence(seq) for seq in others]
            return dumps({"generated_text": best.full_text, "details": details})
        body: dict[str, Any] = {"generated_text": out.full_text}
        if wants_details(out):
            body["details"] = lmi_details(out, include_tokens=True)
        return dumps(body)


def jsonlines_record(out: RequestOutput, token: Token, closing: bool) -> dict[str, Any]:
    """One jsonlines object: ``{"token"}``, plus the closing fields when ``closing``.

    Closing fields: ``generated_text`` (full text so far), and ``details`` without tokens when
    details were asked for; a failed request adds ``error`` and ``code`` and always has
    ``details`` (``finish_reason: "error"``).
    """
    record: dict[str, Any] = {"token": lmi_token(token)}
    if not closing:
        return record
    record["generated_text"] = out.full_text
    if is_error(out):
        record["error"] = error_message(out)
        record["code"] = error_code(out)
        record["details"] = lmi_details(out, include_tokens=False)
    elif wants_details(out):
        record["details"] = lmi_details(out, include_tokens=False)
    return record


class JsonLinesFormatter(Formatter):
    """``jsonlines``: one ``{"token": {...}}`` line per new token; the last line closes (with
    ``error``/``code`` when the request failed mid-stream)."""

    name = "jsonlines"
    content_type = "application/jsonlines"

    def error_chunk(self, out: RequestOutput) -> str:
        return self(out)

    def __call__(self, out: RequestOutput) -> str:
        return "".join(dumps(jsonlines_record(out, token, closing)) + "\n" for _, token, closing in step_events(out))


class NoneFormatter(Formatter):
    """``none``: the raw text of the new tokens, no wrapping, no error marker."""

    name = "none"
    content_type = "text/plain"

    def __call__(self, out: RequestOutput) -> str:
        return "".join(t.text for t in out.new_tokens)
