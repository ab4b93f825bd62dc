"""RequestSlot: one request's life in the rolling batch, from first token to its last record.

The slot turns the engine's ``StepOutput`` into ``Token`` records (detokenizing when the engine
returns bare ids), applies the stopping criteria (eos, stop sequences, max_new_tokens, context
length), and asks the request's formatter for the text to send after each step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.engines.base import Engine, StepOutput, Tokenizer, check_prompt_length
from djl_handlers.errors import InvalidRequest
from djl_handlers.extensions import REQUEST_ID_PROPERTY, STATS_RECORD_KEY, STEP_TOKENS_KEY
from djl_handlers.params.translate import min_tokens
from djl_handlers.request.records import Request, RequestOutput, Token
from djl_handlers.scheduling.detokenizer import IncrementalDetokenizer
from djl_handlers.scheduling.stopping import StopSequenceMatcher

if TYPE_CHECKING:
    from djl_handlers.formatting import Formatter

LOG = logging.getLogger(__name__)


class RequestSlot:
    """State of one request inside the rolling batch."""

    def __init__(
        self,
        request: Request,
        formatter: Formatter,
        request_id: int,
        prompt_ids: Sequence[int] = (),
        tokenizer: Optional[Tokenizer] = None,
        eos_token_ids: frozenset[int] = frozenset(),
        max_model_len: int = 1 << 30,
    ) -> None:
        self.request = request
        self.formatter = formatter
        self.request_id = request_id
        self.output = RequestOutput(request=request, prompt_tokens=len(prompt_ids))
        self.in_engine = False
        self.cancelled = False
        self.sent = False  # some data reached the client (an error is then a stream chunk)
        params = request.params
        self._detok = (
            IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens,
                                   params.spaces_between_special_tokens) if tokenizer else None
        )
        self._eos = frozenset() if params.ignore_eos_token else eos_token_ids
        # stop_token_ids for engines that do not stop on them (the HF engine): a stop token ends the
        # request like eos (its text left out unless include_stop_str_in_output), ignore_eos or not
        self._stop_ids = frozenset(params.stop_token_ids) - self._eos
        self._stops = StopSequenceMatcher(params.stop_sequences or ())
        # The stop string is removed from the text (docs/parameters.md): text that could be the start
        # of one is held back until it cannot be, unless include_stop_str_in_output keeps it.
        self._keep_stop = bool(params.include_stop_str_in_output)
        self._hold = 0 if self._keep_stop or not self._stops else max(len(x) for x in params.stop_sequences) - 1
        self._held = ""
        self._limit = min(params.max_new_tokens, max(0, max_model_len - len(prompt_ids)))
        # as vLLM's min_tokens: no stop sequence ends the request before it has this many tokens
        # (the engine keeps eos from being chosen until then)
        self._min_tokens = min_tokens(params)
        self._prompt_ids = prompt_ids
        self._tokenizer = tokenizer
        self._top_n = params.top_n_tokens
        self._special_ids: Optional[frozenset[int]] = None  # built on first use (prefill/top tokens)
        self._eos_ids = eos_token_ids

    # -- state changes -------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.output.finished

    def finish(self, reason: str) -> None:
        """Mark the request finished; flushes any text the detokenizer still holds."""
        out = self.output
        if out.finished:
            return
        if reason != "error" and out.tokens:
            # text held back for a possible stop string (none came), then the detokenizer's tail
            tail = self._held + (self._detok.flush() if self._detok is not None else "")
            if tail:
                self._replace_last_text(out.tokens[-1].text + tail)
        self._held = ""
        out.finished = True
        out.finish_reason = reason

    def fail(self, message: str, code: int = 424, field: Optional[str] = None) -> None:
        """Finish the request with an error (naming the request ``field`` at fault, if any); it
        gets an error record instead of text. A request that already finished (or was cancelled)
        keeps its outcome."""
        if self.output.finished:
            return
        self.output.error = message or "request failed"
        self.output.error_code = code
        self.output.error_field = field
        self.finish("error")
        LOG.log(logging.WARNING if code >= 500 else logging.INFO, "RequestId=[%s] failed (%d): %s",
                self.request.properties.get(REQUEST_ID_PROPERTY, "-"), code, self.output.error)

    def cancel(self) -> None:
        """The client went away: finish at once, silently."""
        self.cancelled = True
        self.finish("cancelled")

    def consume(self, step: StepOutput) -> None:
        """Apply one engine step's output for this request."""
        if self.output.finished:
            return
        if step.error is not None:
            self.fail(step.error)
            return
        is_eos = step.token_id in self._eos
        stop_id = self._is_stop_token(step.token_id)
        hidden = is_eos or (stop_id and not self._keep_stop)
        if step.text is not None:
            text = step.text
        elif hidden or self._detok is None:
            text = ""
        else:
            text = self._detok.push(step.token_id)
        token = Token(step.token_id, text, step.log_prob, special=hidden)
        self.output.tokens.append(token)
        self.output.new_tokens.append(token)
        if step.prompt_logprobs is not None:
            self.output.prefill = self._prefill_tokens(step.prompt_logprobs)
        if step.prompt_top_tokens is not None:
            self.output.prompt_top_tokens = [None if top is None else [self._lone_token(t, lp) for t, lp in top]
                                             for top in step.prompt_top_tokens]
        if self._top_n:
            self.output.top_tokens.append([self._lone_token(t, lp) for t, lp in step.top_tokens or ()])
        self._check_stop(step, is_eos or stop_id)

    def _is_stop_token(self, token_id: int) -> bool:
        """A ``stop_token_ids`` token once ``min_new_tokens`` is reached (before, it is text)."""
        return token_id in self._stop_ids and len(self.output.tokens) + 1 >= self._min_tokens

    def _lone_token(self, token_id: int, log_prob: Optional[float]) -> Token:
        """A token decoded on its own (prompt and top tokens: no surrounding context)."""
        if self._special_ids is None:
            extra = getattr(self._tokenizer, "all_special_ids", None) or ()
            self._special_ids = self._eos_ids | frozenset(int(i) for i in extra)
        text = self._tokenizer.decode([token_id], skip_special_tokens=False) if self._tokenizer else ""
        return Token(token_id, text, log_prob, special=token_id in self._special_ids)

    def _prefill_tokens(self, log_probs: Sequence[Optional[float]]) -> list[Token]:
        """``details.prefill``: one token per prompt token with its log-prob (None when unknown)."""
        lps = list(log_probs) + [None] * max(0, len(self._prompt_ids) - len(log_probs))
        return [self._lone_token(tid, lp) for tid, lp in zip(self._prompt_ids, lps, strict=False)]

    def _check_stop(self, step: StepOutput, is_eos: bool) -> None:
        if (step.finish_reason is not None or is_eos) and self._held:  # held text precedes this token's
            self._replace_last_text(self._held + self.output.tokens[-1].text)
            self._held = ""
        if step.finish_reason is not None:
            self.finish(step.finish_reason)
            return
        if is_eos:
            self.finish("eos_token")
            return
        last = self.output.tokens[-1].text
        if self._stops and last:
            match = self._stops.push(last)
            if match is not None and len(self.output.tokens) >= self._min_tokens:
                end = match.end if self._keep_stop else len(self._held) + match.end - len(match.sequence)
                self._replace_last_text((self._held + last)[:end] if not self._keep_stop else last[:end])
                self._held = ""
                self.output.finished = True  # no flush: the text after the stop is dropped
                self.output.finish_reason = "stop_sequence"
                return
            if self._hold:
                pending = self._held + last
                cut = max(0, len(pending) - self._hold)
                self._replace_last_text(pending[:cut])
                self._held = pending[cut:]
        if len(self.output.tokens) >= self._limit:
            self.finish("length")

    def _replace_last_text(self, text: str) -> None:
        out = self.output
        old = out.tokens[-1]
        new = Token(old.id, text, old.log_prob, old.special)
        out.tokens[-1] = new
        if out.new_tokens and out.new_tokens[-1] is old:
            out.new_tokens[-1] = new

    # -- output ----------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The rolling-batch record for this step: DJL's keys data/last/code/error, DJL's
        ``step_token_num`` and, on the last record, ``djl_handlers_stats`` (see ``extensions``).

        A failure is rendered by the request's formatter, in its API dialect: before any data
        was sent, the whole error body with ``code``/``error`` (the front end makes ``code`` the
        HTTP status); after, the stream's last chunk (the status is already 200).
        """
        out = self.output
        if out.error is not None:
            if not self.sent:
                code = out.error_code or 424
                return {"data": self.formatter.error_body(out), "last": True, "code": code, "error": out.error,
                        STEP_TOKENS_KEY: 0, STATS_RECORD_KEY: self.stats()}
            data = self.formatter.error_chunk(out)
            out.new_tokens = []
            return {"data": data, "last": True, STEP_TOKENS_KEY: 0, STATS_RECORD_KEY: self.stats()}
        data = "" if self.cancelled else self.formatter(out)
        record: dict[str, Any] = {"data": data, "last": out.finished, STEP_TOKENS_KEY: len(out.new_tokens)}
        out.new_tokens = []
        self.sent = self.sent or bool(data)
        if out.finished:
            record[STATS_RECORD_KEY] = self.stats()
        return record

    def stats(self) -> str:
        """Compact JSON of the request's token counts and finish reason (the last record's stats)."""
        out = self.output
        reason = "cancelled" if self.cancelled else (out.finish_reason or "")
        stats = {"prompt_tokens": out.prompt_tokens, "generated_tokens": len(out.tokens), "finish_reason": reason}
        return json.dumps(stats, separators=(",", ":"))

    @property
    def content_type(self) -> str:
        failed_first = self.output.error is not None and not self.sent
        return "application/json" if failed_first else self.formatter.content_type


def tokenize_prompt(engine: Engine, request: Request, prompt: Optional[str] = None) -> list[int]:
    """Token ids of the request's prompt (the client's own ids when it sent ids; else the text
    encoded with the tokenizer's special tokens unless the request says otherwise; the ids' text
    becomes ``request.prompt``, which ``echo`` shows), truncated by ``parameters.truncate`` (keeping
    the end) and checked against the model's context length."""
    text = request.prompt if prompt is None else prompt
    if request.prompt_ids is not None and prompt is None:
        ids = _client_ids(engine, request)
    elif request.add_special_tokens is None:
        ids = list(engine.tokenizer.encode(text))
    else:
        ids = list(engine.tokenizer.encode(text, add_special_tokens=request.add_special_tokens))
    truncate = request.params.truncate
    if truncate is not None and len(ids) > truncate:
        ids = ids[-truncate:]
    check_prompt_length(len(ids), engine.max_model_len)
    return ids


def _client_ids(engine: Engine, request: Request) -> list[int]:
    """The client's token ids, checked against the vocabulary; their text becomes the prompt."""
    ids = list(request.prompt_ids or ())
    sized: Any = engine.tokenizer
    vocab = len(sized) if hasattr(sized, "__len__") else None
    bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        raise InvalidRequest(f"prompt holds token id {bad[0]}, outside the vocabulary [0, {vocab})", field="prompt")
    if not request.prompt:
        request.prompt = engine.tokenizer.decode(ids, skip_special_tokens=False)
    return ids
