"""The fields of OpenAI chat and completions bodies — OpenAI's own and the extras vLLM's server
accepts — and what the parser does with each: one table, read by the parser
(:mod:`djl_handlers.dialects.openai.request`) and by the OpenAPI description.

Handlings:

* ``own``: validated by the parser's own code (``messages``, ``max_tokens``, ``temperature``...);
  the ranges it checks are the constants below, which the schemas here also state;
* ``parameter``: copied into the LMI ``parameters`` under ``parameter`` (``ignore_eos`` →
  ``ignore_eos_token``, ``min_tokens`` → ``min_new_tokens``...) and validated there, per engine
  (:mod:`djl_handlers.params.support`): an engine that cannot honour a non-default value answers
  400 naming the field;
* ``template``: options of the chat template (``add_generation_prompt``,
  ``continue_final_message``, ``chat_template_kwargs``);
* ``tokenization``: ``add_special_tokens``, honoured when the prompt is tokenized;
* ``ignored``: bookkeeping accepted and ignored, as OpenAI and vLLM do (``user``, ``metadata``...);
* ``default_only``: a feature we do not have; accepted only at its default (or ``null``), else a
  400 naming the field.

A field not in the table is a 400 naming it. Nothing here imports an ML library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from djl_handlers.params.generation import MAX_LOGPROBS, MAX_SAMPLES

__all__ = [
    "CHAT", "COMPLETION", "DEFAULT_MAX_TOKENS", "FIELDS", "MAX_COMPLETION_LOGPROBS", "MAX_TEMPERATURE",
    "MAX_TOP_LOGPROBS", "BodyField", "allowed", "fields_for",
]

CHAT, COMPLETION = "chat", "completion"
BOTH = frozenset((CHAT, COMPLETION))
DEFAULT_MAX_TOKENS = 256
MAX_TEMPERATURE = 2.0
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = MAX_LOGPROBS  # vLLM's default max_logprobs (the OpenAI API allows 5)

OWN, PARAMETER, TEMPLATE, TOKENIZATION, IGNORED, DEFAULT_ONLY = (
    "own", "parameter", "template", "tokenization", "ignored", "default_only")


@dataclass(frozen=True)
class BodyField:
    """One body field: how it is handled, the JSON Schema of its value (``parameter`` fields take
    theirs from the LMI parameter, per engine), the LMI ``parameter`` it sets, the ``default`` a
    ``default_only`` field must keep, and the routes (``apis``) that accept it."""

    name: str
    handling: str
    schema: Mapping[str, Any] = field(default_factory=dict)
    parameter: str | None = None
    default: Any = None
    apis: frozenset[str] = BOTH
    description: str = ""


def _nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"anyOf": [dict(schema), {"type": "null"}]}


_BOOL = {"type": "boolean"}
_INT1 = {"type": "integer", "minimum": 1}
_SAMPLES = {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLES}  # checked as LMI's n / best_of
_OBJECT = {"type": "object"}
_MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"anyOf": [
            {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
            # an image (user messages of a vision-language model, docs/vision.md)
            {"type": "object", "required": ["type", "image_url"],
             "properties": {"type": {"const": "image_url"}, "image_url": {"anyOf": [{"type": "string"}, {
                 "type": "object", "required": ["url"], "properties": {
                     "url": {"type": "string"}, "detail": {"enum": ["auto", "low", "high"]}}}]}}},
        ]}}]},
        "name": {"type": "string"}, "tool_call_id": {"type": "string"},
        "tool_calls": {"type": "array", "items": _OBJECT},
    },
}
_TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"}, "description": {"type": "string"},
        "parameters": _OBJECT, "strict": _BOOL}}}}
_TOOL_CHOICE = {"anyOf": [{"enum": ["none", "auto", "required"]}, {
    "type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]}
_RESPONSE_FORMAT = {"anyOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "schema": _OBJECT, "strict": _nullable(_BOOL),
            "description": {"type": "string"}}}}},
]}
_STRUCTURED_OUTPUTS = {"type": "object", "properties": {
    "json": {"anyOf": [_OBJECT, {"type": "string"}]}, "regex": {"type": "string"},
    "choice": {"type": "array", "items": {"type": "string"}}, "grammar": {"type": "string"},
    "json_object": _BOOL}, "additionalProperties": False}
_STREAM_OPTIONS = {"type": "object", "properties": {"include_usage": _BOOL, "continuous_usage_stats": _BOOL}}


def _own(name: str, schema: Mapping[str, Any], apis: frozenset[str] = BOTH, description: str = "") -> BodyField:
    return BodyField(name, OWN, schema, apis=apis, description=description)


def _param(name: str, parameter: str | None = None, apis: frozenset[str] = BOTH) -> BodyField:
    return BodyField(name, PARAMETER, parameter=parameter or name, apis=apis,
                     description=f"LMI parameter {parameter or name}")


def _default_only(name: str, default: Any = None, apis: frozenset[str] = BOTH) -> BodyField:
    values = [None] if default is None else [None, default]
    return BodyField(name, DEFAULT_ONLY, {"enum": values}, default=default, apis=apis,
                     description="not supported: only the default")


def _ignored(name: str, schema: Mapping[str, Any] | None = None) -> BodyField:
    return BodyField(name, IGNORED, schema or {}, description="accepted and ignored")


_CHAT_ONLY, _COMPLETION_ONLY = frozenset((CHAT,)), frozenset((COMPLETION,))
_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}

_TABLE: tuple[BodyField, ...] = (
    # OpenAI's own fields
    _own("model", _nullable({"type": "string"}), description="the model, or a registered LoRA adapter (selects it)"),
    _own("messages", {"type": "array", "minItems": 1, "items": _MESSAGE}, _CHAT_ONLY),
    _own("prompt", {"anyOf": [{"type": "string"}, _TOKEN_IDS,
                              {"type": "array", "minItems": 1, "items": {"type": "string"}},
                              {"type": "array", "minItems": 1, "items": _TOKEN_IDS}]}, _COMPLETION_ONLY,
         "a prompt (text or token ids) or a list of prompts, one choice (n with n > 1) each, in order"),
    _own("max_tokens", _nullable(_INT1), _CHAT_ONLY, description=f"default {DEFAULT_MAX_TOKENS}"),
    _own("max_tokens", _nullable({"type": "integer", "minimum": 0}), _COMPLETION_ONLY,
         description=f"default {DEFAULT_MAX_TOKENS}; 0 only with echo (the prompt's log-probs alone)"),
    _own("max_completion_tokens", _nullable(_INT1)),
    _own("temperature", _nullable({"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE}),
         description="default 1.0; 0 is greedy"),
    _own("n", _nullable(_SAMPLES), description="choices; > 1 needs sampling and an engine that decodes samples"),
    _own("best_of", _nullable(_SAMPLES), _COMPLETION_ONLY,
         description="samples decoded, the best n (cumulative log-probability) returned; >= n, not streamed"),
    _own("use_beam_search", _BOOL, description="vLLM's beam search: n beams (best_of when larger), the n best "
         "returned as choices; greedy (temperature is not applied); streamed too (settled tokens)"),
    _own("stream", _BOOL),
    _own("stream_options", _nullable(_STREAM_OPTIONS)),
    _own("logprobs", _nullable(_BOOL), _CHAT_ONLY),
    _own("logprobs", _nullable({"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS}),
         _COMPLETION_ONLY),
    _own("top_logprobs", _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}), _CHAT_ONLY),
    _own("echo", _BOOL, _COMPLETION_ONLY, "the prompt (and, with logprobs, its log-probs) before the completion"),
    _own("response_format", _nullable(_RESPONSE_FORMAT)),
    _own("structured_outputs", _nullable(_STRUCTURED_OUTPUTS), description="vLLM's constraint object"),
    _own("tools", _nullable({"type": "array", "minItems": 1, "items": _TOOL}), _CHAT_ONLY),
    _own("tool_choice", _nullable(_TOOL_CHOICE), _CHAT_ONLY),
    _own("parallel_tool_calls", _nullable(_BOOL), _CHAT_ONLY),
    _own("include_reasoning", _nullable(_BOOL), _CHAT_ONLY,
         "false: the reasoning (option.reasoning_parser) is not sent"),
    _param("seed"), _param("top_p"), _param("stop", "stop_sequences"),
    _param("frequency_penalty"), _param("presence_penalty"),
    # vLLM's sampling and stopping extras
    _param("top_k"), _param("min_p"), _param("repetition_penalty"), _param("length_penalty"),
    _param("ignore_eos", "ignore_eos_token"), _param("min_tokens", "min_new_tokens"),
    _param("stop_token_ids"), _param("include_stop_str_in_output"), _param("skip_special_tokens"),
    _param("spaces_between_special_tokens"), _param("truncate_prompt_tokens", "truncate"),
    _param("prompt_logprobs"), _param("bad_words", "bad_sequences"),
    _param("guided_json"), _param("guided_regex"), _param("guided_choice"), _param("guided_grammar"),
    _param("guided_json_object"),
    # vLLM's chat-template and tokenization options
    BodyField("add_generation_prompt", TEMPLATE, _BOOL, default=True, apis=_CHAT_ONLY),
    BodyField("continue_final_message", TEMPLATE, _BOOL, default=False, apis=_CHAT_ONLY),
    BodyField("chat_template_kwargs", TEMPLATE, _nullable(_OBJECT), apis=_CHAT_ONLY,
              description="keyword arguments for the chat template (e.g. enable_thinking)"),
    BodyField("add_special_tokens", TOKENIZATION, _BOOL, description="default: the tokenizer's"),
    # bookkeeping
    *(_ignored(name) for name in ("user", "metadata", "store", "service_tier", "logit_bias", "request_id",
                                  "session_id", "cache_salt", "stream_interval", "prompt_cache_key",
                                  "safety_identifier")),
    # features we do not have: their default only
    _default_only("allowed_token_ids"),
    _default_only("logprob_token_ids"), _default_only("truncation_side", "left"),
    _default_only("priority", 0), _default_only("return_tokens_as_token_ids", False),
    _default_only("return_token_ids", False), _default_only("return_token_offsets", False),
    _default_only("routed_experts_prompt_start", 0), _default_only("return_mm_kwargs", False),
    _default_only("kv_transfer_params"), _default_only("ec_transfer_params"), _default_only("vllm_xargs"),
    _default_only("repetition_detection"), _default_only("watermarking", False),
    _default_only("guided_decoding_backend"), _default_only("guided_whitespace_pattern"),
    _default_only("logits_processors"), _default_only("mm_payload"),
    _default_only("echo", False, _CHAT_ONLY), _default_only("documents", apis=_CHAT_ONLY),
    _default_only("chat_template", apis=_CHAT_ONLY), _default_only("media_io_kwargs", apis=_CHAT_ONLY),
    _default_only("mm_processor_kwargs", apis=_CHAT_ONLY), _default_only("reasoning_effort", apis=_CHAT_ONLY),
    _default_only("thinking_token_budget", apis=_CHAT_ONLY),
    _default_only("return_prompt_text", False, _CHAT_ONLY), _default_only("audio", apis=_CHAT_ONLY),
    _default_only("modalities", apis=_CHAT_ONLY), _default_only("prediction", apis=_CHAT_ONLY),
    _default_only("web_search_options", apis=_CHAT_ONLY), _default_only("suffix", apis=_COMPLETION_ONLY),
    _default_only("prompt_embeds", apis=_COMPLETION_ONLY),
)


def fields_for(api: str) -> dict[str, BodyField]:
    """The fields the ``api`` route (``chat`` or ``completion``) accepts, by name."""
    return {f.name: f for f in _TABLE if api in f.apis}


FIELDS: Mapping[str, Mapping[str, BodyField]] = {CHAT: fields_for(CHAT), COMPLETION: fields_for(COMPLETION)}


def allowed(api: str) -> frozenset[str]:
    """The names of the fields the ``api`` route accepts."""
    return frozenset(FIELDS[api])
