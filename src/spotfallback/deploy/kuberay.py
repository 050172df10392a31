"""KubeRay ``ray.io/v1`` RayJob / RayCluster manifests for a tier ladder.

Shape, and why:
- the head group is always on on-demand capacity: Ray Train's controller runs on the driver's
  node, and a preempted head kills the run; it advertises ``CPU: 0`` so no training worker
  (whose selector may well be ``ray.io/market-type: on-demand``) is ever placed on it;
- one worker group per tier, named after the tier, whose top-level ``labels`` satisfy the
  tier's label selector (how the runner's ``ScalingConfig(label_selector=...)`` finds it) and
  whose pod spec selects the cloud's matching capacity (``clouds.pod_placement``);
- autoscaler v2 with every group empty (``replicas`` and ``minReplicas`` 0): the runner's request
  scales its tier up (a RayJob stays Initializing until every desired pod runs), later tiers
  cost nothing until the runner falls back to them, and a tier the run has left scales back to
  zero instead of being held at a minimum;
- the RayJob runs the spotfallback driver (``rayjob_entrypoint``) in ``SidecarMode``, so the
  submitter lives in the on-demand head pod rather than in a pod that could land on spot;
  ``backoffLimit`` retries re-run the same command, which resumes the run from its checkpoints;
- spot worker pods get a termination grace period that fits the cloud's notice and a Ray drain
  window (``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``) a few seconds shorter: Ray 2.60's
  ``ray start --block`` drains its own node on the pod's SIGTERM (reason PREEMPTION), so Ray Train
  checkpoints just in time even with the stock image and no agent;
- with an image that has spotfallback, those pods (and, on GKE, GPU on-demand pods, which host
  maintenance stops an hour after its notice) also carry the notice agent as a native sidecar
  (``initContainers`` with ``restartPolicy: Always``, Kubernetes 1.29+): it watches the cloud's own
  notice, which comes earlier than the SIGTERM (AWS's 2-minute warning, GCE's preemption and
  maintenance events, Azure's Scheduled Events), drains the node then and records it in the run.

The file needs KubeRay 1.5.1 or later: group ``labels``, group ``resources`` and ``SidecarMode``
first appear in 1.5.0 (an older operator's API server drops them without a word), and scaling a
group for a label selector (how a fallback tier at zero replicas gets nodes) is fully supported
from 1.5.1 (Ray's "KubeRay label-based scheduling" guide).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import yaml

from spotfallback.cloud_notices import GCP_GPU_MAINTENANCE_NOTICE_S, GCP_PREEMPTION_NOTICE_S
from spotfallback.config import (
    GCS_SCHEMES,
    INT32_MAX,
    MARKET_LABEL,
    ON_DEMAND,
    SPOT,
    JobConfig,
    Tier,
)
from spotfallback.deploy.clouds import (
    AGENT_CLOUD,
    DRAIN_MARGIN_S,
    RAY_DRAIN_TIMEOUT_ENV,
    SPOT_SHUTDOWN,
    K8sCloud,
    PodPlacement,
    pod_placement,
    ray_drain_timeout_s,
)
from spotfallback.deploy.common import (
    CLUSTER_LABEL,
    DEFAULT_RAY_VERSION,
    HEAD_CPU,
    HEAD_MEMORY,
    MANAGED_BY_LABEL,
    REGION_LABEL,
    RUN_LABEL,
    ZONE_LABEL,
    check_image,
    check_user_labels,
    choice,
    cpu_quantity,
    default_image,
    fabric_note,
    head_size,
    installs_spotfallback,
    is_stock_image,
    k8s_name,
    label_value,
    object_name_error,
    parse_quantity,
    pip_packages,
    spotfallback_requirement,
    tier_labels,
    to_yaml,
    with_run_name,
    with_spotfallback,
    worker_shape,
)
from spotfallback.deploy.machines import (
    gpu_fabric,
    machine,
    machine_fit_error,
    machine_memory_error,
)
from spotfallback.deploy.pools import (
    ACCELERATOR_LABEL,
    HEAD_TOLERATION,
    k8s_machine_types,
    k8s_pool,
)
from spotfallback.deploy.validate import MIN_KUBERAY_ANNOTATION, assert_valid_text
from spotfallback.errors import ConfigError

API_VERSION = "ray.io/v1"
# KubeRay's own limits: it appends suffixes to build service and cluster names.
MAX_RAYCLUSTER_NAME = 53
MAX_RAYJOB_NAME = 47
RUN_NAME_ANNOTATION = "spotfallback/run-name"
ENTRYPOINT_ANNOTATION = "spotfallback/entrypoint"
GCS_CREDENTIALS_DIR = "/var/run/secrets/spotfallback/storage"
TOPOLOGY_LABELS = {ZONE_LABEL: "topology.kubernetes.io/zone", REGION_LABEL: "topology.kubernetes.io/region"}
# The notice agent's sidecar finds its Ray node through /tmp/ray/ray_current_cluster, which
# `ray start` writes once the node is up (the agent waits for it), so both containers share
# /tmp/ray; the node is the one with the pod's IP, which both containers have.
RAY_TMP_VOLUME = "ray-tmp"
RAY_TMP_DIR = "/tmp/ray"
NOTICE_AGENT_COMMAND = ["spotfallback", "notice-agent"]
MIN_SPOT_GRACE_S = DRAIN_MARGIN_S + 1
# The oldest operator that keeps every field these files use (see the module docstring).
MIN_KUBERAY_VERSION = "1.5.1"
# Ray Train polls for drains every 5 s by default; a 15 s notice needs a quicker look.
PREEMPTION_POLL_ENV = {"name": "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "value": "1"}

# Credentials each storage scheme reads from the environment: (variable, required).
_STORAGE_ENV: dict[str, tuple[tuple[str, bool], ...]] = {
    "s3": (("AWS_ACCESS_KEY_ID", True), ("AWS_SECRET_ACCESS_KEY", True), ("AWS_SESSION_TOKEN", False), ("AWS_REGION", False)),
    # Azure: whichever the Secret holds (store/location.py reads them in this order), a
    # connection string, an account key or SAS, or a service principal.
    "abfs": tuple(
        (var, False)
        for var in (
            "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
            "AZURE_STORAGE_SAS_TOKEN", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET",
        )
    ),  # fmt: skip
}
_STORAGE_ENV["abfss"] = _STORAGE_ENV["az"] = _STORAGE_ENV["abfs"]


class Kind(StrEnum):
    RAYJOB = "rayjob"
    RAYCLUSTER = "raycluster"


@dataclass(frozen=True)
class KubeRayOptions:
    """Everything about a KubeRay manifest that the job file does not say.

    ``run_name`` replaces the job's ``name``: the same name resumes that run from its
    checkpoints, so pass a new one (see ``common.unique_run_name``) for a fresh run.
    ``notice_agent`` adds a ``spotfallback notice-agent`` sidecar to spot worker pods (and GKE
    GPU pods), which drains the Ray node on the cloud's own notice, earlier than the pod's
    SIGTERM. ``None`` (default): on with an image of your own, off with the stock Ray image
    (``rayproject/ray``, the default or given), which has no spotfallback (a RayJob installs it
    with its ``pip`` packages, but they reach only the job's Ray processes, never a sidecar);
    either way Ray drains a spot node on its SIGTERM. ``spot_grace_seconds``: the spot pods'
    ``terminationGracePeriodSeconds``, default per cloud (``clouds.SPOT_SHUTDOWN``); it must fit
    in the cloud's notice, and Ray's drain window is set ``DRAIN_MARGIN_S`` shorter.
    ``labels`` go on the object and every pod, beside ``spotfallback/run`` (the run's name, on
    both): cost allocation (GKE's, OpenCost's) and a cluster's admission policies read pod labels.
    ``priority_class`` is every pod's ``priorityClassName``: on a shared cluster, the pods are
    scheduled before pods of lower priority, and only pods of higher priority may evict them.
    ``head_cpu`` and ``head_memory`` size the head pod (requests and limits), which runs the GCS,
    the dashboard, the driver and Ray Train's controller: a large gang's head wants more.
    """

    cloud: K8sCloud
    kind: Kind = Kind.RAYJOB
    image: str | None = None
    ray_version: str = DEFAULT_RAY_VERSION
    run_name: str | None = None
    namespace: str | None = None
    service_account: str | None = None
    storage_secret: str | None = None
    storage_pvc: str | None = None
    pip: Sequence[str] = ()
    backoff_limit: int = 5
    active_deadline_seconds: int = 3 * 24 * 3600
    ttl_seconds_after_finished: int = 300
    head_cpu: str = HEAD_CPU
    head_memory: str = HEAD_MEMORY
    memory_per_cpu_gib: int = 4
    idle_timeout_seconds: int = 60
    notice_agent: bool | None = None
    spot_grace_seconds: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    priority_class: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cloud", choice("cloud", self.cloud, K8sCloud))
        object.__setattr__(self, "kind", choice("kind", self.kind, Kind))
        object.__setattr__(self, "pip", pip_packages(self.pip))
        check_user_labels(self.labels, "KubeRay")
        head_size(self.head_cpu, self.head_memory)
        if self.priority_class is not None:
            if problem := object_name_error(self.priority_class):
                raise ConfigError(f"priority_class: {problem}")
            if self.priority_class.startswith("system-"):
                raise ConfigError(
                    f"priority_class: {self.priority_class!r}: system-... classes are for the cluster's own pods, its "
                    "critical add-ons, ahead of every workload (many clusters admit them only in kube-system); name a "
                    "PriorityClass of your cluster's"
                )
        for name, low, unit in (
            ("backoff_limit", 0, "retries"),
            ("active_deadline_seconds", 1, "seconds"),
            ("ttl_seconds_after_finished", 0, "seconds"),
            ("memory_per_cpu_gib", 1, "GiB"),
            ("idle_timeout_seconds", 0, "seconds"),
            ("spot_grace_seconds", MIN_SPOT_GRACE_S, "seconds"),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{name}: must be a whole number of {unit}, such as {max(low, 1)} (got {value!r})")
            if value is not None and value < low:
                raise ConfigError(f"{name}: must be at least {low} (got {value})")
            if value is not None and value > INT32_MAX:  # the field's type in the CRD and in Kubernetes
                raise ConfigError(f"{name}: must be at most {INT32_MAX}, Kubernetes' largest (got {value})")
        notice = SPOT_SHUTDOWN[self.cloud].notice_s
        if self.spot_grace_seconds is not None and self.spot_grace_seconds > notice:
            raise ConfigError(
                f"spot_grace_seconds: {self.spot_grace_seconds} s is longer than the spot notice on "
                f"{self.cloud.value} ({notice} s); the VM would be gone before the grace period ends"
            )
        if self.notice_agent and is_stock_image(self.image):
            raise ConfigError(
                "notice_agent: the sidecar runs `spotfallback notice-agent` from the image, and the stock "
                "rayproject/ray image has no spotfallback; pass an image built FROM it with spotfallback "
                "installed (--image), or leave the agent off (--no-notice-agent)"
            )

    @property
    def with_notice_agent(self) -> bool:
        """Whether spot worker pods get the agent (see the class docstring for the default)."""
        return not is_stock_image(self.image) if self.notice_agent is None else self.notice_agent

    @property
    def grace_seconds(self) -> int:
        return self.spot_grace_seconds or SPOT_SHUTDOWN[self.cloud].grace_s


def rayjob_entrypoint(job: JobConfig, ray_address: str = "auto") -> str:
    """The shell command that runs ``job`` with the spotfallback driver on an existing cluster
    (``JobConfig.run_command``, the job's ``ray_address`` replaced)."""
    return job.run_command("--ray-address", ray_address, ray_address=ray_address)


# --- pods --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Storage:
    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()


def _storage(job: JobConfig, opts: KubeRayOptions) -> _Storage:
    """How every pod reaches ``storage_path``: a Secret for remote storage, a shared volume for
    a path. Credentials are only ever references to a Secret, never values."""
    path = job.storage_path
    scheme = path.split("://", 1)[0].lower() if "://" in path else ""
    if scheme in ("", "file"):
        local = path.split("://", 1)[1] if scheme else path
        if opts.storage_secret:
            raise ConfigError(f"storage_secret: storage_path {path!r} is a local path; there are no credentials to pass")
        if not opts.storage_pvc:
            raise ConfigError(
                f"storage_path: {path!r} is a local path, which pods on different nodes do not share; "
                "use s3://, gs:// or abfs:// storage, or mount a shared volume there with --storage-pvc"
            )
        if not local.startswith("/"):
            raise ConfigError(f"storage_path: {path!r} must be absolute to be mounted from --storage-pvc")
        volume = {"name": "run-storage", "persistentVolumeClaim": {"claimName": opts.storage_pvc}}
        return _Storage(volumes=(volume,), mounts=({"name": "run-storage", "mountPath": local},))
    if opts.storage_pvc:
        raise ConfigError(f"storage_pvc: storage_path {path!r} is remote storage; a volume is only for a local path")
    secret = opts.storage_secret
    if not secret:
        return _Storage()  # workload identity / node role via --service-account
    if scheme in GCS_SCHEMES:
        volume = {"name": "storage-credentials", "secret": {"secretName": secret}}
        mount = {"name": "storage-credentials", "mountPath": GCS_CREDENTIALS_DIR, "readOnly": True}
        credentials = {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{GCS_CREDENTIALS_DIR}/key.json"}
        return _Storage(env=(credentials,), volumes=(volume,), mounts=(mount,))
    if scheme not in _STORAGE_ENV:
        raise ConfigError(
            f"storage_secret: no known credentials for {scheme}:// storage; "
            "use --service-account (workload identity) instead"
        )
    env = tuple(
        {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var, **({} if required else {"optional": True})}}}
        for var, required in _STORAGE_ENV[scheme]
    )
    return _Storage(env=env)


def _container(
    name: str, image: str, requests: dict[str, str], storage: _Storage, env: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        # Equal requests and limits: Guaranteed QoS, and Ray sizes itself from the limits.
        "resources": {"requests": dict(requests), "limits": dict(requests)},
    }
    if storage.env or env:
        container["env"] = [dict(e) for e in (*storage.env, *env)]
    if storage.mounts:
        container["volumeMounts"] = [dict(m) for m in storage.mounts]
    return container


def _pod_spec(
    containers: list[dict[str, Any]],
    placement: PodPlacement,
    storage: _Storage,
    opts: KubeRayOptions,
    grace_seconds: int | None = None,
    sidecars: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    # restartPolicy Never: required by autoscaler v2 (and SidecarMode); a dead Ray pod is replaced,
    # not restarted. The agent is a native sidecar (an init container that restarts on its own).
    spec: dict[str, Any] = {"restartPolicy": "Never"}
    if sidecars:
        spec["initContainers"] = sidecars
    spec["containers"] = containers
    volumes = [dict(v) for v in storage.volumes]
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    if sidecars:
        volumes.append({"name": RAY_TMP_VOLUME, "emptyDir": {}})
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.priority_class:
        spec["priorityClassName"] = opts.priority_class
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.affinity:
        spec["affinity"] = placement.affinity
    if placement.tolerations:
        spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if volumes:
        spec["volumes"] = volumes
    return spec


def _agent_notices(tier: Tier, gpu: int, opts: KubeRayOptions) -> list[dict[str, str]]:
    """The notice lengths the agent is told where they differ from its defaults: on GKE, a GPU
    node's hour of host-maintenance notice, and a Spot VM's preemption notice extended to the
    pods' grace (``--spot-grace``, which the node pool must match)."""
    if opts.cloud is not K8sCloud.GKE:
        return []
    env = []
    if gpu:
        env.append({"name": "SPOTFALLBACK_GCP_MAINTENANCE_NOTICE_S", "value": f"{GCP_GPU_MAINTENANCE_NOTICE_S:g}"})
    grace = opts.spot_grace_seconds
    if tier.market == SPOT and grace is not None and grace > GCP_PREEMPTION_NOTICE_S:
        env.append({"name": "SPOTFALLBACK_GCP_NOTICE_S", "value": str(grace)})
    return env


def _notice_agent(image: str, cloud: K8sCloud, run: str, storage: _Storage, notices: list[dict[str, str]]) -> dict[str, Any]:
    """The sidecar: ``spotfallback notice-agent`` in the Ray worker's pod (same IP, so the agent
    finds its Ray node through the shared /tmp/ray), configured by environment: it watches the
    cloud's notice (``AGENT_CLOUD``, and ``notices``' lengths), drains the node on it and records
    it in the run's ledger (storage credentials as the Ray container has them). A native sidecar:
    Kubernetes restarts it if it exits although the pod's restartPolicy is Never, and stops it
    after the Ray container."""
    env = [
        {"name": "SPOTFALLBACK_CLOUD", "value": AGENT_CLOUD[cloud]},
        {"name": "SPOTFALLBACK_RUN", "value": run},
        *notices,
        *(dict(e) for e in storage.env),
    ]
    return {
        "name": "notice-agent",
        "image": image,
        "restartPolicy": "Always",
        "command": list(NOTICE_AGENT_COMMAND),
        "env": env,
        "volumeMounts": [{"name": RAY_TMP_VOLUME, "mountPath": RAY_TMP_DIR}, *(dict(m) for m in storage.mounts)],
        "resources": {"requests": dict(AGENT_REQUESTS), "limits": dict(AGENT_REQUESTS)},
    }


# The notice agent's sidecar: Python with Ray's client imported (64Mi was too little for it).
AGENT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
_AGENT_CPU, _AGENT_MEMORY = (parse_quantity(AGENT_REQUESTS[key]) or 0.0 for key in ("cpu", "memory"))


def _run_uri(job: JobConfig) -> str:
    """The run's location as ``--run`` takes it: STORAGE_PATH/NAME."""
    return f"{job.storage_path.rstrip('/')}/{job.name}"


# Karpenter never disrupts a node running such a pod of its own accord (consolidation, drift,
# expiry), whatever NodePool launched it; a spot interruption still takes it, with its notice.
KARPENTER_DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}


def _template(spec: dict[str, Any], pod_labels: dict[str, str], opts: KubeRayOptions) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": dict(pod_labels)}
    if opts.cloud in (K8sCloud.EKS_KARPENTER, K8sCloud.AKS_NAP):
        metadata["annotations"] = dict(KARPENTER_DO_NOT_DISRUPT)
    return {"metadata": metadata, "spec": spec}


def _head_group(image: str, storage: _Storage, opts: KubeRayOptions, drains: bool, pod_labels: dict[str, str]) -> dict[str, Any]:
    # The Train controller runs here (the driver's node); it is what polls for drains.
    env = (PREEMPTION_POLL_ENV,) if drains else ()
    head = _container("ray-head", image, {"cpu": opts.head_cpu, "memory": opts.head_memory}, storage, env)
    head["ports"] = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
    ]
    placement = pod_placement(opts.cloud, ON_DEMAND)
    if opts.cloud in (K8sCloud.EKS_KARPENTER, K8sCloud.AKS_NAP):  # its own NodePool (manifest nodepools)
        placement = replace(placement, tolerations=[*placement.tolerations, dict(HEAD_TOLERATION)])
    return {
        "rayStartParams": {},
        "labels": {MARKET_LABEL: ON_DEMAND},
        "resources": {"CPU": "0"},
        "template": _template(_pod_spec([head], placement, storage, opts), pod_labels, opts),
    }


def _has_agent(tier: Tier, opts: KubeRayOptions) -> bool:
    """Spot pods; on GKE also GPU pods, which host maintenance stops an hour after its notice."""
    gpu = worker_shape(tier, 0)[1] > 0
    return opts.with_notice_agent and (tier.market == SPOT or (opts.cloud is K8sCloud.GKE and gpu))


def _pod_problem(name: str, index: int, pod_cpu: float, gpu: int, memory_bytes: float, opts: KubeRayOptions,
                 *, memory_given: bool, agent: bool) -> str | None:
    """Why no node of type ``name`` can hold the tier's worker pod, or None: its CPUs and GPUs
    (with the notice agent's CPUs), its memory (with the agent's)."""
    where = f"tiers[{index}].resources_per_worker"
    if problem := machine_fit_error(name, pod_cpu, gpu, where, kubernetes=True, beside_cpu=_AGENT_CPU if agent else 0.0,
                                    beside=f"the notice agent's {AGENT_REQUESTS['cpu']}" if agent else ""):
        return problem
    why = ([] if memory_given else [f"{opts.memory_per_cpu_gib} GiB per CPU from KubeRayOptions.memory_per_cpu_gib, as "
                                     "resources_per_worker names no memory"]) + (
        [f"the notice agent's {AGENT_REQUESTS['memory']} included"] if agent else [])
    return machine_memory_error(
        name, memory_bytes, pod_cpu, gpu, opts.cloud, where + (".memory" if memory_given else ""),
        f" ({'; '.join(why)})" if why else "", _AGENT_MEMORY if agent else 0.0,
    )


def _check_pod_fits(tier: Tier, index: int, pod_cpu: float, gpu: int, memory_bytes: float, opts: KubeRayOptions,
                    *, memory_given: bool, agent: bool) -> None:
    """Refuse a worker pod that no node the tier's pods may land on can hold: its pinned
    instance type, else every machine type of its GPU type there (Karpenter, GKE), whose
    largest's shortfall is named. Unknown types and unnamed pools are not checked."""
    pinned = tier.placement.instance_type
    types = (pinned,) if pinned else k8s_machine_types(opts.cloud, tier, index)
    problems = [_pod_problem(t, index, pod_cpu, gpu, memory_bytes, opts, memory_given=memory_given, agent=agent)
                for t in types]
    if not problems or not all(problems):
        return
    if pinned:
        raise ConfigError(problems[0] or "")
    sized = [(m.gpus, m.vcpus, m.memory_gib, i) for i, t in enumerate(types) if (m := machine(t)) is not None]
    largest = max(sized)[3] if sized else len(types) - 1
    gpu_type = tier.label_selector.get(ACCELERATOR_LABEL)
    which = "" if len(types) == 1 else f", the largest of which is {types[largest]!r}"
    raise ConfigError(f"{problems[largest]} (on {opts.cloud.value}, {ACCELERATOR_LABEL}: {gpu_type} puts the tier's pods "
                      f"on {' or '.join(types)} nodes{which})")


def _worker_group(
    tier: Tier, index: int, image: str, storage: _Storage, opts: KubeRayOptions, run: str, pod_labels: dict[str, str]
) -> dict[str, Any]:
    cpu, gpu, custom = worker_shape(tier, index)
    memory = custom.pop("memory", None)
    custom.pop("object_store_memory", None)
    per_cpu, pod_cpu = max(1, math.ceil(cpu)), (cpu if cpu > 0 else 1)
    requests = {
        "cpu": cpu_quantity(pod_cpu),
        "memory": str(int(memory)) if memory else f"{per_cpu * opts.memory_per_cpu_gib}Gi",
    }
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
    grace = opts.grace_seconds if tier.market == SPOT else None
    # Ray drains the node on the pod's SIGTERM; the window must close before the grace does.
    drain_env = ({"name": RAY_DRAIN_TIMEOUT_ENV, "value": str(ray_drain_timeout_s(grace))},) if grace else ()
    ray_container = _container("ray-worker", image, requests, storage, drain_env)
    sidecars = None
    if _has_agent(tier, opts):
        sidecars = [_notice_agent(image, opts.cloud, run, storage, _agent_notices(tier, gpu, opts))]
        ray_container.setdefault("volumeMounts", []).append({"name": RAY_TMP_VOLUME, "mountPath": RAY_TMP_DIR})
    placement = pod_placement(opts.cloud, tier.market, where=f"tiers[{index}].market")
    labels = tier_labels(tier, index)
    # Ray's zone/region labels must be true of the node: pin them with the well-known node labels.
    topology = {node_key: labels[ray_key] for ray_key, node_key in TOPOLOGY_LABELS.items() if ray_key in labels}
    pool = k8s_pool(opts.cloud, tier, index)
    _check_pod_fits(tier, index, pod_cpu, gpu, memory or per_cpu * opts.memory_per_cpu_gib * 2**30, opts,
                    memory_given=bool(memory), agent=sidecars is not None)
    selector = dict(placement.node_selector)
    for key, value in {**topology, **pool.node_selector}.items():
        if selector.get(key, value) != value:
            raise ConfigError(
                f"tiers[{index}].placement.node_selector.{key}: {value!r} contradicts {selector[key]!r}, which the "
                f"tier's market or zone requires on {opts.cloud.value}; drop it"
            )
        selector[key] = value
    tolerations = [*placement.tolerations, *(t for t in pool.tolerations if t not in placement.tolerations)]
    placement = replace(placement, node_selector=selector, tolerations=tolerations)
    group: dict[str, Any] = {
        "groupName": tier.name,
        # Every group starts empty, and the runner's request for its tier's workers scales it up.
        # A RayJob stays Initializing until its RayCluster is Ready, every desired pod running
        # (KubeRay's RayJob controller): workers asked for up front would hold it there while spot
        # is short, even past the driver's end, whose exit it would then never see.
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": tier.num_workers,
        "labels": labels,
        "rayStartParams": {},
    }
    if custom:
        # Custom Ray resources go in the top-level field, never also in rayStartParams.
        group["resources"] = {k: cpu_quantity(v) for k, v in sorted(custom.items())}
    group["template"] = _template(_pod_spec([ray_container], placement, storage, opts, grace, sidecars), pod_labels, opts)
    return group


def raycluster_spec(job: JobConfig, opts: KubeRayOptions, cluster: str | None = None) -> dict[str, Any]:
    """The ``RayClusterSpec`` (head + one worker group per tier) shared by both kinds.

    ``cluster``: only the tiers on that cluster of a ladder across clusters (indices, hence
    messages, stay the whole ladder's).
    """
    image = check_image(opts.image or default_image(job.tiers[0].use_gpu, opts.ray_version), opts.ray_version)
    storage = _storage(job, opts)
    tiers = [(i, t) for i, t in enumerate(job.tiers) if cluster is None or job.ladder.cluster_key(i) == cluster]
    drains = any(t.market == SPOT or _has_agent(t, opts) for _, t in tiers)
    run = _run_uri(job)
    # Every pod carries the run's name (and its cluster's, across clusters) beside the user's labels.
    pod_labels = {RUN_LABEL: label_value(job.name), **({CLUSTER_LABEL: label_value(cluster)} if cluster else {}), **opts.labels}
    return {
        "rayVersion": opts.ray_version,
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "version": "v2",
            "upscalingMode": "Default",
            "idleTimeoutSeconds": opts.idle_timeout_seconds,
        },
        "headGroupSpec": _head_group(image, storage, opts, drains, pod_labels),
        "workerGroupSpecs": [_worker_group(t, i, image, storage, opts, run, pod_labels) for i, t in tiers],
    }


def _metadata(job: JobConfig, opts: KubeRayOptions, name: str, entrypoint: str | None = None,
              labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The object's metadata: its name, namespace, the run's labels and annotations (the command, on a RayCluster)."""
    metadata: dict[str, Any] = {"name": name}
    if opts.namespace:
        metadata["namespace"] = opts.namespace
    metadata["labels"] = {MANAGED_BY_LABEL: "spotfallback", RUN_LABEL: label_value(job.name), **opts.labels, **(labels or {})}
    metadata["annotations"] = {RUN_NAME_ANNOTATION: job.name, MIN_KUBERAY_ANNOTATION: MIN_KUBERAY_VERSION}
    if entrypoint is not None:
        metadata["annotations"][ENTRYPOINT_ANNOTATION] = entrypoint
    return metadata


def _refuse_pip_on_a_raycluster(opts: KubeRayOptions) -> None:
    if opts.pip:
        raise ConfigError("pip: packages are installed per job; for a RayCluster, build them into the image")


def across_cluster_manifests(job: JobConfig, opts: KubeRayOptions) -> list[tuple[dict[str, Any], list[str]]]:
    """One RayCluster per cluster a ladder across clusters names, with its header lines, in ladder order.

    Each holds its cluster's tiers; the moving driver runs outside them all (``spotfallback run``
    of the whole job, in each one's entrypoint annotation) and submits the run's jobs to each head's Jobs API, so a RayJob (which runs its own
    entrypoint) does not fit.
    """
    job = with_run_name(job, opts.run_name)
    if opts.kind is Kind.RAYJOB:
        raise ConfigError(
            "kind: a ladder across clusters is deployed as one RayCluster per cluster (--kind raycluster); the moving "
            "driver, `spotfallback run JOB.yaml` on a machine that reaches every cluster, submits the run's jobs"
        )
    _refuse_pip_on_a_raycluster(opts)
    if "://" not in job.storage_path or opts.storage_pvc:
        raise ConfigError(
            "storage_path: a ladder across clusters needs object storage every cluster reaches (s3://, gs://, "
            "abfs://), not a volume that lives in one of them"
        )
    out = []
    for key, ref in job.ladder.clusters.items():
        metadata = _metadata(job, opts, k8s_name(f"{job.name}-{key}", MAX_RAYCLUSTER_NAME), job.run_command(),
                             {CLUSTER_LABEL: label_value(key)})
        manifest = {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata,
                    "spec": raycluster_spec(job, opts, key)}
        tiers = ", ".join(t.name for i, t in enumerate(job.tiers) if job.ladder.cluster_key(i) == key)
        region = f" in {ref.region}" if ref.region else ""
        header = [
            f"Generated by `spotfallback manifest kuberay --cloud {opts.cloud.value}`; do not edit by hand.",
            f"Cluster {key!r}{region}: tiers {tiers}. Apply this document in that Kubernetes cluster:",
            f"kubectl apply -f FILE -l {CLUSTER_LABEL}={label_value(key)}. Its head's Ray Jobs API (the dashboard, port 8265)",
            f"must be reachable at {ref.address}, the address its tiers name: KubeRay's {metadata['name']}-head-svc is headless",
            "(no address of its own), so give the head a Service of yours (e.g. an internal LoadBalancer) selecting",
            f"ray.io/cluster={metadata['name']} and ray.io/node-type=head.",
            f"Needs KubeRay >= {MIN_KUBERAY_VERSION}. The run moves between the clusters through their Jobs APIs: run the",
            f"command in the annotation {ENTRYPOINT_ANNOTATION} (or `spotfallback run JOB.yaml`) on a machine outside",
            "every cluster's region that reaches all their Jobs APIs and the storage (docs/clusters.md);",
            f"running it again resumes run {job.name!r}; never reuse a name by accident.",
            *(["The stock Ray image has no spotfallback, which the run's jobs run on every cluster: pass --image with it installed."]
              if is_stock_image(opts.image) else []),
            *_drain_note(job, opts),
        ]
        out.append((manifest, header))
    return out


def kuberay_manifest(job: JobConfig, opts: KubeRayOptions) -> dict[str, Any]:
    """The RayJob (or RayCluster) for ``job`` as a plain dict, ready for YAML."""
    job = with_run_name(job, opts.run_name)
    is_job = opts.kind is Kind.RAYJOB
    if not is_job:
        _refuse_pip_on_a_raycluster(opts)
    entrypoint = rayjob_entrypoint(job)
    name = k8s_name(job.name, MAX_RAYJOB_NAME if is_job else MAX_RAYCLUSTER_NAME)
    metadata = _metadata(job, opts, name, None if is_job else entrypoint)
    cluster = raycluster_spec(job, opts)
    if not is_job:
        return {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata, "spec": cluster}
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "submissionMode": "SidecarMode",
        "backoffLimit": opts.backoff_limit,
        "activeDeadlineSeconds": opts.active_deadline_seconds,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": opts.ttl_seconds_after_finished,
    }
    if pip := with_spotfallback(opts.image, opts.pip, job.entrypoint):  # the stock image has no `spotfallback` to run
        spec["runtimeEnvYAML"] = yaml.safe_dump({"pip": pip}, sort_keys=False)
    spec["rayClusterSpec"] = cluster
    return {"apiVersion": API_VERSION, "kind": "RayJob", "metadata": metadata, "spec": spec}


def kuberay_header(job: JobConfig, opts: KubeRayOptions, name: str) -> list[str]:
    """Comment lines for the top of the file: what it is and how not to lose a run."""
    run = opts.run_name or job.name
    if opts.kind is Kind.RAYJOB:
        how = [
            f"Start: kubectl create -f FILE.  Follow: kubectl get rayjob {name} -w",
            f"Its pods: kubectl get pods -l {RUN_LABEL}={label_value(run)}",
            f"Run name {run!r}: creating this RayJob again (after deleting the old one) RESUMES that run",
            "from its checkpoints. For a new run, generate with another --name or --unique-name;",
            "never reuse a name by accident.",
        ]
    else:
        how = [
            "Start: kubectl apply -f FILE, then run the command in the annotation",
            f"{ENTRYPOINT_ANNOTATION} on the head pod (or submit it with `ray job submit -- ...`).",
            f"Its pods: kubectl get pods -l {RUN_LABEL}={label_value(run)}",
            f"Run name {run!r}: running that command again RESUMES the run; never reuse a name by accident.",
        ]
    if opts.kind is Kind.RAYJOB and installs_spotfallback(opts.image, opts.pip):
        how.append(f"The stock Ray image has no spotfallback: the job installs {spotfallback_requirement(job.entrypoint)} "
                   "(runtimeEnvYAML).")
    elif opts.kind is Kind.RAYCLUSTER and is_stock_image(opts.image):
        how.append("The stock Ray image has no spotfallback: submit the command with `ray job submit --runtime-env-json "
                   f"'{{\"pip\": [\"{spotfallback_requirement(job.entrypoint)}\"]}}' -- ...`, or pass --image.")
    needs = (f"Needs KubeRay >= {MIN_KUBERAY_VERSION} (older operators silently drop group labels and resources, never submit "
             "a SidecarMode job, or do not fully scale a group for a label selector)")
    if any(_has_agent(t, opts) for t in job.tiers):
        needs += " and Kubernetes >= 1.29 (the notice agent is a native sidecar)"
    head = f"Generated by `spotfallback manifest kuberay --cloud {opts.cloud.value}`; do not edit by hand."
    check = "Check an operator: spotfallback manifest validate FILE --kuberay-version X.Y.Z"
    return [head, needs + ".", check, *how, *_drain_note(job, opts)]


def spot_grace_note(job: JobConfig, opts: KubeRayOptions) -> str | None:
    """What the spot nodes need for the pods' grace to hold, when it is longer than the cloud's
    default shutdown gives them (GKE: 15 s unless the node pool is set up for more), or None."""
    needs = SPOT_SHUTDOWN[opts.cloud].longer_needs
    if needs is None or opts.grace_seconds <= SPOT_SHUTDOWN[opts.cloud].grace_s or not any(t.market == SPOT for t in job.tiers):
        return None
    return f"a {opts.grace_seconds} s spot grace needs {needs}"


def pod_fabric_notes(job: JobConfig, opts: KubeRayOptions) -> list[str]:
    """A tier whose gang spans several nodes of a type built for a GPU fabric (EFA, GPUDirect;
    ``machines.gpu_fabric``): its pods ask for none, so NCCL between the nodes runs over TCP."""
    notes = []
    for i, tier in enumerate(job.tiers):
        gpus = worker_shape(tier, i)[1]
        types = k8s_machine_types(opts.cloud, tier, i)
        fabrics = {gpu_fabric(t) for t in types}
        sizes = [size.gpus for t in types if (size := machine(t)) is not None]
        if not gpus or len(fabrics) != 1 or not sizes or (fabric := fabrics.pop()) is None:
            continue
        per_node = max(1, min(sizes) // gpus)
        if tier.num_workers <= per_node:
            continue
        needs = ("the nodes need EFA interfaces and the EFA device plugin, the worker group's container the "
                 "vpc.amazonaws.com/efa devices, and the image libfabric with the aws-ofi-nccl plugin" if fabric == "EFA"
                 else f"the node pool needs the series' extra GPU networks, the pods GKE's multi-network annotations for "
                      f"them, and the image {fabric}'s NCCL plugin")
        notes.append(fabric_note(tier, i, math.ceil(tier.num_workers / per_node), " or ".join(types), fabric, needs))
    return notes


def _drain_note(job: JobConfig, opts: KubeRayOptions) -> list[str]:
    if not any(t.market == SPOT for t in job.tiers):
        return []
    grace = opts.grace_seconds
    lines = [
        f"Spot pods: on SIGTERM Ray drains the node for {ray_drain_timeout_s(grace)} s ({RAY_DRAIN_TIMEOUT_ENV}) "
        f"within a {grace} s grace (terminationGracePeriodSeconds), so the workers checkpoint just in time;",
        f"the SIGTERM comes from {SPOT_SHUTDOWN[opts.cloud].sigterm_from} (docs/deploy.md: what each cloud needs).",
    ]
    if opts.with_notice_agent:
        lines.append(
            f"Notice agent: a native sidecar watches the {AGENT_CLOUD[opts.cloud]} notice, earlier than the SIGTERM, "
            "drains the node then and records it in the run."
        )
        lines.extend(_agent_reach_note(opts))
    else:
        why = "--no-notice-agent" if opts.notice_agent is False else "the stock Ray image has no spotfallback; pass --image"
        lines.append(f"Notice agent: off ({why}): only the SIGTERM drain above, no earlier cloud notice.")
    if (note := spot_grace_note(job, opts)) is not None:
        lines.append(f"Spot grace: {note}.")
    return lines


def _agent_reach_note(opts: KubeRayOptions) -> list[str]:
    """What the nodes need for the agent to read their metadata service from a pod (its health
    record says ``metadata-failing`` otherwise, and only the SIGTERM drain is left)."""
    if opts.cloud in (K8sCloud.EKS_KARPENTER, K8sCloud.EKS_MANAGED):
        where = ("the EC2NodeClass's (whose default is 1)" if opts.cloud is K8sCloud.EKS_KARPENTER
                 else "the node group's launch template's (EC2's default for one is 1)")
        return [f"The agent reads IMDSv2 from the pod: {where} metadataOptions.httpPutResponseHopLimit must be 2 or "
                "more, or the token's answer stops one hop short of the pod."]
    if opts.cloud is K8sCloud.GKE:
        identity = " (--service-account is one)" if opts.service_account else ""
        return [f"Under Workload Identity{identity} pods see the GKE metadata server, reported not to serve "
                "instance/preempted: give the spot and GPU node pools --workload-metadata=GCE_METADATA, or check with "
                "`spotfallback notice-agent --cloud gcp --once` in such a pod."]
    return []


def render_kuberay(job: JobConfig, opts: KubeRayOptions) -> str:
    """The manifest as commented YAML, validated as text (what kubectl will read) first.

    A ladder across clusters gives one RayCluster document per cluster (``across_cluster_manifests``).
    """
    if job.ladder.across_clusters:
        text = "---\n".join(to_yaml(m, header) for m, header in across_cluster_manifests(job, opts))
        assert_valid_text(text)
        return text
    manifest = kuberay_manifest(job, opts)
    text = to_yaml(manifest, kuberay_header(job, opts, manifest["metadata"]["name"]))
    assert_valid_text(text)
    return text
