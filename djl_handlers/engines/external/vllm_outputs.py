"""vLLM's ``RequestOutput`` → ``StepOutput`` records, for the synchronous (``LLMEngine``) and the
asynchronous (``AsyncLLM``) adapter alike; a request's samples (``n`` > 1: one ``CompletionOutput``
each) are tracked apart by ``vllm_samples``.

vLLM batches, samples, detokenizes and stops on its own, so every ``StepOutput`` carries the text
delta and, on the last one, the LMI finish reason:

- Outputs are ``RequestOutputKind.CUMULATIVE`` (everything so far; ``LLMEngine``'s default) or
  ``DELTA`` (only what is new; what the async adapter asks for). For cumulative outputs an
  :class:`OutputTrack` keeps, per request, how much text and how many token ids were reported and
  only the difference is emitted.
- One ``StepOutput`` per new token id. When one output brings several tokens (speculative
  decoding; an ``AsyncLLM`` reader that fell behind gets its outputs merged), vLLM's text delta is
  cut where vLLM's text would have stood had each token come alone: the adapter decodes the
  request's tokens itself from then on
  (:class:`~djl_handlers.scheduling.detokenizer.IncrementalDetokenizer`), and a token's piece
  ends where its text ends minus what vLLM holds back for stop strings (the longest one minus
  one character). Should that decoding disagree with vLLM's text, the tokens before the last get
  ``text=""`` and the last the whole delta. An output without new tokens gives none.
- ``log_prob`` comes from ``CompletionOutput.logprobs`` (``to_vllm`` asks for ``logprobs=1``
  unless told otherwise), else from the change of ``cumulative_logprob``, else None.
- Finish reasons: ``length`` → ``length``; ``stop`` with a str ``stop_reason`` (a stop string) →
  ``stop_sequence``; ``stop`` with ``stop_reason`` None (EOS) or an int (a stop token id) →
  ``eos_token``; ``abort`` → the request fails with an error (vLLM sends nothing, or nothing we
  still read, for requests the caller aborted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.engines.base import StepOutput, Tokenizer
from djl_handlers.engines.external.common import token_logprob
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.scheduling.detokenizer import IncrementalDetokenizer

_CONTEXT = 4  # token ids kept as left context for cutting a multi-token text delta


def map_finish_reason(finish_reason: Optional[str], stop_reason: Any) -> Optional[str]:
    """vLLM's ``finish_reason``/``stop_reason`` → LMI's (``abort`` stays ``abort``)."""
    if finish_reason is None:
        return None
    if finish_reason == "length":
        return "length"
    if finish_reason == "stop":
        return "stop_sequence" if isinstance(stop_reason, str) else "eos_token"
    if finish_reason == "abort":
        return "abort"
    return "error"


@dataclass
class OutputTrack:
    """What the adapter already reported for one request.

    ``prompt_tail``: the prompt's last token ids (left context for decoding); ``holdback``: the
    characters vLLM holds back from an unfinished request's text (the longest stop string minus
    one, unless ``include_stop_str_in_output``). Once an output brings several tokens, the track
    decodes every token itself (``_pieces``/``_ends``: each token's text and where it ends).
    """

    text_len: int = 0
    token_count: int = 0
    cumulative: Optional[float] = 0.0
    finished: bool = False
    prompt_tail: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    holdback: int = 0
    _ids: list[int] = field(default_factory=list)
    _detok: Optional[IncrementalDetokenizer] = None
    _pieces: list[str] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)

    @classmethod
    def for_request(cls, prompt_ids: Sequence[int], params: GenerationParameters) -> OutputTrack:
        stops = () if params.include_stop_str_in_output else params.stop_sequences or ()
        return cls(prompt_tail=list(prompt_ids[-_CONTEXT:]), skip_special_tokens=params.skip_special_tokens,
                   holdback=max((len(s) for s in stops), default=1) - 1)

    def texts(self, tokenizer: Optional[Tokenizer], new_ids: Sequence[int], text: str) -> list[str]:
        """One text per token of ``new_ids``, which vLLM detokenized together as ``text`` (see the
        module docstring); call once per output, before ``text_len`` counts ``text``."""
        if self._detok is None and (len(new_ids) < 2 or tokenizer is None):
            self._ids.extend(new_ids)
            return [""] * (len(new_ids) - 1) + [text]
        if self._detok is None:
            assert tokenizer is not None
            self._detok = IncrementalDetokenizer(tokenizer, self.prompt_tail, self.skip_special_tokens)
            for token_id in self._ids:
                self._push(token_id)
        for token_id in new_ids:
            self._push(token_id)
        if len(new_ids) < 2:
            return [text]
        start, stop = self.text_len, self.text_len + len(text)
        ours = "".join(self._pieces)
        if ours[start:stop] != text:  # our decoding disagrees with vLLM's: all on the last token
            return [""] * (len(new_ids) - 1) + [text]
        # where vLLM's text stood after each token, had it come alone: its end minus the holdback
        cuts = [min(max(end - self.holdback, start), stop) for end in self._ends[-len(new_ids) : -1]]
        bounds = [start, *cuts, stop]
        return [ours[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def _push(self, token_id: int) -> None:
        assert self._detok is not None
        piece = self._detok.push(token_id)
        self._pieces.append(piece)
        self._ends.append((self._ends[-1] if self._ends else 0) + len(piece))


def completion_outputs(rid: int, track: OutputTrack, comp: Any, finished: bool, tokenizer: Optional[Tokenizer],
                       delta: bool = False) -> list[StepOutput]:
    """The new ``StepOutput`` records in ``comp`` (a vLLM ``CompletionOutput`` of a ``RequestOutput``
    whose ``finished`` is given; ``delta``: its kind is DELTA) for request ``rid``; updates ``track``."""
    if delta:
        new_ids, text_delta, start = list(comp.token_ids), comp.text or "", 0
    else:
        ids, text = list(comp.token_ids), comp.text or ""
        new_ids, start = ids[track.token_count :], track.token_count
        text_delta = text[track.text_len :] if len(text) > track.text_len else ""
    log_probs = _log_probs(comp, track, new_ids, start)
    reason = map_finish_reason(comp.finish_reason, comp.stop_reason)
    if reason is None and finished:
        reason = "eos_token"
    if reason is not None:
        track.finished = True
    if reason in ("abort", "error"):
        return [StepOutput(rid, error=f"vLLM ended the request (finish_reason={comp.finish_reason!r})")]
    texts = track.texts(tokenizer, new_ids, text_delta) if new_ids else []
    track.token_count += len(new_ids)
    track.text_len += len(text_delta)
    if not new_ids:
        return [StepOutput(rid, text=text_delta, finish_reason=reason)] if (text_delta or reason) else []
    outs = [StepOutput(rid, token_id=t, log_prob=lp, text=piece)
            for t, lp, piece in zip(new_ids[:-1], log_probs, texts, strict=False)]
    outs.append(StepOutput(rid, token_id=new_ids[-1], log_prob=log_probs[-1], text=texts[-1], finish_reason=reason))
    return outs


def _log_probs(comp: Any, track: OutputTrack, new_ids: Sequence[int], start: int) -> list[Optional[float]]:
    """Per-token log-probs of ``new_ids``; their entries in ``comp.logprobs`` start at ``start``."""
    entries = comp.logprobs
    if entries is not None and len(entries) >= start + len(new_ids):
        return [token_logprob(entries[start + i], tid) for i, tid in enumerate(new_ids)]
    cumulative = comp.cumulative_logprob
    previous, track.cumulative = track.cumulative, cumulative
    if cumulative is not None and previous is not None and len(new_ids) == 1:
        return [float(cumulative - previous)]
    return [None] * len(new_ids)
