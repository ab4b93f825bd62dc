"""Profile of the rolling-batch hot path with py-spy (sampling, so the profile costs the target
nothing): ``py-spy record -f raw`` around ``python -m benchmarks.profile --target``, which pushes a
mixed workload through ``djl_handlers.huggingface``'s ``handle()`` at up to batch 16. The collapsed
stacks are reduced to the inclusive share of samples for the frames that matter (model forward,
attention mask building, sampling, KV compaction/merge, detokenizer, formatter, records) and the
top self (leaf) frames. Needs ``pip install py-spy``; findings in docs/profile.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, rnd

# label -> substring of a py-spy frame "function (file:line)"
FRAMES = {
    "handle() total": "_rolling_step (djl_handlers/service.py",
    "engine.step": "step (djl_handlers/engines/hf/engine.py",
    "  model forward (all)": "forward (transformers/models/llama/modeling_llama.py",
    "  attention mask building": "create_causal_mask (transformers/masking_utils.py",
    "  sdpa attention": "sdpa_attention_forward",
    "  slab cache update": "update (djl_handlers/engines/hf/batch.py",
    "  prefill": "_prefill (djl_handlers/engines/hf/engine.py",
    "  decode": "_decode (djl_handlers/engines/hf/engine.py",
    "  sampling (sample_batch)": "sample_batch (djl_handlers/engines/hf/sampling.py",
    "  compaction (_compact)": "_compact (djl_handlers/engines/hf/engine.py",
    "  merge of new rows": "_merge (djl_handlers/engines/hf/engine.py",
    "  grow_mask": "grow_mask (djl_handlers/engines/hf/batch.py",
    "parse": "parse_request (djl_handlers/dialects/dispatch.py",
    "tokenize prompt": "tokenize_prompt (djl_handlers/scheduling/slot.py",
    "detokenize": "push (djl_handlers/scheduling/detokenizer.py",
    "format": "__call__ (djl_handlers/formatting/lmi.py",
    "records (binary_encode)": "binary_encode (djl_handlers/io/outputs.py",
}


def target(steps_quick: bool) -> None:
    """The profiled process: a mixed workload through handle(), batch <= 16."""
    from benchmarks.common import setup_torch

    setup_torch()
    from benchmarks.engine_throughput import load_hf, run_rolling
    from benchmarks.workload import mixed_workload
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    _, tok = load_hf(model_dir)
    kw: dict[str, Any] = {"n": 8, "prompt_range": (16, 64), "new_range": (8, 16)} if steps_quick else \
        {"n": 24, "prompt_range": (16, 256), "new_range": (16, 64)}
    run_rolling(model_dir, mixed_workload(tok, **kw), max_batch=16)


def summarize(raw: str) -> dict[str, Any]:
    """Inclusive shares of FRAMES and the top self frames from py-spy's collapsed stacks."""
    total, inclusive, leaf = 0, Counter[str](), Counter[str]()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if not any("_rolling_step" in f for f in frames):
            continue  # model loading, imports
        total += n
        for label, needle in FRAMES.items():
            if any(needle in f for f in frames):
                inclusive[label] += n
        leaf[frames[-1].split(" (")[0] + " (" + frames[-1].split("/")[-1]] += n
    return {"samples_in_handle": total,
            "inclusive": [{"frame": k, "pct": rnd(100 * inclusive[k] / total, 1) if total else None} for k in FRAMES],
            "top_self": [{"frame": k, "pct": rnd(100 * v / total, 1)} for k, v in leaf.most_common(15)]}


def run_benchmark(quick: bool) -> dict[str, Any]:
    """Record the target with py-spy and summarize."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stacks.txt"
        cmd = [spy, "record", "-r", "100", "-f", "raw", "-o", str(out), "--", sys.executable, "-m",
               "benchmarks.profile", "--target"] + (["--quick"] if quick else [])
        subprocess.run(cmd, cwd=str(ROOT), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=600)
        report = summarize(out.read_text())
    report["sampler"] = "py-spy record -r 100 -f raw (Python frames only)"
    return report


def main() -> None:
    """``python -m benchmarks.profile --target [--quick]`` (what py-spy runs)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.target:
        target(args.quick)


if __name__ == "__main__":
    main()
