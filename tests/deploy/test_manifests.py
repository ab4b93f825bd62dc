"""The Kubernetes manifests under deploy/ are valid and agree with the handler.

Built-in kinds are validated strictly (unknown fields are errors) by ``kubernetes-validate``, which
ships the published Kubernetes JSON schemas (offline). The LeaderWorkerSet is validated against its
CRD's published schema (``schemas/leaderworkerset-v1.json``, see ``schemas/README.md``), made strict
the same way, and its pod templates as Kubernetes ``PodTemplate``s. Then the contents: each
``serving.properties`` passes the handler's own start-up checks (``config.preflight``), a pod asks
for one GPU per rank (a LeaderWorkerSet group: its pods together), a group spanning several pods
runs vLLM's Ray executor, probes and Services point at the port the server listens on, and the
autoscaler reads metrics our ``/metrics`` serves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.preflight import ENGINE_OF_ENTRY_POINT, preflight
from djl_handlers.config.properties import parse_properties, split_properties

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
LWS_SCHEMA = Path(__file__).parent / "schemas" / "leaderworkerset-v1.json"
KUBERNETES = "1.31"  # the oldest release the manifests are written for (LeaderWorkerSet needs 1.26+)
GPU = "nvidia.com/gpu"
# The split-relevant config.json fields of the models the manifests name (their published configs):
# the handler's start-up check reads them from the weights folder, which a test stands in for.
SHAPES = {
    "/models/llama-3.1-8b-instruct": {"num_attention_heads": 32, "num_key_value_heads": 8,
                                      "num_hidden_layers": 32, "intermediate_size": 14336},
    "/models/llama-3.1-70b-instruct": {"num_attention_heads": 64, "num_key_value_heads": 8,
                                       "num_hidden_layers": 80, "intermediate_size": 28672},
    "/models/llama-3.1-405b-instruct-fp8": {"num_attention_heads": 128, "num_key_value_heads": 8,
                                            "num_hidden_layers": 126, "intermediate_size": 53248},
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


ALL = [(path.name, doc) for path in MANIFESTS for doc in documents(path)]


def _ids(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}:{item[1]['kind']}/{item[1]['metadata']['name']}"


def _strict(schema: Any) -> Any:
    """A CRD schema where unknown fields are errors (the API server would silently prune them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def validate_lws(doc: dict[str, Any]) -> None:
    schema = _strict(json.loads(LWS_SCHEMA.read_text(encoding="utf-8")))
    jsonschema.Draft4Validator(schema).validate(doc)
    template = doc["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        if key in template:
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{key}"},
                            "template": template[key]}
            kubernetes_validate.validate(pod_template, KUBERNETES, strict=True)


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "LeaderWorkerSet":
        validate_lws(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_manifests_are_there() -> None:
    kinds = {doc["kind"] for _, doc in ALL}
    assert {"Deployment", "Service", "ConfigMap", "LeaderWorkerSet", "HorizontalPodAutoscaler"} <= kinds


@pytest.mark.parametrize("item", ALL, ids=_ids)
def test_valid_against_the_published_schemas(item: tuple[str, dict[str, Any]]) -> None:
    validate(item[1])


@pytest.mark.parametrize(("kind", "path", "bad"), [
    ("Deployment", ("spec", "template", "spec", "containers", 0, "resource"), {"limits": {}}),  # typo
    ("HorizontalPodAutoscaler", ("spec", "minReplica"), 1),
    ("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "sizes"), 2),
    ("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "workerTemplate", "spec", "containers", 0, "imag"), "x"),
    ("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),  # not an allowed value
])
def test_the_validation_catches_mistakes(kind: str, path: tuple[Any, ...], bad: Any) -> None:
    doc = copy.deepcopy(next(d for _, d in ALL if d["kind"] == kind))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


def _pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if doc["kind"] == "Deployment":
        yield doc["spec"]["template"]["spec"]
    elif doc["kind"] == "LeaderWorkerSet":
        template = doc["spec"]["leaderWorkerTemplate"]
        yield template["leaderTemplate"]["spec"]
        yield template["workerTemplate"]["spec"]


def _gpus(pod: dict[str, Any]) -> int:
    return sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in pod["containers"])


def _served(doc: dict[str, Any], manifest: str) -> tuple[ServingConfig, dict[str, str], dict[str, str]]:
    """The ServingConfig of the model directory the workload mounts at /opt/ml/model."""
    pod = next(_pod_specs(doc))
    [volume] = [v for v in pod["volumes"] if any(m["mountPath"] == "/opt/ml/model" and m["name"] == v["name"]
                                                for c in pod["containers"] for m in c.get("volumeMounts", []))]
    [config_map] = [d for name, d in ALL if name == manifest and d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == volume["configMap"]["name"]]
    server, options = split_properties(parse_properties(config_map["data"]["serving.properties"]))
    engine = ENGINE_OF_ENTRY_POINT[options["entryPoint"]]
    return ServingConfig.from_properties(options, server, engine), options, server


WORKLOADS = [(name, doc) for name, doc in ALL if doc["kind"] in ("Deployment", "LeaderWorkerSet")]


@pytest.mark.parametrize("item", WORKLOADS, ids=_ids)
def test_model_directory_passes_the_handlers_checks_and_gpus_match_the_ranks(
        item: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    manifest, doc = item
    config, options, server = _served(doc, manifest)
    weights = tmp_path / "weights"  # stands in for the mounted weights: their config.json
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                     **SHAPES[options["model_id"]]}))
    # the checks serve runs at start-up, the model split included
    preflight(options["entryPoint"], str(tmp_path), {**options, "model_id": str(weights)}, server)
    ranks = config.parallel.world_size()
    pods = list(_pod_specs(doc))
    if doc["kind"] == "LeaderWorkerSet":
        size = doc["spec"]["leaderWorkerTemplate"]["size"]
        gpus = _gpus(pods[0]) + (size - 1) * _gpus(pods[1])
        assert size > 1 and config.parallel.distributed_executor_backend == "ray"  # ranks span the pods
        assert config.parallel.pipeline_parallel_degree == size  # one pipeline stage per node
    else:
        gpus = _gpus(pods[0])
        assert config.parallel.distributed_executor_backend in (None, "mp")  # one node
    assert gpus == ranks, f"{manifest}: {gpus} GPUs for {ranks} ranks"


def _listen_port(container: dict[str, Any]) -> int:
    words = [*container.get("command", []), *container.get("args", [])]
    text = " ".join(words).split()
    return int(text[text.index("--port") + 1])


@pytest.mark.parametrize("item", WORKLOADS, ids=_ids)
def test_probes_and_services_reach_the_servers_port(item: tuple[str, dict[str, Any]]) -> None:
    manifest, doc = item
    server = next(_pod_specs(doc))["containers"][0]
    port = _listen_port(server)
    named = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert named["http"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in server:
            assert server[probe]["httpGet"]["path"] == "/ping" and named[server[probe]["httpGet"]["port"]] == port
    labels = (doc["spec"]["template"]["metadata"]["labels"] if doc["kind"] == "Deployment"
              else doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"])
    [service] = [d for name, d in ALL if name == manifest and d["kind"] == "Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_autoscaler_reads_metrics_our_server_serves() -> None:
    from djl_handlers.server.metrics import Metrics

    served = {family.name for family in Metrics("model").registry.collect()}
    [hpa] = [d for _, d in ALL if d["kind"] == "HorizontalPodAutoscaler"]
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names and set(names) <= served
    [deployment] = [d for _, d in ALL if d["kind"] == "Deployment"
                    and d["metadata"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    assert int(annotations["prometheus.io/port"]) == _listen_port(server)
    [rules] = [d for _, d in ALL if d["metadata"]["name"] == "prometheus-adapter-djl-handlers"]
    exposed = {rule["name"]["as"] for rule in yaml.safe_load(rules["data"]["config.yaml"])["rules"]}
    assert set(names) <= exposed
