"""The HF engine's per-request records: a row of the running batch, and a long prompt being prefilled in chunks."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from djl_handlers.engines.base import EngineRequest
from djl_handlers.engines.hf.sampling import RowSampling

if TYPE_CHECKING:
    from djl_handlers.engines.hf.beams import BeamSearch
    from djl_handlers.engines.hf.grammar import RowGrammar
    from djl_handlers.engines.hf.speculation_policy import RowSpeculation
    from djl_handlers.engines.hf.vision import RowImages

__all__ = ["Partial", "Row"]


@dataclass
class Row:
    """One request in the running batch (or being prefilled)."""

    request: EngineRequest
    sampling: RowSampling
    done: bool = False  # released or failed: dropped at the next compaction
    prompt_lp: bool = False  # decoder_input_details: report the prompt tokens' log-probs
    top_n: int = 0  # top_n_tokens: report this many most likely tokens per step
    lora: Any = None  # the row's LoRA adapter weights (engines/hf/lora.py), None: base model
    compiling: Future[Any] | None = None  # structured output: the grammar being compiled
    grammar: RowGrammar | None = None  # structured output: this row's matcher
    # n/best_of > 1: (sample index, request id) of the further samples, forked from this row's prefill
    forks: list[tuple[int, int]] = field(default_factory=list)
    prefix_digests: list[bytes] | None = None  # prefix caching: its prompt's block digests (prefix_cache.py)
    speculation: RowSpeculation | None = None  # speculation: the lookup's context, the row's acceptance counts
    # num_beams > 1: the request's beam search (shared by its beam rows), this row's beam, and the
    # beam rows still to fork from this row's prefill (engines/hf/beam_rows.py)
    beam: BeamSearch | None = None
    beam_slot: int = 0
    beam_forks: int = 0
    images: RowImages | None = None  # a vision-language prompt's images (engines/hf/vision.py)

    @property
    def width(self) -> int:
        """Rows this request takes in the running batch once prefilled (itself and its forks)."""
        return 1 + len(self.forks) + self.beam_forks

    @property
    def ids(self) -> list[int]:
        """The request ids of this row and of its forks (a beam request's: its sequences' ids)."""
        if self.beam is not None:
            return list(self.beam.ids)
        return [self.request.request_id, *(rid for _, rid in self.forks)]

    @property
    def ready(self) -> bool:
        """False until the row's compiled grammar has become its matcher (the engine's ``_start_grammars``)."""
        return self.compiling is None


@dataclass
class Partial:
    """A long prompt being prefilled chunk by chunk in its own batch-1 cache."""

    row: Row
    cache: Any
    offset: int = 0
    prompt_lps: list[float | None] | None = None  # decoder_input_details: filled chunk by chunk
