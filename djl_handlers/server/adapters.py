"""DJL 0.34's adapter management API on the local server (``AdapterManagementRequestHandler``).

Routes, for the one model this server runs (``/adapters...`` without a model works too, as DJL
allows with a single startup model):

* ``GET  /models/{model}/adapters`` (``limit``, ``next_page_token``) → ``{"adapters": [...]}``;
* ``POST /models/{model}/adapters?name=N&src=PATH[&preload=..&pin=..]`` → ``{"status": "Adapter N registered"}``;
* ``GET  /models/{model}/adapters/{name}`` → ``{"name", "src", "preload", "pin"}``;
* ``POST /models/{model}/adapters/{name}/update?...`` → ``{"status": "Adapter N updated"}``;
* ``DELETE /models/{model}/adapters/{name}`` → ``{"status": "Adapter N unregistered"}``.

Header ``X-Amzn-SageMaker-Adapter-Alias`` sets the alias. Bodies are Gson-pretty JSON plus a newline,
as DJL writes them; errors are DJL's ``{"code", "type", "message"}`` with its statuses (400 LoRA not
enabled or a required parameter missing, 404 unknown model/adapter, 405 wrong method, 409 duplicate
name, the worker's code when the worker refuses). The worker is called as DJL's ``PyAdapter`` does:
property ``handler`` = ``register_adapter``/``update_adapter``/``unregister_adapter``, properties
``name``, ``alias``, ``src``, and every single-valued query parameter as a content entry. Adapters
found in the model directory's ``adapters/`` folder are registered at start (with
``option.enable_lora=true``, as DJL does) and re-registered on a restarted worker.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from djl_handlers.io import wire

__all__ = ["FrontAdapter", "FrontAdapters", "adapter_routes", "startup_adapters"]

_LOG = logging.getLogger("djl_handlers.server")
ALIAS_HEADER = "X-Amzn-SageMaker-Adapter-Alias"
_NOT_ALLOWED = "Requested method is not allowed, please refer to API document."


_GSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "=": "\\u003d", "'": "\\u0027"}


def _json(obj: Any, status: int = 200) -> Response:
    """DJL's ``NettyUtils.sendJsonResponse``: Gson's pretty JSON (2 spaces, HTML characters escaped as
    ``\\u0027`` etc., other characters as they are) and a newline."""
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    for char, escaped in _GSON_ESCAPES.items():
        text = text.replace(char, escaped)
    return Response(text + "\n", status_code=status, media_type="application/json")


def _error(status: int, kind: str, message: str) -> Response:
    return _json({"code": status, "type": kind, "message": message}, status)


class AdapterHttpError(Exception):
    """An answer the front end gives without the worker."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestException") -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass
class FrontAdapter:
    """The front end's record of one adapter (DJL's ``Adapter``)."""

    name: str
    src: str
    alias: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def preload(self) -> bool:
        return self.options.get("preload", "true").lower() == "true"

    @property
    def pin(self) -> bool:
        return self.options.get("pin", "false").lower() == "true"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "src": self.src, "preload": self.preload, "pin": self.pin}

    def frame(self, handler: str) -> tuple[dict[str, str], list[tuple[str | None, bytes]]]:
        """The worker call for ``handler`` (as DJL's ``PyAdapter``)."""
        properties = {"handler": handler, "name": self.name}
        if self.alias is not None:
            properties["alias"] = self.alias
        if handler == "unregister_adapter":
            return properties, []
        properties["src"] = self.src
        return properties, [(key, value.encode("utf-8")) for key, value in self.options.items()]


def startup_adapters(model_dir: str | Path) -> list[FrontAdapter]:
    """The adapters in ``model_dir/adapters/`` (one folder each; the folder name is the adapter name)."""
    folder = Path(model_dir) / "adapters"
    if not folder.is_dir():
        return []
    return [FrontAdapter(name=p.name, src=str(p.resolve())) for p in sorted(folder.iterdir()) if p.is_dir()]


class FrontAdapters:
    """The registered adapters of the model (DJL's ``ModelInfo.adapters``), in registration order."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.items: dict[str, FrontAdapter] = {}

    def require(self, name: str, alias: str | None) -> FrontAdapter:
        adapter = self.items.get(name)
        if adapter is None:
            raise AdapterHttpError(404, f"The adapter {alias or name} was not found")
        return adapter


def _worker_error(frame: wire.OutputFrame) -> AdapterHttpError | None:
    if frame.code < 300:
        return None
    return AdapterHttpError(frame.code, frame.message)


class AdapterEndpoints:
    """Route handlers; ``runtime`` is the :class:`~djl_handlers.server.runtime.ModelRuntime`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.adapters: FrontAdapters = runtime.adapters

    async def _call(self, call: tuple[dict[str, str], list[tuple[str | None, bytes]]]) -> wire.OutputFrame:
        from djl_handlers.server.worker_process import WorkerDied

        if not self.runtime.alive():
            raise AdapterHttpError(503, "the worker is not running", "ServiceUnavailableException")
        try:
            frame: wire.OutputFrame = await self.runtime.control(*call)
        except WorkerDied as exc:
            raise AdapterHttpError(503, str(exc), "WlmException") from exc
        return frame

    def _check(self, request: Request) -> None:
        model = request.path_params.get("model")
        if model is not None and model != self.runtime.settings.model_name:
            raise AdapterHttpError(404, f"The model {model} was not found")
        if not self.adapters.enabled:
            raise AdapterHttpError(400, "LoRA is not enabled.")

    async def collection(self, request: Request) -> Response:
        """``/models/{model}/adapters``: GET lists, POST registers."""
        try:
            self._check(request)
            if request.method == "GET":
                return self._list(request)
            if request.method == "POST":
                return await self._register(request)
            raise AdapterHttpError(405, _NOT_ALLOWED, "MethodNotAllowedException")
        except AdapterHttpError as exc:
            return _error(exc.status, exc.kind, exc.message)

    async def item(self, request: Request) -> Response:
        """``/models/{model}/adapters/{name}``: GET describes, DELETE unregisters."""
        alias = request.headers.get(ALIAS_HEADER)
        name = request.path_params["name"]
        try:
            self._check(request)
            if request.method == "GET":
                return _json(self.adapters.require(name, alias).describe())
            if request.method == "DELETE":
                return await self._unregister(name, alias)
            raise AdapterHttpError(405, _NOT_ALLOWED, "MethodNotAllowedException")
        except AdapterHttpError as exc:
            return _error(exc.status, exc.kind, exc.message)

    async def update(self, request: Request) -> Response:
        """``POST /models/{model}/adapters/{name}/update``."""
        alias = request.headers.get(ALIAS_HEADER)
        try:
            self._check(request)
            if request.method != "POST":
                raise AdapterHttpError(405, _NOT_ALLOWED, "MethodNotAllowedException")
            old = self.adapters.require(request.path_params["name"], alias)
            options = dict(old.options)
            options.update(_single_params(request))
            new = FrontAdapter(old.name, options.get("src", old.src), alias or old.alias, options)
            frame = await self._call(new.frame("update_adapter"))
            error = _worker_error(frame)
            if error is not None:
                raise error
            self.adapters.items[new.name] = new
            return _json({"status": frame.message}, frame.code)
        except AdapterHttpError as exc:
            return _error(exc.status, exc.kind, exc.message)

    def _list(self, request: Request) -> Response:
        keys = list(self.adapters.items)
        limit = _int_param(request, "limit", 100)
        token = max(0, _int_param(request, "next_page_token", 0))
        limit = 100 if limit > 100 or limit < 0 else limit
        last = min(token + limit, len(keys))
        body: dict[str, Any] = {}
        if last < len(keys):
            body["nextPageToken"] = str(last)
        body["adapters"] = [self.adapters.items[k].describe() for k in keys[token:last]]
        return _json(body)

    async def _register(self, request: Request) -> Response:
        options = _single_params(request)
        for key in ("name", "src"):
            if not options.get(key):
                raise AdapterHttpError(400, f"The parameter {key} is required")
        adapter = FrontAdapter(options["name"], options["src"], request.headers.get(ALIAS_HEADER), options)
        scheme, sep, _ = adapter.src.partition("://")
        if sep and scheme.lower() != "file":  # as DJL's Adapter.newInstance: only local sources
            raise AdapterHttpError(409, "URL adapters are not currently supported", "IllegalArgumentException")
        return await self.register(adapter)

    async def register(self, adapter: FrontAdapter) -> Response:
        """Register ``adapter`` with the worker, then in the front end's list."""
        if adapter.name in self.adapters.items:
            raise AdapterHttpError(
                409, f"The adapter {adapter.alias or adapter.name} already exists. If you want to replace it, "
                "please unregistering before registering a new adapter with the same name.",
                "IllegalArgumentException")
        frame = await self._call(adapter.frame("register_adapter"))
        error = _worker_error(frame)
        if error is not None:
            raise error
        self.adapters.items[adapter.name] = adapter
        return _json({"status": frame.message}, frame.code)

    async def _unregister(self, name: str, alias: str | None) -> Response:
        adapter = self.adapters.require(name, alias)
        if alias is not None:
            adapter.alias = alias
        frame = await self._call(adapter.frame("unregister_adapter"))
        error = _worker_error(frame)
        if error is not None:
            raise error
        self.adapters.items.pop(name, None)
        return _json({"status": frame.message}, frame.code)


def _single_params(request: Request) -> dict[str, str]:
    """Query parameters given exactly once (DJL keeps only those as adapter options)."""
    values: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        values.setdefault(key, []).append(value)
    return {key: found[0] for key, found in values.items() if len(found) == 1}


def _int_param(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def adapter_routes(runtime: Any) -> list[Route]:
    """The management routes (with and without the ``/models/{model}`` prefix)."""
    ep = AdapterEndpoints(runtime)
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return [
        Route("/models/{model}/adapters", ep.collection, methods=methods),
        Route("/models/{model}/adapters/{name}", ep.item, methods=methods),
        Route("/models/{model}/adapters/{name}/update", ep.update, methods=methods),
        Route("/adapters", ep.collection, methods=methods),
        Route("/adapters/{name}", ep.item, methods=methods),
        Route("/adapters/{name}/update", ep.update, methods=methods),
    ]
