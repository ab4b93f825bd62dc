"""An option with a closed set of values names every value one can write, and only those."""

from __future__ import annotations

import pytest

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError


def test_a_bad_choice_lists_the_allowed_values_without_the_unset_default() -> None:
    reader = Reader({"quantize": "int3"}, {})
    with pytest.raises(ConfigError) as caught:
        reader.choice("quantize", "", ("", "awq", "dynamic_int8"))
    message = str(caught.value)
    assert message == "option.quantize='int3' is invalid; allowed: awq, dynamic_int8"
    assert caught.value.field == "option.quantize"


def test_an_empty_value_is_the_default() -> None:
    assert Reader({"quantize": "  "}, {}).choice("quantize", "", ("", "awq")) == ""
    assert Reader({"quantize": "AWQ"}, {}).choice("quantize", "", ("", "awq")) == "awq"
