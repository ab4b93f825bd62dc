"""One rank of a DeepSpeed tensor-parallel run on CPU, started by ``test_deepspeed_real.py``.

DJL Serving starts one MPI process per rank and feeds every rank the same batches; there is no
MPI here, so the test starts ``WORLD_SIZE`` copies of this script with ``RANK``/``LOCAL_RANK``/
``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set (what ``deepspeed.init_distributed`` reads)
and each one drives ``djl_handlers.deepspeed.handle`` with the same requests, joining at the same
steps, through the in-process emulation of DJL's Java rolling-batch loop.

Usage: ``python deepspeed_tp_worker.py MODEL_DIR OUT_JSON``. Every rank writes
``{"rank", "world_size", "texts", "shards", "shm_vector_kernel_level", "load_s", "run_s",
"tokens"}`` to ``OUT_JSON.<rank>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# (prompt, max_new_tokens, step at which the request joins)
REQUESTS: tuple[tuple[str, int, int], ...] = (
    ("Deep learning is", 6, 0),
    ("The capital of France is", 4, 2),
    ("Once upon a time, in a small village,", 5, 3),
)


def _shards(model: Any) -> dict[str, list[int]]:
    """Shapes of the first layer's projections (AutoTP splits them across ranks)."""
    layer = model.model.layers[0]
    return {
        "q_proj": list(layer.self_attn.q_proj.weight.shape),
        "o_proj": list(layer.self_attn.o_proj.weight.shape),
        "down_proj": list(layer.mlp.down_proj.weight.shape),
    }


def main(model_dir: str, out_path: str) -> None:
    """Initialise the handler with ``tensor_parallel_degree=WORLD_SIZE``, run REQUESTS, dump results."""
    from djl_handlers import deepspeed as entry
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    options = {
        "model_id": model_dir,
        "rolling_batch": "deepspeed",
        "dtype": "fp32",
        "tensor_parallel_degree": str(world),
        "torch_threads": "1",
    }
    start = time.perf_counter()
    driver = RollingBatchDriver(entry.handle)
    assert driver.init(options) is None
    load_s = time.perf_counter() - start
    engine = entry._service._service.engine  # type: ignore[union-attr]

    start = time.perf_counter()
    submitted = []
    for step in range(max(r[2] for r in REQUESTS) + 1):
        for prompt, n, join in REQUESTS:
            if join == step:
                body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}
                submitted.append(driver.submit(json_request(body)))
        if driver.active:
            driver.step()
    driver.run()
    run_s = time.perf_counter() - start

    import deepspeed

    bodies = [json.loads(r.text) for r in submitted]
    result = {
        "rank": rank,
        "world_size": world,
        "texts": [b["generated_text"] for b in bodies],
        "tokens": sum(b["details"]["generated_tokens"] for b in bodies),
        "shards": _shards(engine.model),
        "shm_vector_kernel_level": deepspeed.comm.comm.cdb.shm_vector_kernel_level,
        "load_s": round(load_s, 2),
        "run_s": round(run_s, 2),
    }
    Path(f"{out_path}.{rank}").write_text(json.dumps(result))
    # leave together and tear the process group down before the interpreter does: a rank exiting with
    # gloo's threads still live while the other is mid-call once aborted ("terminate called without
    # an active exception") on a loaded machine
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
