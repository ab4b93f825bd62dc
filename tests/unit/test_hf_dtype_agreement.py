"""``option.dtype=bf16`` and ``fp16`` on the CPU agree with fp32 as docs/engines.md documents, on the
path this CPU takes (run again at the AVX2 level by test_cpu_isa.py, where the linear layers compute
in fp32 over the 16-bit weights).

The documented agreement, teacher-forced over fp32's greedy text of the embedded model: the 16-bit
model's argmax equals fp32's at every position where fp32's two best logits are at least
:data:`engine_runs.AGREEMENT_GAP` apart (measured: the positions that differed all had gaps below
0.14). Whole greedy sequences can still part where two tokens are nearly tied;
benchmarks/cpu_dtypes.py counts those.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import AGREEMENT_PROMPTS as PROMPTS  # noqa: E402
from engine_runs import decided_agreement  # noqa: E402

pytest_plugins = ["conftest_models"]


@functools.cache
def _load(path: Path, dtype: str) -> Any:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.loader import LoadOptions, load_model

    props = {"model_id": str(path), "dtype": dtype, "rolling_batch": "scheduler"}
    return load_model(LoadOptions.from_config(ServingConfig.from_properties(props, engine="huggingface")))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_greedy_agrees_with_fp32_where_fp32_is_decided(embedded_dir: Path, dtype: str) -> None:
    ref, low = _load(embedded_dir, "fp32"), _load(embedded_dir, dtype)
    assert str(low.model.dtype) == {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[dtype]
    assert low.cpu_patches["cpu_linear"].startswith("applied"), low.cpu_patches
    decided = differing = 0
    for text in PROMPTS:
        ids = ref.tokenizer.encode(text)
        with torch.inference_mode():
            seq = ref.model.generate(torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False)
            want = ref.model(seq).logits[0, len(ids) - 1:-1].float()
            got = low.model(seq).logits[0, len(ids) - 1:-1].float()
        clear, differ = decided_agreement(want, got, text)
        decided += clear
        differing += differ
    assert decided >= len(PROMPTS) * 20 // 3  # the rule covers a good share of the positions
    assert differing <= len(PROMPTS) * 20 // 10  # and near-ties stay rare
