"""``djl-handlers``: serve a model directory locally, check it, or run one request in process.

* ``djl-handlers serve [MODEL_DIR] [--host 127.0.0.1] [--port 8080] [--grace 30] [--log-format text|json]
  [--log-prompts] [--api-key KEY] [--protect-probes] [--allowed-origins O1,O2]``
* ``djl-handlers check MODEL_DIR`` — properties parse, entry point imports, configuration builds;
  prints the resolved configuration as JSON; exit 0 or 1.
* ``djl-handlers generate MODEL_DIR '<json>' [--stream]`` — init call + one request driven exactly
  like DJL's Java loop (rolling-batch steps until ``last``, or one dynamic-batch call), in process.

See docs/cli.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["default_model_dir", "main"]

_EXAMPLE = "hf-rolling-batch"


def default_model_dir() -> Path:
    """The embedded example model directory: the repository's copy, else the packaged one."""
    package = Path(__file__).resolve().parent
    repo_copy = package.parent / "serving.properties.examples" / _EXAMPLE
    if repo_copy.is_dir():
        return repo_copy
    return package / "examples" / _EXAMPLE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="djl-handlers", description="DJL Serving LMI handlers, locally.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model directory over HTTP like DJL Serving")
    serve.add_argument("model_dir", nargs="?", default=None, help="model directory (default: the example)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    serve.add_argument("--grace", type=float, default=30.0, help="seconds to drain on SIGTERM")
    serve.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="log lines as text or as JSON objects (one per line)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: env DJL_HANDLERS_API_KEY; none)")
    serve.add_argument("--protect-probes", action="store_true",
                       help="with an API key, require it on /health, /ping and /metrics too")
    serve.add_argument("--allowed-origins", default="",
                       help="comma-separated origins allowed by CORS ('*' for any); default: CORS off")
    serve.add_argument("--log-prompts", action="store_true",
                       help="include the prompt in the finished-request log line (off: never logged)")
    check = sub.add_parser("check", help="validate a model directory and print its configuration")
    check.add_argument("model_dir")
    check.add_argument("--verbose", action="store_true",
                       help="print failures whole (e.g. every model class the engine could load)")
    generate = sub.add_parser("generate", help="run one request in process, without a server")
    generate.add_argument("model_dir")
    generate.add_argument("payload", help='request body, e.g. \'{"inputs": "Hello", "parameters": {}}\'')
    generate.add_argument("--stream", action="store_true", help='set "stream": true and print as it comes')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``djl-handlers`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    from djl_handlers.errors import DjlHandlersError

    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "check":
            return _check(args.model_dir, args.verbose)
        return _generate(args.model_dir, args.payload, args.stream)
    except DjlHandlersError as exc:
        print(f"djl-handlers: error: {exc.message}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    import logging

    from djl_handlers.server.logs import configure_logging
    from djl_handlers.server.serve import run_server
    from djl_handlers.server.settings import load_settings
    from djl_handlers.server.worker_process import StartupError

    configure_logging(os.environ.get("DJL_HANDLERS_LOG_LEVEL", "INFO"), args.log_format)
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    settings = load_settings(model_dir)
    log = logging.getLogger("djl_handlers.serve")
    if settings.resolved is not None:
        log.info("%s: %s", settings.model_name, settings.resolved.why())
        for warning in settings.resolved.warnings:
            log.warning("%s", warning)
    # The entry point is not imported here (the worker does that); a model file gets the key checks only.
    _preflight(settings, logging.getLogger("djl_handlers.server").warning, settings.entry_point)

    def listening(host: str, port: int) -> None:
        print(f"djl-handlers: serving {settings.model_name} at http://{host}:{port}", flush=True)

    try:
        return run_server(settings, args.host, args.port, args.grace, listening, log_prompts=args.log_prompts,
                          access=_access(args))
    except StartupError as exc:
        print(f"djl-handlers: cannot start {settings.model_name}: {exc}", file=sys.stderr)
        return 1


def _access(args: argparse.Namespace) -> Any:
    """The server's access rules from the flags (the key also from env ``DJL_HANDLERS_API_KEY``)."""
    from djl_handlers.server.access import API_KEY_ENV, AccessSettings

    origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    return AccessSettings(api_key=key or None, protect_probes=args.protect_probes, allowed_origins=origins)


@contextlib.contextmanager
def _in_model_dir(model_dir: str) -> Iterator[None]:
    """cwd = model dir and the model dir on ``sys.path``, as the worker runs."""
    previous = os.getcwd()
    os.chdir(model_dir)
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    try:
        yield
    finally:
        os.chdir(previous)


def _handler_module(settings: Any) -> tuple[str, str | None]:
    """``(module the worker will run, recommended entry point or None)``, importing the entry point.

    A model file without the handler function falls back to the recommended entry point, as the
    worker does; with nothing to fall back to, the error names both fixes.
    """
    from djl_handlers.protocol.startup import recommended_for
    from djl_handlers.worker.loader import load_entry_point

    with _in_model_dir(settings.model_dir):
        module = load_entry_point(settings.entry_point, settings.model_dir)
        if callable(getattr(module, settings.handler, None)):
            return settings.entry_point, None
        recommended = recommended_for(settings.entry_point, settings.model_dir)
        if not recommended:
            raise AttributeError(
                f"entry point {settings.entry_point!r} has no function {settings.handler!r}, and nothing to "
                "fall back to: set option.entryPoint (e.g. djl_handlers.huggingface) or option.model_id")
        module = load_entry_point(recommended, settings.model_dir)
        if not callable(getattr(module, settings.handler, None)):
            raise AttributeError(f"entry point {recommended!r} has no function {settings.handler!r}")
        return recommended, recommended


def _preflight(settings: Any, warn: Callable[[str], Any], handler_module: str) -> dict[str, Any]:
    """Run the init-time checks (``config.preflight``, and that ``option.output_formatter`` names a
    registered formatter) for ``handler_module``; every unread key goes to ``warn``. Returns
    ``check``'s additions to the report."""
    from djl_handlers.config.preflight import preflight
    from djl_handlers.dialects.registry import resolve_name

    with _in_model_dir(settings.model_dir):
        result = preflight(handler_module, settings.model_dir, settings.options, settings.server)
    if result.output_formatter:
        resolve_name(result.output_formatter, stream=False, config=True)  # the service checks it at init too
    for warning in result.warnings:
        warn(warning)
    return {"warnings": result.warnings, "servingConfig": result.serving_config, "modelKind": result.model_kind}


def _adapters(settings: Any) -> list[dict[str, Any]]:
    """The LoRA adapters in the model directory's ``adapters/`` folder (registered at start)."""
    from djl_handlers.server.adapters import startup_adapters

    found = startup_adapters(settings.model_dir)
    enabled = settings.options.get("enable_lora", "").strip().lower() in ("true", "1")
    if found and not enabled:
        print(f"djl-handlers: {len(found)} adapter(s) in adapters/ are ignored: option.enable_lora is not true",
              file=sys.stderr)
    return [dict(a.describe(), loadedAtStart=enabled,
                 valid=(Path(a.src) / "adapter_config.json").is_file()) for a in found]


def _cpu(serving_config: Any) -> dict[str, Any]:
    """``check``'s ``cpu`` section for a transformers-engine model on the CPU: the CPU's features and
    the paths the engine will take on it (which ISA, how 16-bit linear layers compute, the C
    kernels' build target)."""
    if not isinstance(serving_config, dict) or serving_config.get("engine") not in ("huggingface", "deepspeed"):
        return {}
    if not str(serving_config.get("device") or "cpu").startswith("cpu"):
        return {}
    from djl_handlers.engines.hf.cpu.isa import features
    from djl_handlers.kernels.build import flag_sets

    cpu = features().describe()
    cpu["kernelFlags"] = " ".join(flag_sets()[0])
    from djl_handlers.kernels import decode_attention

    cpu["attentionKernel"] = decode_attention.path() or (
        f"unavailable ({decode_attention.unavailable_reason()}): torch's SDPA")
    hf = serving_config.get("hf")
    if isinstance(hf, dict) and hf.get("quantize") == "dynamic_int8":
        from djl_handlers.engines.hf.cpu.int8 import backend, unavailable_reason

        why = unavailable_reason()
        cpu["int8"] = ("dynamic_int8: int8 linear layers (per-channel weights, per-row dynamic activations) on "
                       f"{backend()}"
                       if why is None else f"dynamic_int8 cannot run here: {why}")
    return {"cpu": cpu}


def _multimodal(serving_config: Any) -> dict[str, Any]:
    """``check``'s ``multimodal`` section: whether the model folder is a vision-language model and,
    when it is, the image limits requests meet (config/media.py)."""
    if not isinstance(serving_config, dict) or not serving_config.get("model_id"):
        return {}
    from djl_handlers.engines.hf.loader import is_vision_model, read_config

    model_id = str(serving_config["model_id"])
    if not is_vision_model(model_id):
        return {"multimodal": {"images": False}}
    media = serving_config.get("media") or {}
    takes = serving_config.get("engine") in ("huggingface", "vllm", "lmi-dist")
    return {"multimodal": {
        "images": takes, "modelType": read_config(model_id).get("model_type"),
        "limitMmPerPrompt": {"image": media.get("limit_images")},
        "allowedMediaDomains": media.get("allowed_media_domains") or [],
        "allowedLocalMediaPath": media.get("allowed_local_media_path"),
        "mediaFetchTimeout": media.get("fetch_timeout"), "maxImageBytes": media.get("max_image_bytes"),
        "maxImagePixels": media.get("max_image_pixels"),
        **({} if takes else {"note": "this engine serves text only: image parts get a 400"}),
    }}


def _architecture(report: dict[str, Any], verbose: bool) -> None:
    """A generator served by the transformers engines must be a causal LM transformers can load:
    said here, before any weight is read (the init call would fail the same way, later)."""
    serving_config = report.get("servingConfig")
    if report.get("modelKind", "generation") != "generation" or not isinstance(serving_config, dict):
        return
    if serving_config.get("engine") not in ("huggingface", "deepspeed") or not serving_config.get("model_id"):
        return
    from djl_handlers.engines.hf.loader import unloadable_reason
    from djl_handlers.errors import ConfigError

    found = unloadable_reason(str(serving_config["model_id"]))
    if found:
        short, full = found
        raise ConfigError(f"cannot load model {serving_config['model_id']!r}: {full if verbose else short}",
                          field="option.model_id")


def _check(model_dir: str, verbose: bool = False) -> int:
    from djl_handlers.errors import message_of
    from djl_handlers.server.settings import load_settings

    settings = load_settings(model_dir)
    report: dict[str, Any] = settings.describe()
    for warning in settings.resolved.warnings if settings.resolved else ():
        print(f"djl-handlers: warning: {warning}", file=sys.stderr)
    try:
        handler_module, recommended = _handler_module(settings)
        if recommended:
            report["recommendedEntryPoint"] = recommended
        report.update(_preflight(settings, lambda text: print(f"djl-handlers: warning: {text}", file=sys.stderr),
                                 handler_module))
        report["adapters"] = _adapters(settings)
        _architecture(report, verbose)
        report.update(_cpu(report.get("servingConfig")))
        report.update(_multimodal(report.get("servingConfig")))
    except Exception as exc:
        print(f"djl-handlers: check failed for {settings.model_dir}: {message_of(exc)}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def _payload(text: str, stream: bool) -> bytes:
    try:
        body = json.loads(text)
    except ValueError:
        return text.encode("utf-8")
    if stream and isinstance(body, dict):
        body.setdefault("stream", True)
    return json.dumps(body).encode("utf-8")


def _generate(model_dir: str, payload: str, stream: bool) -> int:
    from djl_handlers.server.generate import run_one
    from djl_handlers.server.settings import load_settings
    from djl_handlers.worker.in_process import InProcessTransport

    settings = load_settings(model_dir)
    with _in_model_dir(settings.model_dir):
        transport = InProcessTransport(settings.entry_point, settings.model_dir)
        return run_one(settings, transport, _payload(payload, stream), stream, sys.stdout)
