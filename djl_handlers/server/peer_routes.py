"""Routes the clients of peer servers call besides inference, on the local server.

* ``GET /v1/models`` (OpenAI, vLLM): ``{"object": "list", "data": [...]}``, the served model
  (``root``: its weights, ``max_model_len``) then each registered LoRA adapter (``parent``: the model);
* ``GET /health`` (vLLM, TGI): 200 with an empty body while the worker is up and the server takes
  requests, else 503;
* ``GET /info`` (TGI): ``model_id``, ``model_dtype``, ``model_device_type``, ``max_input_tokens``,
  ``max_total_tokens``, ``version``...;
* ``POST /tokenize`` (TGI's body ``{"inputs"}``, or vLLM's ``{"prompt"}``/``{"messages"}``) and
  ``POST /detokenize`` (vLLM): answered by the worker's tokenizer (:mod:`.worker_queries`);
* ``GET /openapi.json``: the OpenAPI 3.1 description of every route (:mod:`.openapi`), for the
  served engine's parameters.

None of these exist in DJL Serving's own front end (the Java server owns the routes there).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from djl_handlers.__about__ import __version__
from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.params.generation import MAX_SAMPLES
from djl_handlers.server.access import AccessSettings
from djl_handlers.server.openapi import openapi_document
from djl_handlers.server.runtime import ModelRuntime
from djl_handlers.server.sink import error_json
from djl_handlers.server.worker_queries import QueryUnavailable, WorkerQueries

__all__ = ["peer_routes"]

BodyReader = Callable[[Request], Awaitable[bytes]]
OWNER = "djl-handlers"


def _unavailable(exc: QueryUnavailable) -> Response:
    return Response(error_json(exc.code, exc.kind, exc.message), status_code=exc.code, media_type="application/json")


class PeerEndpoints:
    """Route handlers for one runtime; ``read_body`` applies the server's body limit."""

    def __init__(self, runtime: ModelRuntime, read_body: BodyReader, access: AccessSettings | None = None) -> None:
        self.runtime = runtime
        self.access = access
        self.queries = WorkerQueries(runtime)
        self.read_body = read_body
        self.created = int(time.time())

    def _up(self) -> bool:
        return self.runtime.alive() and self.runtime.accepting

    async def health(self, request: Request) -> Response:
        """``/health``: 200 while the worker is up and requests are taken, else 503."""
        return Response(status_code=200 if self._up() else 503)

    async def _facts(self) -> dict[str, Any]:
        """The model's facts from the worker; what the front end knows when it cannot ask."""
        try:
            return await self.queries.facts()
        except QueryUnavailable:
            known = self.queries.known_facts()
            if known is not None:
                return known
            options = self.runtime.settings.options
            return {"model_id": options.get("model_id") or self.runtime.settings.model_dir,
                    "dtype": options.get("dtype"), "device": None, "max_model_len": None}

    async def models(self, request: Request) -> Response:
        """OpenAI's model list: the served model, then its registered LoRA adapters."""
        facts = await self._facts()
        name = self.runtime.settings.model_name
        base = {"id": name, "object": "model", "created": self.created, "owned_by": OWNER,
                "root": facts.get("model_id"), "parent": None, "max_model_len": facts.get("max_model_len")}
        adapters = [{"id": a.name, "object": "model", "created": self.created, "owned_by": OWNER, "root": a.src,
                     "parent": name, "max_model_len": facts.get("max_model_len")}
                    for a in self.runtime.adapters.items.values()]
        return JSONResponse({"object": "list", "data": [base, *adapters]})

    async def info(self, request: Request) -> Response:
        """TGI's ``/info``."""
        facts = await self._facts()
        total = facts.get("max_model_len")
        dtype = DTYPE_NAMES.get(str(facts.get("dtype")), facts.get("dtype"))
        return JSONResponse({
            "model_id": facts.get("model_id"), "model_sha": None,
            "model_dtype": f"torch.{dtype}" if dtype and dtype != "auto" else dtype,
            "model_device_type": facts.get("device"), "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": self.runtime.settings.job_queue_size, "max_best_of": MAX_SAMPLES,
            "max_stop_sequences": None, "max_input_tokens": total - 1 if isinstance(total, int) else None,
            "max_total_tokens": total, "validation_workers": 1, "max_client_batch_size": 1,
            "router": OWNER, "version": __version__, "sha": None, "docker_label": None,
        })

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI description, for the engine the worker serves."""
        try:
            facts: dict[str, Any] | None = await self.queries.facts()
        except QueryUnavailable:
            facts = self.queries.known_facts()
        return JSONResponse(openapi_document(facts, self.runtime.settings.model_name, self.access))

    def relay(self, op: str) -> Callable[[Request], Awaitable[Response]]:
        """A route that hands the body to the worker's ``op`` and answers with its reply."""

        async def endpoint(request: Request) -> Response:
            try:
                body = await self.read_body(request)
                reply = await self.queries.ask(op, body or b"{}")
            except QueryUnavailable as exc:
                return _unavailable(exc)
            return Response(reply.body, status_code=reply.code, media_type="application/json")

        return endpoint


def peer_routes(runtime: ModelRuntime, read_body: BodyReader, access: AccessSettings | None = None) -> list[Route]:
    """The routes, for ``create_app``."""
    ep = PeerEndpoints(runtime, read_body, access)
    return [
        Route("/v1/models", ep.models, methods=["GET"]),
        Route("/health", ep.health, methods=["GET"]),
        Route("/info", ep.info, methods=["GET"]),
        Route("/tokenize", ep.relay("tokenize"), methods=["POST"]),
        Route("/detokenize", ep.relay("detokenize"), methods=["POST"]),
        Route("/openapi.json", ep.openapi, methods=["GET"]),
    ]
