"""TGI request bodies (``/generate``, ``/generate_stream``, or ``option.tgi_compat``) as LMI bodies.

TGI's ``parameters`` are mostly LMI's; the differences handled here: ``adapter_id`` selects the LoRA
adapter (LMI's top-level ``adapters``), ``temperature`` must be strictly positive (TGI's router answers
422, where LMI reads 0 as greedy), ``watermark`` is refused, TGI's neutral defaults (``best_of: 1``,
``top_n_tokens: 0``, ``decoder_input_details: false``) are dropped, prefill details are never
streamed, ``best_of`` > 1 follows TGI's router (422 when streaming or without ``do_sample``; every
sample returned, the best first, the others in ``details.best_of_sequences``; a ``seed`` is allowed,
each sample drawing with one derived from it, where TGI refuses it), and the output is TGI's
(``output_formatter`` ``tgi`` / ``tgi_stream``).
"""

from __future__ import annotations

from typing import Any

from djl_handlers.errors import InvalidParameter, InvalidRequest, UnprocessableParameter
from djl_handlers.request.parser import TOP_LEVEL_KEYS, check_bool

__all__ = ["tgi_to_lmi"]

TGI_NULL_ONLY: tuple[str, ...] = ()  # TGI's grammar is structured output (params/structured.py)


def tgi_to_lmi(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """A TGI ``/generate`` body in LMI terms: TGI's parameter names, TGI's output shapes."""
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidParameter("parameters must be a JSON object", field="parameters")
    unknown = sorted(set(body) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise InvalidRequest(f"unknown request field(s) {unknown}; allowed: {list(TOP_LEVEL_KEYS)}", field=unknown[0])
    if "inputs" in body and not isinstance(body["inputs"], str):
        raise InvalidRequest(f"inputs must be a string (TGI), got {type(body['inputs']).__name__}", field="inputs")
    params = dict(params)  # TGI's `stop` is an accepted alias of stop_sequences (from_dict checks both)
    adapter_id = params.pop("adapter_id", None)  # TGI's LoRA selection = our top-level "adapters"
    for key in TGI_NULL_ONLY:
        if params.pop(key, None) is not None:
            raise InvalidParameter(f"parameters.{key} is not supported", field=key)
    _check_temperature(params.get("temperature"))
    if params.pop("watermark", False):
        raise InvalidParameter("parameters.watermark is not supported", field="watermark")
    if params.get("best_of") in (None, 1):
        params.pop("best_of", None)
    if params.get("top_n_tokens") in (None, 0):
        params.pop("top_n_tokens", None)
    if not params.get("decoder_input_details"):
        params.pop("decoder_input_details", None)
    stream = stream or check_bool(body.get("stream", False), "stream")
    if stream and params.get("decoder_input_details"):  # as TGI: prefill details are never streamed
        raise InvalidParameter("decoder_input_details is not supported when streaming tokens",
                               field="decoder_input_details")
    _check_best_of(params.get("best_of"), stream, params.get("do_sample"))
    params["output_formatter"] = "tgi_stream" if stream else "tgi"
    tgi = {"inputs": body.get("inputs"), "parameters": params, "stream": stream}
    if adapter_id is not None or body.get("adapters") is not None:
        tgi["adapters"] = adapter_id if adapter_id is not None else body.get("adapters")
    return tgi


def _check_best_of(value: Any, stream: bool, do_sample: Any) -> None:
    """TGI's router rules for ``best_of`` > 1 (422, its messages); the value itself is checked as
    LMI's ``best_of``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 1:
        return
    if stream:
        raise UnprocessableParameter("`best_of` != 1 is not supported when streaming tokens", field="best_of")
    if do_sample is not True:
        raise UnprocessableParameter("you must use sampling when `best_of` is > 1", field="best_of")


def _check_temperature(value: Any) -> None:
    """TGI's router refuses ``temperature <= 0`` (422) where the LMI schema means greedy by 0."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and value <= 0:
        raise UnprocessableParameter("`temperature` must be strictly positive", field="temperature")
