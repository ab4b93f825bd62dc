"""Beam requests on vLLM's synchronous engine (``LLMEngine``): each a state machine across the
adapter's steps, beside the other requests (no loop blocks a step).

A beam request adds its step's one-token requests (``vllm_beam_loop``: one per live beam) to the
engine. Every adapter step runs ``LLMEngine.step()`` once for all requests; the outputs of one-token
requests come here (:meth:`SyncBeams.collect`), and once every one of a beam request's step has
finished, :meth:`SyncBeams.advance` feeds their top log-probs to the request's rule, reports what the
rule gives and adds the next step's requests (run by the next ``LLMEngine.step()``). ``release`` of
the request's ids works as for samples: once none is live, its one-token requests still running are
aborted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.vllm_beam_loop import step_prompt, sub_request_id, tops_of
from djl_handlers.engines.external.vllm_beam_rules import BeamRule, Tops, error_outputs

__all__ = ["SyncBeams"]


@dataclass
class _Search:
    request: EngineRequest
    rule: BeamRule
    sampling: Any
    lora: dict[str, Any]
    step: int = 0
    waiting: dict[str, int] = field(default_factory=dict)  # one-token request id -> its beam
    tops: list[Optional[Tops]] = field(default_factory=list)
    failed: bool = False

    @property
    def over(self) -> bool:
        return self.failed or self.rule.done


class SyncBeams:
    """The beam requests of one ``LLMEngine`` adapter (module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._searches: dict[int, _Search] = {}  # by request id
        self._subs: dict[str, _Search] = {}  # by one-token request id
        self._owners: dict[int, int] = {}  # every id of a beam request (its own, its samples) -> request id

    def add(self, request: EngineRequest, rule: BeamRule, sampling: Any, lora: dict[str, Any]) -> None:
        """Start ``request``'s search (its first step's requests); vLLM's rejection propagates."""
        search = _Search(request, rule, sampling, lora)
        self._submit(search)
        self._searches[request.request_id] = search
        self._owners.update((rid, request.request_id) for rid in rule.live)

    def owns(self, request_id: Any) -> bool:
        """Whether ``request_id`` (vLLM's) is one of our one-token requests."""
        return request_id in self._subs

    def collect(self, output: Any) -> None:
        """A ``RequestOutput`` of a one-token request; kept once finished."""
        if not output.finished:
            return
        search = self._subs.pop(output.request_id, None)
        if search is None:
            return
        beam = search.waiting.pop(output.request_id)
        search.tops[beam] = tops_of(output)

    def advance(self) -> list[StepOutput]:
        """Every beam request whose step is complete takes it: its outputs, then its next step."""
        outs: list[StepOutput] = []
        for search in list(self._searches.values()):
            if not search.over and not search.waiting and search.rule.live:
                outs += self._advance(search)
        return outs

    def release(self, request_id: int) -> bool:
        """Let one id of a beam request go (False: not a beam request's); once none is live, forget the
        request and abort its running one-token requests."""
        owner = self._owners.pop(request_id, None)
        if owner is None:
            return False
        search = self._searches.get(owner)
        if search is None:
            return True
        search.rule.live.discard(request_id)
        if not search.rule.live:
            del self._searches[owner]
            self._abort(search)
        return True

    def has_unfinished(self) -> bool:
        return any(not s.over and s.rule.live for s in self._searches.values())

    def _advance(self, search: _Search) -> list[StepOutput]:
        tops = search.tops
        if any(top is None for top in tops):
            search.failed = True
            return error_outputs(search.rule.live, "vLLM failed a step of the beam search")
        outs = search.rule.feed([top for top in tops if top is not None])
        search.step += 1
        if search.rule.done or not search.rule.live:
            return outs
        try:
            self._submit(search)
        except Exception as exc:  # noqa: BLE001 - vLLM refused a later step (the context is full): the request fails
            search.failed = True
            return outs + error_outputs(search.rule.live, f"vLLM refused a step of the beam search: {exc}")
        return outs

    def _submit(self, search: _Search) -> None:
        """Add the step's one-token requests (none stays added when vLLM refuses one)."""
        asks = search.rule.asks()
        search.tops = [None] * len(asks)
        for beam, tokens in enumerate(asks):
            sub = sub_request_id(search.request.request_id, search.step, beam)
            try:
                self.engine.add_request(sub, step_prompt(search.request, tokens), search.sampling, **search.lora)
            except Exception:
                self._abort(search)
                raise
            search.waiting[sub] = beam
            self._subs[sub] = search

    def _abort(self, search: _Search) -> None:
        if search.waiting:
            self.engine.abort_request(list(search.waiting))
        for sub in search.waiting:
            self._subs.pop(sub, None)
        search.waiting.clear()
