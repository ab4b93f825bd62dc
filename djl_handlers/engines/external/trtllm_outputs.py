"""TensorRT-LLM's cumulative ``CompletionOutput`` snapshots → ``StepOutput`` records, for the sync and
async paths of the adapter (:mod:`djl_handlers.engines.external.trtllm`, whose docstring says how
deltas, stop strings and finish reasons are read), and the samples of one request.

Several samples (``n``/``best_of`` > 1): one LLM-API request with ``SamplingParams.n`` set to every
sample to decode (``best_of`` is left at its default, ``n``, so the LLM API returns every sequence
under a stable ``index`` instead of re-sorting them by cumulative log-probability); TensorRT-LLM
decodes them as sequences of the request and each ``CompletionOutput`` of a snapshot is sample
``index`` (:class:`Samples`), reported under that sample's id; the scheduler keeps the best of
``best_of``. TensorRT-LLM draws every sequence of a request from the request's ``random_seed`` (its own
stream per sequence), so each sample reports that seed. The LLM API sets a sequence's finish reason
only on the request's final response: a sample that ended earlier is read then (no reason: v0.27's
rule, ``eos_token`` below ``max_tokens``). A sample the scheduler let go gets no further outputs; the
request is aborted only once every sample was let go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.common import token_logprob

__all__ = ["Samples", "Tracker", "map_finish_reason", "snapshot_outputs", "trtllm_sample_seed"]


def trtllm_sample_seed(seed: Optional[int], index: int) -> Optional[int]:
    """The seed sample ``index`` draws with: the request's own (TensorRT-LLM gives each sequence its
    own stream of it)."""
    return seed


@dataclass
class Delta:
    """What one response added to a request."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[Optional[float]] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Tracker:
    """Pump-side state of one sample (touched only on the adapter's event loop)."""

    max_tokens: int
    holdback: int
    end_id: int
    tokenizer: Any = None
    text_len: int = 0
    token_count: int = 0


def map_finish_reason(reason: Optional[str], stop_reason: Any, generated: int, max_tokens: int) -> Optional[str]:
    """TensorRT-LLM's finish reason → LMI's (``error`` for cancelled/timeout)."""
    if reason is None:
        return "eos_token" if generated < max_tokens else "length"
    if reason == "length":
        return "length"
    if reason == "stop":
        return "stop_sequence" if isinstance(stop_reason, str) else "eos_token"
    return "error"


def delta_of(tracker: Tracker, comp: Any, finished: bool) -> Optional[Delta]:
    """The part of ``comp`` (a cumulative CompletionOutput) not reported yet, or None."""
    ids = list(comp.token_ids or [])
    new_ids = ids[tracker.token_count :]
    entries = comp.logprobs or []
    start = tracker.token_count
    log_probs = [
        token_logprob(entries[start + i], t) if len(entries) > start + i else None for i, t in enumerate(new_ids)
    ]
    tracker.token_count = max(tracker.token_count, len(ids))
    text = comp.text or ""
    visible = text if finished else text[: max(0, len(text) - tracker.holdback)]
    delta_text = visible[tracker.text_len :] if len(visible) > tracker.text_len else ""
    tracker.text_len = max(tracker.text_len, len(visible))
    reason = None
    if finished or comp.finish_reason is not None:
        reason = map_finish_reason(comp.finish_reason, comp.stop_reason, tracker.token_count, tracker.max_tokens)
    if reason == "error":
        return Delta(error=f"TensorRT-LLM ended the request (finish_reason={comp.finish_reason!r})")
    if reason is not None and reason != "length" and not new_ids:
        new_ids, log_probs = [completing_token(tracker, comp.stop_reason)], [None]
    if not new_ids and not delta_text and reason is None:
        return None
    return Delta(new_ids, log_probs, delta_text, reason)


def completing_token(tracker: Tracker, stop_reason: Any) -> int:
    """The token that ended a request whose final response carries no new token: the end id, the
    stop token id, or the last token of the (trimmed) stop word, which TensorRT-LLM matched on
    ``tokenizer.encode(stop)``."""
    if isinstance(stop_reason, int):
        return stop_reason
    if isinstance(stop_reason, str) and tracker.tokenizer is not None:
        ids = tracker.tokenizer.encode(stop_reason, add_special_tokens=False)
        if ids:
            return int(ids[-1])
    return tracker.end_id


def step_outputs(rid: int, delta: Delta) -> list[StepOutput]:
    if delta.error is not None:
        return [StepOutput(rid, error=delta.error)]
    ids = delta.token_ids or [-1]
    log_probs = delta.log_probs or [None]
    outs = [StepOutput(rid, token_id=t, log_prob=lp, text="") for t, lp in zip(ids[:-1], log_probs, strict=False)]
    outs.append(
        StepOutput(rid, token_id=ids[-1], log_prob=log_probs[-1], text=delta.text, finish_reason=delta.finish_reason)
    )
    return outs




@dataclass
class Samples:
    """The samples of one request: ``ids[i]`` names sample ``i`` (``ids[0]`` is the request id),
    ``trackers[i]`` its delta state; ``finished``/``released`` by sample position."""

    ids: list[int]
    trackers: list[Tracker]
    finished: set[int] = field(default_factory=set)
    released: set[int] = field(default_factory=set)

    @classmethod
    def for_request(cls, request: EngineRequest, make: Any) -> Samples:
        """One tracker per sample of ``request`` (``make()`` builds one)."""
        ids = [request.request_id, *request.sample_ids]
        return cls(ids, [make() for _ in ids])

    @property
    def live(self) -> bool:
        """Some sample is neither finished nor let go."""
        return any(i not in self.finished and i not in self.released for i in range(len(self.ids)))

    def release(self, request_id: int) -> bool:
        """Let sample ``request_id`` go; True when every sample has been let go or finished."""
        if request_id in self.ids:
            self.released.add(self.ids.index(request_id))
        return not self.live


def snapshot_outputs(samples: Samples, snapshot: Any) -> list[tuple[int, Delta]]:
    """``(sample id, delta)`` for every sample that ``snapshot`` (the request's ``RequestOutput``)
    advanced; a sample that finished or was let go gets nothing more."""
    out: list[tuple[int, Delta]] = []
    finished = bool(snapshot.finished)
    for position, comp in enumerate(snapshot.outputs):
        index = int(getattr(comp, "index", position)) if len(samples.ids) > 1 else 0
        if not 0 <= index < len(samples.ids) or index in samples.finished or index in samples.released:
            continue
        delta = delta_of(samples.trackers[index], comp, finished)
        if delta is None:
            continue
        if delta.finish_reason is not None or delta.error is not None:
            samples.finished.add(index)
        out.append((samples.ids[index], delta))
    return out
