"""``option.dtype=bf16`` served by ``djl-handlers serve`` on this CPU as it is and at the AVX2 level
(oneDNN without bf16, torch's AVX2 kernels, the C kernels built for x86-64-v3): the server starts,
says which path its linear layers take, and answers fp32's greedy tokens wherever fp32 is decided
(its two best logits at least 0.5 apart: the agreement docs/engines.md documents)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import pytest
from test_server_harness import ServerProcess

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytest_plugins = ["conftest_models"]
LOWER_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "DJL_HANDLERS_KERNEL_MARCH": "x86-64-v3"}
PROMPT = "The capital of France is"
NEW = 12
GAP = 0.5


def _fp32_decided_prefix(model_dir: Path) -> list[int]:
    """fp32's greedy tokens up to (not including) the first position where its two best logits are
    closer than :data:`GAP`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = tok.encode(PROMPT)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
    decided: list[int] = []
    for token, scores in zip(out.sequences[0, len(ids):].tolist(), out.scores, strict=True):
        top = scores[0].float().topk(2).values
        if float(top[0] - top[1]) < GAP:
            break
        decided.append(int(token))
    return decided


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_bf16_serves_fp32s_decided_tokens_on_every_isa_level(tmp_path: Path, embedded_dir: Path, isa: str) -> None:
    if isa == "avx2" and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 ISA levels")
    from djl_handlers.engines.hf.cpu.isa import features

    if isa == "native" and features().isa == "avx2":
        pytest.skip("this CPU's own level is the AVX2 level: the [avx2] case serves on it")
    model = tmp_path / "bf16"
    model.mkdir()
    (model / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
        f"option.model_id={embedded_dir}\noption.dtype=bf16\noption.rolling_batch=scheduler\n", encoding="utf-8")
    env: dict[str, Any] = {"HF_HUB_OFFLINE": "1", "DJL_HANDLERS_KERNEL_DIR": str(tmp_path / "kernels")}
    if isa == "avx2":
        env.update(LOWER_ISA)
    server = ServerProcess(model, tmp_path / "server.log", env=env, start_timeout=300)
    try:
        with server.client() as client:
            reply = client.post("/invocations", json={"inputs": PROMPT, "parameters": {
                "max_new_tokens": NEW, "details": True, "ignore_eos_token": True}})
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_text()
    assert reply.status_code == 200, reply.text
    details = reply.json()["details"]
    assert details["generated_tokens"] == NEW
    served = [int(t["id"][0]) for t in details["tokens"]]  # LMI: "id": [int]
    decided = _fp32_decided_prefix(embedded_dir)
    assert served[:len(decided)] == decided, (served, decided)
    if isa == "avx2":
        assert "fp32-over-bf16" in log and "option.dtype=fp32 is as fast or faster on this CPU" in log, log[-3000:]
