"""Ray across nodes, simulated on one machine: a Ray head and a second Ray node on 127.0.0.1
(``ray_cluster.py``), and vLLM with ``distributed_executor_backend=ray`` placing one rank on each.

The cluster test runs everywhere Ray is installed (``scripts/setup_vllm_cpu.sh`` puts it in
``.venv-vllm``): both nodes join and each runs a task of a strictly spread placement group.

The vLLM test is the GPU recipe: vLLM's CPU build cannot run over Ray. Its CPU platform declares no
Ray device (``CpuPlatform.ray_device_key`` is empty) and ``vllm.v1.executor.ray_utils.
initialize_ray_cluster`` raises ``ValueError: current platform cpu does not support ray.`` in the
engine core; the handler refuses that configuration before vLLM starts
(``test_vllm_cpu_parallel.py``). Where vLLM's platform has a Ray device (GPUs, one per node: set
``DJL_HANDLERS_RAY_GPUS_PER_NODE=1``), the test serves the embedded model with two tensor-parallel
ranks over the two nodes and checks that the texts equal transformers' greedy ones (which one vLLM
rank equals) and that the ranks' placement group spans both nodes. Every process the tests start
is stopped by them, within bounded times.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="needs Ray in .venv-vllm: bash scripts/setup_vllm_cpu.sh")

from ray_cluster import RayCluster  # noqa: E402 - after the Ray check

GPUS_PER_NODE = int(os.environ.get("DJL_HANDLERS_RAY_GPUS_PER_NODE", "0"))
PROMPTS = ("The capital of France is", "Deep learning is")
NEW_TOKENS = 16


def vllm_ray_reason() -> str | None:
    """Why vLLM cannot run over Ray here, or None."""
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        return (f"vLLM {vllm.__version__} on {current_platform.device_name} cannot run over Ray: its platform "
                "declares no Ray device, and vllm.v1.executor.ray_utils.initialize_ray_cluster raises "
                f"'ValueError: current platform {current_platform.device_name} does not support ray.' "
                "(the GPU recipe: DJL_HANDLERS_RAY_GPUS_PER_NODE=1 on a machine with two GPUs)")
    if GPUS_PER_NODE < 1:
        return "set DJL_HANDLERS_RAY_GPUS_PER_NODE=1 to give each Ray node a GPU"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    started = time.monotonic()
    ray_cluster = RayCluster(tmp_path_factory.mktemp("ray"), gpus_per_node=GPUS_PER_NODE)
    print(f"two-node Ray cluster at {ray_cluster.address} in {time.monotonic() - started:.1f}s")
    saved = {key: os.environ.get(key) for key in ray_cluster.env}
    os.environ.update(ray_cluster.env)  # drivers: this process and vLLM's engine core
    try:
        yield ray_cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ray_cluster.stop()
        deadline = time.monotonic() + 30
        while ray_cluster.leftovers() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray_cluster.leftovers() == [], "processes of the Ray cluster outlived it"


def _alive_nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node["Alive"]]


def test_two_nodes_on_the_loopback_each_run_a_task(cluster: RayCluster) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=cluster.address, logging_level="WARNING")
    nodes = _alive_nodes()
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
    assert len({n["NodeID"] for n in nodes}) == 2

    @ray.remote(num_cpus=1)
    def node_of_this_task() -> str:
        return str(ray.get_runtime_context().get_node_id())

    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=120)
    try:
        ran_on = ray.get([node_of_this_task.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote() for i in range(2)], timeout=120)
    finally:
        remove_placement_group(group)
    assert set(ran_on) == {n["NodeID"] for n in nodes}
    ray.shutdown()


def test_vllm_tensor_parallel_over_two_ray_nodes(cluster: RayCluster, embedded_dir: Path) -> None:  # noqa: F811
    reason = vllm_ray_reason()
    if reason:
        pytest.skip(reason)
    from test_vllm_cpu_parallel import OPTIONS, greedy

    import djl_handlers.vllm as handler
    from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

    want = greedy(embedded_dir)
    driver = RollingBatchDriver(handler.handle)
    assert driver.init({"model_id": str(embedded_dir), "rolling_batch": "vllm", **OPTIONS,
                        "tensor_parallel_degree": "2", "distributed_executor_backend": "ray"}) is None
    service = handler._service._service
    try:
        reqs = [driver.submit(json_request({"inputs": p, "parameters": {"max_new_tokens": NEW_TOKENS}}))
                for p in PROMPTS]
        driver.run()
        for prompt, req in zip(PROMPTS, reqs, strict=True):
            assert req.text and req.code is None, req.error
            assert json.loads(req.text)["generated_text"] == want[prompt][1]
        ray.init(address=cluster.address, logging_level="WARNING")
        spans = [set(table["bundles_to_node_id"].values()) for table in
                 ray.util.placement_group_table().values() if table["state"] == "CREATED"]
        assert any(len(nodes) == 2 for nodes in spans), spans  # one rank on each node
    finally:
        service.engine.engine.engine_core.shutdown()
        handler._service._service = None
