"""Mirror of vLLM's synchronous ``LLMEngine`` (V1, ``vllm.v1.engine.llm_engine``), driven by the
toy model in ``vllm._toy``.

Behaviour copied from the real engine, because the adapter depends on it:

- ``add_request(request_id, prompt, params, ...)`` accepts a string, ``{"prompt": str}`` or
  ``{"prompt_token_ids": [...]}``; a prompt longer than ``max_model_len`` raises ``ValueError``.
- ``step()`` returns one ``RequestOutput`` per request that produced tokens this step (requests
  beyond ``max_num_seqs`` wait and get none). With ``RequestOutputKind.CUMULATIVE`` (default)
  ``text``/``token_ids``/``logprobs`` hold everything so far; with ``DELTA`` only what is new.
- Detokenized text of an unfinished request holds back ``output_text_buffer_length`` chars, so
  a stop string is never streamed; on a stop-string match the text is cut (kept with
  ``include_stop_str_in_output``), ``finish_reason="stop"`` and ``stop_reason`` is the string.
  EOS gives ``"stop"`` with ``stop_reason=None``; a stop token id gives ``"stop"`` with the
  int; ``max_tokens`` gives ``"length"``. EOS/stop tokens are ignored before ``min_tokens``.
- ``logprobs``/``cumulative_logprob`` are ``None`` unless ``SamplingParams.logprobs`` is set.
- ``abort_request(request_ids: list[str])`` drops requests; aborted requests get no output.
- ``SamplingParams.n`` > 1 (V1's parallel sampling, ``vllm.v1.engine.parallel_sampling``): the
  request fans out into child sequences ``f"{i}_{request_id}"``, each with ``n=1`` and, when
  seeded, ``seed + i``; each step's output of a child is a ``RequestOutput`` under the parent's id
  whose one ``CompletionOutput`` has ``index=i``, ``finished`` once every child has finished;
  aborting the parent id aborts its children.

- LoRA: ``add_request(..., lora_request=LoRARequest)`` needs ``enable_lora`` and loads the adapter on
  demand; ``add_lora``/``remove_lora``/``pin_lora``/``list_loras`` as in vLLM; a rank above
  ``max_lora_rank`` is a ``ValueError``. (The toy model's tokens do not depend on the adapter.)

Fake-only knobs (not in vLLM): ``tokens_per_step`` (speculative decoding: several tokens per
request per step) and the inspection lists ``added``/``aborted``/``lora_of``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from vllm._toy import EOS_ID, ToyTokenizer, next_token, token_logprob
from vllm.engine.arg_utils import EngineArgs
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import _SAMPLING_EPS, RequestOutputKind, SamplingParams


@dataclass
class ModelConfig:
    """The part of vLLM's ModelConfig that callers read."""

    model: str
    max_model_len: int
    dtype: str


@dataclass
class _Seq:
    request_id: str
    prompt: Optional[str]
    prompt_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    text: str = ""
    sent_text: int = 0
    sent_tokens: int = 0
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    rng: Optional[random.Random] = None  # set when the params sample (temperature > 0)


class LLMEngine:
    """Fake of vLLM's ``LLMEngine``; see the module docstring."""

    def __init__(self, engine_args: EngineArgs) -> None:
        self.engine_args = engine_args
        self.model_config = ModelConfig(engine_args.model, engine_args.max_model_len or 2048, engine_args.dtype)
        self.tokenizer = ToyTokenizer()
        self.max_num_seqs = engine_args.max_num_seqs or 256
        self.tokens_per_step = 1
        self._seqs: dict[str, _Seq] = {}
        self.added: dict[str, SamplingParams] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self.loras: dict[int, Any] = {}
        self.pinned: set[int] = set()
        self.lora_of: dict[str, Any] = {}
        self._children: dict[str, list[str]] = {}  # parent id -> its unfinished children (n > 1)
        self._parent_of: dict[str, tuple[str, int]] = {}  # child id -> (parent id, index)

    @classmethod
    def from_engine_args(
        cls,
        engine_args: EngineArgs,
        usage_context: Any = None,
        stat_loggers: Any = None,
        enable_multiprocessing: bool = False,
    ) -> LLMEngine:
        return cls(engine_args)

    def get_tokenizer(self) -> ToyTokenizer:
        return self.tokenizer

    def get_model_config(self) -> ModelConfig:
        return self.model_config

    def get_num_unfinished_requests(self) -> int:
        return len(self._seqs)

    def has_unfinished_requests(self) -> bool:
        return bool(self._seqs)

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams,
        arrival_time: Optional[float] = None,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict] = None,
        trace_headers: Any = None,
        priority: int = 0,
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        text, ids = self._prompt(prompt)
        if not ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(ids) > self.model_config.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {self.model_config.max_model_len}."
            )
        if lora_request is not None:
            if not self.engine_args.enable_lora:
                raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled!")
            self._check_lora(lora_request)
            self.loras.setdefault(lora_request.lora_int_id, lora_request)  # vLLM loads it on demand
        _validate_structured(params.structured_outputs)
        self.added[request_id] = params
        self.lora_of[request_id] = lora_request
        if params.n == 1:
            self._add_seq(request_id, text, ids, params)
            return
        self._children[request_id] = []
        for index in range(params.n):
            child = f"{index}_{request_id}"
            seed = None if params.seed is None else params.seed + index
            self._add_seq(child, text, ids, replace(params, n=1, seed=seed))
            self._children[request_id].append(child)
            self._parent_of[child] = (request_id, index)

    def _add_seq(self, request_id: str, text: Optional[str], ids: list[int], params: SamplingParams) -> None:
        seq = _Seq(request_id, text, ids, params)
        if params.temperature >= _SAMPLING_EPS:  # vLLM: temperature 0 is greedy
            seq.rng = random.Random(params.seed)
        self._seqs[request_id] = seq

    # -- LoRA (vLLM's LLMEngine.add_lora/remove_lora/pin_lora/list_loras) --------------------------
    def _check_lora(self, lora_request: Any) -> None:
        import json
        import os

        config = os.path.join(lora_request.lora_path, "adapter_config.json")
        if not os.path.isfile(config):
            raise ValueError(f"Loading lora {lora_request.lora_name} failed: No adapter found for "
                             f"{lora_request.lora_path}")
        with open(config, encoding="utf-8") as handle:
            rank = int(json.load(handle).get("r", 8))
        if rank > self.engine_args.max_lora_rank:
            raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self.engine_args.max_lora_rank}.")

    def add_lora(self, lora_request: Any) -> bool:
        if not self.engine_args.enable_lora:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        self._check_lora(lora_request)
        if lora_request.lora_int_id in self.loras:
            return False  # as vLLM's LRU adapter manager: already loaded
        self.loras[lora_request.lora_int_id] = lora_request
        return True

    def remove_lora(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None

    def pin_lora(self, lora_id: int) -> bool:
        if lora_id not in self.loras:
            raise ValueError(f"LoRA {lora_id} is not registered")
        self.pinned.add(lora_id)
        return True

    def list_loras(self) -> set[int]:
        return set(self.loras)

    def _prompt(self, prompt: Any) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return None, list(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        raise TypeError(f"unsupported prompt type {type(prompt).__name__}")

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        if isinstance(request_ids, str):  # V1 iterates the argument: a str would abort per char
            raise TypeError("abort_request takes a list of request ids")
        for rid in request_ids:
            children = self._children.pop(rid, None)
            if children is not None:
                for child in children:
                    self._seqs.pop(child, None)
                    self._parent_of.pop(child, None)
                self.aborted.append(rid)
            elif self._seqs.pop(rid, None) is not None:
                self.aborted.append(rid)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        outputs = []
        for seq in list(self._seqs.values())[: self.max_num_seqs]:
            for _ in range(self.tokens_per_step):
                self._advance(seq)
                if seq.finish_reason is not None:
                    break
            output = self._output(seq)
            if seq.finish_reason is not None:
                del self._seqs[seq.request_id]
            outputs.append(self._as_parent(output) if seq.request_id in self._parent_of else output)
        return outputs

    def _as_parent(self, output: RequestOutput) -> RequestOutput:
        """A child's output under its parent's id, with the child's index."""
        parent, index = self._parent_of[output.request_id]
        output.outputs[0].index = index
        if output.finished:
            del self._parent_of[output.request_id]
            self._children[parent].remove(output.request_id)
        output.finished = not self._children[parent]
        if output.finished:
            del self._children[parent]
        output.request_id = parent
        return output

    def _advance(self, seq: _Seq) -> None:
        params = seq.params
        last = seq.token_ids[-1] if seq.token_ids else seq.prompt_ids[-1]
        tok = next_token(last, seq.rng)
        seq.token_ids.append(tok)
        seq.logprobs.append({tok: Logprob(token_logprob(tok), 1, self.tokenizer.decode([tok], False))})
        seq.text = self.tokenizer.decode(seq.token_ids, params.skip_special_tokens)
        n = len(seq.token_ids)
        if n > params.min_tokens:
            if tok == EOS_ID and not params.ignore_eos:
                seq.finish_reason = "stop"
                return
            if tok in params._all_stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", tok
                return
            if self._check_stop_strings(seq):
                return
        if params.max_tokens is not None and n >= params.max_tokens:
            seq.finish_reason = "length"
        elif len(seq.prompt_ids) + n >= self.model_config.max_model_len:
            seq.finish_reason = "length"

    @staticmethod
    def _check_stop_strings(seq: _Seq) -> bool:
        params = seq.params
        for stop in params.stop or []:
            idx = seq.text.find(stop)
            if idx >= 0:
                end = idx + len(stop) if params.include_stop_str_in_output else idx
                seq.text = seq.text[:end]
                seq.finish_reason, seq.stop_reason = "stop", stop
                return True
        return False

    def _output(self, seq: _Seq) -> RequestOutput:
        params = seq.params
        finished = seq.finish_reason is not None
        visible = seq.text if finished else seq.text[: max(0, len(seq.text) - params.output_text_buffer_length)]
        want_lp = params.logprobs is not None
        if params.output_kind == RequestOutputKind.DELTA:
            text, ids = visible[seq.sent_text :], seq.token_ids[seq.sent_tokens :]
            lps = seq.logprobs[seq.sent_tokens :]
        else:
            text, ids, lps = visible, list(seq.token_ids), list(seq.logprobs)
        seq.sent_text, seq.sent_tokens = len(visible), len(seq.token_ids)
        cum = sum(next(iter(d.values())).logprob for d in seq.logprobs) if want_lp else None
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=ids,
            cumulative_logprob=cum,
            logprobs=lps if want_lp else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_ids, None, [completion], finished)


def _validate_structured(so: Any) -> None:
    """Like vLLM's input processor: a malformed JSON schema or regex, or an empty constraint, is a
    ValueError (the toy model does not follow the constraint; the adapter's translation is what is
    tested)."""
    if so is None:
        return
    if so.regex is not None:
        import re

        try:
            re.compile(so.regex)
        except re.error as exc:
            raise ValueError(f"Failed to convert the regex {so.regex!r}: {exc}") from None
    if isinstance(so.json, str):
        import json

        try:
            json.loads(so.json)
        except ValueError as exc:
            raise ValueError(f"Invalid JSON schema for structured outputs: {exc}") from None
    if all(getattr(so, k) is None for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")):
        raise ValueError("Structured outputs params must have at least one constraint")
