"""lm-evaluation-harness (``lm_eval --model local-completions``) against ``djl-handlers serve`` on
the embedded model (fp32): a local multiple-choice task (loglikelihood requests: token-id prompts in
batches of 4 per request, ``echo``, ``logprobs: 1``, ``max_tokens: 1``) and a local generate_until
task, both from ``tests/lm_eval_tasks`` (no download: the hub and datasets are offline, the tokenizer
is the embedded model's folder).

Checked: every request is answered; each choice's log-likelihood is within 0.05 of transformers'
own forward over the same tokens, and the accuracy is the one those give; each generation is
transformers' greedy ``generate()`` text, cut where lm_eval cuts it. With
``DJL_HANDLERS_LM_EVAL_VLLM=1`` (and ``.venv-vllm``) the same run against ``vllm serve`` on the same
folder must give the same accuracy, exact match and texts, and log-likelihoods within 0.05; the
summary is printed (``-s``) — docs/compatibility.md records it.

Needs lm_eval in ``.venv-lm-eval`` (``bash scripts/setup_lm_eval.sh``; ``DJL_HANDLERS_LM_EVAL`` may
name another ``lm_eval`` executable); skipped without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_models import embedded_dir, real_model  # noqa: F401
from test_server_harness import ROOT, ServerProcess

pytestmark = pytest.mark.slow

TASKS_DIR = ROOT / "tests" / "lm_eval_tasks"
MC, GEN = "djl_local_mc", "djl_local_gen"
TOLERANCE = 0.05
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def lm_eval_executable() -> Path | None:
    named = os.environ.get("DJL_HANDLERS_LM_EVAL")
    path = Path(named) if named else ROOT / ".venv-lm-eval" / "bin" / "lm_eval"
    return path if path.exists() else None


LM_EVAL = lm_eval_executable()
if LM_EVAL is None:
    pytest.skip("lm_eval is not installed: bash scripts/setup_lm_eval.sh (or set DJL_HANDLERS_LM_EVAL)",
                allow_module_level=True)


def run_lm_eval(url: str, tokenizer: Path, out: Path) -> dict[str, Any]:
    """Both tasks against ``url``: accuracy, exact match, each doc's per-choice log-likelihoods and
    generated text."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(out / "datasets"),
           "TOKENIZERS_PARALLELISM": "false"}
    args = f"model=smollm,base_url={url}/v1/completions,tokenizer={tokenizer},tokenizer_backend=huggingface," \
           "num_concurrent=1,max_retries=1"
    done = subprocess.run([str(LM_EVAL), "run", "--model", "local-completions", "--model_args", args,
                           "--tasks", f"{MC},{GEN}", "--include_path", str(TASKS_DIR), "--batch_size", "4",
                           "--output_path", str(out), "--log_samples"],
                          cwd=str(TASKS_DIR), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [results] = out.rglob("results_*.json")
    metrics = json.loads(results.read_text())["results"]
    samples = {task: [json.loads(line) for path in out.rglob(f"samples_{task}_*.jsonl")
                      for line in path.read_text().splitlines()] for task in (MC, GEN)}
    return {
        "acc": metrics[MC]["acc,none"],
        "exact_match": metrics[GEN]["exact_match,strip"],
        "mc": {s["doc_id"]: s for s in samples[MC]},
        "gen": {s["doc_id"]: s["resps"][0][0] for s in samples[GEN]},
        "gen_samples": {s["doc_id"]: s for s in samples[GEN]},
    }


def choice_lls(sample: dict[str, Any]) -> list[float]:
    return [float(resp[0][0]) for resp in sample["resps"]]


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm_eval's split of a (context, continuation) pair into tokens (``TemplateLM._encode_pair``)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    start = len(tokenizer.encode(context, add_special_tokens=False))
    return whole[:start], whole[start:]


def direct_ll(model: Any, tokenizer: Any, context: str, continuation: str) -> float:
    """log P(continuation | context) from one transformers forward (fp32)."""
    ctx, cont = encode_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lps = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return float(sum(lps[len(ctx) + i - 1, t] for i, t in enumerate(cont)))


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> dict[str, Any]:  # noqa: F811
    work = tmp_path_factory.mktemp("lm-eval-djl")
    server = ServerProcess(ROOT / "serving.properties.examples" / "hf-rolling-batch", work / "server.log")
    try:
        return run_lm_eval(server.url, embedded_dir, work / "out")
    finally:
        server.stop()


def test_lm_eval_gives_transformers_log_likelihoods(ours: dict[str, Any], real_model: Any) -> None:  # noqa: F811
    model, tokenizer = real_model
    assert len(ours["mc"]) == 12 and len(ours["gen"]) == 10
    correct = 0
    for sample in ours["mc"].values():
        got = choice_lls(sample)
        pairs = [(a["arg_0"], a["arg_1"]) for _, a in sorted(sample["arguments"].items(),
                                                               key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
        expected = [direct_ll(model, tokenizer, ctx, cont) for ctx, cont in pairs]
        assert got == pytest.approx(expected, abs=TOLERANCE)
        correct += int(max(range(len(expected)), key=expected.__getitem__) == int(sample["target"]))
    assert ours["acc"] == pytest.approx(correct / len(ours["mc"]))


def test_lm_eval_generations_are_transformers_greedy_text(ours: dict[str, Any], real_model: Any) -> None:  # noqa: F811
    model, tokenizer = real_model
    for doc, sample in ours["gen_samples"].items():
        args = sample["arguments"]["gen_args_0"]
        ids = torch.tensor([tokenizer.encode(args["arg_0"], add_special_tokens=False)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=args["arg_1"]["max_gen_toks"], do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        for stop in args["arg_1"]["until"]:
            text = text.split(stop)[0]
        assert ours["gen"][doc] == text


@contextlib.contextmanager
def vllm_serve(model_dir: Path, log: Path) -> Iterator[str]:
    """``vllm serve model_dir`` (its OpenAI server, fp32) on 127.0.0.1; yields its base URL."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(model_dir), "--served-model-name", "smollm", "--host", "127.0.0.1", "--port",
                                 str(port), "--dtype", "float32", "--max-model-len", "2048", "--seed", "0"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            time.sleep(2)
        else:
            raise RuntimeError(f"vllm serve did not start; see {log}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.environ.get("DJL_HANDLERS_LM_EVAL_VLLM") != "1" or not VLLM_PYTHON.exists(),
                    reason="set DJL_HANDLERS_LM_EVAL_VLLM=1 (with .venv-vllm) to compare with vllm serve")
def test_lm_eval_matches_vllm_serve(ours: dict[str, Any], embedded_dir: Path,  # noqa: F811
                                    tmp_path: Path) -> None:
    with vllm_serve(embedded_dir, tmp_path / "vllm.log") as url:
        theirs = run_lm_eval(url, embedded_dir, tmp_path / "out")
    diffs = [abs(a - b) for doc, sample in ours["mc"].items()
             for a, b in zip(choice_lls(sample), choice_lls(theirs["mc"][doc]), strict=True)]
    summary = {"acc": {"djl-handlers serve": ours["acc"], "vllm serve": theirs["acc"]},
               "exact_match": {"djl-handlers serve": ours["exact_match"], "vllm serve": theirs["exact_match"]},
               "choices": len(diffs), "max_abs_ll_diff": max(diffs),
               "same_texts": sum(ours["gen"][d] == theirs["gen"][d] for d in ours["gen"]), "texts": len(ours["gen"])}
    print("lm_eval summary:", json.dumps(summary), file=sys.stderr)
    assert ours["acc"] == theirs["acc"] and ours["exact_match"] == theirs["exact_match"]
    assert max(diffs) <= TOLERANCE
    assert ours["gen"] == theirs["gen"]
