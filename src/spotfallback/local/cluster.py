"""A multi-node Ray cluster on one machine whose nodes are labelled like cloud spot/on-demand VMs.

Why: the runner, its end-to-end tests and the demo need real Ray nodes that can be drained,
killed and denied, without a cloud account. ``ray.cluster_utils.Cluster`` starts real raylets;
this wrapper adds what a cloud adds: market labels, node groups, and a view of which nodes are
up. The head has no CPUs so no training worker ever lands next to the driver and the Train
controller (the controller needs none), just as the head of a real cluster sits on on-demand
capacity. One idea, the cluster and its view of its nodes, kept in one module.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from spotfallback.config import Ladder, Tier, label_key_error, label_selector_value_error

if TYPE_CHECKING:
    from ray._private.node import Node

MARKET_LABEL = "ray.io/market-type"
REGION_LABEL = "ray.io/availability-region"
ZONE_LABEL = "ray.io/availability-zone"
GROUP_LABEL = "ray.io/node-group"
HEAD_GROUP = "head"
TRAIN_WORKER_CLASS = "RayTrainWorker"

# Environment of every raylet, hence of the Train controller and workers it starts.
LOCAL_RAY_ENV: Mapping[str, str] = {
    "RAY_TRAIN_V2_ENABLED": "1",
    # Ray Train V2 blocks each ray.train.report() until the controller's next poll (default
    # every 2 s): per-step reports would cost 2 s a step.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    # Workers learn of a drain within a second (default 5 s), so a few-second notice is usable.
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
    # Ray starts its workers (the Train controller and every training worker) at nice 15, so
    # that on a VM of their own they never slow the raylet down. Here all nodes share one
    # machine with the driver and whatever else runs on it, and each busy nice-0 process gets
    # about 28 times their CPU share: two of them on two cores stall training for minutes.
    "RAY_worker_niceness": "0",
}

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _node_label_error(key: str, value: str) -> str | None:
    """Why Ray would reject ``key=value`` as a node label (selectors allow more than nodes)."""
    problem = label_key_error(key) or label_selector_value_error(value)
    if problem is None and (value.startswith("!") or "(" in value):
        problem = f"node label value {value!r} must be a plain value, not a selector expression"
    return problem


@dataclass(frozen=True)
class NodeGroup:
    """A set of identical worker nodes, like one cloud node pool / instance group.

    ``market`` becomes ``ray.io/market-type`` and ``name`` (default: the market)
    ``ray.io/node-group``; ``labels`` are added last so they can override either.
    ``count`` is how many nodes start, and what ``Injector.replenish`` refills to.
    """

    market: str
    count: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    region: str | None = None
    zone: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.market)
        if self.count < 0:
            raise ValueError(f"node group {self.name!r}: count must be >= 0 (got {self.count})")
        if self.cpus < 0 or self.gpus < 0:
            raise ValueError(f"node group {self.name!r}: cpus and gpus must be >= 0")
        for key, value in self.node_labels().items():
            problem = _node_label_error(key, value)
            if problem:
                raise ValueError(f"node group {self.name!r}: {problem}")

    def node_labels(self) -> dict[str, str]:
        """Labels every node of this group carries."""
        labels = {GROUP_LABEL: self.name, MARKET_LABEL: self.market}
        if self.region:
            labels[REGION_LABEL] = self.region
        if self.zone:
            labels[ZONE_LABEL] = self.zone
        labels.update(self.labels)
        return labels

    @classmethod
    def for_tier(cls, tier: Tier, count: int | None = None) -> NodeGroup:
        """One node per worker of ``tier``, labelled so its label selector matches them.

        Only plain equality selector values become labels; ``!x`` and ``in(...)`` describe
        what to avoid or choose among, not what a node is.
        """
        res = tier.worker_resources()
        labels = {
            k: v
            for k, v in tier.label_selector.items()
            if v and not v.startswith("!") and "(" not in v
        }
        return cls(
            market=tier.market,
            count=tier.num_workers if count is None else count,
            cpus=float(res.get("CPU", 0.0)),
            gpus=float(res.get("GPU", 0.0)),
            resources={k: v for k, v in res.items() if k not in ("CPU", "GPU")},
            labels=labels,
            name=tier.name,
        )


@dataclass(frozen=True)
class LocalNode:
    """A worker node this cluster started and has not removed (its processes are running).

    ``handle``: Ray's handle on a node this process started (None for a node Ray's autoscaler
    launched, which only its id reaches).
    """

    node_id: str
    group: str
    market: str
    labels: Mapping[str, str]
    started_at: float
    handle: Node | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class NodeStatus:
    """What the GCS says about a node: the view Ray Train acts on."""

    node_id: str
    alive: bool
    labels: Mapping[str, str]
    draining: bool
    drain_deadline_ms: int | None
    death_reason: str | None  # e.g. AUTOSCALER_DRAIN_PREEMPTED, UNEXPECTED_TERMINATION
    death_message: str | None


class LocalSpotCluster:
    """Head (0 CPUs) plus labelled worker node groups, all on this machine.

    Use as a context manager; ``shutdown()`` stops every process it started, even after a
    failed start. ``node_timeout_s`` is how long the GCS takes to declare a node that died
    without notice dead (Ray's default is about 15 s; 5 s keeps failure tests short while
    leaving a loaded 2-core machine room); ``None`` keeps Ray's default. Raylets, hence the
    Train controller and workers, inherit this process's environment plus
    :data:`LOCAL_RAY_ENV` (for variables not already set) plus ``ray_env``.
    """

    def __init__(
        self,
        groups: Iterable[NodeGroup],
        *,
        connect: bool = False,
        temp_dir: str | None = None,
        node_timeout_s: float | None = 5.0,
        object_store_mb: int = 100,
        ray_env: Mapping[str, str] | None = None,
        verbose: bool = False,
        jobs_api: bool = False,
    ) -> None:
        self.groups: dict[str, NodeGroup] = {}
        self._jobs_api = jobs_api
        self._dashboard_port: int | None = None
        for g in groups:
            if g.name in self.groups:
                raise ValueError(f"node group names must be unique; repeated: {g.name!r}")
            self.groups[g.name] = g
        self._connect = connect
        self._own_temp_dir = temp_dir is None
        self._temp_dir = temp_dir
        self._node_timeout_s = node_timeout_s
        self._object_store_bytes = object_store_mb * 1024 * 1024
        # What this process's environment already sets wins over our defaults.
        defaults = {k: os.environ.get(k, v) for k, v in LOCAL_RAY_ENV.items()}
        self._ray_env = {**defaults, **(ray_env or {})}
        self._verbose = verbose
        self._cluster: Any = None
        self._spawner: ThreadPoolExecutor | None = None
        self._gcs: Any = None
        self._nodes: dict[str, LocalNode] = {}
        self._lock = threading.RLock()  # guards _nodes
        self._gcs_lock = threading.Lock()
        self._connected = False
        self.start_seconds: float | None = None

    @classmethod
    def for_ladder(
        cls, tiers: Iterable[Tier] | Ladder, *, extra: Iterable[NodeGroup] = (), **kwargs: Any
    ) -> LocalSpotCluster:
        """A cluster with one group per tier, sized to the tier's workers."""
        tier_list = tiers.tiers if isinstance(tiers, Ladder) else tuple(tiers)
        return cls([NodeGroup.for_tier(t) for t in tier_list] + list(extra), **kwargs)

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalSpotCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> LocalSpotCluster:
        """Start the head and every group's nodes; on any failure stop what started."""
        if self._cluster is not None:
            return self
        t0 = time.monotonic()
        os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")  # for ray.train in this driver
        import ray  # noqa: F401  (configures Ray's loggers, which we then quiet)

        if not self._verbose:
            logging.getLogger("ray").setLevel(logging.WARNING)
        try:
            self._start_head()
            self._spawner = ThreadPoolExecutor(1, thread_name_prefix="spotfallback-nodes")
            for group in self.groups.values():
                for _ in range(group.count):
                    self._add(group, wait=False)
            self._on_spawner(lambda: self._cluster.wait_for_nodes(timeout=60))
            if self._connect:
                self.connect()
        except BaseException:
            self.shutdown()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _on_spawner(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the one thread that starts and stops worker nodes.

        Why one long-lived thread: Ray ties each node's processes to the *thread* that
        spawned them (Linux parent-death signal), so a node started from a short-lived
        thread would die with it; one thread also serialises changes to the Cluster object.
        """
        if self._spawner is None:
            raise RuntimeError("the local cluster is not running; use it as a context manager")
        return self._spawner.submit(fn).result()

    def _start_head(self) -> None:
        from ray.cluster_utils import Cluster

        if self._temp_dir is None:
            # Short path: Unix socket paths under it must stay below 108 bytes.
            self._temp_dir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
        system_config: dict[str, Any] = {}
        if self._node_timeout_s is not None:
            system_config = {
                "health_check_period_ms": 1000,
                "health_check_timeout_ms": 5000,
                "health_check_failure_threshold": max(1, math.ceil(self._node_timeout_s)),
            }
        # Ray's exit hooks (signal handlers) can only be installed from the main thread;
        # started elsewhere, the head is stopped by shutdown() alone.
        self._cluster = Cluster(
            shutdown_at_exit=threading.current_thread() is threading.main_thread()
        )
        self._dashboard_port = _free_port()  # Ray's API server; 8265 may be another cluster's
        with _keep_ray_address_file():
            self._cluster.add_node(
                num_cpus=0,
                labels={GROUP_LABEL: HEAD_GROUP},
                dashboard_port=self._dashboard_port,
                temp_dir=self._temp_dir,
                object_store_memory=self._object_store_bytes,
                env_vars=self._ray_env,
                _system_config=system_config,
                **jobs_api_params(self._jobs_api),
            )
        if self._jobs_api:
            publish_cluster_address(self._cluster.gcs_address, self._temp_dir)

    def connect(self) -> None:
        """Make this process the cluster's driver, keeping Ray's log noise out of the terminal."""
        if not self._connected:
            connect_driver(self.address, self._verbose)
            self._connected = True

    def shutdown(self) -> None:
        """Disconnect the driver (if we connected it) and stop every process we started."""
        import ray

        pids: set[int] = set()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                pids = self.pids()
        try:
            if self._connected:
                self._connected = False
                ray.shutdown()
        finally:
            cluster, self._cluster = self._cluster, None
            spawner, self._spawner = self._spawner, None
            self._nodes.clear()
            self._gcs = None
            try:
                if cluster is not None:
                    if spawner is not None:  # the thread that owns the worker nodes
                        spawner.submit(_stop_workers, cluster).result()
                    with _keep_ray_address_file():
                        cluster.shutdown()
            finally:
                if spawner is not None:
                    spawner.shutdown(wait=True)
                # Raylets' children exit on their own a moment later; let them finish writing
                # their logs before the directory goes, or it comes back half-empty.
                _wait_gone(pids, timeout_s=10.0)
                if self._own_temp_dir and self._temp_dir is not None:
                    shutil.rmtree(self._temp_dir, ignore_errors=True)
                    self._temp_dir = None

    # ----------------------------------------------------------------- addresses

    @property
    def running(self) -> bool:
        return self._cluster is not None

    def _require(self) -> Any:
        if self._cluster is None:
            raise RuntimeError("the local cluster is not running; use it as a context manager")
        return self._cluster

    @property
    def address(self) -> str:
        """What ``ray.init(address=...)`` takes (GCS host:port)."""
        return self._require().address

    @property
    def gcs_address(self) -> str:
        return self._require().gcs_address

    @property
    def jobs_address(self) -> str:
        """The Ray Jobs API of the cluster (``jobs_api=True``), as a tier's ``cluster.address`` names it."""
        self._require()
        return jobs_address(self._jobs_api, self._dashboard_port)

    def kill_all(self) -> None:
        """A region outage: SIGKILL every process of the cluster at once (head, nodes, jobs' drivers).

        ``shutdown()`` afterwards only cleans up what is left.
        """
        import signal

        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    @property
    def temp_dir(self) -> str | None:
        """Ray's session and log files live here (removed on shutdown if we made it)."""
        return self._temp_dir

    @property
    def head_node_id(self) -> str:
        return self._require().head_node.node_id

    # ----------------------------------------------------------------- nodes

    def add_node(self, group: NodeGroup | str) -> LocalNode:
        """Start one more node of ``group`` (a NodeGroup or a group name) and wait until it is up.

        A group not given to the constructor is registered on first use.
        """
        if isinstance(group, str):
            if group not in self.groups:
                raise KeyError(f"no node group named {group!r}; groups: {sorted(self.groups)}")
            group = self.groups[group]
        else:
            self.groups.setdefault(group.name, group)
        return self._add(group, wait=True)

    def _add(self, group: NodeGroup, *, wait: bool) -> LocalNode:
        cluster = self._require()
        labels = group.node_labels()
        handle = self._on_spawner(
            lambda: _start_worker_node(
                cluster,
                wait=wait,
                num_cpus=group.cpus,
                num_gpus=group.gpus,
                resources=dict(group.resources) or None,
                labels=labels,
                object_store_memory=self._object_store_bytes,
                env_vars=self._ray_env,
            )
        )
        node = LocalNode(
            node_id=handle.node_id,
            group=group.name,
            market=group.market,
            labels=labels,
            started_at=time.time(),
            handle=handle,
        )
        with self._lock:
            self._nodes[node.node_id] = node
        return node

    def remove_node(self, node: LocalNode | str, *, graceful: bool = False) -> LocalNode:
        """Stop a node's processes (SIGKILL unless ``graceful``); the GCS notices on its own."""
        cluster = self._require()
        with self._lock:
            local = self.node(node)
            del self._nodes[local.node_id]
        handle = local.handle
        assert handle is not None, "every node of a LocalSpotCluster has its handle"
        self._on_spawner(lambda: _remove_node(cluster, handle, graceful))
        return local

    def node(self, node: LocalNode | str) -> LocalNode:
        """The running node with this id (or the node itself, if still running)."""
        node_id = node if isinstance(node, str) else node.node_id
        with self._lock:
            try:
                return self._nodes[node_id]
            except KeyError:
                raise KeyError(
                    f"node {node_id[:12]} is not a running node of this cluster"
                ) from None

    def nodes(self, market: str | None = None, *, group: str | None = None) -> list[LocalNode]:
        """Running worker nodes (not the head), oldest first, optionally of one market/group."""
        with self._lock:
            return [
                n
                for n in self._nodes.values()
                if (market is None or n.market == market) and (group is None or n.group == group)
            ]

    # ----------------------------------------------------------------- GCS view

    def gcs_client(self) -> Any:
        """A ``ray._raylet.GcsClient`` for this cluster (drains, node table); thread-safe."""
        from spotfallback.notices.drain import gcs_client

        with self._gcs_lock:
            if self._gcs is None:
                self._gcs = gcs_client(self.gcs_address)
            return self._gcs

    def node_statuses(self) -> dict[str, NodeStatus]:
        """Every node the GCS has seen (head included), alive or dead, by node id hex."""
        from ray.core.generated import gcs_pb2

        infos = self.gcs_client().get_all_node_info(timeout=10)
        draining = self.draining_nodes()
        alive_state = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
        reasons = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["death_info"].message_type
        reason_names = {v.number: v.name for v in reasons.enum_types_by_name["Reason"].values}
        out = {}
        for nid, info in infos.items():
            hex_id = nid.hex()
            alive = info.state == alive_state
            has_death = info.HasField("death_info") and not alive
            out[hex_id] = NodeStatus(
                node_id=hex_id,
                alive=alive,
                labels=dict(info.labels),
                draining=alive and hex_id in draining,
                drain_deadline_ms=draining.get(hex_id) or None,
                death_reason=reason_names.get(info.death_info.reason) if has_death else None,
                death_message=info.death_info.reason_message if has_death else None,
            )
        return out

    def node_status(self, node: LocalNode | str) -> NodeStatus:
        node_id = node if isinstance(node, str) else node.node_id
        try:
            return self.node_statuses()[node_id]
        except KeyError:
            raise KeyError(f"the GCS has never seen node {node_id[:12]}") from None

    def draining_nodes(self) -> dict[str, int]:
        """Node id hex -> drain deadline (ms since the epoch, 0 = none) of nodes being drained."""
        return dict(self._require().global_state.get_draining_nodes())

    def wait_for_node_dead(self, node: LocalNode | str, timeout_s: float = 30.0) -> NodeStatus:
        """Block until the GCS marks the node dead; the time this takes is what Ray reacts to."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.node_status(node)
            if not status.alive:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {status.node_id[:12]} still alive after {timeout_s} s")
            time.sleep(0.05)

    def pids(self) -> set[int]:
        """Every process of this cluster now running (Ray's daemons and their children)."""
        import psutil  # vendored by Ray; importable once ray is

        handles = [self._require().head_node, *(n.handle for n in self.nodes() if n.handle is not None)]
        out: set[int] = set()
        for handle in handles:
            for infos in handle.all_processes.values():
                for info in infos:
                    with contextlib.suppress(psutil.Error):
                        proc = psutil.Process(info.process.pid)
                        out.add(proc.pid)
                        out.update(c.pid for c in proc.children(recursive=True))
        return out

    def train_workers_per_node(self) -> dict[str, int]:
        """How many live Ray Train worker actors each node hosts (from the GCS actor table)."""
        return train_workers_per_node(self._require().global_state)

    @contextlib.contextmanager
    def driver(self) -> Iterator[LocalSpotCluster]:
        """Connect this process as driver for the duration of a block."""
        import ray

        already = self._connected
        self.connect()
        try:
            yield self
        finally:
            if not already:
                self._connected = False
                ray.shutdown()


def train_workers_per_node(global_state: Any) -> dict[str, int]:
    """How many live Ray Train worker actors each node hosts, from a cluster's GCS actor table."""
    table = global_state.actor_table(None, actor_state_name="ALIVE")
    counts: dict[str, int] = {}
    for info in table.values():
        if info["ActorClassName"].endswith(TRAIN_WORKER_CLASS):
            nid = info["Address"]["NodeID"]
            counts[nid] = counts.get(nid, 0) + 1
    return counts


def _start_worker_node(cluster: Any, *, wait: bool, **node_args: Any) -> Node:
    """``Cluster.add_node`` for a worker node, minus its main-thread-only signal handlers.

    Same parameters as ray.cluster_utils.Cluster.add_node (Ray 2.60); the node shares
    the spawning thread's fate (kernel parent-death signal) instead of using atexit hooks.
    """
    from ray._private.client_mode_hook import disable_client_hook
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(**node_args)
    params.update_if_absent(
        num_cpus=1,
        num_gpus=0,
        min_worker_port=0,
        max_worker_port=0,
        redis_address=cluster.redis_address,
        gcs_address=cluster.gcs_address,
        include_log_monitor=False,  # one log monitor per machine: the head's
        node_manager_port=0,
    )
    params.dashboard_agent_listen_port = None
    with disable_client_hook():
        node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=True)
    cluster.worker_nodes.add(node)
    if wait:
        cluster._wait_for_node(node)
    return node


def _remove_node(cluster: Any, node: Node, graceful: bool) -> None:
    """Kill a node the way a vanished VM dies: its agents cannot report the raylet's death.

    Left alone, the node's dashboard/runtime-env agents notice the SIGKILLed raylet and
    publish "Raylet is terminated ... unexpected" with 20 log lines to every driver's
    stdout. They are frozen (SIGSTOP: the raylet does not notice) before the raylet dies,
    and killed after it.
    """
    import signal

    import psutil
    from ray._private import ray_constants

    frozen = []
    if not graceful:
        for info in node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, []):
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(info.process.pid).children():
                    with contextlib.suppress(psutil.Error):
                        if _is_agent(child.cmdline()):
                            child.send_signal(signal.SIGSTOP)
                            frozen.append(child)
    try:
        cluster.remove_node(node, allow_graceful=graceful)
    finally:
        for child in frozen:
            with contextlib.suppress(psutil.Error):
                child.kill()


def jobs_api_params(jobs_api: bool) -> dict[str, Any]:
    """A local head's dashboard parameters: with ``jobs_api``, the Ray Jobs API on loopback.

    The Jobs API runs in the head's dashboard and its agent; two clusters on one machine need
    their own agent port (Ray's default is fixed). Without it, no dashboard: less to start.
    """
    if not jobs_api:
        return {"include_dashboard": False}
    return {"include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_agent_listen_port": _free_port()}


def publish_cluster_address(gcs_address: str, temp_dir: str) -> None:
    """Write the head's "current cluster" file into its temp dir, where a Ray job's driver looks.

    Ray's test Cluster writes only the machine-wide one, which another cluster on this machine may own.
    """
    from ray._private.utils import write_ray_address

    write_ray_address(gcs_address, temp_dir)


def jobs_address(jobs_api: bool, dashboard_port: int | None) -> str:
    """The Ray Jobs API's address of a local cluster started with ``jobs_api``."""
    if not jobs_api or dashboard_port is None:
        raise RuntimeError("this local cluster runs no Jobs API; start it with jobs_api=True")
    return f"http://127.0.0.1:{dashboard_port}"


def connect_driver(address: str, verbose: bool) -> None:
    """``ray.init`` this process as a local cluster's driver, Ray's log noise kept out unless ``verbose``."""
    import ray

    ray.init(
        address=address,
        log_to_driver=verbose,
        logging_level=logging.INFO if verbose else logging.WARNING,
        include_dashboard=False,
        configure_logging=True,
    )


@contextlib.contextmanager
def _keep_ray_address_file() -> Iterator[None]:
    """Leave Ray's "current cluster" file (used by a bare ``ray.init()``) as it was.

    ``Cluster`` overwrites it on start and deletes it on shutdown; on a machine shared with
    other Ray users either would redirect or break their ``ray.init()``.
    """
    from ray._common.utils import get_ray_address_file

    path = get_ray_address_file(None)
    try:
        with open(path) as f:
            before: str | None = f.read()
    except OSError:
        before = None
    os.makedirs(os.path.dirname(path), exist_ok=True)  # Cluster writes it unconditionally
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if before is None:
                os.remove(path)
            else:
                with open(path, "w") as f:
                    f.write(before)


_AGENT_MARKS = (
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "dashboard/agent.py",
    "runtime_env/agent/main.py",
)


def _is_agent(cmdline: list[str]) -> bool:
    return any(mark in part for part in cmdline[:4] for mark in _AGENT_MARKS)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_gone(pids: set[int], timeout_s: float) -> None:
    import psutil

    deadline = time.monotonic() + timeout_s
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.05)


def _stop_workers(cluster: Any) -> None:
    for node in list(cluster.worker_nodes):
        _remove_node(cluster, node, graceful=False)
