"""Mirror of ``tensorrt_llm.executor.result`` (TensorRT-LLM 0.17-1.x): ``CompletionOutput`` and
the streaming ``GenerationResult`` that ``LLM.generate_async`` returns.

As in the real class, the result is created with an async queue only when an event loop is
running in the creating thread (``has_event_loop()``); ``async for`` over a result created
without one fails. Each response from the executor updates the output of its
``sequence_index`` in place (``best_of`` outputs; ``outputs`` shows the first ``n``, or with
``best_of`` > ``n`` the ``n`` of highest cumulative log-prob, re-indexed, as the real property does):
token ids are extended, the text is re-decoded, and on the request's final response (only there, as
in the real class) that sequence's ``finish_reason`` is set
("stop" | "length" | "cancelled"); a stop-word finish sets ``stop_reason`` and trims the stop
word's tokens (unless ``include_stop_str_in_output``). ``abort()`` asks the executor to cancel;
the executor then sends a final "cancelled" response. A beam search's response carries every beam
whole (the runtime rewrites beams while it searches): each output's tokens are replaced, not extended.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from tensorrt_llm._toy import token_logprob
from tensorrt_llm.sampling_params import SamplingParams


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: Optional[int] = None


@dataclass(slots=True)
class CompletionOutput:
    """One completion of a request (real field names; ``*_diff`` properties included)."""

    index: int
    text: str = ""
    token_ids: Optional[list[int]] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list[dict[int, Logprob]]] = field(default_factory=list)
    prompt_logprobs: Optional[list[dict[int, Logprob]]] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    generation_logits: Any = None
    disaggregated_params: Any = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids or [])

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return (self.token_ids or [])[self._last_token_ids_len :]


@dataclass
class Response:
    """What the fake executor sends per iteration (stands in for ``tllm.Response``)."""

    new_token_ids: list[int]
    new_logprobs: list[float]
    is_final: bool = False  # the request's last response (every sequence finished)
    sequence_index: int = 0
    finish: Optional[str] = None  # "end_id" | "stop_words" | "length" | "cancelled"
    error: Optional[str] = None
    # beam search: one response carries every beam, best first, whole (the runtime rewrites beams
    # while it searches), each with its finish ("end_id" | "length", read on the final response)
    beams: Optional[list[tuple[list[int], Optional[str]]]] = None


class GenerationResult:
    """A streaming result: iterate it (sync or async) to get updated snapshots of itself."""

    def __init__(
        self,
        request_id: int,
        prompt: Optional[str],
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        streaming: bool,
        tokenizer: Any,
        abort_fn: Callable[[int], None],
    ) -> None:
        self._request_id = request_id
        self._prompt = prompt
        self._prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self._streaming = streaming
        self.tokenizer = tokenizer
        self._abort_fn = abort_fn
        self._aborted = False
        self._done = False
        self._outputs = [CompletionOutput(i) for i in range(sampling_params.best_of or sampling_params.n)]
        self.queue: queue.Queue[Response] = queue.Queue()
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
            self._event: Optional[asyncio.Event] = asyncio.Event()
        except RuntimeError:
            self._loop, self._event = None, None

    # -- public API ----------------------------------------------------------------------------
    @property
    def request_id(self) -> int:
        return self._request_id

    @property
    def prompt(self) -> Optional[str]:
        return self._prompt

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> list[CompletionOutput]:
        params = self.sampling_params
        if params.use_beam_search or params.n == (params.best_of or params.n):
            return self._outputs[: params.n]
        ranked = sorted(self._outputs, key=lambda o: o.cumulative_logprob if o.cumulative_logprob is not None
                        else float("-inf"), reverse=True)
        for i, out in enumerate(ranked):
            out.index = i
        return ranked[: params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Abort the generation request."""
        self._abort_fn(self._request_id)
        self._aborted = True

    def aborted(self) -> bool:
        """Return whether the generation request is aborted."""
        return self._aborted

    def result(self, timeout: Optional[float] = None) -> GenerationResult:
        while not self._done:
            self._handle_response(self.queue.get(timeout=timeout))
        return self

    def __iter__(self) -> GenerationResult:
        return self

    def __next__(self) -> GenerationResult:
        if self._done:
            raise StopIteration
        self._handle_response(self.queue.get())
        return self

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> GenerationResult:
        if self._done:
            raise StopAsyncIteration
        assert self._event is not None, (
            "The asyncio event loop was not present during initialization, so async operations are not available."
        )
        while True:
            try:
                response = self.queue.get_nowait()
                break
            except queue.Empty:
                self._event.clear()
                if self.queue.empty():
                    await self._event.wait()
        self._handle_response(response)
        return self

    # -- executor side -------------------------------------------------------------------------
    def _deliver(self, response: Response) -> None:
        """Called from the executor thread."""
        self.queue.put(response)
        if self._loop is not None and self._event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    def _handle_response(self, response: Response) -> None:
        if response.error is not None:
            raise RuntimeError(response.error)
        if response.beams is not None:
            self._handle_beams(response)
            return
        out = self._outputs[response.sequence_index]
        out._last_text_len = len(out.text)
        out._last_token_ids_len = len(out.token_ids or [])
        assert out.token_ids is not None
        out.token_ids.extend(response.new_token_ids)
        if self.sampling_params.logprobs:
            assert out.logprobs is not None
            out.logprobs.extend(
                {t: Logprob(lp, 1)} for t, lp in zip(response.new_token_ids, response.new_logprobs, strict=False)
            )
            out.cumulative_logprob = sum(next(iter(d.values())).logprob for d in out.logprobs)
        self._done = response.is_final
        if response.finish == "cancelled":
            out.finish_reason = "cancelled"
        elif self._done:
            self._finish(out, response.finish)
        if self.sampling_params.detokenize and self.tokenizer is not None:
            out.text = self.tokenizer.decode(
                out.token_ids, skip_special_tokens=self.sampling_params.skip_special_tokens
            )

    def _handle_beams(self, response: Response) -> None:
        """A beam-search response: every beam's tokens replaced (not extended), finishes on the final one."""
        assert response.beams is not None
        self._done = response.is_final
        for out, (tokens, finish) in zip(self._outputs, response.beams, strict=False):
            out._last_text_len = len(out.text)
            out._last_token_ids_len = len(out.token_ids or [])
            out.token_ids = list(tokens)
            if self.sampling_params.logprobs:
                out.logprobs = [{t: Logprob(token_logprob(t), 1)} for t in tokens]
            if response.finish == "cancelled":
                out.finish_reason = "cancelled"
            elif self._done:
                self._finish(out, finish)
            if self.sampling_params.detokenize and self.tokenizer is not None:
                out.text = self.tokenizer.decode(tokens, skip_special_tokens=self.sampling_params.skip_special_tokens)

    def _finish(self, out: CompletionOutput, finish: Optional[str]) -> None:
        if finish == "end_id":
            out.finish_reason = "stop"
        elif finish == "stop_words":
            out.finish_reason = "stop"
            assert out.token_ids is not None
            for reason, ids in self.sampling_params._get_stop_reasons_and_words():
                if ids and out.token_ids[-len(ids) :] == ids:
                    out.stop_reason = reason
                    if not self.sampling_params.include_stop_str_in_output:
                        out.token_ids = out.token_ids[: -len(ids)]
                    break
        elif finish == "length":
            out.finish_reason = "length"
