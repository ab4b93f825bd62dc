"""TGI-compatible formatters (``tgi_compat``): ``tgi`` (non-stream) and ``tgi_stream`` (SSE).

Shapes follow text-generation-inference's router (``GenerateResponse``, ``StreamResponse``), so
Hugging Face's own clients work: scalar token ``id``, ``logprob`` and ``special`` keys, compact
JSON as serde writes it, and SSE events written ``data:{json}\\n\\n`` (no space, as TGI).

- ``tgi``: ``[{"generated_text", "details"?}]``: the object wrapped in a one-element list, as
  TGI's ``/`` route and DJL's ``tgi_compat`` do; ``details`` (when ``parameters.details``) is
  ``{"finish_reason", "generated_tokens", "seed", "prefill", "tokens"[, "top_tokens"]}``;
  ``prefill`` lists the prompt tokens ``{"id", "text", "logprob"}`` with
  ``decoder_input_details`` (else ``[]``); ``top_tokens`` (one list per token) only with
  ``top_n_tokens``, as TGI omits it when empty. With ``best_of`` > 1 the text and details are the
  sample with the highest cumulative log-probability and ``details.best_of_sequences`` lists the
  others (``{"generated_text", "finish_reason", "generated_tokens", "seed", "prefill", "tokens"[,
  "top_tokens"]}``, each with its own seed), as TGI writes them.
- ``tgi_stream``: one event per token ``{"index", "token"[, "top_tokens"], "generated_text", "details"}``;
  ``index`` counts tokens from 1; ``generated_text``/``details`` are null except on the last
  event (``details`` = ``{"finish_reason", "generated_tokens", "seed", "input_length"}`` when
  details were asked for).
- A failure is TGI's error object ``{"error", "error_type": "generation"}`` (as the body, or as
  the last event of a stream after the tokens of that step).
"""

from __future__ import annotations

from typing import Any, Optional

from djl_handlers.formatting.base import SAMPLES_FINAL
from djl_handlers.formatting.lmi import (
    Formatter,
    dumps_compact,
    error_code,
    error_message,
    finite,
    first_new_index,
    is_error,
    step_events,
    wants_details,
    wants_prefill,
    wants_top_tokens,
)
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.records import RequestOutput, Token
from djl_handlers.request.sequences import best_first


def tgi_token(token: Token) -> dict[str, Any]:
    """TGI token ``{"id", "text", "logprob", "special"}`` (logprob null when unknown)."""
    return {"id": token.id, "text": token.text, "logprob": finite(token.log_prob), "special": token.special}


def tgi_prefill_token(token: Token) -> dict[str, Any]:
    """TGI ``PrefillToken`` ``{"id", "text", "logprob"}`` (null for the first prompt token)."""
    return {"id": token.id, "text": token.text, "logprob": finite(token.log_prob)}


def tgi_top_tokens(out: RequestOutput, index: int) -> list[dict[str, Any]]:
    """The top tokens of generated token ``index`` (empty when none were asked for or reported)."""
    if index >= len(out.top_tokens):
        return []
    return [tgi_token(t) for t in out.top_tokens[index]]


def tgi_seed(out: RequestOutput) -> Optional[int]:
    """The seed TGI reports: the request's resolved seed when it sampled, null when greedy (as
    TGI); ``Request.seed`` is decided once, by the parser (``resolve_seed``)."""
    return out.request.seed if is_sampling(out.request.params) else None


def tgi_error(out: RequestOutput) -> dict[str, Any]:
    """TGI's error object: ``error_type`` ``validation`` for a request the server refused (4xx but
    DJL's 424), ``generation`` for a failed generation."""
    return tgi_error_object(error_code(out), error_message(out))


def tgi_error_object(code: int, message: str, kind: Optional[str] = None) -> dict[str, Any]:
    """TGI's error body for status ``code`` (``error_type`` ``kind`` when given)."""
    if kind is None:
        kind = "validation" if 400 <= code < 500 and code != 424 else "generation"
    return {"error": message, "error_type": kind}


def tgi_details(out: RequestOutput) -> dict[str, Any]:
    """``{"finish_reason", "generated_tokens", "seed", "prefill", "tokens"[, "top_tokens"]}`` of one sequence."""
    details: dict[str, Any] = {
        "finish_reason": out.finish_reason,
        "generated_tokens": len(out.tokens),
        "seed": tgi_seed(out),
        "prefill": [tgi_prefill_token(t) for t in out.prefill] if wants_prefill(out) else [],
        "tokens": [tgi_token(t) for t in out.tokens],
    }
    if wants_top_tokens(out) and out.top_tokens:
        details["top_tokens"] = [[tgi_token(t) for t in top] for top in out.top_tokens]
    return details


class TgiFormatter(Formatter):
    """``tgi``: nothing until finished, then ``[{"generated_text", "details"?}]``."""

    name = "tgi"
    content_type = "application/json"
    samples = SAMPLES_FINAL

    def error_body(self, out: RequestOutput) -> str:
        return dumps_compact(tgi_error(out))

    def __call__(self, out: RequestOutput) -> str:
        if not out.finished:
            return ""
        if is_error(out):
            return dumps_compact(tgi_error(out))
        best, others = best_first(out)
        body: dict[str, Any] = {"generated_text": best.full_text}
        if wants_details(out):
            details = tgi_details(best)
            if others:
                details["best_of_sequences"] = [{"generated_text": seq.full_text, **tgi_details(seq)} for seq in others]
            body["details"] = details
        return dumps_compact([body])


class TgiStreamFormatter(Formatter):
    """``tgi_stream``: TGI ``/generate_stream`` events, one per new token."""

    name = "tgi_stream"
    content_type = "text/event-stream"

    def error_body(self, out: RequestOutput) -> str:
        return dumps_compact(tgi_error(out))  # TGI answers a refused stream with a JSON body

    def error_chunk(self, out: RequestOutput) -> str:
        return self(out)

    def __call__(self, out: RequestOutput) -> str:
        if out.finished and is_error(out):
            start = first_new_index(out)
            events = [self._event(out, start + i, tok, closing=False) for i, tok in enumerate(out.new_tokens)]
            return "".join(events) + f"data:{dumps_compact(tgi_error(out))}\n\n"
        return "".join(self._event(out, index, token, closing=closing) for index, token, closing in step_events(out))

    @staticmethod
    def _event(out: RequestOutput, index: int, token: Token, *, closing: bool) -> str:
        details: Optional[dict[str, Any]] = None
        if closing and wants_details(out):
            details = {
                "finish_reason": out.finish_reason,
                "generated_tokens": len(out.tokens),
                "seed": tgi_seed(out),
                "input_length": out.prompt_tokens,
            }
        event: dict[str, Any] = {"index": index + 1, "token": tgi_token(token)}
        top = tgi_top_tokens(out, index) if wants_top_tokens(out) else []
        if top:  # TGI omits an empty list
            event["top_tokens"] = top
        event["generated_text"] = out.full_text if closing else None
        event["details"] = details
        return f"data:{dumps_compact(event)}\n\n"
