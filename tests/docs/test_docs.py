"""Every fenced code block in README.md, docs/*.md and the recipe/docker READMEs says true things.

Per block, by its info string (an untagged block is judged by its content):

* ``json`` (or untagged text that is JSON / JSON lines / SSE ``data:`` events): parses; a body
  with ``inputs``/``messages``/``prompt`` is a valid request for the real request parser; a
  response with ``generated_text`` has the keys the ``json`` formatter's golden has;
* ``python``: compiles;
* ``properties``: parses like ``serving.properties``; with an ``option.entryPoint`` of ours it
  builds a ``ServingConfig`` for that handler's engine;
* ``bash``/``sh``/``shell``/``console``: ``make`` names real Makefile targets; ``djl-handlers``
  real subcommands with arguments the CLI's own parser accepts and model directories that exist;
  ``curl`` real routes of the local server, with request bodies the parser accepts;
  ``python -m`` real modules; ``pytest -m`` registered markers; repository scripts exist and
  ``docker/build.sh`` flags are ones it knows.
* ``<!-- golden: fmt/scenario -->`` markers name existing golden files (their bytes are checked
  by ``tests/unit/test_formatting_golden.py``).

Blocks known to be wrong in documents this suite does not own are listed in ``KNOWN_BAD`` and
run as non-strict xfail, so they show up in every run's summary until fixed. Fast: no model.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.properties import HANDLER_MODULES, parse_properties, split_properties
from djl_handlers.dialects.dispatch import parse_request
from djl_handlers.errors import DjlHandlersError
from djl_handlers.io import Input
from djl_handlers.request.parser import ParserSettings

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
               REPO / "serving.properties.examples" / "README.md", REPO / "docker" / "README.md"])
GOLDEN = REPO / "tests" / "golden" / "formatting"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\s]*)[^`]*$")
SHELL = {"bash", "sh", "shell", "console", "zsh"}

# (document, first non-blank line of the block) → why it is wrong. Reported, not fixed, here.
KNOWN_BAD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string and its dedented text."""

    doc: str
    line: int
    lang: str
    text: str

    @property
    def first(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")


def extract_blocks(text: str, doc: str) -> list[Block]:
    """Fenced blocks of a Markdown text (``` or ~~~, any indentation, nested fences ignored)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) \
                    and not closing["info"]:
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append(Block(doc, i + 1, opening["info"].lower(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _all_blocks() -> list[Block]:
    found: list[Block] = []
    for path in DOCS:
        if path.is_file():
            found.extend(extract_blocks(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix()))
    return found


BLOCKS = _all_blocks()


# -- what the repository really offers -----------------------------------------------------------
def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {t for line in re.findall(r"^([\w .-]+):(?!=)", text, re.M) for t in line.split()} - {".PHONY"}


def cli_parser() -> argparse.ArgumentParser | None:
    if not (REPO / "djl_handlers" / "cli.py").is_file():
        return None
    from djl_handlers import cli

    parser = getattr(cli, "_parser", None)
    return parser() if callable(parser) else None


def server_routes() -> list[re.Pattern[str]]:
    """The local server's routes (``Route("/path/{param}", ...)`` in djl_handlers/server/)."""
    paths: set[str] = set()
    for source in (REPO / "djl_handlers" / "server").glob("*.py"):
        paths.update(re.findall(r"""Route\(\s*["']([^"']+)["']""", source.read_text(encoding="utf-8")))
    return [re.compile(re.sub(r"\\\{\w+(?::\w+)?\\\}", "[^/]+", re.escape(p)) + "/?") for p in sorted(paths)]


def pytest_markers() -> set[str]:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    return set(re.findall(r'^\s*"(\w+):', text, re.M)) | {"slow", "not"}


def build_sh_flags() -> set[str]:
    script = REPO / "docker" / "build.sh"
    return set(re.findall(r"^\s*(--[\w-]+|-h\|--help)\)", script.read_text(encoding="utf-8"), re.M)) | {"--help"}


# -- JSON: requests and responses ----------------------------------------------------------------
class _AnyAdapter:
    """Docs name adapters that a real server registers first: every name counts as registered."""

    def __contains__(self, name: object) -> bool:
        return True

    def check(self, names: Any) -> None:
        return None


def _template(messages: list[dict[str, Any]], **_: Any) -> str:
    """A stand-in chat template (chat examples are parsed as for a vision-language model)."""
    return json.dumps(messages)


def check_request_body(body: Any) -> None:
    """A request example must get past the real parser (dynamic batch when ``inputs`` is a list)."""
    if not isinstance(body, dict) or not ({"inputs", "messages", "prompt"} & set(body)):
        return
    rolling = not isinstance(body.get("inputs"), list)
    item = Input.from_parts({"Content-Type": "application/json"}, [("data", json.dumps(body).encode())])
    try:
        parse_request(item, ParserSettings(rolling_batch=rolling, adapters=_AnyAdapter(), chat_template=_template,
                                           image_limit=8, image_placeholder="<image>"))
    except DjlHandlersError as exc:
        raise AssertionError(f"request example rejected by the parser: {exc.message}") from None


def _golden_json_keys() -> tuple[set[str], set[str]]:
    golden = json.loads((GOLDEN / "json" / "details.txt").read_text(encoding="utf-8"))
    # prefill / top_tokens / best_of_sequences appear only on request (decoder_input_details,
    # top_n_tokens, n / best_of)
    return set(golden), set(golden["details"]) | {"prefill", "top_tokens", "best_of_sequences"}


def check_response(value: Any) -> None:
    """A non-stream LMI response example uses only the keys the json formatter writes."""
    if not isinstance(value, dict) or "generated_text" not in value or "token" in value:
        return
    if set(value) - {"generated_text", "details"}:
        return  # another format (3p, TGI list item...), covered by the goldens
    top, details = _golden_json_keys()
    assert set(value) <= top
    if isinstance(value.get("details"), dict):
        extra = set(value["details"]) - details
        assert not extra, f"details keys {sorted(extra)} are not what the json formatter writes"


def json_values(text: str) -> list[Any] | None:
    """The block as JSON, JSON lines or SSE ``data:`` events; ``None`` when it is none of them."""
    stripped = text.strip()
    try:
        return [json.loads(stripped)]
    except ValueError:
        pass
    lines = [ln for ln in stripped.splitlines() if ln.strip()]
    payloads = [ln[5:].strip() if ln.startswith("data:") else ln for ln in lines
                if not re.match(r"(event|id|retry):", ln) and ln.strip() != "data: [DONE]"]
    try:
        return [json.loads(p) for p in payloads if p != "[DONE]"]
    except ValueError:
        return None


def check_json(block: Block) -> None:
    values = json_values(block.text)
    assert values is not None, "does not parse as JSON, JSON lines or SSE events"
    for value in values:
        check_request_body(value)
        check_response(value)


# -- other languages -----------------------------------------------------------------------------
def check_python(block: Block) -> None:
    compile(block.text, f"{block.doc}:{block.line}", "exec")


def check_properties(block: Block) -> None:
    props = parse_properties(block.text)
    assert props, "no key=value pairs"
    server, options = split_properties(props)
    entry = options.get("entryPoint")
    if entry in HANDLER_MODULES:
        ServingConfig.from_properties(options, server, engine=entry.rsplit(".", 1)[1])


def shell_commands(text: str) -> Iterator[list[str]]:
    """Simple commands of a shell snippet (continuations joined; split at ; & | && ||)."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = re.sub(r"^\s*\$ ", "", line)  # console prompts
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        command: list[str] = []
        try:
            tokens = list(lexer)
        except ValueError as exc:
            raise AssertionError(f"shell line does not tokenize ({exc}): {line}") from None
        for token in tokens:
            if token and set(token) <= set(";&|"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def _strip_env(command: list[str]) -> list[str]:
    """Drop leading ``VAR=value`` assignments and ``sudo``/``env``/``time``."""
    i = 0
    while i < len(command) and (re.fullmatch(r"\w+=.*", command[i]) or command[i] in ("env", "time", "sudo")):
        i += 1
    return command[i:]


def check_make(args: list[str]) -> None:
    targets = makefile_targets()
    named = [a for a in args if not a.startswith("-") and "=" not in a]
    unknown = [t for t in named if t not in targets]
    assert not unknown, f"make targets {unknown} are not in the Makefile ({sorted(targets)})"


def _looks_like_repo_path(arg: str) -> bool:
    return bool(re.match(r"(serving\.properties\.examples|tests|docs|docker|scripts|benchmarks)/", arg))


def check_djl_handlers(args: list[str]) -> None:
    parser = cli_parser()
    if parser is None:
        pytest.skip("djl_handlers/cli.py does not exist yet")
    try:
        parsed = parser.parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"djl-handlers {' '.join(args)}: the CLI rejects these arguments") from exc
    model_dir = getattr(parsed, "model_dir", None)
    if model_dir and _looks_like_repo_path(model_dir):
        assert (REPO / model_dir / "serving.properties").is_file(), f"{model_dir} is not a model directory"
    payload = getattr(parsed, "payload", None)
    if payload is not None:
        check_request_body(json.loads(payload))


def check_curl(args: list[str]) -> None:
    urls = [a for a in args if re.match(r"(https?://)?(127\.0\.0\.1|localhost)(:\d+)?(/|$)", a)]
    assert urls, f"curl without a local URL: {args}"
    for url in urls:
        path = "/" + re.sub(r"^(https?://)?[^/]+/?", "", url).split("?")[0]
        assert any(r.fullmatch(path) for r in server_routes()), f"no route {path} in djl_handlers/server"
    for i, arg in enumerate(args[:-1]):
        if arg in ("-d", "--data", "--data-raw", "--data-binary") and not args[i + 1].startswith("@"):
            body = json.loads(args[i + 1])
            check_request_body(body)


def check_python_m(args: list[str]) -> None:
    if "-m" in args:
        module = args[args.index("-m") + 1]
        if module == "pytest":
            check_pytest(args[args.index("-m") + 2:])
        else:
            assert _module_exists(module), f"python -m {module}: no such module"


def _module_exists(module: str) -> bool:
    """Whether ``python -m module`` finds a module. A top-level name is looked up on ``sys.path`` by the
    path finder alone: a meta-path hook may act on a lookup (setuptools' distutils shim takes a lookup
    of ``pip`` for pip starting, and turns itself off for the rest of the process, after which a later
    first import of setuptools, e.g. by torch's inductor, fails)."""
    if "." not in module:
        return importlib.machinery.PathFinder.find_spec(module) is not None
    return importlib.util.find_spec(module) is not None


def check_pytest(args: list[str]) -> None:
    if "-m" in args:
        words = re.findall(r"\w+", args[args.index("-m") + 1])
        unknown = set(words) - pytest_markers() - {"and", "or"}
        assert not unknown, f"pytest markers {sorted(unknown)} are not registered in pyproject.toml"
    for arg in args:
        if arg.startswith("tests/"):
            assert (REPO / arg.split("::")[0]).exists(), f"{arg} does not exist"


def check_script(command: list[str]) -> None:
    path = command[0]
    assert (REPO / path).is_file(), f"{path} does not exist"
    if path == "docker/build.sh":
        unknown = [a for a in command[1:] if a.startswith("--") and a not in build_sh_flags()]
        assert not unknown or "--" in command[1:command.index(unknown[0])], f"build.sh has no {unknown}"


COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "make": check_make,
    "djl-handlers": check_djl_handlers,
    "curl": check_curl,
    "pytest": check_pytest,
}


def check_shell(block: Block) -> None:
    for raw in shell_commands(block.text):
        command = _strip_env(raw)
        if not command:
            continue
        name = command[0].rsplit("/", 1)[-1]
        if name in COMMANDS:
            COMMANDS[name](command[1:])
        elif re.fullmatch(r"python3?(\.\d+)?", name):
            check_python_m(command[1:])
        elif command[0].endswith(".sh") and not command[0].startswith(("/", "$")):
            check_script(command)


def check_untagged(block: Block) -> None:
    if block.first.startswith(("{", "[", "data:")):
        check_json(block)


CHECKS: dict[str, Callable[[Block], None]] = {
    "json": check_json, "jsonl": check_json, "jsonlines": check_json,
    "python": check_python, "py": check_python,
    "properties": check_properties, "": check_untagged,
    **{lang: check_shell for lang in SHELL},
}


def test_documents_have_blocks() -> None:
    assert {b.doc for b in BLOCKS} >= {"README.md"}
    assert len(BLOCKS) > 20


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.doc}:{b.line}:{b.lang or 'text'}")
def test_block(block: Block) -> None:
    reason = KNOWN_BAD.get((block.doc, block.first))
    if reason:
        pytest.xfail(reason)
    CHECKS.get(block.lang, lambda _b: None)(block)


def test_golden_markers_name_real_goldens() -> None:
    for path in DOCS:
        if not path.is_file():
            continue
        for fmt, scenario in re.findall(r"<!-- golden: (\S+)/(\S+) -->", path.read_text(encoding="utf-8")):
            assert (GOLDEN / fmt / f"{scenario}.txt").is_file(), f"{path.name}: no golden {fmt}/{scenario}"


def test_known_bad_entries_still_exist() -> None:
    """An entry whose block was edited away must be dropped from KNOWN_BAD."""
    present = {(b.doc, b.first) for b in BLOCKS}
    assert set(KNOWN_BAD) <= present, set(KNOWN_BAD) - present


# -- the checker itself catches what it should -----------------------------------------------------
@pytest.mark.parametrize(
    ("lang", "text", "fragment"),
    [
        ("json", '{"inputs": "x",}\n', "JSON"),
        ("json", '{"inputs": "x", "parameters": {"temperature": -1}}\n', "temperature"),
        ("", '{"inputs": "x", "bogus": 1}\n', "bogus"),
        ("python", "def f(:\n", "invalid syntax"),
        ("bash", "make no-such-target\n", "no-such-target"),
        ("bash", "curl -s http://127.0.0.1:8080/nowhere -d '{}'\n", "/nowhere"),
        ("bash", "python -m djl_handlers.no_such_module\n", "no_such_module"),
        ("bash", "pytest -m nosuchmarker tests\n", "nosuchmarker"),
        ("bash", "docker/build.sh --frobnicate\n", "--frobnicate"),
        ("properties", "engine=Python\noption.entryPoint=djl_handlers.vllm\noption.rolling_batch=scheduler\n",
         "rolling_batch"),
    ],
)
def test_checker_rejects(lang: str, text: str, fragment: str) -> None:
    block = Block("self-test.md", 1, lang, text)
    with pytest.raises((AssertionError, SyntaxError, DjlHandlersError, ValueError)) as info:
        CHECKS[lang](block)
    assert fragment in str(info.value)


def test_checker_rejects_cli_misuse() -> None:
    if cli_parser() is None:
        pytest.skip("djl_handlers/cli.py does not exist yet")
    with pytest.raises(AssertionError, match="rejects"):
        check_shell(Block("self-test.md", 1, "bash", "djl-handlers frobnicate x\n"))
    with pytest.raises(AssertionError, match="not a model directory"):
        check_shell(Block("self-test.md", 1, "bash", "djl-handlers check serving.properties.examples/nope\n"))


def test_extractor_handles_indented_and_tilde_fences() -> None:
    text = "1. step\n\n   ```bash\n   make test\n   ```\n\n~~~json\n{\"a\": 1}\n~~~\n````\n```\ninner\n```\n````\n"
    blocks = extract_blocks(text, "x.md")
    assert [(b.line, b.lang, b.text) for b in blocks] == [
        (3, "bash", "make test\n"), (7, "json", '{"a": 1}\n'), (10, "", "```\ninner\n```\n")]
