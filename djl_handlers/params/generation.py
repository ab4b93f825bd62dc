"""``GenerationParameters``: one frozen, validated object per request.

Defaults are the LMI v0.27 schema's (the seed), including each engine's own defaults:
vLLM/lmi-dist ``top_k=-1``; TensorRT-LLM ``temperature/top_k/top_p`` = ``0.8/0/0`` when greedy
and ``1.0/5/0.85`` when ``do_sample`` is true. ``from_dict`` validates types and ranges and
applies the unknown-key rule documented in ``docs/parameters.md``. Errors are
``InvalidParameter`` with ``field`` set to the offending key.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Optional

from djl_handlers.errors import InvalidParameter
from djl_handlers.params.structured import KEYS as STRUCTURED_KEYS
from djl_handlers.params.structured import StructuredOutput, extract
from djl_handlers.params.support import known_parameters, normalize_engine, supported_parameters

logger = logging.getLogger(__name__)

# Keys the request parser normally pops; accepted and ignored here when still present.
META_KEYS: frozenset[str] = frozenset({"stream", "output_formatter"})
# Alternative spellings accepted in requests (``stop`` is TGI's/OpenAI's/TRT-LLM's name).
ALIASES: Mapping[str, str] = {"stop": "stop_sequences"}
MAX_LOGPROBS = 20
MAX_SAMPLES = 128  # n and best_of (OpenAI's own limit for n): each sample is a row of the batch
_MAX_SEED = 2**64 - 1
_DIGITS = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class GenerationParameters:
    """Decoding parameters of one request (field names as in the LMI schema).

    ``engine`` is the engine the values were validated for; ``provided`` the parameter names
    the client set; ``ignored`` the keys dropped in lenient mode. These three are bookkeeping:
    they are not generation parameters and do not take part in equality/hashing except
    ``engine``.
    """

    # common (every engine)
    do_sample: bool = False
    seed: Optional[int] = None
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 30
    details: bool = False
    return_full_text: bool = False
    stop_sequences: tuple[str, ...] = ()
    # DeepSpeed / lmi-dist
    typical_p: float = 1.0
    truncate: Optional[int] = None
    # vLLM / lmi-dist
    ignore_eos_token: bool = False
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never" (transformers' beam-search rule)
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # TensorRT-LLM
    min_length: int = 1
    bad_sequences: tuple[str, ...] = ()
    # LMI v0.29+ / TGI
    decoder_input_details: bool = False
    top_n_tokens: int = 0
    best_of: Optional[int] = None
    n: int = 1
    min_new_tokens: int = 0
    # structured output (guided_json/regex/choice/grammar/json_object, TGI grammar): see structured.py
    structured_output: Optional[StructuredOutput] = None
    # bookkeeping
    engine: str = "huggingface"
    provided: frozenset[str] = field(default=frozenset(), compare=False)
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        engine: str = "huggingface",
        *,
        max_new_tokens_limit: int = 4096,
        strict: bool = True,
    ) -> GenerationParameters:
        """Validate a request's ``parameters`` object for ``engine``.

        Raises ``InvalidParameter`` (``field`` = the key) for a wrong type or range, and — when
        ``strict`` — for a key no engine knows or one the engine does not support. With
        ``strict=False`` such keys are logged and listed in ``ignored``.
        """
        if not isinstance(data, Mapping):
            raise InvalidParameter(
                f"parameters must be a JSON object, got {type(data).__name__}", field="parameters"
            )
        name = normalize_engine(engine)
        ctx = _Context(name, max_new_tokens_limit)
        constraint, data = extract(data)
        accepted, ignored = _partition(data, ctx, strict)
        values = {key: SPECS[key](key, value, ctx) for key, value in accepted.items()}
        values = {**engine_defaults(name, bool(values.get("do_sample", False))), **values}
        values.update(_logprob_aliases(values, name))
        if "max_new_tokens" not in values:  # the default (30) never exceeds the server's cap
            values["max_new_tokens"] = min(cls.max_new_tokens, max_new_tokens_limit)
        provided = frozenset(accepted) | ({constraint.source} if constraint else frozenset())
        params = cls(**values, structured_output=constraint, engine=name, provided=provided, ignored=tuple(ignored))
        _cross_check(params)
        return params

    def to_dict(self) -> dict[str, Any]:
        """Every generation parameter (no bookkeeping), JSON-ready (tuples become lists)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self) if f.name in _FIELDS}

    def changed(self) -> dict[str, Any]:
        """Only the parameters that differ from the engine's defaults (for logs and details)."""
        base = replace(GenerationParameters(), **engine_defaults(self.engine, self.do_sample))
        return {k: v for k, v in self.to_dict().items() if v != _jsonable(getattr(base, k))}


_FIELDS: frozenset[str] = frozenset(known_parameters())


def engine_defaults(engine: str, do_sample: bool) -> dict[str, Any]:
    """The seed's per-engine defaults that differ from the common ones."""
    if engine in ("vllm", "lmi-dist"):
        return {"top_k": -1}
    if engine == "tensorrt_llm":
        if do_sample:
            return {"temperature": 1.0, "top_k": 5, "top_p": 0.85}
        return {"temperature": 0.8, "top_k": 0, "top_p": 0.0}
    return {}


@dataclass(frozen=True)
class _Context:
    engine: str
    max_new_tokens_limit: int


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _show(value: Any) -> str:
    """A short JSON-ish rendering of a client value for error messages."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return "an integer with more than 60 digits"
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = object.__repr__(value) if isinstance(value, int) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(name: str, what: str, value: Any) -> InvalidParameter:
    return InvalidParameter(f"parameters.{name} must be {what}, got {_show(value)}", field=name)


def _boolean(name: str, value: Any, ctx: _Context) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "a boolean (true or false)", value)
    return value


def _early_stopping(name: str, value: Any, ctx: _Context) -> bool | str:
    """Beam search's stopping rule: true, false or "never" (as transformers' ``generate``)."""
    if value == "never" or isinstance(value, bool):
        return value
    raise _bad(name, 'true, false or "never"', value)


def _integer(name: str, value: Any, ctx: _Context, *, low: int, high: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        what = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise _bad(name, what, value)
    return int(value)


def _number(name: str, value: Any, ctx: _Context, *, low: float | None = None,
            high: float | None = None, low_open: bool = False) -> float:
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.nan
    too_low = low is not None and (number < low or (low_open and number == low))
    if not math.isfinite(number) or too_low or (high is not None and number > high):
        raise _bad(name, _range_text(low, high, low_open), value)
    return number


def _range_text(low: float | None, high: float | None, low_open: bool) -> str:
    if low is not None and high is not None:
        return f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
    if low is not None:
        return f"a number {'>' if low_open else '>='} {low:g}"
    return "a finite number"


def _top_p(name: str, value: Any, ctx: _Context) -> float:
    # 0 is allowed only where the engine's own default is 0 (TensorRT-LLM greedy).
    return _number(name, value, ctx, low=0.0, high=1.0, low_open=ctx.engine != "tensorrt_llm")


def _max_new_tokens(name: str, value: Any, ctx: _Context) -> int:
    return _integer(name, value, ctx, low=1, high=ctx.max_new_tokens_limit)


def _seed(name: str, value: Any, ctx: _Context) -> int:
    """An integer in [0, 2**64-1]; a digit string is accepted (DJL's Java side sends one)."""
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    return _integer(name, value, ctx, low=0, high=_MAX_SEED)


def _strings(name: str, value: Any, ctx: _Context) -> tuple[str, ...]:
    """A list of non-empty strings; one string is taken as a one-element list."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise _bad(name, "a list of non-empty strings", value)
    return tuple(items)


def _token_ids(name: str, value: Any, ctx: _Context) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise _bad(name, "a list of integers >= 0", value)
    return tuple(value)


Validator = Callable[[str, Any, _Context], Any]

SPECS: dict[str, Validator] = {
    "do_sample": _boolean,
    "seed": _seed,
    "temperature": partial(_number, low=0.0),
    "repetition_penalty": partial(_number, low=0.0, low_open=True),
    "top_k": partial(_integer, low=-1),
    "top_p": _top_p,
    "max_new_tokens": _max_new_tokens,
    "details": _boolean,
    "return_full_text": _boolean,
    "stop_sequences": _strings,
    "typical_p": partial(_number, low=0.0, high=1.0, low_open=True),
    "truncate": partial(_integer, low=1),
    "ignore_eos_token": _boolean,
    "min_p": partial(_number, low=0.0, high=1.0),
    "presence_penalty": partial(_number, low=-2.0, high=2.0),
    "frequency_penalty": partial(_number, low=-2.0, high=2.0),
    "num_beams": partial(_integer, low=1),
    "length_penalty": _number,
    "early_stopping": _early_stopping,
    "stop_token_ids": _token_ids,
    "include_stop_str_in_output": _boolean,
    "logprobs": partial(_integer, low=0, high=MAX_LOGPROBS),
    "prompt_logprobs": partial(_integer, low=0, high=MAX_LOGPROBS),
    "skip_special_tokens": _boolean,
    "spaces_between_special_tokens": _boolean,
    "min_length": partial(_integer, low=0),
    "bad_sequences": _strings,
    "decoder_input_details": _boolean,
    "top_n_tokens": partial(_integer, low=0, high=MAX_LOGPROBS),
    "best_of": partial(_integer, low=1, high=MAX_SAMPLES),
    "n": partial(_integer, low=1, high=MAX_SAMPLES),
    "min_new_tokens": partial(_integer, low=0),
}


def _is_default(name: str, value: Any, ctx: _Context) -> bool:
    """True when ``value`` is valid and equals the field's default (it then asks for nothing)."""
    try:
        checked = SPECS[name](name, value, ctx)
    except InvalidParameter:
        return False
    return bool(checked == _DEFAULTS[name])


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GenerationParameters)}


def _unknown_message(key: str) -> str:
    names = sorted(known_parameters() | META_KEYS | set(ALIASES) | STRUCTURED_KEYS)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown parameter {key!r}{hint}"


def _unsupported_message(key: str, engine: str) -> str:
    served = " (served by vLLM)" if engine == "lmi-dist" else ""
    return f"parameter {key} is not supported by engine {engine}{served}"


def _classify(key: Any, value: Any, ctx: _Context) -> tuple[str | None, str | None]:
    """``(field name, None)`` to accept, ``(None, None)`` to drop silently,
    ``(None, reason)`` for a key that is unknown or unsupported."""
    if not isinstance(key, str):
        return None, f"parameter names must be strings, got {_show(key)}"
    if key in META_KEYS:
        return None, None
    if key == "stop" and isinstance(value, bool) and ctx.engine == "tensorrt_llm":
        return None, None  # the seed documents TRT-LLM's ``stop`` as a boolean; it has no effect
    name = ALIASES.get(key, key)
    if name not in known_parameters():
        return None, _unknown_message(key)
    if value is None:
        return None, None  # null means "use the default"
    if name in supported_parameters(ctx.engine):
        return name, None
    if _is_default(name, value, ctx):
        return None, None
    return None, _unsupported_message(key, ctx.engine)


def _partition(data: Mapping[Any, Any], ctx: _Context, strict: bool) -> tuple[dict[str, Any], list[str]]:
    """Split the client's keys into accepted ``{field: raw value}`` and ignored key names."""
    accepted: dict[str, Any] = {}
    origin: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in data.items():
        name, reason = _classify(key, value, ctx)
        if reason is not None:
            if strict or not isinstance(key, str):
                raise InvalidParameter(reason, field=key if isinstance(key, str) and key else "parameters")
            logger.warning("ignoring %s", reason)
            ignored.append(key)
        elif name is not None:
            if name in accepted:
                raise InvalidParameter(
                    f"parameters.{key} and parameters.{origin[name]} mean the same; give only one",
                    field=key,
                )
            accepted[name] = value
            origin[name] = key
    return accepted, ignored


# engines that report top tokens and prompt log-probs through top_n_tokens / decoder_input_details
_LOGPROB_ENGINES = frozenset({"huggingface", "deepspeed", "vllm", "lmi-dist"})


def _logprob_aliases(values: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """vLLM's ``logprobs: N`` asks for each token's N most likely tokens (``top_n_tokens``, the
    larger of the two) and ``prompt_logprobs`` for the prompt tokens' log-probs
    (``decoder_input_details``), rendered as ``details.top_tokens`` / ``details.prefill``."""
    if engine not in _LOGPROB_ENGINES:
        return {}
    out: dict[str, Any] = {}
    if values.get("logprobs"):
        out["top_n_tokens"] = max(int(values.get("top_n_tokens") or 0), int(values["logprobs"]))
    if values.get("prompt_logprobs") is not None:
        out["decoder_input_details"] = True
    return out


def _cross_check(p: GenerationParameters) -> None:
    if p.min_new_tokens > p.max_new_tokens:
        raise InvalidParameter(
            f"parameters.min_new_tokens must be <= max_new_tokens ({p.max_new_tokens}), "
            f"got {p.min_new_tokens}",
            field="min_new_tokens",
        )
    if p.structured_output is not None and p.min_new_tokens > 0:
        raise InvalidParameter(
            f"parameters.min_new_tokens cannot be combined with {p.structured_output.describe()}: "
            "the constraint decides where the output ends",
            field="min_new_tokens",
        )
    if p.best_of is not None and p.best_of < p.n:
        raise InvalidParameter(
            f"parameters.best_of must be >= n ({p.n}), got {p.best_of}", field="best_of"
        )
