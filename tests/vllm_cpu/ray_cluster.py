"""A two-node Ray cluster on 127.0.0.1 for tests: a head node (GCS + raylet) and a second node (its
own raylet), started by Ray's multi-node test utility (``ray.cluster_utils.Cluster``) in a helper
process of its own session, so stopping it stops every process the cluster started. No dashboard,
no usage stats, a small object store, bounded start-up.

Why not two ``ray start`` commands: Ray replaces ``127.0.0.1`` as a node or bootstrap address by the
machine's routable address, unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (its single-machine
switch), with which ``ray start`` refuses to start a second node. The helper runs with that switch,
so both nodes register as 127.0.0.1; drivers (this test, vLLM's engine core) join with
``RayCluster.env`` (``RAY_ADDRESS`` plus the same switch) and Ray's token authentication off, as
nothing here listens beyond the loopback interface.

Run as a script (``python ray_cluster.py ADDRESS_FILE CPUS GPUS``) it is that helper: it writes the
head's address to ADDRESS_FILE once both nodes are up and shuts the cluster down on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
       "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}
OBJECT_STORE_BYTES = 100 * 1024 * 1024
START_S = 300


class RayCluster:
    """The helper process and the head's address (``address``); ``env`` is what a driver needs."""

    def __init__(self, folder: Path, cpus_per_node: int = 1, gpus_per_node: int = 0) -> None:
        self.folder = folder
        address_file = folder / "address"
        log = open(folder / "cluster.log", "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen([sys.executable, __file__, str(address_file), str(cpus_per_node),
                                      str(gpus_per_node)], stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **ENV}, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_S
        while not address_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Ray cluster did not start: {self.log()[-4000:]}")
            time.sleep(0.5)
        self.address = address_file.read_text().strip()
        self.env = {**ENV, "RAY_ADDRESS": self.address}

    def log(self) -> str:
        return (self.folder / "cluster.log").read_text(errors="replace")

    def stop(self, grace_s: float = 60) -> None:
        """SIGTERM the helper (it shuts the cluster down), then SIGKILL what is left of its session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def leftovers(self) -> list[int]:
        """Pids still running in the helper's session (empty after ``stop``; zombies do not count)."""
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                running = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                if running and os.getsid(int(entry.name)) == self.proc.pid:
                    alive.append(int(entry.name))
            except (OSError, IndexError):
                continue
        return alive


def _serve(address_file: Path, cpus: int, gpus: int) -> None:
    from ray.cluster_utils import Cluster

    node = {"num_cpus": cpus, "num_gpus": gpus, "object_store_memory": OBJECT_STORE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes(timeout=START_S)
        address_file.write_text(cluster.address + "\n")
        print(f"ray cluster up at {cluster.address}", flush=True)
        while not stopping:
            time.sleep(0.2)
    finally:
        cluster.shutdown()
        print("ray cluster stopped", flush=True)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
