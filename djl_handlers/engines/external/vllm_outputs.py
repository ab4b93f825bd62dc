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
- ``top_tokens`` (``top_n_tokens``, which vLLM's ``logprobs: N`` also asks for): the N most likely
  entries of the token's logprobs dict (vLLM adds the sampled token when it is not among them; it
  is left out). ``prompt_logprobs`` (``decoder_input_details``, vLLM's ``prompt_logprobs``) on each
  sample's first output: each prompt token's log-prob from ``RequestOutput.prompt_logprobs`` (None
  for the first), and with ``top_n_tokens`` each position's most likely tokens
  (``prompt_top_tokens``). vLLM computes both from the raw logits (its default ``raw_logprobs``).
- Finish reasons: ``length`` → ``length``; ``stop`` with a str ``stop_reason`` (a stop string) →
  ``stop_sequence``; ``stop`` with ``stop_reason`` None (EOS) or an int (a stop token id) →
  ``eos_token``; ``abort`` → the request fails with an error (vLLM sends nothing, or nothing we
  still read, for requests the caller aborted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    top_n: int = 0
    prompt_ids: Optional[list[int]] = None  # decoder_input_details: reported with the first output
    _ids: list[int] = field(default_factory=list)
    _detok: Optional[IncrementalDetokenizer] = None
    _pieces: list[str] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)

    @classmethod
    def for_request(cls, prompt_ids: Sequence[int], params: GenerationParameters) -> OutputTrack:
        stops = () if params.include_stop_str_in_output else params.stop_sequences or ()
        return cls(prompt_tail=list(prompt_ids[-_CONTEXT:]), skip_special_tokens=params.skip_special_tokens,
                   holdback=max((len(s) for s in stops), default=1) - 1, top_n=params.top_n_tokens,
                   prompt_ids=list(prompt_ids) if params.decoder_input_details else None)

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
                       delta: bool = False, prompt_logprobs: Any = None) -> list[StepOutput]:
    """The new ``StepOutput`` records in ``comp`` (a vLLM ``CompletionOutput`` of a ``RequestOutput``
    whose ``finished`` and ``prompt_logprobs`` are given; ``delta``: its kind is DELTA) for request
    ``rid``; updates ``track``."""
    if delta:
        new_ids, text_delta, start = list(comp.token_ids), comp.text or "", 0
    else:
        ids, text = list(comp.token_ids), comp.text or ""
        new_ids, start = ids[track.token_count :], track.token_count
        text_delta = text[track.text_len :] if len(text) > track.text_len else ""
    log_probs = _log_probs(comp, track, new_ids, start)
    tops = _top_tokens(comp, track, new_ids, start)
    prompt = _prompt(track, prompt_logprobs) if new_ids and track.token_count == 0 else (None, None)
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
    outs = [StepOutput(rid, token_id=t, log_prob=lp, text=piece, top_tokens=top)
            for t, lp, piece, top in zip(new_ids[:-1], log_probs, texts, tops, strict=False)]
    outs.append(StepOutput(rid, token_id=new_ids[-1], log_prob=log_probs[-1], text=texts[-1], finish_reason=reason,
                           top_tokens=tops[-1]))
    if prompt[0] is not None:
        outs[0] = replace(outs[0], prompt_logprobs=prompt[0], prompt_top_tokens=prompt[1])
    return outs


def _most_likely(entry: Any, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely ``(token_id, log_prob)`` of one position's logprobs dict."""
    if not entry or not hasattr(entry, "items"):
        return []
    pairs = [(int(tid), float(getattr(lp, "logprob", lp))) for tid, lp in entry.items()]
    return sorted(pairs, key=lambda pair: -pair[1])[:n]


def _top_tokens(comp: Any, track: OutputTrack, new_ids: Sequence[int],
                start: int) -> list[Optional[list[tuple[int, float]]]]:
    """Per new token, its ``top_n`` most likely tokens (None when the request asked for none)."""
    entries = comp.logprobs
    if not track.top_n or entries is None or len(entries) < start + len(new_ids):
        return [None] * len(new_ids)
    return [_most_likely(entries[start + i], track.top_n) for i in range(len(new_ids))]


def _prompt(track: OutputTrack, prompt_logprobs: Any) -> tuple[Optional[list[Optional[float]]], Any]:
    """The prompt tokens' log-probs (first None) and, with ``top_n``, each position's most likely
    tokens, from vLLM's ``RequestOutput.prompt_logprobs``; ``(None, None)`` when not asked for."""
    ids = track.prompt_ids
    if ids is None:
        return None, None
    entries = list(prompt_logprobs or [])
    entries += [None] * (len(ids) - len(entries))
    lps = [None if i == 0 else token_logprob(entries[i], tid) for i, tid in enumerate(ids)]
    tops = [None if i == 0 or not entries[i] else _most_likely(entries[i], track.top_n) for i in range(len(ids))]
    return lps, (tops if track.top_n else None)


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
