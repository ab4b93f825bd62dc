"""Every validation error keeps its field name: rolling-batch records carry only the message
(DJL's front end sends ``{"error", "code"}``), so the message names the field."""

from __future__ import annotations

from djl_handlers.errors import InvalidParameter, InvalidRequest, error_body
from djl_handlers.scheduling.rolling import _naming_field


def test_rolling_error_text_names_the_field() -> None:
    assert _naming_field(InvalidRequest("must be a JSON object", field="body")) == "body: must be a JSON object"
    named = InvalidParameter("parameters.top_p must be a number in (0, 1], got 2", field="top_p")
    assert _naming_field(named) == named.message, "not prefixed twice"
    assert _naming_field(ValueError("boom")) == "boom"


def test_dynamic_error_body_has_the_field_key() -> None:
    body = error_body(InvalidParameter("parameters.top_p must be a number in (0, 1], got 2", field="top_p"))
    assert (body["code"], body["field"], body["message"]) == (400, "top_p", "invalid request")


def test_a_field_that_utf8_cannot_encode_is_escaped() -> None:
    text = _naming_field(InvalidRequest("bad key", field="\ud800"))
    assert text == "\\ud800: bad key" and text.encode("utf-8")
