"""Bedrock-style ("3p") request bodies, as newer LMI parses them with ``option.bedrock_compat=true``.

``{"prompt", "temperature", "top_p", "max_gen_len"}`` becomes an LMI request with ``details`` and
``return_full_text`` on (newer LMI's choice; the 3p formatters report token counts from the details);
sampling when ``temperature > 0``. The SageMaker header ``X-Amzn-SageMaker-Forwarded-Api:
InvokeEndpointWithResponseStream`` selects the streaming ``3p_stream`` format, otherwise ``3p``.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.request.parser import check_text

KEYS = frozenset(("prompt", "temperature", "top_p", "max_gen_len"))
STREAM_API = "InvokeEndpointWithResponseStream"
DEFAULTS = {"temperature": 0.5, "top_p": 0.9, "max_gen_len": 512}


def bedrock_to_lmi(body: dict[str, Any], forwarded_api: str | None) -> dict[str, Any]:
    """An LMI request body (``inputs``, ``parameters``, ``stream``) for a Bedrock-style body."""
    unknown = sorted(set(body) - KEYS)
    if unknown:
        raise InvalidRequest(f"unknown field(s) {unknown}; allowed: {sorted(KEYS)}", field=unknown[0])
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string", field="prompt")
    values = {key: body.get(key, default) for key, default in DEFAULTS.items()}
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InvalidParameter(f"{key} must be a number, got {value!r}", field=key)
    stream = (forwarded_api or "").strip() == STREAM_API
    params: dict[str, Any] = {
        "max_new_tokens": values["max_gen_len"],
        "top_p": values["top_p"],
        "details": True,
        "return_full_text": True,
        "output_formatter": "3p_stream" if stream else "3p",
    }
    if values["temperature"] > 0:
        params.update(do_sample=True, temperature=values["temperature"])
    return {"inputs": check_text(prompt, "prompt"), "parameters": params, "stream": stream}
