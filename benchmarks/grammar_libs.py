"""Grammar libraries side by side on the embedded SmolLM2 vocabulary (49,152 tokens): xgrammar
(what djl_handlers uses), llguidance and outlines-core. For each JSON schema: does it compile
(coverage), compile time, and the mean time per generated token to compute the allowed-token mask
and advance the matcher along a fixed valid output (the per-step cost a constrained row adds).

``python -m benchmarks.grammar_libs`` prints the table and writes
``benchmarks/results/grammar-libs.json``. A library that is not installed is skipped (only
xgrammar is a dependency; ``pip install llguidance outlines-core`` to compare). Single run on a
shared box: read the orders of magnitude, not the digits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("object", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"]}, {"name": "Ada Lovelace", "age": 36}),
    ("enum+bool", {"type": "object", "properties": {"sky": {"enum": ["sunny", "rain"]}, "ok": {"type": "boolean"}},
                   "required": ["sky", "ok"]}, {"sky": "rain", "ok": False}),
    ("array 1..3", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                    "minItems": 1, "maxItems": 3}, [3, 14, 15]),
    ("pattern", {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                 "required": ["zip"]}, {"zip": "75001"}),
    ("anyOf+null", {"type": "object", "properties": {"note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                    "required": ["note"]}, {"note": None}),
    ("$defs/$ref", {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                    "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}, "required": ["a"]}, {"a": {"x": 1}}),
    ("format date", {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]},
     {"d": "2024-05-01"}),
    ("nested 3", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "array", "items": {"type": "string"}}}, "required": ["c"]}},
        "required": ["b"]}}, "required": ["a"]}, {"a": {"b": {"c": ["x", "y"]}}}),
]


def _xgrammar(tok: Any, vocab: int, eos: int) -> Callable[[dict[str, Any]], Any]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def build(schema: dict[str, Any]) -> Any:
        matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))

        def step(token: int) -> bool:
            matcher.fill_next_token_bitmask(bitmask)
            return bool(matcher.accept_token(token))

        return step

    return build


def _llguidance(tok: Any, vocab: int, eos: int) -> Callable[[dict[str, Any]], Any]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    bitmask = llguidance.torch.allocate_token_bitmask(1, lltok.vocab_size)

    def build(schema: dict[str, Any]) -> Any:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        matcher = llguidance.LLMatcher(lltok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())

        def step(token: int) -> bool:
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            return bool(matcher.consume_token(token))

        return step

    return build


def _outlines(tok: Any, vocab: int, eos: int) -> Callable[[dict[str, Any]], Any]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    mapping: dict[str, list[int]] = {}
    for i in range(len(tok)):
        if i != eos:
            mapping.setdefault(tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)]), []).append(i)
    vocabulary = Vocabulary(eos, mapping)

    def build(schema: dict[str, Any]) -> Any:
        guide = Guide(Index(build_regex_from_schema(json.dumps(schema)), vocabulary))

        def step(token: int) -> bool:
            allowed = guide.get_tokens()
            guide.advance(token)
            return token in allowed

        return step

    return build


LIBRARIES = {"xgrammar": _xgrammar, "llguidance": _llguidance, "outlines-core": _outlines}


def run_benchmark() -> dict[str, Any]:
    from transformers import AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    vocab, eos = len(tok), int(tok.eos_token_id)
    rows: list[dict[str, Any]] = []
    for lib, factory in LIBRARIES.items():
        try:
            t0 = time.perf_counter()
            build = factory(tok, vocab, eos)
            setup_ms = (time.perf_counter() - t0) * 1e3
        except ImportError as exc:
            print(f"{lib}: not installed ({exc})")
            continue
        rows.append({"library": lib, "case": "(vocabulary set-up)", "compile_ms": rnd(setup_ms, 1)})
        for name, schema, sample in CASES:
            # the same compact serialisation the constrained engines emit (", " and ": ")
            ids = tok.encode(json.dumps(sample), add_special_tokens=False)
            row: dict[str, Any] = {"library": lib, "case": name}
            try:
                t0 = time.perf_counter()
                step = build(schema)
                row["compile_ms"] = rnd((time.perf_counter() - t0) * 1e3, 2)
                t0 = time.perf_counter()
                accepted = all(step(t) for t in ids)
                row["us_per_token"] = rnd((time.perf_counter() - t0) * 1e6 / len(ids), 1)
                row["ok"] = accepted
            except Exception as exc:  # noqa: BLE001 - coverage: record what failed
                row["ok"] = False
                row["error"] = str(exc).splitlines()[0][:80]
            rows.append(row)
    return {"rows": rows, "vocab": vocab}


def main() -> None:
    setup_torch()
    started = context()
    report = run_benchmark()
    print_table(report["rows"], ["library", "case", "ok", "compile_ms", "us_per_token", "error"],
                "grammar libraries on the SmolLM2 vocabulary")
    write_report("grammar-libs", report, False, started)


if __name__ == "__main__":
    main()
