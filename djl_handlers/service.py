"""InferenceService: the one pipeline every entry point shares.

``handle(inputs)`` follows DJL's handler contract: the first call (normally the empty init call
whose properties are the model's options) builds the service; an empty Input returns None
(DJL answers 204); otherwise the batch is either one rolling-batch step or one dynamic batch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any, Optional

from djl_handlers.custom_hooks import CustomHooks, load_hooks
from djl_handlers.errors import DjlHandlersError, error_body
from djl_handlers.extensions import CANCEL_PROPERTY
from djl_handlers.io.compat import new_output
from djl_handlers.request.parser import ParserSettings, parse_request
from djl_handlers.request.records import Request
from djl_handlers.scheduling.dynamic import run_dynamic_batch, stream_dynamic_request
from djl_handlers.scheduling.rolling import RollingBatch

LOG = logging.getLogger(__name__)

EngineFactory = Callable[[Any], Any]


class InferenceService:
    """Parse → schedule → format for one engine; built lazily from the init call's properties."""

    def __init__(self, engine_name: str, engine_factory: Optional[EngineFactory] = None) -> None:
        self.engine_name = engine_name
        self._engine_factory = engine_factory
        self.initialized = False
        self.config: Any = None
        self.engine: Any = None
        self.rolling: Optional[RollingBatch] = None
        self.settings = ParserSettings(engine=engine_name)
        self.hooks = CustomHooks()
        self.streaming = False

    # -- lifecycle ---------------------------------------------------------------------------
    def initialize(self, properties: Mapping[str, str]) -> None:
        """Build config, engine and scheduler from the init call's properties."""
        from djl_handlers.config.models import ServingConfig

        # DJL's engine injects the formatter functions it found in model.py into the properties;
        # load_hooks finds the same functions, so only string options go to the config.
        props = {k: v for k, v in properties.items() if not callable(v)}
        if props.get("embedded_model") and not props.get("model_id"):
            from djl_handlers.model.embedded import embedded_model_dir

            props["model_id"] = str(embedded_model_dir())
        config = ServingConfig.from_properties(props, engine=self.engine_name)
        factory = self._engine_factory or _registry_factory(config, self.engine_name)
        if isinstance(config.output_formatter, str):
            from djl_handlers.formatting.registry import resolve_name

            resolve_name(config.output_formatter, stream=False, config=True)  # a typo fails init, not requests
        self.engine = factory(config)
        self.hooks = load_hooks(config.model_dir)
        rolling = config.is_rolling
        self.settings = ParserSettings(
            engine=config.params_engine,
            rolling_batch=rolling,
            default_output_formatter=self.hooks.output_formatter or config.output_formatter,
            tgi_compat=config.tgi_compat,
            bedrock_compat=config.bedrock_compat,
            max_new_tokens_limit=config.max_new_tokens_limit,
            strict_parameters=config.strict_parameters,
            input_formatter=self.hooks.input_formatter,
            chat_template=_chat_template(self.engine),
        )
        self.streaming = config.enable_streaming in ("true", "huggingface")
        if rolling:
            self.rolling = RollingBatch(self.engine, self._formatter_for, int(config.max_rolling_batch_size))
        self.config = config
        self.initialized = True
        LOG.info(
            "djl_handlers %s engine ready (%s, rolling_batch=%s)",
            self.engine_name,
            getattr(self.engine, "name", type(self.engine).__name__),
            config.resolved_rolling_batch(),
        )

    def handle(self, inputs: Any) -> Any:
        """DJL's handler entry: init on first call, None for an empty Input, else one batch."""
        if not self.initialized:
            self.initialize(inputs.get_properties())
        if inputs.is_empty():
            return None
        if self.rolling is not None:
            return self._rolling_step(inputs)
        return self._dynamic_batch(inputs)

    # -- rolling batch -----------------------------------------------------------------------
    def _formatter_for(self, request: Request) -> Any:
        from djl_handlers.formatting import get_formatter

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
                batch.add_error(exc)
        out = new_output(inputs)
        for index, (record, content_type) in enumerate(batch.step()):
            out.add(type(out).binary_encode(record), key="data", batch_index=index)
            out.add_property(f"batch_{index}_Content-Type", content_type)
        return out

    def _parse(self, item: Any) -> Request:
        request = parse_request(item, self.settings)
        if request.params.do_sample and request.params.seed is None:
            request = _with_seed(request, random.randrange(1 << 31))
        return request

    # -- dynamic batch -----------------------------------------------------------------------
    def _dynamic_batch(self, inputs: Any) -> Any:
        items = inputs.get_batches()
        parsed: list[Any] = []
        for item in items:
            try:
                parsed.append(self._parse(item))
            except DjlHandlersError as exc:
                parsed.append(exc)
        out = new_output(inputs)
        if self.streaming and len(items) == 1 and isinstance(parsed[0], Request):
            out.add_property("Content-Type", "application/jsonlines")
            out.add_stream_content(stream_dynamic_request(self.engine, parsed[0]))
            return out
        results = run_dynamic_batch(self.engine, [p for p in parsed if isinstance(p, Request)])
        texts = iter(results)
        for index, item in enumerate(parsed):
            if isinstance(item, Request):
                body: Any = next(texts)
            else:
                body = error_body(item)
            out.add_as_json(body, key="data", batch_index=index)
        out.add_property("Content-Type", "application/json")
        return out


def _chat_template(engine: Any) -> Optional[Callable[..., str]]:
    """The tokenizer's chat template as a function ``(messages, tools=None)``, or None when the
    model has none. ``reads_tools`` on it: the template renders ``tools`` (it mentions them)."""
    tokenizer = getattr(engine, "tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    if tokenizer is None or not template:
        return None

    def render(messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None) -> str:
        extra = {"tools": tools} if tools else {}
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra))

    texts = template.values() if isinstance(template, dict) else [template]
    render.reads_tools = any("tools" in str(t) for t in texts)  # type: ignore[attr-defined]
    return render


def _with_seed(request: Request, seed: int) -> Request:
    from dataclasses import replace

    return replace(request, params=replace(request.params, seed=seed), seed=seed)


def _registry_factory(config: Any, engine_name: str) -> EngineFactory:
    from djl_handlers.engines.registry import load_engine_class

    return load_engine_class(config.serving_engine).from_config  # type: ignore[no-any-return]


class LazyService:
    """The one lazily built service a handler module holds (no import-time work)."""

    def __init__(self, engine_name: str) -> None:
        self.engine_name = engine_name
        self._service: Optional[InferenceService] = None

    def handle(self, inputs: Any) -> Any:
        if self._service is None:
            self._service = InferenceService(self.engine_name)
        return self._service.handle(inputs)
