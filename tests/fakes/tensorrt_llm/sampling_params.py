"""Mirror of ``tensorrt_llm.sampling_params.SamplingParams`` (LLM API, TensorRT-LLM 0.17-1.x).

A keyword-only dataclass with the real field names and defaults (``None`` means "C++ runtime
default": top_k 0, top_p 0, temperature 1, min_tokens 1, ...). Unknown keywords raise
``TypeError``; ``_validate`` raises ``ValueError`` as the real one does. ``_setup(tokenizer)``
fills ``end_id``/``pad_id`` and tokenizes ``stop``/``bad`` (the engine matches stop words on
token ids, not on text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass(kw_only=True)
class GuidedDecodingParams:
    """Mirror of ``tensorrt_llm.sampling_params.GuidedDecodingParams``: exactly one of json (schema
    dict, pydantic model or string), regex, grammar (EBNF), json_object, structural_tag."""

    json: Union[str, dict, None] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None

    def _validate(self) -> None:
        count = sum(v is not None for v in (self.json, self.regex, self.grammar, self.structural_tag))
        if count + int(self.json_object) != 1:
            raise ValueError(f"Only one guided decoding type is allowed, got {self}")


@dataclass(kw_only=True)
class SamplingParams:
    """Sampling parameters for text generation (TensorRT-LLM LLM API names and defaults)."""

    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    bad: Union[str, list[str], None] = None
    bad_token_ids: Optional[list[int]] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    top_p_min: Optional[float] = None
    top_p_reset_ids: Optional[int] = None
    top_p_decay: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    beam_search_diversity_rate: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    length_penalty: Optional[float] = None
    early_stopping: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    min_p: Optional[float] = None
    beam_width_array: Optional[list[int]] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Optional[list[Any]] = None
    lookahead_config: Any = None
    guided_decoding: Optional[GuidedDecodingParams] = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stop_word_ids: Optional[list[list[int]]] = field(default=None, init=False, repr=False)
    _bad_word_ids: Optional[list[list[int]]] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()
        if self.guided_decoding is not None:
            self.guided_decoding._validate()

    @property
    def _greedy_decoding(self) -> bool:
        return (
            not self.use_beam_search
            and (self.top_k is None or self.top_k == 1)
            and (self.top_p is None or self.top_p == 0.0)
        )

    def _validate(self) -> None:
        assert self.best_of is not None
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of > 1 and self._greedy_decoding:
            raise ValueError(
                f"Greedy decoding in the LLM API does not allow multiple returns, got best_of={self.best_of}."
            )
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    def _setup(self, tokenizer: Any, add_special_tokens: bool = False) -> SamplingParams:
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        if self.bad is not None:
            words = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in words]
        if self.stop is not None:
            words = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in words]
        return self

    def _get_stop_reasons_and_words(self) -> list[tuple[Union[str, int], list[int]]]:
        reasons: list[Union[str, int]] = list(self.stop_token_ids or [])
        words = [[i] for i in self.stop_token_ids or []]
        if self.stop is not None:
            reasons.extend([self.stop] if isinstance(self.stop, str) else self.stop)
            words.extend(self._stop_word_ids or [])
        return list(zip(reasons, words, strict=False))
