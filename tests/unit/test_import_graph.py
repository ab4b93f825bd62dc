"""The import graph of ``djl_handlers``, read from the source: no cycles, and the layers point one way
(docs/architecture.md). Imports under ``if TYPE_CHECKING:`` do not count (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "djl_handlers"
# Layers below the engines: they may not import an engine, the service, a front end or an entry point.
LOWER = ("io", "config", "params", "request", "lora", "formatting", "dialects")
UPPER = ("djl_handlers.engines", "djl_handlers.service", "djl_handlers.server", "djl_handlers.worker",
         "djl_handlers.cli", "djl_handlers.huggingface", "djl_handlers.vllm", "djl_handlers.deepspeed",
         "djl_handlers.tensorrt_llm")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skipped


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``djl_handlers`` modules ``name`` imports anywhere (top level or inside functions)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert len(graph) > 50 and "djl_handlers.engines.hf.engine" in graph  # the graph is the package's
    assert _cycles(graph) == []


def test_lower_layers_import_no_engine_service_or_front_end(graph: dict[str, set[str]]) -> None:
    wrong = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                   if name.count(".") and name.split(".")[1] in LOWER and target.startswith(UPPER))
    assert wrong == []


def test_scheduling_knows_only_the_engine_protocol(graph: dict[str, set[str]]) -> None:
    wrong = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                   if name.startswith("djl_handlers.scheduling") and target.startswith(UPPER)
                   and target != "djl_handlers.engines.base")
    assert wrong == []


def test_neutral_engine_modules_import_no_engine_family(graph: dict[str, set[str]]) -> None:
    neutral = ("djl_handlers.engines.base", "djl_handlers.engines.registry", "djl_handlers.engines.fake")
    families = ("djl_handlers.engines.hf", "djl_handlers.engines.external")
    assert {name: sorted(t for t in graph[name] if t.startswith(families)) for name in neutral} == {
        name: [] for name in neutral}
    hf = [f"{name} -> {target}" for name, targets in graph.items() for target in targets
          if name.startswith("djl_handlers.engines.hf") and target.startswith("djl_handlers.engines.external")]
    assert hf == []  # the HF family does not depend on external engines (DeepSpeed builds on HF, not back)


def _crossing(graph: dict[str, set[str]], sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    """``source -> target`` imports from modules under ``sources`` to modules under ``targets``."""
    def under(name: str, roots: tuple[str, ...]) -> bool:
        return any(name == f"djl_handlers.{r}" or name.startswith(f"djl_handlers.{r}.") for r in roots)

    return sorted(f"{name} -> {target}" for name, found in graph.items() if under(name, sources)
                  for target in found if under(target, targets))


def test_the_worker_and_the_server_share_only_the_protocol(graph: dict[str, set[str]]) -> None:
    assert _crossing(graph, ("worker",), ("server",)) == []
    assert _crossing(graph, ("server",), ("worker",)) == []
    assert _crossing(graph, ("protocol",), ("server", "worker", "service", "cli")) == []
    assert _crossing(graph, ("server",), ("protocol",)) and _crossing(graph, ("worker",), ("protocol",))


def test_dialects_build_on_request_and_formatting_not_the_other_way(graph: dict[str, set[str]]) -> None:
    assert _crossing(graph, ("io", "config", "params", "request", "formatting"), ("dialects",)) == []
    assert _crossing(graph, ("io", "config", "params", "request"), ("formatting",)) == []
    assert _crossing(graph, ("dialects",), ("scheduling", "protocol")) == []
    assert _crossing(graph, ("dialects.tgi", "dialects.bedrock"), ("dialects.openai",)) == []
