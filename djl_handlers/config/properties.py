"""serving.properties + environment → the property maps DJL Serving would build.

This mirrors DJL Serving's Java side (``ModelInfo.loadServingProperties``) for the Python engine:

* ``serving.properties`` in the model directory is read with Java ``.properties`` syntax.
* ``option.*`` keys are model options; DJL strips the prefix before they reach Python.
  All other keys (``engine``, ``batch_size``, ``max_batch_delay``, ...) are server settings.
* Environment variables only fill gaps — **the file always wins** (DJL uses
  ``putIfAbsent``; empty values are skipped):

  - ``OPTION_<NAME>`` → ``option.<name lower-cased>``; ``OPTION_ENTRYPOINT`` → ``option.entryPoint``;
    ``OPTION_ENGINE`` → the server key ``engine``.
  - ``SERVING_<NAME>`` → server key ``<name lower-cased>`` for the per-model server settings
    in ``SERVING_SERVER_KEYS`` (DJL's LMI env-var guide: ``SERVING_BATCH_SIZE`` ...).
  - ``HF_MODEL_ID`` → ``option.model_id``; ``HF_TASK`` → ``option.task``;
    ``HF_TRUST_REMOTE_CODE`` → ``option.trust_remote_code``;
    ``TENSOR_PARALLEL_DEGREE`` → ``option.tensor_parallel_degree``.

No ML library is imported; nothing runs at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from djl_handlers.errors import ConfigError

PROPERTIES_FILE = "serving.properties"

# SERVING_<NAME> env vars that map to per-model server keys (other SERVING_* vars such as
# SERVING_OPTS or SERVING_FEATURES mean something else and are not copied).
SERVING_SERVER_KEYS: frozenset[str] = frozenset(
    {"batch_size", "max_batch_delay", "job_queue_size", "max_idle_time", "load_on_devices",
     "max_dynamic_batch_size", "minworkers", "maxworkers"}
)

# Plain env vars (SageMaker/LMI conventions) that default an option when it is absent.
ENV_OPTION_DEFAULTS: Mapping[str, str] = {
    "HF_MODEL_ID": "model_id",
    "HF_TASK": "task",
    "HF_TRUST_REMOTE_CODE": "trust_remote_code",
    "TENSOR_PARALLEL_DEGREE": "tensor_parallel_degree",
}

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass
class ModelProperties:
    """The two maps DJL builds for a model.

    ``server`` holds the non-option keys (``engine``, ``batch_size``, ...); ``options`` holds the
    ``option.*`` keys with the prefix stripped — exactly what DJL's init call sends to Python.
    """

    model_dir: str
    server: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)

    @property
    def engine(self) -> str | None:
        """The DJL engine name (``Python``, ``MPI``, ``DeepSpeed`` ...) when configured."""
        return self.server.get("engine")


def _logical_lines(text: str) -> list[str]:
    """Join Java continuation lines (odd number of trailing backslashes) and drop comments."""
    out: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
            pending = line
        else:
            pending += line
        trailing = len(pending) - len(pending.rstrip("\\"))
        if trailing % 2 == 1:
            pending = pending[:-1]
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _unescape(text: str) -> str:
    """Resolve Java properties escapes: ``\\t \\n \\r \\f \\uXXXX``; ``\\x`` → ``x`` otherwise."""
    result: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            result.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        digits = text[i + 2 : i + 6]
        if nxt == "u" and len(digits) == 4 and all(c in _HEX for c in digits):
            result.append(chr(int(digits, 16)))
            i += 6
            continue
        result.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(result)


def _split_key_value(line: str) -> tuple[str, str]:
    """Split at the first unescaped ``=``, ``:`` or whitespace (Java rules)."""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            break
        i += 1
    key = line[:i]
    j = i
    while j < len(line) and line[j] in " \t\f":
        j += 1
    if j < len(line) and line[j] in "=:":
        j += 1
    rest = line[j:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (later keys override earlier ones).

    Values keep inner whitespace; trailing whitespace is trimmed (DJL users routinely leave
    trailing blanks, which Java would keep, and that never means anything in an option).
    """
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split_key_value(line)
        if key:
            props[key] = value.rstrip()
    return props


def read_serving_properties(model_dir: str | Path) -> dict[str, str]:
    """Read ``<model_dir>/serving.properties``; ``{}`` when the file does not exist.

    The file is decoded as UTF-8, falling back to ISO-8859-1 (Java's ``Properties.load``
    encoding) when it is not valid UTF-8.
    """
    path = Path(model_dir) / PROPERTIES_FILE
    if not path.is_file():
        return {}
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field=PROPERTIES_FILE) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text.lstrip("\ufeff"))


def apply_env(props: dict[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Fill ``props`` (full keys, ``option.`` prefix kept) from ``env`` without overriding.

    Returns the same dict for chaining. Keys already present (from the file) always win.
    """
    for name in sorted(env):
        value = env[name]
        if not value:
            continue
        if name.startswith("OPTION_") and len(name) > 7:
            key = name[7:].lower()
            if key == "engine":
                props.setdefault("engine", value)
                continue
            if key == "entrypoint":
                key = "entryPoint"
            props.setdefault("option." + key, value)
        elif name.startswith("SERVING_") and name[8:].lower() in SERVING_SERVER_KEYS:
            props.setdefault(name[8:].lower(), value)
    for name, option in ENV_OPTION_DEFAULTS.items():
        default = env.get(name)
        if default:
            props.setdefault("option." + option, default)
    return props


def split_properties(props: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split full keys into ``(server, options)``; options lose their ``option.`` prefix."""
    server: dict[str, str] = {}
    options: dict[str, str] = {}
    for key, value in props.items():
        if key.startswith("option."):
            options[key[len("option."):]] = value
        else:
            server[key] = value
    return server, options


def load_model_properties(
    model_dir: str | Path, env: Mapping[str, str] | None = None
) -> ModelProperties:
    """serving.properties + environment → ``ModelProperties`` with DJL's precedence.

    ``env`` defaults to ``os.environ``. See the module docstring for the exact rules.
    """
    props = read_serving_properties(model_dir)
    apply_env(props, os.environ if env is None else env)
    server, options = split_properties(props)
    return ModelProperties(model_dir=str(model_dir), server=server, options=options)


# DJL's built-in handler modules → ours (a model directory written for DJL keeps working).
DJL_MODULE_ALIASES: Mapping[str, str] = {
    "djl_python.huggingface": "djl_handlers.huggingface",
    "djl_python.deepspeed": "djl_handlers.deepspeed",
    "djl_python.tensorrt_llm": "djl_handlers.tensorrt_llm",
    "djl_python.tensorrt_llm_python": "djl_handlers.tensorrt_llm",
    "djl_python.lmi_trtllm.trtllm_async_service": "djl_handlers.tensorrt_llm",
    "djl_python.lmi_vllm.vllm_async_service": "djl_handlers.vllm",
    "djl_python.vllm": "djl_handlers.vllm",
}

HANDLER_MODULES: tuple[str, ...] = (
    "djl_handlers.huggingface",
    "djl_handlers.deepspeed",
    "djl_handlers.tensorrt_llm",
    "djl_handlers.vllm",
)


def _normalize_entry_point(value: str, source: str) -> str:
    """Map DJL's module names to ours; reject other ``djl_python.*`` modules clearly."""
    value = value.strip()
    if value in DJL_MODULE_ALIASES:
        return DJL_MODULE_ALIASES[value]
    if value.startswith("djl_python.") or value == "djl_python":
        raise ConfigError(
            f"{source}={value!r} names a DJL module that djl_handlers does not provide; "
            f"use one of {list(HANDLER_MODULES)} or a model.py",
            field="entryPoint",
        )
    return value


def _model_file(model_dir: Path) -> str | None:
    """``model.py`` or ``<directory name>.py`` in the model directory (DJL's order)."""
    for name in ("model.py", f"{model_dir.name}.py"):
        if (model_dir / name).is_file():
            return name
    return None


def recommended_entry_point(
    model_dir: str | Path, props: ModelProperties, env: Mapping[str, str] | None = None
) -> str | None:
    """The handler module to use when no entry point is named and no model file decides.

    DJL 0.34's ``PyModel.load`` computes such a "recommended entry point" next to the model file
    (``djl_python.tensorrt_llm`` when ``SERVING_FEATURES`` is ``trtllm``, ``djl_python.huggingface``
    when ``option.model_id`` is set or the directory holds ``config.json``); its worker falls back
    to it when ``model.py`` has no handler function. Ours, in order: engine ``DeepSpeed`` ⇒
    ``djl_handlers.deepspeed`` → ``option.rolling_batch=trtllm`` (or ``SERVING_FEATURES``
    containing ``trtllm``) ⇒ ``djl_handlers.tensorrt_llm`` → ``option.rolling_batch`` ``vllm``/
    ``lmi-dist`` ⇒ ``djl_handlers.vllm`` → ``option.model_id`` or ``option.embedded_model`` set,
    or ``config.json`` in the directory ⇒ ``djl_handlers.huggingface`` → ``None``.
    """
    env = os.environ if env is None else env
    if (props.engine or "").lower() == "deepspeed":
        return "djl_handlers.deepspeed"
    rolling = props.options.get("rolling_batch", "").strip().lower()
    if rolling == "trtllm" or "trtllm" in env.get("SERVING_FEATURES", "").lower():
        return "djl_handlers.tensorrt_llm"
    if rolling in ("vllm", "lmi-dist"):
        return "djl_handlers.vllm"
    if (props.options.get("model_id") or props.options.get("embedded_model")
            or (Path(model_dir) / "config.json").is_file()):
        return "djl_handlers.huggingface"
    return None


def resolve_entry_point(
    model_dir: str | Path, props: ModelProperties, env: Mapping[str, str] | None = None
) -> str:
    """Pick the handler module the way DJL's ``PyModel.load`` does, adapted to us.

    Order: ``option.entryPoint`` → env ``DJL_ENTRY_POINT`` → ``model.py`` (or
    ``<dir name>.py``) in the model directory → ``recommended_entry_point`` → ``ConfigError``.
    DJL's own module names (``djl_python.huggingface`` ...) map to ours. A model file is returned
    as its file name (``model.py``), relative to the model directory; when it has no handler
    function the worker falls back to ``recommended_entry_point`` (as DJL 0.34's worker does).
    """
    env = os.environ if env is None else env
    explicit = props.options.get("entryPoint")
    if explicit:
        return _normalize_entry_point(explicit, "option.entryPoint")
    if env.get("DJL_ENTRY_POINT"):
        return _normalize_entry_point(env["DJL_ENTRY_POINT"], "DJL_ENTRY_POINT")
    found = _model_file(Path(model_dir))
    if found is not None:
        return found
    recommended = recommended_entry_point(model_dir, props, env)
    if recommended is not None:
        return recommended
    raise ConfigError(
        f"no entry point for model directory {str(model_dir)!r}: set option.entryPoint "
        f"(one of {list(HANDLER_MODULES)}), add a model.py, or set option.model_id",
        field="entryPoint",
    )


def recommended_for_model_dir(model_dir: str | Path, env: Mapping[str, str] | None = None) -> str | None:
    """``recommended_entry_point`` from the model directory's serving.properties + env."""
    return recommended_entry_point(model_dir, load_model_properties(model_dir, env), env)
