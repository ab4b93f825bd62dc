"""The HTTP side: a Starlette app mirroring DJL Serving's inference front end for one model.

Routes: ``POST /invocations``, ``POST /predictions/{model}[/{version}]``, ``GET /ping``,
``GET /models``, ``GET /models/{model}``, ``GET /metrics``; and the opt-in OpenAI routes
``/v1/chat/completions``, ``/v1/completions`` and TGI routes ``/generate``, ``/generate_stream``,
``POST /``; for embedding and reranking models ``/v1/embeddings``, ``/v1/rerank`` (also ``/rerank``,
``/v2/rerank``) and ``/v1/score`` (also ``/score``). Request mapping as DJL's
``RequestParser``: every header becomes an ``Input`` property (names arrive lower-cased through
ASGI; ``get_property`` is case-insensitive), ``X-Amzn-SageMaker-Custom-Attributes: k=v;k2=v2`` adds
``k``/``k2``; the body becomes content ``data``; query parameters become content entries. A request
cannot choose the handler (a ``handler`` header, or a ``handler=`` custom attribute, is a 400). The
model has no version: ``/predictions/{model}/{version}`` is a 404. Bodies over 20 MiB (env
``MAX_NETTY_BUFFER_SIZE``) are a 413.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from djl_handlers.extensions import API_PROPERTY, REQUEST_ID_PROPERTY
from djl_handlers.io import wire
from djl_handlers.protocol.messages import WorkerRequest
from djl_handlers.server.access import AccessSettings, access_middleware
from djl_handlers.server.adapters import adapter_routes
from djl_handlers.server.peer_routes import peer_routes
from djl_handlers.server.request_id import RequestIdMiddleware
from djl_handlers.server.runtime import ModelRuntime, QueueFull, ShuttingDown
from djl_handlers.server.sink import BODY_SEND_KEY, SinkResponse, error_json
from djl_handlers.server.worker_queries import QueryUnavailable

__all__ = ["RequestRejected", "create_app", "to_worker_request"]

_CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


class RequestRejected(Exception):
    """A transport-level problem answered by the front end itself (400, 404, 413)."""

    def __init__(self, code: int, kind: str, message: str) -> None:
        """``kind`` is the DJL exception name in the error body's ``type``."""
        super().__init__(message)
        self.code = code
        self.kind = kind
        self.message = message


def _error(code: int, kind: str, message: str) -> Response:
    """DJL's front-end error body (``error_json``, shared with the runtime)."""
    return Response(error_json(code, kind, message), status_code=code, media_type="application/json")


def _properties(request: Request) -> dict[str, str]:
    properties: dict[str, str] = {}
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        if name.lower() == "handler":
            raise RequestRejected(400, "BadRequestException", "a request may not set the 'handler' property")
        properties[name] = value
        if name.lower() == _CUSTOM_ATTRIBUTES:
            for item in value.split(";"):
                key, sep, val = item.partition("=")
                if sep and key.strip().lower() == "handler":  # as DJL's RequestParser: refused, not dropped
                    raise RequestRejected(400, "BadRequestException", "a request may not set the 'handler' property")
                if sep and key.strip():
                    properties[key.strip()] = val.strip()
    return properties


async def _body(request: Request) -> bytes:
    limit = wire.max_frame_bytes()
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestRejected(413, "PayloadTooLargeException", f"request body exceeds {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestRejected(413, "PayloadTooLargeException", f"request body exceeds {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def to_worker_request(request: Request, api: str | None = None) -> WorkerRequest:
    """Map an HTTP request to DJL's ``Input`` shape; :class:`RequestRejected` for front-end errors.

    ``api`` (set by the OpenAI/TGI routes) travels as property ``X-Djl-Handlers-Api`` so the handler
    parses the body in that dialect and answers in its shapes."""
    properties = _properties(request)
    if api is not None:
        properties[API_PROPERTY] = api
    request_id = getattr(request.state, "request_id", None)
    if request_id:  # as DJL's InferenceRequestHandler does; a client "requestId" header cannot shadow it
        properties = {k: v for k, v in properties.items() if k.lower() != REQUEST_ID_PROPERTY.lower()}
        properties[REQUEST_ID_PROPERTY] = request_id
    body = await _body(request)
    content: list[tuple[str | None, bytes]] = [
        (key, value.encode("utf-8")) for key, value in request.query_params.multi_items()
    ]
    content.append(("data", body))  # DJL adds query parameters first, then the body
    return WorkerRequest(properties, content)


async def _query_body(request: Request) -> bytes:
    """A query route's body, within the same limit (413 as :class:`QueryUnavailable`)."""
    try:
        return await _body(request)
    except RequestRejected as exc:
        raise QueryUnavailable(exc.code, exc.kind, exc.message) from None


class _Endpoints:
    """The route handlers for one model runtime."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self.runtime = runtime
        self.name = runtime.settings.model_name

    def routed(self, api: str) -> Any:
        """A predict endpoint that parses bodies in the ``api`` dialect (chat, completion, tgi...)."""

        async def endpoint(request: Request) -> Any:
            return await self.predict(request, api)

        return endpoint

    async def predict(self, request: Request, api: str | None = None) -> Any:
        wanted = request.path_params.get("model") or request.query_params.get("model_name") \
            or request.headers.get("model_name")
        if wanted and wanted != self.name:
            return _error(404, "ModelNotFoundException", f"Model or workflow not found: {wanted}")
        if "version" in request.path_params:  # the model has no version: DJL finds none either
            return _error(404, "ModelNotFoundException", f"Model or workflow not found: {wanted}")
        try:
            item = await to_worker_request(request, api)
            sink = self.runtime.submit(item)
        except RequestRejected as exc:
            return _error(exc.code, exc.kind, exc.message)
        except QueueFull as exc:
            return _error(503, "WlmCapacityException", str(exc))
        except ShuttingDown as exc:
            return _error(503, "ServiceUnavailableException", str(exc))
        return SinkResponse(sink)

    async def ping(self, request: Request) -> Response:
        healthy = self.runtime.alive() and self.runtime.accepting
        status = "Healthy" if healthy else "Unhealthy"
        return JSONResponse({self.name: {"status": status}}, status_code=200 if healthy else 503)

    def _status(self) -> str:
        return "READY" if self.runtime.alive() else "UNAVAILABLE"

    async def models(self, request: Request) -> Response:
        url = f"file://{self.runtime.settings.model_dir}"
        return JSONResponse({"models": [{"modelName": self.name, "modelUrl": url, "status": self._status()}]})

    async def describe(self, request: Request) -> Response:
        runtime = self.runtime
        if request.path_params["model"] != self.name:
            return _error(404, "ModelNotFoundException", f"Model not found: {request.path_params['model']}")
        info = runtime.settings.describe()
        info.update({
            "status": self._status(),
            "requestInQueue": runtime.queue_depth(),
            "workers": [{"id": 1, "pid": runtime.worker.pid, "restarts": max(runtime.worker.restarts, 0),
                         "status": self._status()}],
        })
        return JSONResponse([info])

    async def metrics(self, request: Request) -> Response:
        body, content_type = self.runtime.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"content-type": content_type})


def create_app(runtime: ModelRuntime, access: AccessSettings | None = None) -> Starlette:
    """The ASGI app for one model runtime (the worker must already be started); ``access``: the
    API key and CORS rules (:mod:`.access`; none by default)."""
    ep = _Endpoints(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.attach()
        try:
            yield
        finally:
            await runtime.close()

    routes = [
        Route("/invocations", ep.predict, methods=["POST"]),
        Route("/predictions/{model}", ep.predict, methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", ep.predict, methods=["POST", "PUT"]),
        Route("/ping", ep.ping, methods=["GET", "POST"]),
        Route("/models", ep.models, methods=["GET"]),
        Route("/models/{model}", ep.describe, methods=["GET"]),
        Route("/metrics", ep.metrics, methods=["GET"]),
        # Opt-in dialects beyond LMI v0.27 (see docs/schema.md): OpenAI and TGI.
        Route("/v1/chat/completions", ep.routed("chat"), methods=["POST"]),
        Route("/v1/completions", ep.routed("completion"), methods=["POST"]),
        Route("/generate", ep.routed("tgi"), methods=["POST"]),
        Route("/generate_stream", ep.routed("tgi_stream"), methods=["POST"]),
        Route("/", ep.routed("tgi"), methods=["POST"]),
        # Embedding and reranking models (djl_handlers.pooling): OpenAI's, vLLM's and Cohere/Jina's routes.
        Route("/v1/embeddings", ep.routed("embeddings"), methods=["POST"]),
        Route("/v1/rerank", ep.routed("rerank"), methods=["POST"]),
        Route("/v2/rerank", ep.routed("rerank"), methods=["POST"]),
        Route("/rerank", ep.routed("rerank"), methods=["POST"]),
        Route("/v1/score", ep.routed("score"), methods=["POST"]),
        Route("/score", ep.routed("score"), methods=["POST"]),
        *adapter_routes(runtime),  # DJL's adapter management API (server/adapters.py)
        *peer_routes(runtime, _query_body, access),  # /v1/models, /health, /info, /tokenize, /detokenize, /openapi.json
    ]
    middleware = [Middleware(RequestIdMiddleware), *access_middleware(access)]
    return _App(routes=routes, lifespan=lifespan, middleware=middleware)


class _App(Starlette):
    """Starlette, keeping the server's own ``send`` in the scope: streamed body chunks go straight
    to it (sink.SinkResponse), past the middleware that only handles the response head (request
    id, Starlette's error and exception handlers): three wrapper calls less per chunk."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Remember ``send``, then run the app; forget it afterwards (``send`` is bound to uvicorn's
        request cycle, which holds the scope: kept, the cycle would wait for the garbage collector)."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope[BODY_SEND_KEY] = send
        try:
            await super().__call__(scope, receive, send)
        finally:
            scope.pop(BODY_SEND_KEY, None)
