"""Several samples of one prompt (``n``, ``best_of``): how many are decoded, how many are returned,
the seed of each, and the rules every engine that decodes them applies. Pure; no ML library.

- ``sample_count``: sequences decoded = ``best_of`` when given, else ``n``.
- ``returned_count``: sequences in the response = ``n`` when the client gave it (or gave no
  ``best_of``), else ``best_of`` (TGI's ``best_of`` and LMI's ``best_of`` without ``n`` return every
  sequence, the best first). When fewer are returned than decoded, the ones with the highest
  cumulative log-probability are kept.
- ``sample_seed``: sample 0 samples with the request's seed itself (so ``n=1`` is unchanged), sample
  ``i`` with a seed derived from it (a SplitMix64 step over ``seed + i``): a seeded request gives the
  same set of samples every time, and no two samples share a random stream.
- ``check_samples``: greedy decoding with more than one sample is refused (400), as vLLM and TGI do:
  argmax decoding would return the same sequence ``n`` times at ``n`` times the cost; beam search
  (``num_beams`` >= the count) returns its best hypotheses instead. The caller
  passes the request's greedy/sampling decision (``translate.is_sampling``, the one rule), so this
  module stays below the translations (``to_vllm`` reads ``sample_count``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from djl_handlers.errors import InvalidParameter

if TYPE_CHECKING:
    from djl_handlers.params.generation import GenerationParameters

__all__ = ["check_samples", "returned_count", "sample_count", "sample_field", "sample_seed"]

_MASK = (1 << 64) - 1


def sample_count(p: GenerationParameters) -> int:
    """How many sequences are decoded for the request (``best_of``, else ``n``)."""
    return p.best_of if p.best_of is not None else p.n


def returned_count(p: GenerationParameters) -> int:
    """How many sequences the response holds (see the module docstring)."""
    if p.best_of is None or "n" in p.provided:
        return p.n
    return p.best_of


def sample_field(p: GenerationParameters) -> str:
    """The parameter an error about the sample count names: ``best_of`` when given, else ``n``."""
    return "best_of" if p.best_of is not None else "n"


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` of a request seeded with ``seed`` (None stays None: random)."""
    if seed is None or index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def check_samples(p: GenerationParameters, sampling: bool) -> None:
    """``InvalidParameter`` when more than one sample is asked for without ``sampling``
    (``is_sampling(p)``: greedy decoding), unless they are the best hypotheses of a beam search
    (``num_beams`` at least as many)."""
    count = sample_count(p)
    if count > 1 and not sampling and count > p.num_beams:
        name = sample_field(p)
        raise InvalidParameter(
            f"parameters.{name} must be 1 when decoding greedily, got {count}: greedy decoding gives the "
            "same sequence every time; set do_sample=true and a temperature > 0 to draw several samples",
            field=name,
        )
