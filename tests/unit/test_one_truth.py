"""Facts that live in one place only: the engine table, aliases, dtypes, content types, the
prompt-length rule. Each test fails if a second copy comes back or the users disagree."""

from __future__ import annotations

import pytest

from djl_handlers.config.engines import ALIASES, DTYPE_NAMES, ENGINES, canonical_engine
from djl_handlers.config.models import DTYPES, ServingConfig
from djl_handlers.dialects.registry import FORMATTERS, content_type_for, get_formatter
from djl_handlers.engines import registry
from djl_handlers.engines.base import check_prompt_length
from djl_handlers.errors import PromptTooLong
from djl_handlers.params.support import SUPPORT, normalize_engine


def test_every_layer_knows_the_same_engines() -> None:
    assert tuple(SUPPORT) == ENGINES
    assert set(registry.ENGINES) == {*ENGINES, "fake"}
    for engine in ENGINES:
        assert ServingConfig.from_properties({"model_id": "m", "rolling_batch": "auto"}, engine=engine).engine == engine


@pytest.mark.parametrize(("alias", "canonical"), sorted(ALIASES.items()))
def test_every_alias_means_the_same_everywhere(alias: str, canonical: str) -> None:
    assert canonical_engine(alias) == canonical
    assert normalize_engine(alias) == canonical
    assert registry.canonical_name(alias) == canonical
    assert ServingConfig.from_properties({"model_id": "m", "rolling_batch": "auto"}, engine=alias).engine == canonical


def test_dtype_option_values_are_the_table_keys() -> None:
    assert DTYPES == tuple(DTYPE_NAMES)


@pytest.mark.parametrize("name", sorted(FORMATTERS))
def test_content_type_is_the_formatters_own(name: str) -> None:
    assert content_type_for(name, stream=False) == get_formatter(name, stream=False).content_type


@pytest.mark.parametrize(
    ("tokens", "limit", "error"),
    [(0, 10, "empty"), (1, 10, None), (9, 10, None), (10, 10, "at most 9"), (11, 10, "at most 9")],
)
def test_one_prompt_length_rule(tokens: int, limit: int, error: str | None) -> None:
    if error is None:
        check_prompt_length(tokens, limit)
        return
    with pytest.raises(PromptTooLong, match=error) as info:
        check_prompt_length(tokens, limit)
    assert info.value.field == "inputs"


# --------------------------------------------------------------------------- docs that name code

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
# DJL's classes (Java and its own Python engine) and vLLM's that the architecture page compares with
JAVA_NAMES = {"PyPredictor", "AsyncRequestManager", "PythonAsyncEngine", "LoRARequest"}


def test_architecture_names_only_classes_that_exist() -> None:
    import re

    source = "\n".join(p.read_text() for p in (ROOT / "djl_handlers").rglob("*.py"))
    names = set(re.findall(r"`([A-Z][A-Za-z]+)`", (ROOT / "docs" / "architecture.md").read_text()))
    missing = [n for n in sorted(names - JAVA_NAMES)
               if not re.search(rf"^\s*(class {n}\b|{n}\s*[:=])", source, re.MULTILINE)]
    assert not missing, f"docs/architecture.md names {missing}, which the code does not define"


def test_engines_read_generation_settings_only_through_translations() -> None:
    """No ``getattr`` on a request's parameters in the engines: settings come from ``to_*``."""
    for path in (ROOT / "djl_handlers" / "engines").rglob("*.py"):
        text = path.read_text()
        assert "getattr(params" not in text and "getattr(request.params" not in text, path.name
        assert "getattr(r.params" not in text and "getattr(req.params" not in text, path.name
    for name in ("hf/engine.py", "hf/static.py"):
        assert "translate(" in (ROOT / "djl_handlers" / "engines" / name).read_text(), name
