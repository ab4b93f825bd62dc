"""Mirror of ``tensorrt_llm.llmapi.LLM`` (TensorRT-LLM 0.17-1.x LLM API) over the toy model.

``LLM(model, tokenizer=None, ..., tensor_parallel_size=1, dtype="auto", **kwargs)`` (unknown
kwargs are rejected, as the real pydantic ``LlmArgs`` does); ``generate_async(inputs,
sampling_params=None, ..., streaming=False)`` returns a ``RequestOutput`` at once and a
background executor thread generates one token per iteration for every active request (in-flight
batching). ``inputs`` is a str, a list of token ids, ``{"prompt": ...}`` or
``{"prompt_token_ids": [...]}``. The end token is not part of ``token_ids``: an end-id finish
arrives as a final response without new tokens.

Beam search (``use_beam_search``, ``best_of`` beams, at most ``max_beam_width``, 1 unless given,
else ``ValueError`` as the real argument check raises) runs the fake's own search over the toy model
(``tensorrt_llm/_beams.py``), one step per iteration, its response carrying every beam.

Fake-only knobs: ``iteration_s`` (seconds per engine iteration), ``submitted`` (inspection).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from types import SimpleNamespace
from typing import Any, Optional, Union

from tensorrt_llm._beams import BeamSearch
from tensorrt_llm._toy import ToyTokenizer, next_token, token_logprob
from tensorrt_llm.executor.result import GenerationResult, Response
from tensorrt_llm.sampling_params import SamplingParams

_KNOWN_KWARGS = {
    "max_batch_size",
    "max_seq_len",
    "max_num_tokens",
    "max_input_len",
    "max_beam_width",
    "kv_cache_config",
    "backend",
    "enable_chunked_prefill",
    "pipeline_parallel_size",
    "build_config",
    "scheduler_config",
    "enable_prompt_adapter",
    "enable_lora",
    "max_lora_rank",
    "max_loras",
    "lora_config",
    "guided_decoding_backend",
}


class RequestOutput(GenerationResult):
    """The output data of a completion request to the LLM (``tensorrt_llm.llmapi.RequestOutput``)."""


class _Sequence:
    """Executor-side state of one sequence of a request (``best_of`` of them, sampling)."""

    __slots__ = ("index", "last", "tokens", "sent", "rng", "done")

    def __init__(self, index: int, last: int, rng: Optional[random.Random]) -> None:
        self.index, self.last, self.rng = index, last, rng
        self.tokens: list[int] = []
        self.sent = 0
        self.done = False


class _Active:
    """Executor-side state of one request: its sequences."""

    __slots__ = ("result", "params", "seqs", "beams")

    def __init__(self, result: RequestOutput, params: SamplingParams, last: int) -> None:
        self.result, self.params = result, params
        self.beams = BeamSearch(params, last) if params.use_beam_search else None  # tensorrt_llm/_beams.py
        # The toy samples unless top_k is 0/1 and top_p is 0 (the runtime's greedy switch); it
        # looks at no other field. Sequence 0 draws from the request's seed, sequence i from its own
        # stream of it (the runtime's per-sequence streams).
        greedy = (params.top_k or 0) <= 1 and not (params.top_p or 0.0)
        count = params.best_of or params.n
        self.seqs = [
            _Sequence(i, last, None if greedy else random.Random(params.seed if i == 0 else f"{params.seed}/{i}"))
            for i in range(count)
        ]


class LLM:
    """Fake of the TensorRT-LLM ``LLM`` class; see the module docstring."""

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: Optional[str] = None,
        tokenizer_revision: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - _KNOWN_KWARGS
        if unknown:
            raise ValueError(f"Unknown LLM arguments: {sorted(unknown)}")
        self.args = SimpleNamespace(
            model=model,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            trust_remote_code=trust_remote_code,
            max_batch_size=kwargs.get("max_batch_size", 2048),
            max_seq_len=kwargs.get("max_seq_len", 2048),
            lora_config=kwargs.get("lora_config"),
            **{k: v for k, v in kwargs.items() if k not in ("max_batch_size", "max_seq_len", "lora_config")},
        )
        self.tokenizer = None if skip_tokenizer_init else ToyTokenizer()
        self.iteration_s = 0.001
        self.submitted: dict[int, SamplingParams] = {}
        self.submitted_lora: dict[int, Any] = {}
        self._ids = itertools.count(1)
        self._active: dict[int, _Active] = {}
        self._cancel: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-trtllm-executor", daemon=True)
        self._thread.start()

    def generate_async(
        self,
        inputs: Union[str, list[int], dict],
        sampling_params: Optional[SamplingParams] = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
    ) -> RequestOutput:
        """Submit one prompt; returns its (streaming) result at once."""
        if self._stop.is_set():
            raise RuntimeError("LLM is shut down")
        params = sampling_params if sampling_params is not None else SamplingParams()
        params._setup(self.tokenizer)
        prompt, ids = self._inputs(inputs)
        if len(ids) + params.max_tokens > self.args.max_seq_len:
            raise ValueError(
                f"The sum of prompt length ({len(ids)}), query length (0) and max_tokens "
                f"({params.max_tokens}) should not exceed max_seq_len ({self.args.max_seq_len})"
            )
        width = getattr(self.args, "max_beam_width", 1)
        if params.use_beam_search and (params.best_of or params.n) > width:
            raise ValueError(f"beam width {params.best_of or params.n} exceeds the engine's max_beam_width ({width})")
        rid = next(self._ids)
        result = RequestOutput(rid, prompt, ids, params, streaming, self.tokenizer, self._abort_request)
        if lora_request is not None:
            if self.args.lora_config is None:
                raise ValueError("LoRA request given but the LLM was built without lora_config")
            self.submitted_lora[rid] = lora_request
        with self._lock:
            self.submitted[rid] = params
            self._active[rid] = _Active(result, params, ids[-1])
        return result

    def _inputs(self, inputs: Union[str, list[int], dict]) -> tuple[Optional[str], list[int]]:
        if isinstance(inputs, dict):
            inputs = inputs["prompt_token_ids"] if "prompt_token_ids" in inputs else inputs["prompt"]
        if isinstance(inputs, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer")
            return inputs, self.tokenizer.encode(inputs)
        if isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
            return None, list(inputs)
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")

    def _abort_request(self, request_id: int) -> None:
        with self._lock:
            self._cancel.add(request_id)

    def shutdown(self) -> None:
        """Stop the executor thread."""
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- the executor loop ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                batch = list(self._active.items())
                cancelled, self._cancel = self._cancel, set()
            for rid, act in batch:
                if rid in cancelled:
                    act.result._deliver(Response([], [], is_final=True, finish="cancelled"))
                    done = True
                else:
                    done = self._iterate(act)
                if done:
                    with self._lock:
                        self._active.pop(rid, None)
            time.sleep(self.iteration_s)

    def _iterate(self, act: _Active) -> bool:
        """One in-flight-batching iteration for one request (a token for each of its unfinished
        sequences); returns True when every sequence finished. A sequence's response is final only
        when it is the request's last. A beam search advances every beam; its response carries them all."""
        if act.beams is not None:
            act.beams.step()
            if act.result._streaming or act.beams.done:
                beams = [(h.tokens, h.finish) for h in act.beams.current()]
                act.result._deliver(Response([], [], is_final=act.beams.done, beams=beams))
            return act.beams.done
        finishes = {seq.index: self._advance(act, seq) for seq in act.seqs if not seq.done}
        done = all(seq.done for seq in act.seqs)
        if done and not act.result._streaming:  # one response per sequence at the end, the last final
            for seq in act.seqs:
                self._send(act, seq, is_final=seq is act.seqs[-1], finish=finishes.get(seq.index))
        return done

    def _advance(self, act: _Active, seq: _Sequence) -> Optional[str]:
        params = act.params
        tok = next_token(seq.last, seq.rng)
        seq.last = tok
        past_min = len(seq.tokens) + 1 >= (params.min_tokens or 1)
        finish = None
        if tok == params.end_id and not params.ignore_eos and past_min:
            finish = "end_id"
        else:
            seq.tokens.append(tok)
            words = params._get_stop_reasons_and_words()
            if past_min and any(ids and seq.tokens[-len(ids) :] == ids for _, ids in words):
                finish = "stop_words"
            elif len(seq.tokens) >= params.max_tokens:
                finish = "length"
        seq.done = finish is not None
        if act.result._streaming:
            self._send(act, seq, is_final=all(s.done for s in act.seqs), finish=finish)
        return finish

    @staticmethod
    def _send(act: _Active, seq: _Sequence, is_final: bool, finish: Optional[str]) -> None:
        new = seq.tokens[seq.sent :]
        seq.sent = len(seq.tokens)
        act.result._deliver(Response(new, [token_logprob(t) for t in new], is_final=is_final, finish=finish,
                                     sequence_index=seq.index))
