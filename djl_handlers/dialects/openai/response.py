"""OpenAI-compatible formatters: chat completions and (legacy) completions.

Names: ``chat_json``, ``chat_sse``, ``completion_json``, ``completion_sse``; and DJL's chat names
``json_chat`` / ``jsonlines_chat`` (v0.27) and ``sse_chat`` (v0.29+ HEAD). The OpenAI names
write compact JSON like OpenAI/vLLM; ``json_chat`` and ``jsonlines_chat`` keep DJL's spaced
``json.dumps`` separators.

What the formatters read from the request's ``ResponseOptions`` (``Request.response_options``, which
the OpenAI parser fills from the body):

- ``model`` (str): echoed as ``model``; ``"lmi"`` when empty.
- ``logprobs``: chat: bool; completions: int (legacy ``logprobs: N``); None/false: none. The
  objects are built by :mod:`.logprobs` (``top_logprobs`` with the N most likely tokens).
- ``echo`` / ``prompt_only`` (completions): the prompt (and its log-probs) before the completion;
  with ``max_tokens`` 0 the prompt alone.
- ``include_usage`` (``stream_options.include_usage``): adds ``"usage": null`` to every chunk and a
  final chunk with ``"choices": []`` and the usage before ``[DONE]``.

What they fix on the first call and repeat on every later one (``OpenAIState``, the request's
``formatter_state``): the response ``id`` (``chatcmpl-<request id>`` / ``cmpl-<request id>`` from the
``requestId`` property, else ``-<hex>``) and ``created`` (the current Unix time).

Choices: one (index 0), or one per returned sample with ``n`` > 1 (``RequestOutput.sequences``; with
``best_of`` the best ``n`` by cumulative log-probability, best first), or, for a completions
request with several prompts, one per prompt and sample (index = prompt × n + sample). A stream sends each choice's
tokens under its ``index`` as they come, and its ``finish_reason`` when that choice ends; ``usage``
counts the tokens of every sample decoded (``best_of`` included), as OpenAI bills them. Finish reasons map
``eos_token``/``stop_sequence`` -> ``stop`` and ``length`` -> ``length``. A failure is the nested
error ``{"error": {"message", "type", "param", "code"}}``: the body (non-stream) or, in a
stream, an event after the step's tokens, then ``[DONE]``. Replies of requests with ``tools``
may become ``tool_calls`` (:mod:`.tool_calls`; streamed by :mod:`.tool_stream`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Optional

from djl_handlers.dialects.openai.logprobs import chat_logprobs, completion_logprobs, shown_tokens
from djl_handlers.dialects.openai.reply import message_fields, reads_reply, reasoning_tokens, reply_of
from djl_handlers.dialects.openai.state import state_of
from djl_handlers.dialects.openai.tool_calls import tool_message
from djl_handlers.extensions import REQUEST_ID_PROPERTY
from djl_handlers.formatting.base import SAMPLES_FINAL, SAMPLES_STREAMED
from djl_handlers.formatting.lmi import (
    PLACEHOLDER_TOKEN,
    Formatter,
    dumps_compact,
    error_code,
    error_message,
    first_new_index,
    is_error,
    step_events,
)
from djl_handlers.formatting.sse import sse_event
from djl_handlers.request.records import RequestOutput, Token
from djl_handlers.request.sequences import returned

DEFAULT_MODEL = "lmi"
FINISH_REASONS = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
DONE_EVENT = "data: [DONE]\n\n"
Dump = Callable[[Any], str]


# --------------------------------------------------------------------------- response fields


def response_id(out: RequestOutput, kind: str) -> str:
    """The response id, made on first use and kept in the request's ``OpenAIState``: ``<prefix>-<request
    id>`` when the front end sent DJL's ``requestId`` property (the HTTP ``x-request-id``), else a
    random hex id."""
    state = state_of(out)
    if not state.response_id:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        request_id = out.request.properties.get(REQUEST_ID_PROPERTY)
        state.response_id = f"{prefix}-{request_id or uuid.uuid4().hex}"
    return state.response_id


def created_time(out: RequestOutput) -> int:
    """``created``: the current time on first use, kept in the request's ``OpenAIState``."""
    state = state_of(out)
    if state.created is None:
        state.created = int(time.time())
    return state.created


def model_name(out: RequestOutput) -> str:
    """``model`` echoed from the request's ``ResponseOptions``."""
    return out.request.response_options.model or DEFAULT_MODEL


def include_usage(out: RequestOutput) -> bool:
    """True when ``stream_options.include_usage`` was requested."""
    return out.request.response_options.include_usage


def openai_finish_reason(out: RequestOutput) -> str:
    """OpenAI finish reason for a finished request."""
    return FINISH_REASONS.get(out.finish_reason or "", "stop")


def usage(out: RequestOutput) -> dict[str, Any]:
    """``usage`` object from the prompt and generated token counts (every sample's tokens); with a
    reasoning parser, ``completion_tokens_details.reasoning_tokens`` as vLLM reports it."""
    completion = sum(len(seq.tokens) for seq in out.sequences) if out.sequences else len(out.tokens)
    body: dict[str, Any] = {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": out.prompt_tokens + completion,
    }
    thinking = reasoning_tokens(out)
    if thinking is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": thinking}
    return body


def openai_error(out: RequestOutput) -> dict[str, Any]:
    """Nested OpenAI error object (vLLM >= 0.10.1 layout)."""
    return openai_error_object(error_code(out), error_message(out), out.error_field)


def openai_error_object(code: int, message: str, param: Optional[str] = None,
                        kind: Optional[str] = None) -> dict[str, Any]:
    """The OpenAI error body for status ``code``: ``type`` ``invalid_request_error`` for a refused
    request (4xx but DJL's 424), else ``server_error`` (or ``kind``); ``param`` names the field."""
    if kind is None:
        kind = "invalid_request_error" if 400 <= code < 500 and code != 424 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --------------------------------------------------------------------------- completions text


def _prefix(out: RequestOutput) -> str:
    return out.full_text[: len(out.full_text) - len(out.generated_text)]


def completion_text(out: RequestOutput) -> str:
    """A completions choice's ``text``: the prompt with ``echo``, then the generated text (none
    for ``max_tokens`` 0)."""
    return _prefix(out) if out.request.response_options.prompt_only else out.full_text


# --------------------------------------------------------------------------- non-stream


class OpenAIJsonFormatter(Formatter):
    """Non-stream chat (``chat.completion``) or completion (``text_completion``) object."""

    samples = SAMPLES_FINAL

    def __init__(self, name: str, kind: str, dump: Dump = dumps_compact) -> None:
        self.name = name
        self.kind = kind
        self.content_type = "application/json"
        self._dump = dump

    def error_body(self, out: RequestOutput) -> str:
        return self._dump(openai_error(out))

    def __call__(self, out: RequestOutput) -> str:
        if not out.finished:
            return ""
        if is_error(out):
            return self._dump(openai_error(out))
        body = {
            "id": response_id(out, self.kind),
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": created_time(out),
            "model": model_name(out),
            "choices": [self._choice(seq, index) for index, seq in enumerate(returned(out))],
            "usage": usage(out),
        }
        return self._dump(body)

    def _choice(self, seq: RequestOutput, index: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.kind == "chat":
            choice["message"] = _message(seq)
            choice["logprobs"] = chat_logprobs(seq, seq.tokens)
        else:
            choice["text"] = completion_text(seq)
            choice["logprobs"] = completion_logprobs(seq, shown_tokens(seq), 0,
                                                     with_prompt=seq.request.response_options.echo)
        choice["finish_reason"] = openai_finish_reason(seq)
        if self.kind == "chat" and seq.request.tools is not None:
            called = tool_message(seq)
            if called is not None:
                choice["message"], choice["finish_reason"] = called
        return choice


def _message(seq: RequestOutput) -> dict[str, Any]:
    """A finished chat reply's message: the text, or what the model's parsers read in it."""
    if not reads_reply(seq):
        return {"role": "assistant", "content": seq.generated_text}
    reply = reply_of(seq)
    return {"role": "assistant", "content": reply.content, **message_fields(seq, reply.reasoning)}


# --------------------------------------------------------------------------- stream


class OpenAIStreamFormatter(Formatter):
    """Streamed chunks (``chat.completion.chunk`` / ``text_completion``), SSE or jsonlines."""

    samples = SAMPLES_STREAMED

    def __init__(self, name: str, kind: str, *, sse: bool = True, dump: Dump = dumps_compact) -> None:
        self.name = name
        self.kind = kind
        self.sse = sse
        self.content_type = "text/event-stream" if sse else "application/jsonlines"
        self._dump = dump

    def error_body(self, out: RequestOutput) -> str:
        return self._dump(openai_error(out))  # OpenAI answers a refused stream with a JSON body

    def error_chunk(self, out: RequestOutput) -> str:
        return self(out)

    def __call__(self, out: RequestOutput) -> str:
        # a sample (n > 1) always ends with a token of its own: one with none this step sends nothing
        choices = [(i, seq) for i, seq in enumerate(out.sequences) if seq.new_tokens] if out.sequences else [(0, out)]
        if out.finished and is_error(out):
            events = [self._chunk(out, seq, first_new_index(seq) + i, t, False, choice)
                      for choice, seq in choices for i, t in enumerate(seq.new_tokens)]
            events.append(openai_error(out))
            return self._frame(events, done=True)
        events = [self._chunk(out, seq, index, token, closing, choice)
                  for choice, seq in choices for index, token, closing in step_events(seq)]
        if out.finished and include_usage(out):
            events.append({**self._envelope(out), "choices": [], "usage": usage(out)})
        return self._frame(events, done=out.finished)

    def _frame(self, events: list[dict[str, Any]], *, done: bool) -> str:
        if not self.sse:
            return "".join(self._dump(e) + "\n" for e in events)
        text = "".join(sse_event(self._dump(e)) for e in events)
        return text + DONE_EVENT if done else text

    def _envelope(self, out: RequestOutput) -> dict[str, Any]:
        return {
            "id": response_id(out, self.kind),
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": created_time(out),
            "model": model_name(out),
        }

    def _chunk(self, out: RequestOutput, seq: RequestOutput, index: int, token: Token, closing: bool,
               number: int) -> dict[str, Any]:
        """Choice ``number``'s chunk for token ``index`` of its sequence ``seq`` (``out`` itself, or
        one of its samples); the envelope is the request's (``out``)."""
        placeholder = token is PLACEHOLDER_TOKEN
        tokens = [] if placeholder else [token]
        choice: dict[str, Any] = {"index": number}
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if index == 0 else {}
            if not placeholder or index == 0:
                delta["content"] = token.text
            choice["delta"] = delta
            choice["logprobs"] = chat_logprobs(seq, tokens, index)
        else:
            options = seq.request.response_options
            tokens = [] if options.prompt_only else tokens
            choice["text"] = (_prefix(seq) if index == 0 else "") + "".join(t.text for t in tokens)
            choice["logprobs"] = completion_logprobs(seq, tokens, index, with_prompt=options.echo and index == 0)
        choice["finish_reason"] = openai_finish_reason(seq) if closing else None
        chunk = {**self._envelope(out), "choices": [choice]}
        if include_usage(out):
            chunk["usage"] = None
        return chunk
