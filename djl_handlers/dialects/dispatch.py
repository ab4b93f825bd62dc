"""Which API dialect one DJL ``Input`` item speaks, and its parse into a ``Request``.

The dialect is the ``X-Djl-Handlers-Api`` property the local server's routes set
(``extensions.API_PROPERTY``: ``chat``, ``completion``, ``tgi``, ``tgi_stream``), else the body's shape:
``messages`` is an OpenAI chat, ``prompt`` an OpenAI completion (a Bedrock-style body with
``option.bedrock_compat``), anything else the LMI schema. TGI and Bedrock bodies become LMI bodies;
OpenAI bodies carry their own response options and tool plan.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.dialects.bedrock.request import bedrock_to_lmi
from djl_handlers.dialects.openai.request import openai_request
from djl_handlers.dialects.tgi.request import tgi_to_lmi
from djl_handlers.errors import InvalidRequest
from djl_handlers.extensions import API_PROPERTY
from djl_handlers.request.parser import ParserSettings, lmi_request, read_body
from djl_handlers.request.records import Request

__all__ = ["POOLING_APIS", "parse_request"]

POOLING_APIS = ("embeddings", "rerank", "score")  # the routes of djl_handlers.pooling's models


def parse_request(item: Any, settings: ParserSettings) -> Request:
    """Parse one Input item; raises ``InvalidRequest`` (with ``field``) on any problem."""
    body = read_body(item, settings)
    api = (item.get_property(API_PROPERTY) or "").strip().lower()
    if api in POOLING_APIS:
        raise InvalidRequest(f"this model generates text: the {api!r} route needs an embedding or reranking model "
                             "(option.task=text_embedding or rerank)", field="route")
    if api == "chat" or (not api and "messages" in body and "inputs" not in body):
        return openai_request(item, body, settings, chat=True)
    if api == "completion" or (not api and not settings.bedrock_compat and "prompt" in body and "inputs" not in body):
        return openai_request(item, body, settings, chat=False)
    if api in ("tgi", "tgi_stream"):
        body = tgi_to_lmi(body, stream=api == "tgi_stream")
    elif settings.bedrock_compat and "prompt" in body and "inputs" not in body:
        body = bedrock_to_lmi(body, item.get_property("X-Amzn-SageMaker-Forwarded-Api"))
    return lmi_request(item, body, settings)
