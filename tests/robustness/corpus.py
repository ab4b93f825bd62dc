"""The bad-input corpus: generated and hand-written request bodies, each with its expected outcome.

Every :class:`Case` is one client request (body bytes, Content-Type, extra headers, the API the
server's route would set) and the outcome the rule in ``docs/robustness.md`` asks for:

* ``status`` 400/413/415: the request gets its own error with that code and a message that contains
  every string in ``mentions`` (case-insensitive) — the field or the problem;
* ``status`` 200: the request succeeds (whitespace prompts, ``null`` parameters, harmless headers);
  ``expect_text`` is then the exact generated text on the fake engine.

``known_bug`` marks a case whose current behaviour is wrong (the tests turn it into a strict xfail
and the benchmark counts it as failed). ``build_corpus()`` returns the whole list; names are unique.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Optional

from djl_handlers.engines.fake import REPLY
from djl_handlers.params.generation import SPECS, GenerationParameters
from djl_handlers.params.translate import supported_parameters

JSON = "application/json"
ROLLING = "rolling"
DYNAMIC = "dynamic"
BOTH = (ROLLING, DYNAMIC)
# structured_output is built from guided_* keys: tests/unit/test_structured_params.py covers it
BOOKKEEPING = frozenset({"engine", "provided", "ignored", "structured_output"})
# Engines tried in this order for a field, so the field is validated rather than "not supported".
ENGINE_ORDER = ("huggingface", "vllm", "tensorrt_llm")
N = 4  # max_new_tokens of every body that should succeed


@dataclass(frozen=True)
class Case:
    """One request of the corpus and the outcome it must get."""

    name: str
    body: bytes
    status: int = 400
    mentions: tuple[str, ...] = ()
    content_type: Optional[str] = JSON
    headers: tuple[tuple[str, str], ...] = ()
    api: Optional[str] = None
    engine: str = "huggingface"
    modes: tuple[str, ...] = BOTH
    expect_text: Optional[str] = None
    http_status: Optional[int] = None
    http: bool = True
    known_bug: Optional[str] = None
    bug_modes: tuple[str, ...] = BOTH
    origin: str = "hand"

    @property
    def ok(self) -> bool:
        """True when the request must succeed."""
        return self.status < 300

    def bug_in(self, mode: str) -> Optional[str]:
        """The known bug that makes this case fail in ``mode`` (``rolling``/``dynamic``/``http``)."""
        modes = (*self.bug_modes, "http") if ROLLING in self.bug_modes else self.bug_modes
        return self.known_bug if self.known_bug and mode in modes else None

    @property
    def expected_http_status(self) -> int:
        """The status the local server must answer with (defaults to ``status``)."""
        return self.status if self.http_status is None else self.http_status

    def properties(self) -> dict[str, str]:
        """The Input properties of this request (headers + Content-Type + the route's API)."""
        props = dict(self.headers)
        if self.content_type is not None:
            props["Content-Type"] = self.content_type
        if self.api is not None:
            props["X-Djl-Handlers-Api"] = self.api
        return props


def dumps(value: Any) -> bytes:
    """JSON bytes the way a client would send them (NaN/Infinity allowed, as Python writes them)."""
    return json.dumps(value, allow_nan=True).encode("utf-8")


def body_with(raw_params: str, inputs: str = '"hello"', extra: str = "") -> bytes:
    """``{"inputs": ..., "parameters": {<raw_params>}<extra>}`` from raw JSON text."""
    return f'{{"inputs": {inputs}, "parameters": {{{raw_params}}}{extra}}}'.encode()


# ------------------------------------------------------------------------------------------------
# generated: every GenerationParameters field with wrong types and out-of-range values


def generation_fields() -> list[str]:
    """The parameter names, taken from ``GenerationParameters`` itself."""
    return [f.name for f in fields(GenerationParameters) if f.name not in BOOKKEEPING]


def _bounds(name: str) -> tuple[str, Optional[float], Optional[float]]:
    """(kind, low, high) of a field from its validator in ``SPECS``."""
    spec = SPECS[name]
    func = spec.func if isinstance(spec, partial) else spec
    kw = spec.keywords if isinstance(spec, partial) else {}
    kind = func.__name__.lstrip("_")
    table: dict[str, tuple[str, Optional[float], Optional[float]]] = {
        "top_p": ("number", 0.0, 1.0),
        "max_new_tokens": ("integer", 1, 4096),
        "seed": ("integer", 0, 2**64 - 1),
    }
    if kind in table:
        return table[kind]
    return kind, kw.get("low"), kw.get("high")


def _wrong_values(name: str) -> list[tuple[str, str]]:
    """(label, raw JSON) values that ``name`` must reject."""
    kind, low, high = _bounds(name)
    common = [("object", "{}"), ("list", "[]")]
    if kind == "early_stopping":  # true, false or "never"
        return common + [("int1", "1"), ("string", '"always"'), ("float", "1.0")]
    if kind == "boolean":
        return common + [("int1", "1"), ("int0", "0"), ("string", '"true"'), ("float", "1.0")]
    if kind == "strings":
        return common[:1] + [("int", "5"), ("int_list", "[1]"), ("empty_string", '[""]'), ("bool", "true"),
                             ("nested", '[["a"]]')]
    if kind == "token_ids":
        return common[:1] + [("string", '"1"'), ("negative", "[-1]"), ("float", "[1.5]"), ("bool", "[true]"),
                             ("int", "5")]
    string = '"-1"' if name == "seed" else '"1"'  # a digit string is a valid seed (DJL sends one)
    values = common + [("string", string), ("bool", "true"), ("nan", "NaN"), ("inf", "Infinity"),
                       ("neg_inf", "-Infinity"), ("overflow", "1e309")]
    if kind == "integer":
        values.append(("float", "1.5"))
    if low is not None:
        below = low - 1 if kind == "integer" else low - 0.5
        values.append(("below_min", json.dumps(below)))
    if high is not None:
        above = (high + 1 if kind == "integer" else high + 0.5) if high < 10**6 else 10**30
        values.append(("above_max", json.dumps(above)))
    return values


def _engine_for(name: str) -> str:
    for engine in ENGINE_ORDER:
        if name in supported_parameters(engine):
            return engine
    return "huggingface"


def _modes(engine: str) -> tuple[str, ...]:
    return BOTH if engine == "huggingface" else (ROLLING,)


def generated_parameter_cases() -> Iterator[Case]:
    """Wrong types/ranges for every field (400 naming it) and ``null`` for every field (success)."""
    for name in generation_fields():
        engine = _engine_for(name)
        supported = name in supported_parameters(engine)
        problem = "must be" if supported else "not supported"
        n_tokens = "" if name == "max_new_tokens" else f', "max_new_tokens": {N}'
        for label, raw in _wrong_values(name):
            yield Case(f"param-{name}-{label}", body_with(f'"{name}": {raw}{n_tokens}'),
                       mentions=(name, problem), engine=engine, modes=_modes(engine), origin="generated")
        text = REPLY[:30] if name == "max_new_tokens" else REPLY[:N]
        yield Case(f"param-{name}-null", body_with(f'"{name}": null{n_tokens}'), status=200,
                   expect_text=text, engine=engine, modes=_modes(engine), origin="generated")


# ------------------------------------------------------------------------------------------------
# generated: truncated and byte-corrupted JSON

BASE = dumps({"inputs": "Deep learning is", "parameters": {"max_new_tokens": N, "details": False}})


def truncation_cases() -> Iterator[Case]:
    """Every proper prefix of a good body: no prefix of a JSON object is valid JSON."""
    yield Case("truncated-0", b"", mentions=("empty",), origin="generated")
    for cut in range(1, len(BASE)):
        yield Case(f"truncated-{cut}", BASE[:cut], mentions=("JSON",), origin="generated")


INVALID_UTF8 = {
    "ff": b"\xff",
    "fe-ff": b"\xfe\xff",
    "lone-continuation": b"\x80",
    "overlong-slash": b"\xc0\xaf",
    "overlong-nul": b"\xc0\x80",
    "truncated-3byte": b"\xe6\x97",
    "truncated-4byte": b"\xf0\x9f\x98",
    "encoded-surrogate": b"\xed\xa0\x80",
    "above-u10ffff": b"\xf4\x90\x80\x80",
    "latin1-e-acute": b"caf\xe9",
}


def utf8_cases() -> Iterator[Case]:
    """Invalid UTF-8 inside the prompt string, as the whole body, and in a text/plain body."""
    for label, bad in INVALID_UTF8.items():
        yield Case(f"utf8-in-inputs-{label}", b'{"inputs": "x' + bad + b'"}', mentions=("UTF-8",),
                   origin="generated")
        yield Case(f"utf8-whole-body-{label}", bad, mentions=("UTF-8",), origin="generated")
        yield Case(f"utf8-text-plain-{label}", b"prompt " + bad, content_type="text/plain",
                   mentions=("UTF-8",), origin="generated")


# ------------------------------------------------------------------------------------------------
# hand-written


def malformed_json_cases() -> Iterator[Case]:
    """Syntax errors a JSON parser must refuse, and valid JSON of the wrong shape."""
    bad = {
        "single-quotes": b"{'inputs': 'x'}",
        "trailing-comma": b'{"inputs": "x",}',
        "comment": b'{"inputs": "x" /* hi */}',
        "unquoted-key": b'{inputs: "x"}',
        "trailing-garbage": b'{"inputs": "x"} trailing',
        "two-objects": b'{"inputs": "x"}\n{"inputs": "y"}',
        "nul-byte": b'{"inputs": "x"}\x00',
        "raw-newline-in-string": b'{"inputs": "a\nb"}',
        "raw-tab-in-string": b'{"inputs": "a\tb"}',
        "bad-escape": b'{"inputs": "\\q"}',
        "short-unicode-escape": b'{"inputs": "\\u12"}',
        "bom": b'\xef\xbb\xbf{"inputs": "x"}',
        "whitespace-only": b"   \n\t ",
        "nan-bare": b"NaN",
        "python-true": b'{"inputs": "x", "stream": True}',
        "hex-number": b'{"inputs": "x", "parameters": {"max_new_tokens": 0x10}}',
        "leading-zero": b'{"inputs": "x", "parameters": {"max_new_tokens": 010}}',
        "plus-sign": b'{"inputs": "x", "parameters": {"max_new_tokens": +5}}',
        "missing-colon": b'{"inputs" "x"}',
        "unclosed-string": b'{"inputs": "x}',
    }
    for label, body in bad.items():
        yield Case(f"json-{label}", body, mentions=("JSON",))
    shapes = {"array": b'["x"]', "string": b'"x"', "number": b"42", "null": b"null", "true": b"true",
              "empty-object": b"{}"}
    for label, body in shapes.items():
        mention = "inputs" if label == "empty-object" else "JSON object"
        yield Case(f"shape-{label}", body, mentions=(mention,))


def nesting_cases() -> Iterator[Case]:
    """Deeply nested JSON: 100k levels is refused as such; 500 levels parses and is a type error."""
    deep = 100_000
    yield Case("nested-100k-arrays", b"[" * deep + b"]" * deep, mentions=("nested",))
    yield Case("nested-100k-objects", b'{"a":' * deep + b"1" + b"}" * deep, mentions=("nested",))
    yield Case("nested-100k-unclosed", b"[" * deep, mentions=("nested",))
    yield Case("nested-100k-in-parameters", body_with('"stop_sequences": ' + "[" * deep + "]" * deep),
               mentions=("nested",))
    yield Case("nested-100k-in-inputs", b'{"inputs": ' + b"[" * deep + b"]" * deep + b"}", mentions=("nested",))
    mid = 500
    yield Case("nested-500-stop-sequences", body_with('"stop_sequences": ' + "[" * mid + "]" * mid),
               mentions=("stop_sequences",))
    yield Case("nested-500-unknown-field", b'{"inputs": "x", "deep": ' + b"[" * mid + b"]" * mid + b"}",
               mentions=("deep",))
    yield Case("nested-500-inputs", b'{"inputs": ' + b"[" * mid + b"]" * mid + b"}", mentions=("inputs",))


def top_level_cases() -> Iterator[Case]:
    """Wrong types for ``inputs``, ``parameters`` and ``stream``; unknown top-level fields."""
    for label, raw in {"int": "5", "float": "1.5", "bool": "true", "object": '{"text": "x"}', "null": "null",
                       "list-in-rolling": '["a", "b"]'}.items():
        modes = (ROLLING,) if label == "list-in-rolling" else BOTH
        yield Case(f"inputs-{label}", f'{{"inputs": {raw}}}'.encode(), mentions=("inputs",), modes=modes)
    yield Case("inputs-missing", b'{"parameters": {"max_new_tokens": 4}}', mentions=("inputs",))
    yield Case("inputs-empty-string", b'{"inputs": ""}', mentions=("inputs", "empty"))
    # DJL's own integration client sends {"inputs": [prompt]} to rolling-batch models
    yield Case("inputs-one-element-list-in-rolling", dumps({"inputs": ["a"], "parameters": {"max_new_tokens": N}}),
               status=200, modes=(ROLLING,))
    yield Case("inputs-list-with-int", b'{"inputs": ["a", 1]}', mentions=("inputs[1]",), modes=(DYNAMIC,))
    yield Case("inputs-empty-list", b'{"inputs": []}', mentions=("inputs",), modes=(DYNAMIC,))
    yield Case("inputs-list-of-lists", b'{"inputs": [["a"]]}', mentions=("inputs[0]",), modes=(DYNAMIC,))
    yield Case("inputs-list-ok-in-dynamic", dumps({"inputs": ["a", "b"], "parameters": {"max_new_tokens": N}}),
               status=200, expect_text=REPLY[:N], modes=(DYNAMIC,))
    for label, raw in {"string": '"hot"', "int": "5", "bool": "true", "list": '[{"max_new_tokens": 4}]'}.items():
        yield Case(f"parameters-{label}", f'{{"inputs": "x", "parameters": {raw}}}'.encode(),
                   mentions=("parameters",))
    for label, raw in {"string": '"yes"', "int": "1", "zero": "0", "null": "null", "list": "[]",
                       "object": "{}"}.items():
        yield Case(f"stream-{label}", f'{{"inputs": "x", "stream": {raw}}}'.encode(), mentions=("stream",))
        yield Case(f"stream-in-parameters-{label}",
                   f'{{"inputs": "x", "parameters": {{"stream": {raw}}}}}'.encode(), mentions=("stream",))
    yield Case("adapters-int", b'{"inputs": "x", "adapters": 5}', mentions=("adapters",))
    yield Case("adapters-unknown", b'{"inputs": "x", "adapters": "nope"}', status=404, mentions=("nope",))
    yield Case("adapters-header-unknown", b'{"inputs": "x"}', status=404, mentions=("nope",),
               headers=(("X-Amzn-SageMaker-Adapter-Identifier", "nope"),))
    for key in ("input", "Inputs", "params", "prompt_text", "model", "handler", "__proto__", ""):
        body = dumps({"inputs": "x", key: 1})
        yield Case(f"unknown-top-level-{key or 'empty'}", body, mentions=("unknown request field",
                                                                          key or "''"))


def number_cases() -> Iterator[Case]:
    """JSON NaN/Infinity/1e309, huge and negative values in the common parameters."""
    raw = {
        "temperature-nan": ('"temperature": NaN', "temperature"),
        "temperature-inf": ('"temperature": Infinity', "temperature"),
        "temperature-1e309": ('"temperature": 1e309', "temperature"),
        "temperature-neg": ('"temperature": -0.5', "temperature"),
        "top-p-nan": ('"top_p": NaN', "top_p"),
        "top-p-zero": ('"top_p": 0', "top_p"),
        "top-p-1e-400": ('"top_p": 1e-400', "top_p"),
        "top-k-neg-inf": ('"top_k": -Infinity', "top_k"),
        "top-k-float-exp": ('"top_k": 1e2', "top_k"),
        "repetition-penalty-zero": ('"repetition_penalty": 0', "repetition_penalty"),
        "max-new-tokens-zero": ('"max_new_tokens": 0', "max_new_tokens"),
        "max-new-tokens-negative": ('"max_new_tokens": -1', "max_new_tokens"),
        "max-new-tokens-huge": ('"max_new_tokens": 1000000000', "max_new_tokens"),
        "max-new-tokens-2pow63": (f'"max_new_tokens": {2**63}', "max_new_tokens"),
        "max-new-tokens-30-digits": (f'"max_new_tokens": {10**30}', "max_new_tokens"),
        "max-new-tokens-1e309": ('"max_new_tokens": 1e309', "max_new_tokens"),
        "max-new-tokens-float": ('"max_new_tokens": 10.0', "max_new_tokens"),
        "max-new-tokens-string": ('"max_new_tokens": "10"', "max_new_tokens"),
        "max-new-tokens-above-limit": ('"max_new_tokens": 4097', "max_new_tokens"),
        "seed-negative": ('"seed": -1', "seed"),
        "seed-2pow64": (f'"seed": {2**64}', "seed"),
        "seed-digit-string-too-big": ('"seed": "99999999999999999999"', "seed"),
        "seed-non-digit-string": ('"seed": "abc"', "seed"),
        "seed-float": ('"seed": 1.5', "seed"),
        "min-gt-max-new-tokens": ('"min_new_tokens": 9, "max_new_tokens": 4', "min_new_tokens"),
        "truncate-zero": ('"truncate": 0', "truncate"),
    }
    for label, (params, field) in raw.items():
        yield Case(f"number-{label}", body_with(params), mentions=(field,))
    digits = "9" * 5000
    yield Case("number-5000-digit-int", body_with(f'"max_new_tokens": {digits}'), mentions=("body",))
    yield Case("number-5000-digit-int-in-unknown-field",
               f'{{"inputs": "x", "junk": {digits}}}'.encode(), mentions=("body",))
    yield Case("number-seed-digit-string-ok", body_with(f'"seed": "123", "max_new_tokens": {N}'), status=200,
               expect_text=REPLY[:N])
    yield Case("number-max-new-tokens-limit-ok", body_with('"max_new_tokens": 4096'), status=200,
               expect_text=(REPLY * 100)[:2048 - len("hello")], modes=(ROLLING,))




def unknown_parameter_cases() -> Iterator[Case]:
    """Typos, unknown keys, aliases given twice, engine-unsupported keys."""
    yield Case("unknown-param-typo", body_with('"temprature": 0.5'), mentions=("temprature", "did you mean"))
    yield Case("unknown-param-case", body_with('"Temperature": 0.5'), mentions=("Temperature",))
    yield Case("unknown-param-foo", body_with('"foo": 1'), mentions=("unknown parameter", "foo"))
    yield Case("unknown-param-empty-key", body_with('"": 1'), mentions=("unknown parameter",))
    yield Case("unknown-param-dunder", body_with('"__class__": 1'), mentions=("__class__",))
    yield Case("unknown-param-escaped-surrogate-key", body_with('"\\ud800": 1'), mentions=("unknown parameter",))
    yield Case("unknown-top-level-escaped-surrogate-key", b'{"inputs": "x", "\\udfff": 1}',
               mentions=("unknown request field",))
    yield Case("unknown-openai-escaped-surrogate-key", b'{"prompt": "x", "\\udbff": 1}',
               mentions=("unsupported field",))
    yield Case("unknown-param-null-value", body_with('"foo": null'), mentions=("foo",))
    yield Case("alias-stop-twice", body_with('"stop": ["a"], "stop_sequences": ["b"]'),
               mentions=("mean the same",))
    yield Case("unsupported-typical-p-vllm", body_with('"typical_p": 0.5'), engine="vllm",
               modes=(ROLLING,), mentions=("typical_p", "not supported", "vllm"))
    yield Case("unsupported-default-value-ok", body_with(f'"num_beams": 1, "max_new_tokens": {N}'), status=200,
               expect_text=REPLY[:N])
    # Dynamic batching uses no formatter, so a formatter name is only checked in rolling mode.
    yield Case("output-formatter-unknown", body_with('"output_formatter": "xml"'), mentions=("output_formatter",),
               modes=(ROLLING,))
    yield Case("output-formatter-int", body_with('"output_formatter": 5'), mentions=("output_formatter",))
    yield Case("output-formatter-module-path", body_with('"output_formatter": "os:system"'),
               mentions=("output_formatter", "os:system"), modes=(ROLLING,))
    yield Case("output-formatter-dunder", body_with('"output_formatter": "__import__"'),
               mentions=("output_formatter",), modes=(ROLLING,))
    yield Case("prompt-too-long", dumps({"inputs": "x" * 5000}), mentions=("inputs", "max_model_len"))


def whitespace_cases() -> Iterator[Case]:
    """Prompts that are blank but not empty succeed: whitespace is text a model can continue."""
    params = {"max_new_tokens": N}
    for label, text in {"spaces": "   ", "newline": "\n", "tabs": "\t\t", "nbsp": "\u00a0", "crlf": "\r\n",
                        "zero-width": "\u200b", "nul-escaped": "\u0000"}.items():
        yield Case(f"whitespace-inputs-{label}", dumps({"inputs": text, "parameters": params}), status=200,
                   expect_text=REPLY[:N])
    yield Case("whitespace-text-plain", b"   ", content_type="text/plain", status=200, expect_text=REPLY[:30])
    yield Case("whitespace-text-plain-empty", b"", content_type="text/plain", mentions=("empty",))
    yield Case("whitespace-json-padding", b'  \n {"inputs": "x", "parameters": {"max_new_tokens": 4}}  \n',
               status=200, expect_text=REPLY[:N])
    yield Case("whitespace-parameters-null", b'{"inputs": "x", "parameters": null}', status=200,
               expect_text=REPLY[:30])
    yield Case("whitespace-parameters-empty", b'{"inputs": "x", "parameters": {}}', status=200,
               expect_text=REPLY[:30])
    yield Case("surrogate-escape-in-inputs", b'{"inputs": "\\ud800"}', mentions=("inputs",))
    yield Case("surrogate-escape-in-stop-ok", body_with(f'"stop_sequences": ["\\udc00"], "max_new_tokens": {N}'),
               status=200, expect_text=REPLY[:N])


def content_type_cases() -> Iterator[Case]:
    """Content types the parser cannot read (415) and the ones it can (success)."""
    good = dumps({"inputs": "x", "parameters": {"max_new_tokens": N}})
    for ctype in ("application/octet-stream", "application/xml", "image/png", "multipart/form-data; boundary=x",
                  "application/x-www-form-urlencoded", "audio/wav", "tensor/ndlist", "tensor/npz", "garbage"):
        yield Case(f"ctype-{ctype.split(';')[0].replace('/', '-')}", good, status=415, content_type=ctype,
                   mentions=("Content-Type",))
    ok = {"json-charset": "application/json; charset=utf-8", "json-upper": "APPLICATION/JSON",
          "vendor-json": "application/vnd.api+json", "jsonlines": "application/jsonlines", "none": None,
          "empty": ""}
    for label, ctype in ok.items():
        yield Case(f"ctype-ok-{label}", good, status=200, content_type=ctype, expect_text=REPLY[:N])
    yield Case("ctype-text-plain-prompt", b"Deep learning is", status=200, content_type="text/plain",
               expect_text=REPLY[:30])
    yield Case("ctype-text-plain-json-is-prompt", good, status=200, content_type="text/plain",
               expect_text=REPLY[:30])
    yield Case("ctype-utf16-body", '{"inputs": "x"}'.encode("utf-16"), mentions=("UTF-8",))


def header_cases() -> Iterator[Case]:
    """Headers a client may send. ``handler`` is refused by the server; in-process it is inert."""
    good = dumps({"inputs": "x", "parameters": {"max_new_tokens": N}})
    for label, headers in {
        "handler": (("handler", "evil_function"),),
        "handler-upper": (("Handler", "__init__"),),
        "custom-attributes-handler": (("X-Amzn-SageMaker-Custom-Attributes", "handler=evil"),),
        "batch-size": (("batch_size", "1000"),),
        "reset": (("reset_rollingbatch", "true"),),
        "cancel-property": (("djl_handlers_cancel", "true"),),
    }.items():
        http_status = 400 if label in ("handler", "handler-upper", "custom-attributes-handler") else None
        yield Case(f"header-{label}", good, status=200, headers=headers, expect_text=REPLY[:N],
                   http_status=http_status)
    yield Case("header-api-chat-with-inputs", good, api="chat", mentions=("inputs",))
    yield Case("header-api-completion-with-inputs", good, api="completion", mentions=("inputs",))


CHAT_OK = [{"role": "user", "content": "hi"}]


def openai_cases() -> Iterator[Case]:
    """OpenAI chat/completions bodies with bad fields."""
    chat: dict[str, tuple[dict[str, Any], str]] = {
        "messages-string": ({"messages": "hi"}, "messages"),
        "messages-empty": ({"messages": []}, "messages"),
        "messages-no-role": ({"messages": [{"content": "hi"}]}, "messages"),
        "messages-role-int": ({"messages": [{"role": 1, "content": "hi"}]}, "messages"),
        "messages-content-null": ({"messages": [{"role": "user", "content": None}]}, "content"),
        "messages-not-objects": ({"messages": ["hi"]}, "messages"),
        # images on a text model, and parts this server does not take (docs/vision.md)
        "image-on-text-model": ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": "hi"}]}]}, "messages[0].content[0].image_url"),
        "image-url-empty": ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": ""}}]}]}, "messages[0].content[0].image_url"),
        "audio-part": ({"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "messages[0].content[0]"),
        "tools": ({"messages": CHAT_OK, "tools": []}, "tools"),
        # the corpus's fake engine has no grammar engine: a constraint is refused, never ignored
        "response-format": ({"messages": CHAT_OK, "response_format": {"type": "json_object"}}, "structured output"),
        "functions": ({"messages": CHAT_OK, "functions": []}, "functions"),
        "n-2-greedy": ({"messages": CHAT_OK, "n": 2, "temperature": 0}, "n must be 1"),
        "temperature-3": ({"messages": CHAT_OK, "temperature": 3}, "temperature"),
        "temperature-string": ({"messages": CHAT_OK, "temperature": "hot"}, "temperature"),
        "temperature-nan": ({"messages": CHAT_OK, "temperature": math.nan}, "temperature"),
        "temperature-bool": ({"messages": CHAT_OK, "temperature": True}, "temperature"),
        "top-logprobs-50": ({"messages": CHAT_OK, "top_logprobs": 50}, "top_logprobs"),
        "logprobs-int": ({"messages": CHAT_OK, "logprobs": 1}, "logprobs"),
        "stream-string": ({"messages": CHAT_OK, "stream": "yes"}, "stream"),
        "stream-options-list": ({"messages": CHAT_OK, "stream_options": []}, "stream_options"),
        "top-p-2": ({"messages": CHAT_OK, "top_p": 2}, "top_p"),
        "seed-negative": ({"messages": CHAT_OK, "seed": -1}, "seed"),
        "stop-empty": ({"messages": CHAT_OK, "stop": [""]}, "stop"),
        "echo-on-chat": ({"messages": CHAT_OK, "echo": True}, "echo"),
    }
    for label, (body, mention) in chat.items():
        yield Case(f"chat-{label}", dumps(body), mentions=(mention,))
    yield Case("chat-ok", dumps({"messages": CHAT_OK, "max_tokens": N, "temperature": 0}), status=200)
    # OpenAI's content parts ([{"type": "text", "text": ...}]) are accepted
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    yield Case("chat-content-parts-ok", dumps({"messages": parts, "max_tokens": N, "temperature": 0}), status=200)
    yield Case("chat-route-with-prompt", dumps({"prompt": "x"}), api="chat", mentions=("prompt",))
    completion: dict[str, tuple[dict[str, Any], str]] = {
        "prompt-int": ({"prompt": 1}, "prompt"),
        "prompt-mixed-list": ({"prompt": ["a", 1]}, "prompt"),
        "prompt-negative-token-id": ({"prompt": [1, -2, 3]}, "prompt"),
        "prompt-empty-list": ({"prompt": []}, "prompt"),
        "prompt-null": ({"prompt": None}, "prompt"),
        "suffix": ({"prompt": "x", "suffix": "y"}, "suffix"),
        "best-of-2-greedy": ({"prompt": "x", "best_of": 2, "temperature": 0}, "best_of"),
        "logprobs-21": ({"prompt": "x", "logprobs": 21}, "logprobs"),
        "logprobs-bool": ({"prompt": "x", "logprobs": True}, "logprobs"),
        "echo-int": ({"prompt": "x", "echo": 1}, "echo"),
        "n-string": ({"prompt": "x", "n": "1"}, "n"),
        "presence-penalty-3": ({"prompt": "x", "presence_penalty": 3.0}, "presence_penalty"),
        "temperature-neg": ({"prompt": "x", "temperature": -1}, "temperature"),
        "frequency-penalty-string": ({"prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
        "top-k-float": ({"prompt": "x", "top_k": 2.5}, "top_k"),
    }
    for label, (body, mention) in completion.items():
        yield Case(f"completion-{label}", dumps(body), mentions=(mention,))
    yield Case("completion-ok", dumps({"prompt": "x", "max_tokens": N, "temperature": 0}), status=200)
    # prompts as lm-evaluation-harness sends them: token ids, and several in one request (a choice each)
    two = dumps({"prompt": ["a", "b"], "max_tokens": N, "temperature": 0})
    yield Case("completion-prompt-two-ok", two, status=200, modes=(ROLLING,))
    # dynamic batching pads one generate() batch per request batch: one prompt per request there
    yield Case("completion-prompt-two-dynamic", two, mentions=("prompt", "rolling batch"), modes=(DYNAMIC,))
    yield Case("completion-prompt-token-ids-ok", dumps({"prompt": [1, 2, 3], "max_tokens": N, "temperature": 0}),
               status=200)
    yield Case("completion-max-tokens-string", dumps({"prompt": "x", "max_tokens": "5"}), mentions=("max_tokens",))
    yield Case("chat-max-tokens-zero", dumps({"messages": CHAT_OK, "max_tokens": 0}), mentions=("max_tokens",))
    yield Case("completion-stop-int", dumps({"prompt": "x", "stop": 5}), mentions=("stop",))
    yield Case("completion-surrogate-prompt", b'{"prompt": "\\udc00"}', mentions=("prompt",))


def tgi_cases() -> Iterator[Case]:
    """TGI ``/generate`` bodies (the route sets the API property ``tgi``)."""
    tgi: dict[str, tuple[str, str]] = {
        "parameters-list": ('{"inputs": "x", "parameters": ["a"]}', "parameters"),
        "parameters-string": ('{"inputs": "x", "parameters": "a"}', "parameters"),
        "watermark": ('{"inputs": "x", "parameters": {"watermark": true}}', "watermark"),
        "grammar": ('{"inputs": "x", "parameters": {"grammar": {"type": "json", "value": {}}}}', "grammar"),
        "stop-int": ('{"inputs": "x", "parameters": {"stop": 5}}', "stop"),
        "top-n-tokens-50": ('{"inputs": "x", "parameters": {"top_n_tokens": 50}}', "top_n_tokens"),
        "max-new-tokens-string": ('{"inputs": "x", "parameters": {"max_new_tokens": "5"}}', "max_new_tokens"),
        "temperature-nan": ('{"inputs": "x", "parameters": {"temperature": NaN}}', "temperature"),
        "inputs-missing": ('{"parameters": {}}', "inputs"),
        "typo": ('{"inputs": "x", "parameters": {"max_new_token": 5}}', "max_new_token"),
    }
    for label, (body, mention) in tgi.items():
        yield Case(f"tgi-{label}", body.encode(), api="tgi", mentions=(mention,))
    # TGI answers a greedy best_of with its own 422 (validation), as TGI does
    yield Case("tgi-best-of-2-greedy", b'{"inputs": "x", "parameters": {"best_of": 2, "do_sample": false}}', api="tgi",
               status=422, mentions=("best_of",))
    yield Case("tgi-adapter-id-unknown", b'{"inputs": "x", "parameters": {"adapter_id": "lora"}}', api="tgi",
               status=404, mentions=("lora",))
    yield Case("tgi-inputs-list", b'{"inputs": ["a"]}', api="tgi", mentions=("inputs",), modes=(ROLLING,))
    yield Case("tgi-ok", dumps({"inputs": "x", "parameters": {"max_new_tokens": N}}), api="tgi", status=200)
    yield Case("tgi-stream-string", b'{"inputs": "x", "stream": "yes"}', api="tgi", mentions=("stream",))
    yield Case("tgi-unknown-top-level", b'{"inputs": "x", "bogus": 1}', api="tgi", mentions=("bogus",))
    yield Case("tgi-stop-and-stop-sequences", b'{"inputs": "x", "parameters": {"stop": ["a"], '
               b'"stop_sequences": ["b"]}}', api="tgi", mentions=("mean the same",))


def build_corpus() -> list[Case]:
    """All cases, generated and hand-written, with unique names."""
    groups = (generated_parameter_cases, truncation_cases, utf8_cases, malformed_json_cases, nesting_cases,
              top_level_cases, number_cases, unknown_parameter_cases, whitespace_cases, content_type_cases,
              header_cases, openai_cases, tgi_cases)
    cases = [case for group in groups for case in group()]
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AssertionError(f"duplicate case names: {duplicates}")
    return cases


CORPUS: list[Case] = build_corpus()
