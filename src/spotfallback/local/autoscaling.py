"""A local cluster whose worker nodes Ray's own autoscaler (v2) launches, with cloud-like capacity.

Why: climbing back onto a tier whose node pool scales to zero only works if a resource request
makes the autoscaler add that pool's nodes. The pre-started ``LocalSpotCluster`` cannot show
that. Here the head runs Ray's autoscaler with the fake multi-node provider, subclassed so that
each node type launches only after a provisioning delay and never beyond a capacity cap; both
live in a small JSON file that a test rewrites while a run goes (spot capacity gone, back).
Node types carry the same labels as ``NodeGroup``, so a tier's label selector matches them.

Ray's ``AutoscalingCluster`` is not used as is: it runs ``ray stop --force``, which would stop
every Ray cluster on the machine, and it always uses port 6379. This one starts its head in
this process on free ports and stops only the processes it started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from spotfallback.config import Tier
from spotfallback.local.cluster import (
    GROUP_LABEL,
    HEAD_GROUP,
    LOCAL_RAY_ENV,
    MARKET_LABEL,
    LocalNode,
    NodeGroup,
    _free_port,
    _keep_ray_address_file,
    _wait_gone,
    connect_driver,
    jobs_address,
    jobs_api_params,
    publish_cluster_address,
    train_workers_per_node,
)

logger = logging.getLogger(__name__)

PROVIDER_MODULE = "spotfallback.local.autoscaling.CappedFakeProvider"
HEAD_TYPE = "ray.head.default"
# The fake provider's fixed ids: the autoscaler matches its instances to Ray nodes by them.
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"


@dataclass(frozen=True)
class AutoscaledGroup:
    """A node type of the autoscaler: identical nodes, ``min_workers`` to ``max_workers`` of them.

    ``cap`` is how many may exist now (the cloud's capacity; default ``max_workers``) and
    ``delay_s`` how long a launch takes before the node starts; both can change later.
    """

    group: NodeGroup
    max_workers: int
    min_workers: int = 0
    cap: int | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(f"node type {self.name!r}: need 0 <= min_workers <= max_workers")
        if self.delay_s < 0:
            raise ValueError(f"node type {self.name!r}: delay_s must be >= 0")

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def configured_cap(self) -> int:
        """The cap the cluster starts with: ``cap``, else ``max_workers``."""
        return self.max_workers if self.cap is None else self.cap

    @classmethod
    def for_tier(cls, tier: Tier, *, min_workers: int = 0, cap: int | None = None, delay_s: float = 0.0) -> AutoscaledGroup:
        """One node per worker of ``tier`` at most, labelled as ``NodeGroup.for_tier`` labels them."""
        return cls(NodeGroup.for_tier(tier), max_workers=tier.num_workers, min_workers=min_workers, cap=cap, delay_s=delay_s)

    def node_type(self) -> dict[str, Any]:
        """This group as an entry of the autoscaling config's ``available_node_types``."""
        g = self.group
        resources: dict[str, float] = {"CPU": g.cpus, **g.resources}
        if g.gpus:
            resources["GPU"] = g.gpus
        return {
            "resources": resources,
            "labels": g.node_labels(),
            "node_config": {},
            "min_workers": self.min_workers,
            "max_workers": self.max_workers,
        }


def read_control(path: str) -> dict[str, Any]:
    """The capacity file: ``{"caps": {type: n}, "delay_s": {type: s}}``; unreadable means no change."""
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    """Replace the file at once, so the provider never reads half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _running(entry: Mapping[str, Any]) -> bool:
    """Whether a fake node still holds its "VM": its raylet runs (a node killed as a spot VM is
    taken stays listed until the autoscaler terminates it, seconds later)."""
    from ray._private import ray_constants

    node = entry.get("node")
    if node is None:  # the head: no process of its own here
        return True
    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, [])
    return not raylets or any(info.process.poll() is None for info in raylets)


def _base_provider() -> type:
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    return FakeMultiNodeProvider


def _share_the_heads_log_monitor() -> None:
    """Start the nodes this (autoscaler) process launches without a log monitor of their own.

    The nodes share the head's session directory, so the head's log monitor already reads
    every log file; each extra one read them all again (measured: about 1.3% of a core per
    node while idle, and about 9% of all the CPU of a cluster test module with five nodes).
    Ray's fake provider builds the node's parameters itself, so its ``Node`` is swapped for
    one that turns the log monitor off; only node launches use it in this process.
    """
    import ray._private.node as ray_node

    base = ray_node.Node
    if getattr(base, "_shares_the_heads_log_monitor", False):
        return

    class NodeWithoutLogMonitor(base):  # type: ignore[misc, valid-type]
        _shares_the_heads_log_monitor = True

        def __init__(self, ray_params: Any, *args: Any, **kwargs: Any) -> None:
            ray_params.include_log_monitor = False
            super().__init__(ray_params, *args, **kwargs)

    ray_node.Node = NodeWithoutLogMonitor  # type: ignore[misc]


class CappedFakeProvider(_base_provider()):  # type: ignore[misc]
    """Ray's fake multi-node provider with a launch delay and a capacity cap per node type.

    Runs inside the autoscaler (monitor) process. A launch the cap refuses entirely fails at
    once, as a cloud's "insufficient capacity" does, and the autoscaler retries it later; a
    launch the cap allows waits the type's delay, then starts its nodes (as many as the cap
    allows: the autoscaler gives up on the rest after its allocation timeout and asks again).
    The cap counts nodes whose raylet still runs, plus launches under way: a cloud frees a
    spot VM's quota when it takes the VM, not when Ray's autoscaler later notices the node died
    and terminates it. Its log lines (asked, launched, terminated) go to the session's
    ``monitor.log``, beside the autoscaler's own, to time a launch against a request.
    """

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        os.environ.setdefault("RAY_FAKE_CLUSTER", "1")  # the base class insists on it
        super().__init__(provider_config, cluster_name)
        _share_the_heads_log_monitor()
        self._control_file: str = provider_config["control_file"]
        self._pending: dict[str, int] = {}

    def _count(self, node_type: str) -> int:
        from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

        with self.lock:
            up = sum(
                1 for n in self._nodes.values() if n["tags"].get(TAG_RAY_USER_NODE_TYPE) == node_type and _running(n)
            )
            return up + self._pending.get(node_type, 0)

    def create_node_with_resources_and_labels(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int, resources: dict[str, float], labels: dict[str, str]
    ) -> None:
        from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

        node_type = tags[TAG_RAY_USER_NODE_TYPE]
        control = read_control(self._control_file)
        cap = int(control.get("caps", {}).get(node_type, count))
        delay = float(control.get("delay_s", {}).get(node_type, 0.0))
        with self.lock:
            allowed = max(0, min(count, cap - self._count(node_type)))
            self._pending[node_type] = self._pending.get(node_type, 0) + allowed
        logger.info("launch of %d %r nodes asked: cap %d, %d allowed, delay %.1f s", count, node_type, cap, allowed, delay)
        if allowed == 0:
            raise RuntimeError(f"insufficient capacity for {node_type!r} (cap {cap})")
        try:
            time.sleep(delay)  # outside the lock: the autoscaler keeps polling meanwhile
            for _ in range(allowed):
                self._create_node_with_resources_and_labels(node_config, tags, 1, resources, labels)
        finally:
            with self.lock:
                self._pending[node_type] -= allowed
        logger.info("launched %d of %d %r nodes after %.1f s", allowed, count, node_type, delay)

    def terminate_node(self, node_id: str) -> None:
        logger.info("terminating node %s", node_id)
        super().terminate_node(node_id)


class LocalAutoscalingCluster:
    """A head (0 CPUs) running Ray's autoscaler v2, and node types it launches on demand.

    Use as a context manager; ``shutdown()`` stops every process it started (head, autoscaler,
    and every node the autoscaler launched), even after a failed start. Raylets inherit this
    process's environment plus :data:`LOCAL_RAY_ENV` (for variables not already set) plus
    ``ray_env``. ``idle_timeout_s`` is how long an unneeded node lives before the autoscaler
    removes it. ``jobs_api`` starts the head's dashboard with the Ray Jobs API (``jobs_address``),
    which is all a driver moving a run between clusters reaches of each.
    """

    def __init__(
        self,
        groups: Iterable[AutoscaledGroup],
        *,
        connect: bool = False,
        node_timeout_s: float | None = 5.0,
        idle_timeout_s: float = 30.0,
        object_store_mb: int = 100,
        ray_env: Mapping[str, str] | None = None,
        verbose: bool = False,
        jobs_api: bool = False,
    ) -> None:
        self.groups: dict[str, AutoscaledGroup] = {}
        self._jobs_api = jobs_api
        self._dashboard_port: int | None = None
        for g in groups:
            if g.name in self.groups or g.name == HEAD_TYPE:
                raise ValueError(f"node type names must be unique and not {HEAD_TYPE!r}; repeated: {g.name!r}")
            self.groups[g.name] = g
        self._connect = connect
        self._node_timeout_s = node_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._object_store_bytes = object_store_mb * 1024 * 1024
        defaults = {k: os.environ.get(k, v) for k, v in LOCAL_RAY_ENV.items()}
        self._ray_env = {**defaults, **(ray_env or {})}
        self._verbose = verbose
        self._temp_dir: str | None = None
        self._cluster: Any = None  # ray.cluster_utils.Cluster holding the head
        self._connected = False
        self._lock = threading.Lock()
        self._gcs: Any = None
        # Nodes this cluster killed: the GCS lists them as alive until its health check fails
        # (seconds later); a cloud's VM is gone at once, and so they are for ``nodes()``.
        self._killed: set[str] = set()

    def __enter__(self) -> LocalAutoscalingCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- capacity

    @property
    def control_file(self) -> str:
        if self._temp_dir is None:
            raise RuntimeError("the autoscaling cluster is not running; use it as a context manager")
        return os.path.join(self._temp_dir, "capacity.json")

    def _control(self) -> dict[str, Any]:
        return {
            "caps": {name: g.configured_cap for name, g in self.groups.items()},
            "delay_s": {name: g.delay_s for name, g in self.groups.items()},
        }

    def capacity(self, group: str) -> int:
        """How many ``group`` nodes the "cloud" can hold now (what ``set_capacity`` last set)."""
        if group not in self.groups:
            raise KeyError(f"no node type named {group!r}; types: {sorted(self.groups)}")
        return int(read_control(self.control_file)["caps"][group])

    def set_capacity(self, group: str, cap: int, *, delay_s: float | None = None) -> None:
        """How many ``group`` nodes the "cloud" can hold from now on (and its launch delay).

        Nodes already up stay up (lowering a cap is no preemption); later launches obey it.
        """
        if group not in self.groups:
            raise KeyError(f"no node type named {group!r}; types: {sorted(self.groups)}")
        if cap < 0:
            raise ValueError(f"set_capacity({group!r}, {cap}): the cap is a node count, >= 0")
        with self._lock:
            control = read_control(self.control_file)
            control["caps"][group] = cap
            if delay_s is not None:
                control["delay_s"][group] = delay_s
            _write_json(self.control_file, control)

    # ----------------------------------------------------------------- lifecycle

    def autoscaling_config(self, gcs_address: str) -> dict[str, Any]:
        """The cluster config the autoscaler reads: Ray's fake multi-node one, with our provider."""
        types = {name: g.node_type() for name, g in self.groups.items()}
        types[HEAD_TYPE] = {"resources": {}, "node_config": {}, "max_workers": 0}
        return {
            "cluster_name": "spotfallback-local",
            "max_workers": sum(g.max_workers for g in self.groups.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": self._idle_timeout_s / 60.0,
            "provider": {
                "type": "external",
                "module": PROVIDER_MODULE,
                "gcs_address": gcs_address,
                "head_node_id": FAKE_HEAD_NODE_ID,
                "launch_multiple": True,
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "control_file": self.control_file,
            },
            "available_node_types": types,
            "head_node_type": HEAD_TYPE,
            "auth": {},
            "docker": {},
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }

    def start(self) -> LocalAutoscalingCluster:
        """Start the head with its autoscaler; min_workers nodes follow (see ``wait_for_nodes``)."""
        if self._cluster is not None:
            return self
        os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
        import ray  # noqa: F401  (configures Ray's loggers, which we then quiet)

        if not self._verbose:
            logging.getLogger("ray").setLevel(logging.WARNING)
        try:
            self._temp_dir = tempfile.mkdtemp(prefix="sfas-", dir="/tmp")  # short: socket paths
            _write_json(self.control_file, self._control())
            self._start_head()
            if self._connect:
                self.connect()
        except BaseException:
            self.shutdown()
            raise
        return self

    def _start_head(self) -> None:
        from ray.cluster_utils import Cluster

        assert self._temp_dir is not None
        from ray._private.services import get_node_ip_address

        ip = get_node_ip_address()
        port = _free_port()
        config_path = os.path.join(self._temp_dir, "autoscaling.json")
        _write_json(config_path, self.autoscaling_config(f"{ip}:{port}"))
        system_config: dict[str, Any] = {"enable_autoscaler_v2": True}
        if self._node_timeout_s is not None:
            system_config.update(
                health_check_period_ms=1000,
                health_check_timeout_ms=5000,
                health_check_failure_threshold=max(1, math.ceil(self._node_timeout_s)),
            )
        # The autoscaler process inherits this environment, and the nodes it starts inherit
        # the autoscaler's: set what both need only while the head starts.
        env = {
            **self._ray_env,
            "RAY_enable_autoscaler_v2": "1",
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        }
        self._dashboard_port = _free_port()  # Ray's API server; 8265 may be another cluster's
        cluster = self._cluster = Cluster(shutdown_at_exit=threading.current_thread() is threading.main_thread())
        with _keep_ray_address_file(), _environ(env):
            cluster.add_node(
                num_cpus=0,
                labels={GROUP_LABEL: HEAD_GROUP},
                dashboard_port=self._dashboard_port,
                gcs_server_port=port,
                temp_dir=self._temp_dir,
                object_store_memory=self._object_store_bytes,
                autoscaling_config=config_path,
                env_vars={**self._ray_env, "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID},
                _system_config=system_config,
                **jobs_api_params(self._jobs_api),
            )
        if self._jobs_api:
            publish_cluster_address(cluster.gcs_address, self._temp_dir)

    def connect(self) -> None:
        """Make this process the cluster's driver, keeping Ray's log noise out of the terminal."""
        if not self._connected:
            connect_driver(self.address, self._verbose)
            self._connected = True

    def pids(self) -> set[int]:
        """Every process of this cluster now running: the head's, and the autoscaler's nodes'.

        The autoscaler starts nodes as its own children; a node process that outlived its
        parent is still found by the cluster's temp dir on its command line.
        """
        import psutil

        if self._cluster is None:
            return set()
        out: set[int] = set()
        for infos in self._cluster.head_node.all_processes.values():
            for info in infos:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(info.process.pid)
                    out.add(proc.pid)
                    out.update(c.pid for c in proc.children(recursive=True))
        if self._temp_dir:
            me = os.getuid()
            for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
                with contextlib.suppress(psutil.Error, TypeError):
                    if proc.info["uids"].real == me and any(self._temp_dir in part for part in proc.info["cmdline"] or ()):
                        out.add(proc.pid)
        out.discard(os.getpid())
        return out

    def shutdown(self) -> None:
        """Disconnect the driver (if we connected it) and stop every process we started."""
        import psutil
        import ray

        try:
            if self._connected:
                self._connected = False
                ray.shutdown()
        finally:
            if self._cluster is not None:
                from ray._private import ray_constants

                # The autoscaler first, so that it launches nothing more; a node it was starting
                # meanwhile is found by the second look (by the temp dir, if orphaned).
                pids = self.pids()
                for info in self._cluster.head_node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                    with contextlib.suppress(psutil.Error):
                        psutil.Process(info.process.pid).kill()
                        psutil.Process(info.process.pid).wait(10)
                pids |= self.pids()
                cluster, self._cluster, self._gcs = self._cluster, None, None
                with contextlib.suppress(Exception), _keep_ray_address_file():
                    cluster.shutdown()
                for pid in pids:  # the autoscaler's nodes: Cluster.shutdown knows only the head
                    with contextlib.suppress(psutil.Error):
                        psutil.Process(pid).kill()
                _wait_gone(pids, timeout_s=10.0)
            if self._temp_dir is not None:
                shutil.rmtree(self._temp_dir, ignore_errors=True)
                self._temp_dir = None

    def kill_node(self, node_id: str, timeout_s: float = 10.0) -> bool:
        """The cloud takes ``node_id``'s VM: its raylet and every process of it, killed at once.

        Found by the node id on the command lines of this cluster's processes (the raylet's
        ``--node_id``, its workers'); the autoscaler sees the node die and may replace it.
        False if the node was already gone (the autoscaler removes a drained node once idle).
        """
        import psutil

        doomed: set[int] = set()
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if any(node_id in part for part in proc.cmdline()):
                    doomed.add(pid)
                    doomed.update(c.pid for c in proc.children(recursive=True))
        if not doomed:
            if any(n["NodeID"] == node_id for n in self.alive_nodes()):
                raise KeyError(f"no process of node {node_id[:12]} in this cluster")
            return False
        with self._lock:
            self._killed.add(node_id)
        for pid in doomed:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        _wait_gone(doomed, timeout_s=timeout_s)
        return True

    # ----------------------------------------------------------------- views

    def _head_cluster(self) -> Any:
        if self._cluster is None:
            raise RuntimeError("the autoscaling cluster is not running; use it as a context manager")
        return self._cluster

    @property
    def address(self) -> str:
        """What ``ray.init(address=...)`` takes (GCS host:port)."""
        return str(self._head_cluster().address)

    @property
    def gcs_address(self) -> str:
        """The head's GCS (host:port): what ``RAY_ADDRESS`` takes for a process that joins as a driver."""
        return str(self._head_cluster().gcs_address)

    @property
    def jobs_address(self) -> str:
        """The Ray Jobs API of the cluster (``jobs_api=True``), as a tier's ``cluster.address`` names it."""
        self._head_cluster()
        return jobs_address(self._jobs_api, self._dashboard_port)

    @property
    def temp_dir(self) -> str | None:
        """Ray's session and log files, the capacity file and the config live here (removed on shutdown)."""
        return self._temp_dir

    def alive_nodes(self, group: str | None = None) -> list[dict[str, Any]]:
        """Alive worker nodes (``ray.nodes()`` entries), optionally of one node type; needs a driver."""
        import ray

        return [
            n
            for n in ray.nodes()
            if n.get("Alive")
            and (n.get("Labels") or {}).get(GROUP_LABEL) not in (None, HEAD_GROUP)
            and (group is None or (n.get("Labels") or {}).get(GROUP_LABEL) == group)
        ]

    def nodes(self, market: str | None = None, *, group: str | None = None) -> list[LocalNode]:
        """Alive worker nodes, oldest first, optionally of one market/group: what an ``Injector`` picks from.

        Read from the GCS node table (no driver needed), less the nodes ``kill_node`` killed;
        ``handle`` is None, since Ray's autoscaler, not this process, started them.
        """
        from ray.core.generated import gcs_pb2

        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
        with self._lock:
            killed = set(self._killed)
        out = []
        for nid, info in self.gcs_client().get_all_node_info(timeout=10).items():
            labels = dict(info.labels)
            name = labels.get(GROUP_LABEL)
            if info.state != alive or name in (None, HEAD_GROUP) or nid.hex() in killed:
                continue
            node = LocalNode(node_id=nid.hex(), group=name, market=labels.get(MARKET_LABEL) or name, labels=labels,
                             started_at=info.start_time_ms / 1000.0)
            if (market is None or node.market == market) and (group is None or node.group == group):
                out.append(node)
        return sorted(out, key=lambda n: n.started_at)

    def node(self, node: LocalNode | str) -> LocalNode:
        """The alive worker node with this id."""
        node_id = node if isinstance(node, str) else node.node_id
        for found in self.nodes():
            if found.node_id == node_id:
                return found
        raise KeyError(f"node {node_id[:12]} is not an alive worker node of this cluster")

    def remove_node(self, node: LocalNode | str, *, graceful: bool = False) -> LocalNode:
        """The cloud takes the node (``kill_node``); KeyError if it is already gone. ``graceful`` is
        ignored: a cloud gives a VM no shutdown of Ray's own."""
        local = node if isinstance(node, LocalNode) else self.node(node)
        if not self.kill_node(local.node_id):
            raise KeyError(f"node {local.node_id[:12]} is already gone")
        return local

    def gcs_client(self) -> Any:
        """A ``ray._raylet.GcsClient`` for this cluster (drains, node table); thread-safe."""
        from spotfallback.notices.drain import gcs_client

        with self._lock:
            if self._gcs is None:
                self._gcs = gcs_client(self.gcs_address)
            return self._gcs

    def draining_nodes(self) -> dict[str, int]:
        """Node id hex -> drain deadline (ms since the epoch, 0 = none) of nodes being drained."""
        return dict(self._head_cluster().global_state.get_draining_nodes())

    def train_workers_per_node(self) -> dict[str, int]:
        """How many live Ray Train worker actors each node hosts (from the GCS actor table)."""
        return train_workers_per_node(self._head_cluster().global_state)

    def requested_bundles(self) -> list[tuple[dict[str, float], dict[str, list[str]]]]:
        """What the autoscaler is asked to keep room for: (resources, label key -> values) per bundle.

        The merged request of every requester (Ray Train's coordinator sends them together), one
        entry per bundle; it shows whose nodes a run is asking for without reading its logs.
        """
        from ray.autoscaler.v2.sdk import get_cluster_resource_state

        from spotfallback.notices.drain import gcs_client

        state = get_cluster_resource_state(gcs_client(self.gcs_address))
        out = []
        for constraint in state.cluster_resource_constraints:
            for by_count in constraint.resource_requests:
                request = by_count.request
                labels = {
                    c.label_key: list(c.label_values) for sel in request.label_selectors for c in sel.label_constraints
                }
                out += [(dict(request.resources_bundle), labels)] * by_count.count
        return out

    def wait_for_nodes(self, group: str, count: int, timeout_s: float = 120.0) -> list[LocalNode]:
        """Block until ``group`` has ``count`` alive nodes as ``nodes()`` counts them (a node this
        cluster killed no longer counts, though the GCS lists it for seconds); returns them."""
        deadline = time.monotonic() + timeout_s
        while True:
            nodes = self.nodes(group=group)
            if len(nodes) >= count:
                return nodes
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(nodes)} of {count} {group!r} nodes up after {timeout_s} s")
            time.sleep(0.2)


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
