"""The samples of one vLLM request (``n``/``best_of`` > 1) as the pipeline names them.

The scheduler gives a request with several samples one engine request whose ``request_id`` is
sample 0 and whose ``sample_ids`` name the others (``EngineRequest``). vLLM decodes them natively
(``SamplingParams.n``, asked for by ``to_vllm``; V1 has no ``best_of``, so ``best_of`` samples are
decoded and the scheduler keeps the best): every ``CompletionOutput`` of the request carries its
sample's ``index``, and :func:`request_outputs` reports it under that sample's id, with its own
:class:`~djl_handlers.engines.external.vllm_outputs.OutputTrack`. vLLM derives sample ``i``'s seed
as ``seed + i`` (its own rule, not ``params.samples.sample_seed``): :func:`vllm_sample_seed`, which
the adapters offer the scheduler as ``sample_seed`` so each sample reports the seed it drew with.

A sample the scheduler let go (``release``: it finished by one of our rules) gets no further
outputs; vLLM itself is asked to abort the request only when every sample was let go before vLLM
finished them all (vLLM aborts a request's samples together).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput, Tokenizer
from djl_handlers.engines.external.vllm_outputs import OutputTrack, completion_outputs

__all__ = ["RequestTracks", "request_outputs", "vllm_sample_seed"]


def vllm_sample_seed(seed: Optional[int], index: int) -> Optional[int]:
    """The seed vLLM draws sample ``index`` of a request seeded with ``seed`` with (None: random)."""
    return None if seed is None else seed + index


@dataclass
class RequestTracks:
    """What the adapter reported for each sample of one vLLM request: ``ids[i]`` names sample
    ``i`` (``ids[0]`` is the vLLM request id), ``tracks[i]`` its track, ``released`` the samples
    the scheduler let go."""

    ids: list[int]
    tracks: list[OutputTrack]
    released: set[int] = field(default_factory=set)

    @classmethod
    def for_request(cls, request: EngineRequest) -> RequestTracks:
        ids = [request.request_id, *request.sample_ids]
        return cls(ids, [OutputTrack.for_request(request.prompt_ids, request.params) for _ in ids])

    @property
    def finished(self) -> bool:
        """vLLM finished every sample."""
        return all(track.finished for track in self.tracks)

    @property
    def live(self) -> bool:
        """Some sample is neither finished by vLLM nor let go."""
        return any(not t.finished and i not in self.released for i, t in enumerate(self.tracks))

    def release(self, request_id: int) -> bool:
        """Let sample ``request_id`` go; True when every sample has been let go."""
        if request_id in self.ids:
            self.released.add(self.ids.index(request_id))
        return len(self.released) == len(self.ids)


def request_outputs(tracks: RequestTracks, output: Any, tokenizer: Optional[Tokenizer],
                    delta: bool = False) -> list[StepOutput]:
    """The new ``StepOutput`` records in ``output`` (a vLLM ``RequestOutput``, one or several
    ``CompletionOutput``; ``delta``: its kind is DELTA), each under its sample's id."""
    results: list[StepOutput] = []
    single = len(tracks.ids) == 1
    for comp in output.outputs:
        index = 0 if single else int(getattr(comp, "index", 0))
        if not 0 <= index < len(tracks.ids) or index in tracks.released:
            continue
        track = tracks.tracks[index]
        if track.finished:
            continue
        results.extend(completion_outputs(tracks.ids[index], track, comp, output.finished, tokenizer, delta,
                                          getattr(output, "prompt_logprobs", None)))
    return results
