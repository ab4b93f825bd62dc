"""Beam search (``num_beams``) on TensorRT-LLM: what the adapter checks before it submits a beam request.

``to_trtllm`` turns ``num_beams`` into the LLM API's beam search (``use_beam_search=True``,
``best_of`` = the beam width, ``n`` = the beams returned, ``length_penalty``, ``early_stopping`` as an
int). The engine searches at most ``max_beam_width`` beams, fixed when the LLM is built
(``option.max_beam_width``, default 1: no beam search); a wider request is a 400 naming ``num_beams``
here rather than an executor error. Beam search is greedy (as on the other engines): ``do_sample``
with beams is a 400. A beam request is submitted without streaming (TensorRT-LLM rewrites every
beam's tokens while it searches, so no prefix is final before the end): its tokens come out at once
when the search ends, the best beam under the request's id and the next ``n - 1`` under its sample ids.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.errors import InvalidParameter
from djl_handlers.params.translate import is_sampling

__all__ = ["check_trtllm_beams", "max_beam_width_of", "streams"]


def max_beam_width_of(llm: Any) -> int:
    """The widest beam search ``llm`` was built for (its ``args.max_beam_width``; 1 when not set)."""
    width = getattr(getattr(llm, "args", None), "max_beam_width", None)
    return int(width) if isinstance(width, int) and width > 0 else 1


def check_trtllm_beams(params: Any, max_beam_width: int) -> None:
    """400 (naming the field) unless ``params``' beam search can run on an engine of ``max_beam_width``."""
    beams = int(params.num_beams)
    if beams <= 1:
        return
    if is_sampling(params):
        raise InvalidParameter(
            f"parameters.do_sample cannot be used with num_beams={beams}: beam search is greedy here "
            "(as in vLLM); set do_sample=false (or temperature 0)", field="do_sample")
    if beams > max_beam_width:
        raise InvalidParameter(
            f"parameters.num_beams is {beams} but this TensorRT-LLM engine was built for beams up to "
            f"{max_beam_width} (option.max_beam_width): ask for at most {max_beam_width} or load the model "
            f"with option.max_beam_width={beams}", field="num_beams")


def streams(sampling: Any) -> bool:
    """Whether the request is submitted streaming (every request but a beam search)."""
    return not bool(getattr(sampling, "use_beam_search", False))
