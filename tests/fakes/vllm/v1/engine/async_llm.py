"""Mirror of vLLM's asynchronous engine ``AsyncLLM`` (V1, ``vllm.v1.engine.async_llm``; vLLM 0.10-0.3x),
over the fake ``LLMEngine`` as its engine core.

Behaviour copied from the real class, because the adapter depends on it:

- ``AsyncLLM.from_engine_args(AsyncEngineArgs(...))``; attributes ``model_config``,
  ``get_tokenizer()``, ``get_num_unfinished_requests()``, ``shutdown()``, ``errored``.
- ``generate(prompt, sampling_params, request_id, *, lora_request=None, ...)`` is an async
  generator of ``RequestOutput``: it adds the request (under an internal id: the external id plus a
  random suffix), then yields the outputs an engine task on the event loop puts in the request's
  collector. When the reader is behind, the collector merges outputs (``RequestOutput.add``;
  DELTA outputs are appended, cumulative ones replaced). The engine task starts on the running
  loop when the engine is built inside one, else with the first request.
- Rejections: a prompt that is empty or too long raises ``VLLMValidationError`` (vLLM 0.11+,
  not a ``ValueError``); any other error while adding the request (a bad structured-output
  constraint, a LoRA problem) raises ``EngineGenerateError`` whose ``__cause__`` is the original.
- ``abort(request_id, internal=False)`` (external ids; unknown ids do nothing) removes the request
  from the core and puts a final output with ``finish_reason="abort"`` in its collector.
  Closing or cancelling ``generate`` aborts the request as well.
- ``add_lora``/``remove_lora``/``pin_lora``/``list_loras`` are coroutines.

Fake-only knobs: ``burst`` (core steps run back to back before the event loop gets a turn: the
reader falls behind and its outputs merge), ``step_s`` (seconds between core steps), ``core``
(the fake ``LLMEngine``: ``added``/``aborted``/``lora_of``/``tokens_per_step``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Optional, Union

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.exceptions import VLLMValidationError
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.exceptions import EngineGenerateError


class RequestOutputCollector:
    """One request's outputs, handed from the engine task to its ``generate`` reader."""

    def __init__(self, output_kind: RequestOutputKind, request_id: str) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        self.request_id = request_id
        self.output: Optional[RequestOutput] = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput) -> None:
        if self.output is None:
            self.output = output
            self.ready.set()
        else:
            self.output.add(output, aggregate=self.aggregate)

    async def get(self) -> RequestOutput:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        return output

    def get_nowait(self) -> Optional[RequestOutput]:
        output = self.output
        if output is not None:
            self.output = None
            self.ready.clear()
        return output


class AsyncLLM:
    """Fake of vLLM's ``AsyncLLM``; see the module docstring. (The real constructor takes a
    ``VllmConfig``; build both with ``from_engine_args``.)"""

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        self.engine_args = engine_args
        self.core = LLMEngine(engine_args)
        self.model_config = self.core.model_config
        self.burst = 1
        self.step_s = 0.0
        self.errored = False
        self._queues: dict[str, RequestOutputCollector] = {}  # internal id -> collector
        self._external: dict[str, list[str]] = {}
        self._to_external: dict[str, str] = {}
        self._wake: Optional[asyncio.Event] = None
        self.output_handler: Optional[asyncio.Task[None]] = None
        try:
            asyncio.get_running_loop()
            self._run_output_handler()
        except RuntimeError:
            pass

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                         usage_context: Any = None, stat_loggers: Any = None) -> AsyncLLM:
        return cls(engine_args)

    def get_tokenizer(self) -> Any:
        return self.core.get_tokenizer()

    @property
    def tokenizer(self) -> Any:
        return self.core.get_tokenizer()

    def get_num_unfinished_requests(self) -> int:
        return len(self._queues)

    def shutdown(self, timeout: Optional[float] = None) -> None:
        if self.output_handler is not None:
            self.output_handler.cancel()

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: Optional[str] = None,
        lora_request: Any = None,
        tokenization_kwargs: Optional[dict[str, Any]] = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: Optional[int] = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        queue: Optional[RequestOutputCollector] = None
        try:
            queue = self._add_request(request_id, prompt, sampling_params, lora_request)
            finished = False
            while not finished:
                out = queue.get_nowait() or await queue.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            if queue is not None:
                await self.abort(queue.request_id, internal=True)
            raise

    def _add_request(self, request_id: str, prompt: Any, params: SamplingParams,
                     lora_request: Any) -> RequestOutputCollector:
        internal = f"{request_id}-{uuid.uuid4().hex[:8]}"
        try:
            self.core.add_request(internal, prompt, params, lora_request=lora_request)
        except ValueError as exc:
            if "prompt" in str(exc):
                raise VLLMValidationError(str(exc)) from None
            raise EngineGenerateError() from exc
        except Exception as exc:
            raise EngineGenerateError() from exc
        self._run_output_handler()
        queue = RequestOutputCollector(params.output_kind, internal)
        self._queues[internal] = queue
        self._external.setdefault(request_id, []).append(internal)
        self._to_external[internal] = request_id
        assert self._wake is not None
        self._wake.set()
        return queue

    async def abort(self, request_id: Union[str, Iterable[str]], internal: bool = False) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            for internal_id in [rid] if internal else self._external.get(rid, []):
                queue = self._forget(internal_id)
                if queue is None:
                    continue
                self.core.abort_request([internal_id])
                comp = CompletionOutput(0, "", [], None, None, finish_reason="abort")
                queue.put(RequestOutput(self._to_external.get(internal_id, rid), None, None, None, [comp], True))

    def _forget(self, internal_id: str) -> Optional[RequestOutputCollector]:
        queue = self._queues.pop(internal_id, None)
        external = self._to_external.get(internal_id)
        if external is not None and internal_id in self._external.get(external, []):
            self._external[external].remove(internal_id)
            if not self._external[external]:
                del self._external[external]
        return queue

    # -- LoRA (coroutines, as in vLLM) -----------------------------------------------------------
    async def add_lora(self, lora_request: Any) -> bool:
        return self.core.add_lora(lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        return self.core.remove_lora(lora_id)

    async def pin_lora(self, lora_id: int) -> bool:
        return self.core.pin_lora(lora_id)

    async def list_loras(self) -> set[int]:
        return self.core.list_loras()

    # -- the engine task -------------------------------------------------------------------------
    def _run_output_handler(self) -> None:
        if self.output_handler is not None:
            return
        self._wake = asyncio.Event()
        self.output_handler = asyncio.get_running_loop().create_task(self._engine_loop())

    async def _engine_loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.core.has_unfinished_requests():
                self._wake.clear()
                await self._wake.wait()
                continue
            for _ in range(self.burst):
                for out in self.core.step():
                    queue = self._queues.get(out.request_id)
                    if queue is None:
                        continue
                    out.request_id = self._to_external.get(out.request_id, out.request_id)
                    queue.put(out)
                    if out.finished:
                        self._forget(queue.request_id)
            await asyncio.sleep(self.step_s)
