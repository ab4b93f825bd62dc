"""djl_handlers.server: a local HTTP server mirroring DJL Serving's front end for the Python engine.

* :mod:`.worker_process` — the worker process over a unix socket (a ``protocol.transport.Transport``);
  DJL's Java-side loops without I/O (dynamic batch frames, the rolling-batch step state machine,
  record decoding) are :mod:`djl_handlers.protocol`, shared with the worker;
* :mod:`.runtime` — queue, batching drivers, restarts, draining;
* :mod:`.app` — the Starlette routes; :mod:`.serve` — uvicorn with graceful shutdown;
* :mod:`.generate` — one request in process (``djl-handlers generate``);
* :mod:`.telemetry`, :mod:`.metrics`, :mod:`.request_id`, :mod:`.logs`, :mod:`.tracing` — per-request
  timing, ``/metrics`` (prometheus-client), ``x-request-id``, JSON logs, optional OpenTelemetry spans
  (docs/observability.md).

See docs/server.md.
"""
