"""The service of the pooling kinds (embeddings, reranking) on DJL's handler contract.

``handle(inputs)`` answers every request of the call at once, whatever mode the configuration
resolved: a dynamic batch (one ``batch_NNN.`` reply per request), a rolling-batch step (each
request's one record, ``last=true``: nothing is left for a next step) or, in async mode, one request
(its one record), gathered with the requests awaited beside it (:mod:`.gather`). The texts of all
requests of a call are run together, sorted by length
(:class:`~djl_handlers.pooling.hf_engine.HfPoolingEngine`). A request that fails (bad input,
an over-long text with truncation off) gets its own 4xx naming the field; its neighbours succeed.
A lone request's status is the reply's; in a dynamic batch each request's status travels as
``batch_{i}_`` + ``extensions.STATUS_PROPERTY`` (DJL's own front end answers such a request 200 with
the error body).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from djl_handlers.config.kinds import EMBEDDING, check_kind_engine
from djl_handlers.errors import DjlHandlersError, InvalidRequest, status_of
from djl_handlers.extensions import (
    API_PROPERTY,
    CANCEL_TRACKING_PREFIX,
    STATS_RECORD_KEY,
    STATUS_PROPERTY,
    TRACKING_ID_PROPERTY,
)
from djl_handlers.io.compat import new_output
from djl_handlers.pooling.gather import Gatherer
from djl_handlers.pooling.hf_engine import Encoded, HfPoolingEngine
from djl_handlers.pooling.parse import parse_pooling
from djl_handlers.pooling.records import PoolingRequest, PoolingResult
from djl_handlers.pooling.respond import error_answer, success_answer

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig

__all__ = ["PoolingService", "build_pooling_service"]

LOG = logging.getLogger(__name__)
_FIELDS = {"lmi": "inputs", "embeddings": "input", "rerank": "documents", "score": "text_2"}


@dataclass
class _Plan:
    """One parsed request and where its encoded texts sit in the call's flat list."""

    request: PoolingRequest
    start: int
    count: int
    tokens: int


class PoolingService:
    """Embeds or scores for one model (see the module docstring); built by the entry point's service."""

    def __init__(self, config: ServingConfig, kind: str, engine: HfPoolingEngine, model_name: str) -> None:
        self.config = config
        self.kind = kind
        self.engine = engine
        self.model_name = model_name
        self._lock = threading.Lock()  # async mode runs calls in threads: one forward at a time
        self._gatherer: Optional[Gatherer] = None  # async mode: concurrent requests run together

    # -- DJL's entry ----------------------------------------------------------------------------
    def handle(self, inputs: Any) -> Any:
        """One call's answer (see the module docstring); an awaitable in async mode."""
        if self.config.async_mode:
            return self._handle_async(inputs)
        if inputs.is_empty():
            return None
        items = inputs.get_batches() if _is_batch(inputs) else [inputs]
        answers = self.answer(items)
        out = new_output(inputs)
        if self.config.is_rolling:
            for index, (status, body, stats) in enumerate(answers):
                out.add(type(out).binary_encode(_record(status, body, stats)), key="data", batch_index=index)
                out.add_property(f"batch_{index}_Content-Type", "application/json")
            return out
        for index, (status, body, stats) in enumerate(answers):
            out.add(body, key="data", batch_index=index)
            prefix = f"batch_{index}_" if len(answers) > 1 else ""
            out.add_property(f"{prefix}{STATS_RECORD_KEY}", stats)
            if prefix:
                out.add_property(f"{prefix}Content-Type", "application/json")
                out.add_property(f"{prefix}{STATUS_PROPERTY}", str(status))
        if len(answers) == 1 and answers[0][0] != 200:
            out.set_code(answers[0][0])
        out.add_property("Content-Type", "application/json")
        return out

    async def _handle_async(self, inputs: Any) -> Any:
        """Async mode: one request, its one record (``async_mode.record_output``'s shape), run together
        with the requests that arrive while a forward is in progress (:mod:`.gather`, at most
        ``option.max_rolling_batch_size``). A cancel frame is answered with None: nothing to abort."""
        tracking = str(inputs.get_property(TRACKING_ID_PROPERTY) or "")
        if inputs.is_empty() or tracking.startswith(CANCEL_TRACKING_PREFIX):
            return None
        if self._gatherer is None:
            self._gatherer = Gatherer(self.answer, self.config.max_rolling_batch_size)
        status, body, stats = await self._gatherer.submit(inputs)
        out = new_output(inputs)
        out.add_property("Content-Type", "application/json")
        out.add(type(out).binary_encode(_record(status, body, stats)))
        return out

    # -- the work -------------------------------------------------------------------------------
    def answer(self, items: list[Any]) -> list[tuple[int, str, str]]:
        """``(status, JSON body, stats)`` per item, all items' texts run together; ``stats`` is the
        compact JSON of ``extensions.STATS_RECORD_KEY`` (prompt tokens, inputs, the kind and, on the
        call's first request, the forward batches' sizes) for the local server's metrics."""
        plans: list[Union[_Plan, BaseException]] = []
        encoded: list[Encoded] = []
        for item in items:
            try:
                request = parse_pooling(item, self.kind, self.config.pooling.max_inputs)
                self._check_dimensions(request)
                chunk = self._encode(request)
            except DjlHandlersError as exc:
                if not hasattr(exc, "dialect"):
                    exc.dialect = _api_dialect(item)  # type: ignore[attr-defined]
                plans.append(exc)
                continue
            plans.append(_Plan(request, len(encoded), len(chunk), sum(len(e["input_ids"]) for e in chunk)))
            encoded.extend(chunk)
        failure: Optional[BaseException] = None
        rows: Any = None
        sizes: list[int] = []
        try:
            with self._lock:
                if encoded:
                    rows, sizes = self.engine.run(encoded)
        except Exception as exc:  # noqa: BLE001 - the whole forward failed: every request of it fails
            LOG.exception("pooling forward failed")
            failure = exc
        replies = []
        for plan in plans:
            status, body = self._reply(plan, rows, failure)
            stats: dict[str, Any] = {"kind": self.kind, "generated_tokens": 0}  # a pooled answer generates none
            if isinstance(plan, _Plan):
                stats.update(prompt_tokens=plan.tokens, inputs=plan.request.size)
            if sizes:
                stats["batches"], sizes = sizes, []
            replies.append((status, body, json.dumps(stats, separators=(",", ":"))))
        return replies

    def _reply(self, plan: Union[_Plan, BaseException], rows: Any, failure: Optional[BaseException]) -> tuple[int, str]:
        if isinstance(plan, BaseException) or failure is not None:
            exc = plan if isinstance(plan, BaseException) else failure
            assert exc is not None
            dialect = plan.request.dialect if isinstance(plan, _Plan) else getattr(plan, "dialect", "lmi")
            return status_of(exc), json.dumps(error_answer(dialect, exc))
        result = self._result(plan, rows[plan.start:plan.start + plan.count])
        return 200, json.dumps(success_answer(plan.request, result, self.model_name))

    def _result(self, plan: _Plan, rows: Any) -> PoolingResult:
        request = plan.request
        if self.kind != EMBEDDING:
            return PoolingResult(scores=rows.tolist(), prompt_tokens=plan.tokens)
        if request.pairs:  # an embedder asked for scores: cosine similarity of each pair
            unit = self.engine.normalize(rows)
            cosine = (unit[0::2] * unit[1::2]).sum(dim=1)
            return PoolingResult(scores=[[float(c)] for c in cosine], prompt_tokens=plan.tokens)
        if request.dimensions is not None:
            rows = rows[:, :request.dimensions]
        normalize = self.config.pooling.normalize if request.normalize is None else request.normalize
        if normalize:
            rows = self.engine.normalize(rows)
        return PoolingResult(vectors=rows.tolist(), prompt_tokens=plan.tokens)

    def _check_dimensions(self, request: PoolingRequest) -> None:
        wanted, size = request.dimensions, self.engine.hidden_size
        if wanted is None or wanted == size:
            return
        allowed = self.engine.matryoshka
        if not allowed:
            raise _dialect(InvalidRequest(f"dimensions={wanted}: this model's embeddings have {size} dimensions and "
                                          "it is not a Matryoshka model (no matryoshka_dimensions in its "
                                          "config.json)", field="dimensions"), request)
        if wanted > size or (isinstance(allowed, list) and wanted not in allowed):
            choices = allowed if isinstance(allowed, list) else f"1 to {size}"
            raise _dialect(InvalidRequest(f"dimensions={wanted} is not allowed; allowed: {choices}",
                                          field="dimensions"), request)

    def _encode(self, request: PoolingRequest) -> list[Encoded]:
        field = _FIELDS[request.dialect] if request.dialect != "lmi" or not request.pairs else "texts"
        out: list[Encoded] = []
        try:
            if request.pairs and self.kind != EMBEDDING:
                for index, (first, second) in enumerate(request.pairs):
                    name = f"{field}[{index}]"
                    out.append(self.engine.encode_pair(first, second, request.truncate))
            elif request.pairs:
                for index, (first, second) in enumerate(request.pairs):
                    name = f"{field}[{index}]"
                    out.append(self.engine.encode_text(first, request.truncate))
                    out.append(self.engine.encode_text(second, request.truncate))
            else:
                for index, text in enumerate(request.texts):
                    name = field if request.single else f"{field}[{index}]"
                    out.append(self.engine.encode_text(text, request.truncate))
        except ValueError as exc:
            raise _dialect(InvalidRequest(f"{name} is too long: {exc}; send truncate=true (the default) to cut it "
                                          "to the model's length", field=name), request) from None
        return out


def build_pooling_service(config: ServingConfig, kind: str, entry_point: str) -> PoolingService:
    """The service for an embedder or reranker on ``entry_point``: the transformers engine, or vLLM's
    pooling runner for an embedder on ``djl_handlers.vllm``; another engine is a ``ConfigError`` naming
    the task (``config.kinds.check_kind_engine``)."""
    from pathlib import Path

    check_kind_engine(kind, config.serving_engine, config.pooling.task)
    if config.serving_engine == "vllm":
        from djl_handlers.pooling.vllm_engine import VllmPoolingEngine

        engine: HfPoolingEngine = VllmPoolingEngine.from_config(config, kind)
    else:
        engine = HfPoolingEngine.from_config(config, kind)
    LOG.info("djl_handlers %s engine ready (%s model, %s)", entry_point, kind,
             "async mode" if config.async_mode else f"rolling_batch={config.resolved_rolling_batch()}")
    return PoolingService(config, kind, engine, Path(str(config.model_id or config.model_dir or "model")).name)


def _dialect(exc: DjlHandlersError, request: PoolingRequest) -> DjlHandlersError:
    """``exc`` tagged with the dialect whose error shape renders it."""
    exc.dialect = request.dialect  # type: ignore[attr-defined]
    return exc


def _record(status: int, body: str, stats: str) -> dict[str, Any]:
    """A request's one rolling-batch (or async-mode) record: ``last``, its stats, its error's code."""
    record: dict[str, Any] = {"data": body, "last": True, STATS_RECORD_KEY: stats}
    if status != 200:
        record.update(code=status, error=body)
    return record


def _api_dialect(item: Any) -> str:
    """The dialect whose error shape a request that could not be parsed gets (its route's)."""
    api = (item.get_property(API_PROPERTY) or "").strip().lower()
    return api if api in _FIELDS else "lmi"


def _is_batch(inputs: Any) -> bool:
    """A dynamic batch from the front end (``batch_NNN.`` keyed content) or a rolling-batch step."""
    content = inputs.get_content()
    return bool(inputs.is_batch()) and all(str(content.key_at(i)).startswith("batch_") for i in range(content.size()))
