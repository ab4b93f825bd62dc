"""The ``logprobs`` objects of OpenAI responses, as the OpenAI API and vLLM shape them.

- Chat (``logprobs: true``, ``top_logprobs: N``): ``{"content": [{token, logprob, bytes,
  top_logprobs}]}``; ``top_logprobs`` lists the N most likely tokens of that position
  (``RequestOutput.top_tokens``, which the parser asks for as ``top_n_tokens``), most likely first;
  the chosen token alone where the engine reports no alternatives.
- Completions (``logprobs: N``): ``{text_offset, token_logprobs, tokens, top_logprobs}``; each
  position's ``top_logprobs`` maps token text to log-prob for the chosen token and the N most likely
  ones (N + 1 entries when the chosen one is not among them, as vLLM and the OpenAI API answer).
  With ``echo`` the prompt's tokens come first (``RequestOutput.prefill`` and
  ``prompt_top_tokens``, asked for as ``decoder_input_details``): the first has ``null`` log-prob
  and ``null`` top entries. ``text_offset`` counts characters of the listed tokens' text from 0.

Log-probs are the model's distribution before the request's processors (vLLM's default
``raw_logprobs``); -inf is written as -9999.0, as vLLM writes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

from djl_handlers.request.records import RequestOutput, Token

__all__ = ["chat_logprobs", "completion_logprobs", "completion_offset", "shown_tokens"]

FLOOR = -9999.0  # vLLM's stand-in for -inf (JSON has no infinities)


def clamp(value: Optional[float]) -> Optional[float]:
    """A log-prob as JSON writes it: -inf (and below) as -9999.0, NaN as None."""
    if value is None or math.isnan(value):
        return None
    return max(float(value), FLOOR)


def _alternatives(out: RequestOutput, index: int) -> list[Token]:
    return out.top_tokens[index] if index < len(out.top_tokens) else []


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(out: RequestOutput, tokens: Sequence[Token], start: int = 0) -> Optional[dict[str, Any]]:
    """Chat ``logprobs`` for ``tokens`` (the tokens of ``out`` from position ``start``) or None."""
    options = out.request.response_options
    if not options.logprobs:
        return None
    top_n = options.top_logprobs
    content = []
    for k, tok in enumerate(tokens):
        entry = {"token": tok.text, "logprob": clamp(tok.log_prob), "bytes": _bytes(tok.text)}
        top: list[dict[str, Any]] = []
        if top_n > 0:
            alternatives = _alternatives(out, start + k)[:top_n]
            top = [{"token": t.text, "logprob": clamp(t.log_prob), "bytes": _bytes(t.text)} for t in alternatives]
            top = top or [dict(entry)]
        content.append({**entry, "top_logprobs": top})
    return {"content": content}


def shown_tokens(out: RequestOutput) -> list[Token]:
    """The generated tokens a completions choice shows: none for ``max_tokens`` 0 (``prompt_only``)."""
    return [] if out.request.response_options.prompt_only else list(out.tokens)


def completion_offset(out: RequestOutput, index: int) -> int:
    """``text_offset`` of generated token ``index``: the listed prompt tokens' text (with ``echo``
    and log-probs) plus the generated tokens' text before it."""
    options = out.request.response_options
    prompt = sum(len(t.text) for t in out.prefill) if options.echo and options.logprobs is not None else 0
    return prompt + sum(len(t.text) for t in out.tokens[:index])


def completion_logprobs(out: RequestOutput, tokens: Sequence[Token], start: int, *,
                        with_prompt: bool = False) -> Optional[dict[str, Any]]:
    """Completions ``logprobs`` for ``tokens`` (the generated tokens of ``out`` from position
    ``start``), after the prompt's tokens when ``with_prompt`` (the first chunk of an ``echo``), or
    None when the client did not ask."""
    wanted = out.request.response_options.logprobs
    if wanted is None or wanted is False:
        return None
    n = int(wanted)
    listed: list[tuple[str, Optional[float], Optional[dict[str, Optional[float]]]]] = []
    if with_prompt:
        for j, tok in enumerate(out.prefill):
            if j == 0 or tok.log_prob is None:
                listed.append((tok.text, None, None))
                continue
            top = out.prompt_top_tokens[j] if j < len(out.prompt_top_tokens) else None
            listed.append((tok.text, clamp(tok.log_prob), _top_map(tok, top or [], n)))
    for k, tok in enumerate(tokens):
        listed.append((tok.text, clamp(tok.log_prob), _top_map(tok, _alternatives(out, start + k), n)))
    offsets, offset = [], completion_offset(out, start) if not with_prompt else 0
    for text, _, _ in listed:
        offsets.append(offset)
        offset += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": [lp for _, lp, _ in listed],
        "tokens": [text for text, _, _ in listed],
        "top_logprobs": [top for _, _, top in listed],
    }


def _top_map(chosen: Token, alternatives: Sequence[Token], n: int) -> dict[str, Optional[float]]:
    """The chosen token, then the ``n`` most likely (without the chosen one again): the first
    ``n`` + 1 of them, by text (a later token of the same text keeps the first one's place)."""
    ordered = [chosen, *(t for t in alternatives if t.id != chosen.id)][: n + 1]
    top: dict[str, Optional[float]] = {}
    for tok in ordered:
        top[tok.text] = clamp(tok.log_prob)
    return top
