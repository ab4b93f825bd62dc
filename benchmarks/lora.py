"""``python -m benchmarks.lora [--tokens N] [--model embedded|tiny]``: the cost of mixed-adapter batches.

Runs the HF engine (our continuous batching) on the embedded SmolLM2 fp32 with 8 and 32 rows, each
row generating ``--tokens`` tokens, in three modes side by side: ``base`` (no adapter), ``1 adapter``
(every row uses the same adapter) and ``4 adapters`` (rows cycle through four). The adapters are
random rank-16 PEFT LoRAs on every attention and MLP projection (made with peft in a tmp folder).
``4 adapters`` runs with both strategies of ``engines/hf/lora.py`` (``stacked``, the default, and
``grouped``). Then one forward of a mixed 4-adapter batch (no cache) compares the two strategies
with peft's own mixed-adapter inference (``adapter_names=...``).

Prints tables and writes ``benchmarks/results/lora.json``. Read the ratios, not the absolute tok/s:
the box is shared (2 cores, other jobs running; the load average is recorded).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import ROOT, context, print_table, rnd, setup_torch, write_report

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPT = "The history of the printing press begins in"


def _model(which: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.model.embedded import embedded_model_dir

    path = embedded_model_dir()
    if which == "tiny":
        from djl_handlers.model.tiny import tiny_model_dir

        path = tiny_model_dir(Path(tempfile.mkdtemp(prefix="lora-bench-tiny")), source=path)
    tok = AutoTokenizer.from_pretrained(str(path))
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval(), tok


def _adapters(model: Any, root: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from lora_adapters import make_adapter

    return [make_adapter(model, root / f"lora{i}", seed=100 + i, rank=16, alpha=16, targets=TARGETS, std=0.02)
            for i in range(4)]


def _engine_run(model: Any, tok: Any, folders: list[Path], rows: int, mode: str, tokens: int,
                strategy: str = "stacked") -> dict[str, Any]:
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.engines.hf.lora import LoraSet
    from djl_handlers.lora.registry import AdapterSpec
    from djl_handlers.params.generation import GenerationParameters

    engine = HFEngine(model, tok, max_batch_size=rows, max_prefill_tokens=4096)
    lora = LoraSet(model, max_loras=4, max_lora_rank=16)
    lora.strategy = strategy
    engine.lora = lora
    for i, folder in enumerate(folders):
        engine.load_adapter(AdapterSpec(f"l{i}", str(folder)))
    names: list[Optional[str]] = {"base": [None] * rows, "1 adapter": ["l0"] * rows,
                                  "4 adapters": [f"l{i % 4}" for i in range(rows)]}[mode]
    params = GenerationParameters.from_dict({"max_new_tokens": tokens}, "huggingface")
    ids = tok(PROMPT).input_ids
    for rid, name in enumerate(names):
        engine.add_request(EngineRequest(rid, ids, params, PROMPT, name))
    counts = [0] * rows
    started = time.perf_counter()
    cpu = time.process_time()
    while engine.has_unfinished():
        for out in engine.step():
            counts[out.request_id] += 1
            if counts[out.request_id] >= tokens:
                engine.release(out.request_id)
    wall, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    lora.close()
    total = sum(counts)
    return {"rows": rows, "mode": mode, "strategy": strategy if mode != "base" else "-",
            "tokens": total, "wall_s": rnd(wall, 3), "tok_s": rnd(total / wall, 1),
            "tok_per_cpu_s": rnd(total / cpu_s, 1)}


def _forward_compare(model: Any, tok: Any, folders: list[Path], rows: int, repeats: int) -> dict[str, Any]:
    """One [rows, T] forward with 4 adapters mixed: our hooks vs peft's ``adapter_names``."""
    import torch
    from peft import PeftModel

    from djl_handlers.engines.hf.lora import LoraSet
    from djl_handlers.lora.registry import AdapterSpec

    ids = tok([PROMPT] * rows, return_tensors="pt").input_ids
    names = [f"l{i % 4}" for i in range(rows)]
    ours_model = copy.deepcopy(model)
    lora = LoraSet(ours_model, max_loras=4, max_lora_rank=16)
    for i, folder in enumerate(folders):
        lora.load(AdapterSpec(f"l{i}", str(folder)))
    peft_model = PeftModel.from_pretrained(copy.deepcopy(model), str(folders[0]), adapter_name="l0")
    for i, folder in enumerate(folders[1:], start=1):
        peft_model.load_adapter(str(folder), adapter_name=f"l{i}")
    peft_model.eval()

    def ours() -> Any:
        lora.strategy = "stacked"
        lora.use([lora.resolve(n) for n in names])
        return ours_model(input_ids=ids).logits

    def grouped() -> Any:
        lora.strategy = "grouped"
        lora.use([lora.resolve(n) for n in names])
        return ours_model(input_ids=ids).logits

    def peft() -> Any:
        return peft_model(input_ids=ids, adapter_names=names).logits

    def base() -> Any:
        lora.use([None] * rows)
        return ours_model(input_ids=ids).logits

    times: dict[str, float] = {}
    with torch.inference_mode():
        reference = peft()
        same = bool(torch.allclose(ours(), reference, atol=1e-4) and torch.allclose(grouped(), reference, atol=1e-4))
        for label, fn in (("base", base), ("ours", ours), ("grouped", grouped), ("peft", peft)):
            fn()
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[label] = (time.perf_counter() - start) / repeats * 1000
    return {"rows": rows, "tokens_per_row": int(ids.shape[1]), "base_ms": rnd(times["base"], 1),
            "stacked_ms": rnd(times["ours"], 1), "grouped_ms": rnd(times["grouped"], 1),
            "peft_ms": rnd(times["peft"], 1),
            "peft_vs_ours": rnd(times["peft"] / times["ours"], 2), "logits_equal": same}


def run_benchmark(tokens: int, which: str, repeats: int) -> dict[str, Any]:
    model, tok = _model(which)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        folders = _adapters(model, Path(tmp))
        results = [_engine_run(model, tok, folders, rows, mode, tokens, strategy)
                   for rows in (8, 32)
                   for mode, strategy in (("base", "stacked"), ("1 adapter", "stacked"), ("4 adapters", "stacked"),
                                          ("4 adapters", "grouped"))]
        forward = [_forward_compare(model, tok, folders, rows, repeats) for rows in (8, 32)]
    for row in results:
        base = next(r for r in results if r["rows"] == row["rows"] and r["mode"] == "base")  # same rows, no adapter
        row["vs_base"] = rnd(row["tok_s"] / base["tok_s"], 2)
        row["cpu_vs_base"] = rnd(row["tok_per_cpu_s"] / base["tok_per_cpu_s"], 2)
    return {"model": which, "tokens_per_row": tokens, "adapter_rank": 16, "targets": list(TARGETS),
            "engine": results, "forward": forward}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lora", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per row")
    parser.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    parser.add_argument("--repeats", type=int, default=3, help="forwards timed per variant")
    args = parser.parse_args(argv)
    setup_torch()
    started = context()
    report = run_benchmark(args.tokens, args.model, args.repeats)
    print_table(report["engine"], ["rows", "mode", "strategy", "tok_s", "vs_base", "tok_per_cpu_s", "cpu_vs_base",
                                   "tokens", "wall_s"],
                f"HF engine, {args.model}, {args.tokens} tokens/row, rank-16 adapters on all projections")
    print_table(report["forward"], ["rows", "tokens_per_row", "base_ms", "stacked_ms", "grouped_ms", "peft_ms",
                                    "peft_vs_ours", "logits_equal"],
                "one forward, 4 adapters mixed: our hooks (stacked, grouped) vs peft adapter_names")
    write_report("lora", report, False, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
