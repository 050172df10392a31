"""Ray cluster-launcher (``ray up``) configs for a tier ladder, on AWS or GCP.

Same shape as the KubeRay manifest: an on-demand head that advertises ``CPU: 0`` (the driver
and Ray Train's controller live there, training workers never do), and one node type per tier
whose Ray ``labels`` satisfy the tier's label selector and whose ``node_config`` asks the cloud
for the tier's market. Every tier starts at ``min_workers: 0``; the autoscaler adds nodes when
the runner asks for the tier's label selector. One node runs one worker, so a node type
advertises exactly one worker's resources.

The launcher runs a cluster in one region, so tiers that name different regions need one
cluster each; on GCP it also runs in one zone. On AWS one cluster may span the zones of its
region: each zone-pinned tier's node type launches in its zone's subnets. KubeRay has no such limit.

Spot nodes also start the preemption-notice agent right after ``ray start`` (see
``notice_agent_command``): on plain VMs nothing else turns the cloud's notice into a Ray drain.
"""

from __future__ import annotations

import copy
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotfallback.cloud_notices import GCP_GPU_MAINTENANCE_NOTICE_S
from spotfallback.config import MARKET_LABEL, ON_DEMAND, SPOT, JobConfig, Tier
from spotfallback.deploy.clouds import VmCloud, vm_market_config
from spotfallback.deploy.common import (
    DEFAULT_RAY_VERSION,
    REGION_LABEL,
    ZONE_LABEL,
    check_image,
    choice,
    default_image,
    fabric_note,
    installs_spotfallback,
    k8s_name,
    pip_packages,
    shared_label,
    short_repr,
    spotfallback_requirement,
    tier_labels,
    to_yaml,
    with_run_name,
    with_spotfallback,
    worker_shape,
)
from spotfallback.deploy.kuberay import rayjob_entrypoint
from spotfallback.deploy.machines import (
    GVNIC,
    family,
    gcp_series,
    gpu_fabric,
    head_machine_error,
    machine,
    vm_holds_memory,
)
from spotfallback.deploy.pools import GPUS, machine_type_error, vm_pool, with_memory
from spotfallback.deploy.validate import assert_valid_text
from spotfallback.errors import ConfigError

HEAD_TYPE = "head"
GCP_CPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cpu"
GCP_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]

# (instance type, vCPUs, GPUs), smallest first: the default is the first that fits one worker.
_AWS_TYPES = family("m5.")
_AWS_GPU_TYPES = GPUS["A10G"].aws
_GCP_TYPES = family("n2-standard-")
_GCP_GPU_TYPES = GPUS["L4"].gcp
HEAD_INSTANCE_TYPES = {VmCloud.AWS: "m5.2xlarge", VmCloud.GCP: "n2-standard-8"}  # without --head-instance-type

# Ray's own default worker start (ray/autoscaler/{aws,gcp}/defaults.yaml); a config that sets
# worker_start_ray_commands replaces it, so it is repeated before the agent's line.
RAY_WORKER_START = [
    "ray stop",
    "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
]
# The updater exports each node type's labels to its start commands as compact JSON
# (RAY_OVERRIDE_LABELS='{"ray.io/market-type":"spot",...}'), under autoscaler v1 and v2 alike.
# Node types that run the agent carry this label: spot ones, and on GCP the GPU ones, which host
# maintenance stops (onHostMaintenance TERMINATE) an hour after a notice the agent watches.
AGENT_LABEL = "spotfallback/notice-agent"
AGENT_LABELS_PATTERN = f'*\'"{AGENT_LABEL}":"true"\'*'
AGENT_LOG = "~/spotfallback-notice-agent.log"
AGENT_PID = "~/spotfallback-notice-agent.pid"
# GCE's guest gets 30 s of soft-off on preemption; Docker would stop the container after its
# default 10 s (Ray's docker runner sets no stop timeout), cutting the workers' last checkpoint.
GCP_STOP_TIMEOUT_S = 30


# An EC2 image id: 'ami-' and 8 (older) or 17 hexadecimal digits.
_AMI_ID = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
# A login name as useradd takes it (the user `ray up` logs in as).
_SSH_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# A GCP project id (Resource Manager's rule), with the legacy 'example.com:' domain prefix.
_GCP_PROJECT_ID = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


@dataclass(frozen=True)
class LauncherOptions:
    """What a ``ray up`` file needs beyond the job file.

    ``instance_types`` maps tier names to instance/machine types; tiers not named get the
    smallest general-purpose (or GPU) type that fits one worker. ``head_instance_type`` replaces
    ``HEAD_INSTANCE_TYPES``; a known type too small for a head is refused (``head_machine_error``).
    ``instance_profile`` (AWS, an ARN) or ``service_account`` (GCP, an email) gives the worker nodes access to
    storage_path; the head keeps the identity Ray creates for it, which has storage access.
    ``notice_agent`` (default on) starts ``spotfallback notice-agent`` on spot nodes (and GPU
    nodes on GCP). The driver and the agent run spotfallback on the nodes: with the stock Ray
    image and no spotfallback in ``pip``, this version of spotfallback is installed from PyPI
    by the setup commands. ``subnetwork`` (GCP) puts every node on that subnetwork (a name in the
    cluster's region, or its partial or full URL, a Shared VPC host project's included) rather
    than the project's default network or the region's first subnet, which Ray's launcher picks.
    ``subnet_ids`` (AWS) are the subnets every node may launch in, in the order Ray's launcher
    tries them, rather than the default VPC's. ``zone_subnet_ids`` (AWS) maps a zone to its
    subnets: the node types of the tiers in that zone launch there, and the others (the head, a
    tier pinned to no zone) in ``subnet_ids`` or, with none, in any of them; a ladder whose tiers
    name several zones of the region needs each zone's. ``security_group_ids`` (AWS) are every node's
    security groups, rather than the one Ray's launcher makes. ``tags`` go on every node (and, on
    AWS, its volumes): AWS tags or GCP labels, for cost allocation or an organisation's policy.
    ``internal_ips`` has ``ray up`` reach the nodes by their private IPs, so it runs inside the
    network; AWS nodes may then be in private subnets, and GCP nodes get no external IP.
    """

    cloud: VmCloud
    image: str | None = None
    ray_version: str = DEFAULT_RAY_VERSION
    run_name: str | None = None
    region: str | None = None
    zone: str | None = None
    project_id: str | None = None
    instance_types: Mapping[str, str] = field(default_factory=dict)
    head_instance_type: str | None = None
    source_image: str | None = None
    image_id: str | None = None
    instance_profile: str | None = None
    service_account: str | None = None
    pip: Sequence[str] = ()
    ssh_user: str = "ubuntu"
    idle_timeout_minutes: int = 5
    disk_size_gb: int = 100
    notice_agent: bool = True
    subnetwork: str | None = None
    subnet_ids: Sequence[str] = ()
    zone_subnet_ids: Mapping[str, Sequence[str]] = field(default_factory=dict)
    security_group_ids: Sequence[str] = ()
    internal_ips: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cloud", choice("cloud", self.cloud, VmCloud))
        object.__setattr__(self, "pip", pip_packages(self.pip))
        for name, low in (("idle_timeout_minutes", 0), ("disk_size_gb", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}: must be a whole number, at least {low} (got {value!r})")
        if self.image_id is not None and not _AMI_ID.fullmatch(self.image_id):
            raise ConfigError(f"image_id: {short_repr(self.image_id)} is not an AMI id; give one such as "
                              "'ami-0123456789abcdef0' (the region's, from `aws ec2 describe-images`), not its name")
        if not _SSH_USER.fullmatch(self.ssh_user):
            raise ConfigError(f"ssh_user: {short_repr(self.ssh_user)} is not a login name; give the image's user, e.g. "
                              "'ubuntu' (Ubuntu AMIs and images) or 'ec2-user' (Amazon Linux)")
        if self.project_id is not None and not _GCP_PROJECT_ID.fullmatch(self.project_id):
            raise ConfigError(f"project_id: {short_repr(self.project_id)} is not a GCP project id (6-30 lowercase "
                              "letters, digits and hyphens, starting with a letter); give the id, e.g. "
                              "'my-project-123', not the project's display name or number")


def notice_agent_command(job: JobConfig, cloud: VmCloud) -> str:
    """The start command that runs the notice agent on the node types labelled for it, after ``ray start``.

    The agent polls the cloud's metadata service and drains this node (found through the
    ``/tmp/ray`` file ``ray start`` just wrote) on a notice, recording it in the run's ledger:
    the worker nodes write checkpoints to storage_path, so they can write the ledger too. A
    restart of Ray (``ray up`` again) replaces the previous agent, whose node is gone.
    """
    run = f"{job.storage_path.rstrip('/')}/{job.name}"
    agent = shlex.join(["spotfallback", "notice-agent", "--cloud", cloud.value, "--run", run])
    return (
        f'case "$RAY_OVERRIDE_LABELS" in {AGENT_LABELS_PATTERN}) '
        f'kill "$(cat {AGENT_PID} 2>/dev/null)" 2>/dev/null; '
        f"nohup {agent} >{AGENT_LOG} 2>&1 </dev/null & echo $! >{AGENT_PID};; esac"
    )


# How long a GPU node waits for its NVIDIA driver before Docker starts: a Deep Learning VM
# image builds and loads it on first boot (minutes; Ray's own GCP GPU example waits 5).
GPU_DRIVER_WAIT_S = 600
# Asks a GCP Deep Learning VM image to install the NVIDIA driver on first boot; without it the
# image only offers to at an interactive login, which Ray's launcher never makes.
GCP_DRIVER_METADATA = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}


def gpu_driver_wait(timeout_s: float = GPU_DRIVER_WAIT_S, poll_s: float = 5.0) -> str:
    """The initialization command of a GPU node type: wait until ``nvidia-smi`` answers, or fail
    the node's set-up saying why.

    Ray's launcher gives the container the GPUs (``--runtime=nvidia``) only if ``nvidia-smi``
    answers when Docker starts it; a node still installing its driver, or booted from an image
    without one, would otherwise start Ray with GPU resources that CUDA cannot see, and the
    gang would fail at its first CUDA call instead of at set-up.
    """
    minutes = f"{timeout_s / 60:g} minute{'s' if timeout_s != 60 else ''}"
    message = (f"spotfallback: no NVIDIA driver answered nvidia-smi within {minutes} of boot; boot GPU nodes "
               "from an image with NVIDIA drivers (a Deep Learning AMI or Deep Learning VM image)")
    return (f"timeout {timeout_s:g} bash -c {shlex.quote(f'until nvidia-smi >/dev/null 2>&1; do sleep {poll_s:g}; done')}"
            f" || {{ echo {shlex.quote(message)} >&2; exit 1; }}")


def _instance_type(tier: Tier, index: int, opts: LauncherOptions) -> tuple[str, dict[str, Any]]:
    """The tier's machine type (``--instance-type`` first, then the tier's pool, then the
    default fit) and any extra ``node_config`` its GPU type needs."""
    cpu, gpu, custom = worker_shape(tier, index)
    chosen = opts.instance_types.get(tier.name)
    pooled, extra = vm_pool(opts.cloud, tier, index, cpu, gpu, pinned=chosen,
                            where=f"instance_type: {tier.name}" if chosen else None)
    return (pooled or _default_fit(tier, index, opts, cpu, gpu, custom.get("memory", 0.0))), extra


def _default_fit(tier: Tier, index: int, opts: LauncherOptions, cpu: float, gpu: int, memory: float) -> str:
    gcp = opts.cloud is VmCloud.GCP
    table = (_GCP_GPU_TYPES if gcp else _AWS_GPU_TYPES) if gpu else (_GCP_TYPES if gcp else _AWS_TYPES)
    for name, vcpus, gpus in table:
        if vcpus >= cpu and gpus >= gpu and vm_holds_memory(name, memory):
            return name
    raise ConfigError(
        f"tiers[{index}].resources_per_worker: no default {opts.cloud.value} type has {cpu:g} CPUs{with_memory(memory)} and "
        f"{gpu} GPUs; name one with --instance-type {tier.name}=TYPE"
    )


def workers_per_node(tier: Tier, index: int, instance_type: str) -> int:
    """How many of the tier's workers one node of ``instance_type`` holds.

    Ray Train runs one process per worker, and ``ray.train.torch`` gives each the one GPU
    ``get_device`` returns (the lowest of its GPUs): a job of one-GPU workers is Ray Train's shape,
    and a node with more GPUs than one worker takes as many workers as its GPUs, vCPUs and memory
    allow (Ray Train packs a gang's workers onto nodes). A CPU tier, or a machine whose size
    spotfallback does not know, runs one worker per node.
    """
    cpu, gpu, custom = worker_shape(tier, index)
    size = machine(instance_type)
    if not gpu or size is None or size.gpus <= gpu:
        return 1
    fits = [size.gpus // gpu, tier.num_workers]
    if cpu > 0:
        fits.append(int(size.vcpus // cpu))
    if custom.get("memory"):
        fits.append(int(size.memory_gib * 2**30 // custom["memory"]))
    return max(1, min(fits))


@dataclass(frozen=True)
class TierNode:
    """One tier's node: its machine type, the ``node_config`` its GPU type needs beyond the
    type, and how many of the tier's workers one node holds."""

    instance_type: str
    accelerators: dict[str, Any]
    per_node: int


def tier_nodes(job: JobConfig, opts: LauncherOptions) -> list[TierNode]:
    """Each tier's node, in the ladder's order, as the ``ray up`` file's node types have them."""
    nodes = []
    for i, tier in enumerate(job.tiers):
        instance_type, accelerators = _instance_type(tier, i, opts)
        nodes.append(TierNode(instance_type, accelerators, workers_per_node(tier, i, instance_type)))
    return nodes


def _node_resources(tier: Tier, index: int, per_node: int = 1) -> dict[str, int]:
    # Ray's launcher schema takes whole numbers; rounding up keeps a node to its ``per_node`` workers.
    cpu, gpu, custom = worker_shape(tier, index)
    resources = {"CPU": max(1, math.ceil(cpu * per_node))}
    if gpu:
        resources["GPU"] = gpu * per_node
    resources.update({k: math.ceil(v * per_node) for k, v in sorted(custom.items()) if k != "object_store_memory"})
    return resources


def _node_config(instance_type: str, market: str, gpu: bool, where: str, opts: LauncherOptions) -> dict[str, Any]:
    # The identity options go on workers only: Ray gives the head its own autoscaler identity
    # (EC2 + S3 / compute + storage.objectAdmin), which overriding would break.
    worker = where != "head"
    if opts.cloud is VmCloud.AWS:
        config: dict[str, Any] = {"InstanceType": instance_type}
        if opts.image_id:
            config["ImageId"] = opts.image_id
        config.update(vm_market_config(opts.cloud, market, gpu=gpu, where=where))
        if opts.instance_profile and worker:
            config["IamInstanceProfile"] = {"Arn": opts.instance_profile}
        return config
    if gpu and not opts.source_image:
        raise ConfigError(
            "source_image: GPU tiers on GCP need a boot image with NVIDIA drivers, such as a Deep Learning VM image "
            "family; pass --source-image"
        )
    boot: dict[str, Any] = {"diskSizeGb": opts.disk_size_gb, "sourceImage": opts.source_image or GCP_CPU_IMAGE}
    series = gcp_series(instance_type)
    if series is not None:
        # The API's default boot disk (pd-standard) is refused by the newer series (machines.GCP_SERIES).
        boot["diskType"] = series.boot_disks[0]
    config = {
        "machineType": instance_type,
        "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT", "initializeParams": boot}],
    }
    if series is not None and series.gvnic:
        config["networkInterfaces"] = [_gcp_interface(GVNIC)]
    if gpu:
        config["metadata"] = copy.deepcopy(GCP_DRIVER_METADATA)
    config.update(vm_market_config(opts.cloud, market, gpu=gpu, where=where))
    if opts.service_account and worker:
        config["serviceAccounts"] = [{"email": opts.service_account, "scopes": list(GCP_SCOPES)}]
    return config


def _share_network(node_types: dict[str, Any], subnetwork: str | None, external_ips: bool) -> None:
    """Give every GCP node type the same network interface once one of them sets its own (gVNIC),
    a ``subnetwork`` is named, or the nodes are to have no external IP.

    Ray's launcher fills ``networkInterfaces`` (its region's first subnet, an external IP) only on
    node configs without one, and looks no subnet up when all have one; so a gVNIC node type would
    otherwise get the project's default network while the others get Ray's pick. With all of them
    set, every node is on ``subnetwork``, else on the default network (the Compute API's default
    when an interface names no network or subnetwork), each with an external IP unless
    ``external_ips`` is false (an interface without ``accessConfigs`` has none).
    """
    configs = [node_type["node_config"] for node_type in node_types.values()]
    if subnetwork or not external_ips or any("networkInterfaces" in config for config in configs):
        for config in configs:
            interface = config.setdefault("networkInterfaces", [_gcp_interface()])[0]
            if subnetwork:
                interface["subnetwork"] = subnetwork
            if not external_ips:
                interface.pop("accessConfigs", None)


# A subnetwork as the Compute API takes it in an instance's networkInterfaces[].subnetwork: a full or
# partial URL (https://www.googleapis.com/compute/v1/projects/P/regions/R/subnetworks/S,
# projects/P/regions/R/subnetworks/S, regions/R/subnetworks/S). Its name is a resource name (RFC 1035,
# up to 63 characters); a project id is lowercase letters, digits and hyphens (a domain-scoped one,
# example.com:my-project, also dots and a colon).
_GCP_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SUBNETWORK = re.compile(
    rf"(?:https://www\.googleapis\.com/compute/v1/)?(?:projects/[a-z][-a-z0-9.:]*[a-z0-9]/)?"
    rf"regions/(?P<region>[a-z0-9-]+)/subnetworks/(?P<name>{_GCP_NAME})"
)


def gcp_subnetwork(value: str, region: str) -> str:
    """``value`` as the path every node's interface names: a bare name is taken in ``region``.

    A VM's subnetwork must be in its zone's region, so one elsewhere is refused here rather
    than by the Compute API at the first node's launch.
    """
    if re.fullmatch(_GCP_NAME, value):
        return f"regions/{region}/subnetworks/{value}"
    found = _SUBNETWORK.fullmatch(value)
    if found is None:
        raise ConfigError(f"subnetwork: {value!r} is not a subnetwork; give its name (such as 'ray-subnet', in region "
                          f"{region}) or its path, projects/HOST_PROJECT/regions/{region}/subnetworks/NAME")
    if found["region"] != region:
        raise ConfigError(f"subnetwork: {value!r} is in region {found['region']!r}, but the nodes are in {region!r}; a "
                          "VM's subnetwork must be in its zone's region: name one there, or change --zone")
    return value


def _aws_ids(values: Sequence[str], field: str, prefix: str, what: str, lister: str) -> list[str]:
    """``values`` checked as EC2 IDs of one kind (``prefix`` and 8, older, or 17 hexadecimal
    digits), each once, in the order given. One string is one ID."""
    ids: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        if not re.fullmatch(rf"{prefix}-(?:[0-9a-f]{{8}}|[0-9a-f]{{17}})", value):
            raise ConfigError(f"{field}: {value!r} is not {what} ID; give one such as '{prefix}-0123456789abcdef0' "
                              f"(`aws ec2 {lister}` lists them)")
        if value in ids:
            raise ConfigError(f"{field}: {value!r} is given twice; give each once")
        ids.append(value)
    return ids


def _aws_network_ids(opts: LauncherOptions) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """``opts``' subnet IDs, each zone's, and security group IDs, checked: a subnet is in one zone."""
    zoned: dict[str, list[str]] = {}
    zone_of: dict[str, str] = {}
    for zone, ids in opts.zone_subnet_ids.items():  # each a zone of the cluster's (cluster_zones)
        zoned[zone] = _aws_ids(ids, "zone_subnet_ids", "subnet", "a subnet", "describe-subnets")
        if not zoned[zone]:
            raise ConfigError(f"zone_subnet_ids: zone {zone!r} has no subnet; give its subnets, or leave the zone out")
        for subnet in zoned[zone]:
            if subnet in zone_of:
                raise ConfigError(f"zone_subnet_ids: {subnet!r} is given for {zone_of[subnet]} and for {zone}; a subnet is "
                                  "in one zone")
            zone_of[subnet] = zone
    return (_aws_ids(opts.subnet_ids, "subnet_ids", "subnet", "a subnet", "describe-subnets"), zoned,
            _aws_ids(opts.security_group_ids, "security_group_ids", "sg", "a security group", "describe-security-groups"))


def _aws_network(node_types: dict[str, Any], opts: LauncherOptions) -> None:
    """Put every AWS node type in ``opts``' subnets and security groups, where it names any: a
    zone-pinned node type in its zone's subnets, where they are given; the others in the
    subnets for every node, or, with none, in all the zones' subnets.

    Ray's launcher launches a node in the first subnet and tries the next where a launch fails
    (no capacity in its zone). A node type with security groups gets none of Ray's own.
    """
    subnets, zoned, groups = _aws_network_ids(opts)
    anywhere = subnets or [subnet for ids in zoned.values() for subnet in ids]
    for node_type in node_types.values():
        chosen = zoned.get(node_type["labels"].get(ZONE_LABEL, "")) or anywhere
        if chosen:
            node_type["node_config"]["SubnetIds"] = list(chosen)
        if groups:
            node_type["node_config"]["SecurityGroupIds"] = list(groups)


# What each cloud takes as a tag (AWS) or label (GCP): AWS keys of 1-128 and values of up to 256
# letters, digits, spaces and + - = . _ : / @, keys not starting with aws:; GCP keys of 1-63
# lowercase letters (international ones too), digits, _ and -, starting with a letter, values of
# up to 63 of the same. Ray's own tags and labels start with ray- (AWS also has Name, the node's
# name), and a tag of the same key would replace Ray's on AWS, or be replaced by it on GCP.
_AWS_TAG_TEXT = r"[\w .:/=+\-@]"
_TAG_RULES: dict[VmCloud, tuple[re.Pattern[str], re.Pattern[str], str]] = {
    VmCloud.AWS: (re.compile(rf"(?!aws:){_AWS_TAG_TEXT}{{1,128}}"), re.compile(rf"{_AWS_TAG_TEXT}{{0,256}}"),
                  "an AWS tag's key has 1-128 and its value up to 256 letters, digits, spaces and + - = . _ : / @, the key "
                  "not starting with aws:"),
    VmCloud.GCP: (re.compile(r"[^\W\d_][\w-]{0,62}"), re.compile(r"[\w-]{0,63}"),
                  "a GCP label's key has 1-63 lowercase letters, digits, _ and -, starting with a letter, and its value up "
                  "to 63 of the same"),
}


def _tag_nodes(node_types: dict[str, Any], opts: LauncherOptions) -> None:
    """Put ``opts.tags`` on every node: AWS tags on the instance and its volumes, GCP labels."""
    key_re, value_re, rule = _TAG_RULES[opts.cloud]
    for key, value in opts.tags.items():
        if key.startswith("ray-") or (opts.cloud is VmCloud.AWS and key == "Name"):
            raise ConfigError(f"tags: {key!r} is one of Ray's own tags (ray-..., and Name on AWS), which the launcher sets "
                              "on every node; choose another key")
        lowercase = opts.cloud is VmCloud.AWS or f"{key}{value}" == f"{key}{value}".lower()
        if not key_re.fullmatch(key) or not value_re.fullmatch(value) or not lowercase:
            raise ConfigError(f"tags: {key}={value} is refused by the cloud: {rule}")
    if not opts.tags:
        return
    for node_type in node_types.values():
        if opts.cloud is VmCloud.AWS:
            tags = [{"Key": key, "Value": value} for key, value in opts.tags.items()]
            node_type["node_config"]["TagSpecifications"] = [
                {"ResourceType": kind, "Tags": [dict(tag) for tag in tags]} for kind in ("instance", "volume")]
        else:
            node_type["node_config"]["labels"] = dict(opts.tags)


def _gcp_interface(nic_type: str | None = None) -> dict[str, Any]:
    """The interface Ray's launcher gives a node config without one (``gcp/config.py``,
    ``_configure_subnet``) less its subnet: an ephemeral external IP for ssh, pip and image pulls."""
    interface: dict[str, Any] = {"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}
    if nic_type:
        interface["nicType"] = nic_type
    return interface


# Region and zone names as each cloud spells them: AWS us-east-1 / us-gov-west-1, zones us-east-1a or a
# Local Zone us-west-2-lax-1a; GCP us-central1 / europe-west10, zones us-central1-a. A name of
# another shape would only fail at `ray up`, after the file is written and handed on.
_AWS_REGION = r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+"
_GCP_REGION = r"[a-z]+-[a-z]+\d+"
_NAMES: dict[VmCloud, tuple[str, re.Pattern[str], re.Pattern[str], str, str]] = {
    VmCloud.AWS: ("an AWS", re.compile(_AWS_REGION), re.compile(rf"{_AWS_REGION}([a-z]|-[a-z0-9-]*[a-z0-9])"),
                  "us-east-1", "us-east-1a"),
    VmCloud.GCP: ("a GCP", re.compile(_GCP_REGION), re.compile(rf"{_GCP_REGION}-[a-z][a-z0-9]*"), "us-central1", "us-central1-a"),
}


def _check_names(cloud: VmCloud, region: str | None, zone: str | None) -> None:
    a_cloud, region_re, zone_re, region_eg, zone_eg = _NAMES[cloud]
    if region and not region_re.fullmatch(region):
        raise ConfigError(f"region: {region!r} is not {a_cloud} region name; give one such as {region_eg!r}")
    if zone and not zone_re.fullmatch(zone):
        raise ConfigError(f"zone: {zone!r} is not {a_cloud} zone name; give one such as {zone_eg!r}")


def cluster_zones(job: JobConfig, opts: LauncherOptions) -> list[str]:
    """The zones the cluster's nodes launch in, in ladder order: the one ``opts.zone`` or the tiers'
    zone labels name, or on AWS the several the tiers name, each pinned by its zone's subnets."""
    if opts.cloud is VmCloud.GCP:  # a GCP launcher cluster lives in one zone
        named = [zone] if (zone := shared_label(job, ZONE_LABEL)) else []
    else:
        named = list(dict.fromkeys(t.label_selector[ZONE_LABEL] for t in job.tiers if ZONE_LABEL in t.label_selector))
    if opts.zone and named and named != [opts.zone]:
        if len(named) == 1:
            raise ConfigError(f"zone: {opts.zone!r} differs from the tiers' {ZONE_LABEL} {named[0]!r}")
        raise ConfigError(f"zone: the tiers name several zones ({', '.join(named)}), which the cluster spans; leave the "
                          "zone out")
    zones = named or ([opts.zone] if opts.zone else [])
    if len(zones) > 1:
        for i, tier in enumerate(job.tiers):
            zone = tier.label_selector.get(ZONE_LABEL)
            if zone is not None and zone not in opts.zone_subnet_ids:
                raise ConfigError(
                    f"tiers[{i}].label_selector.{ZONE_LABEL}: {zone!r}: the tiers name several zones ({', '.join(zones)}), "
                    f"so each tier's nodes launch in its zone's subnets; give {zone}'s (--subnet-id {zone}=SUBNET; "
                    f"`aws ec2 describe-subnets --filters Name=availability-zone,Values={zone}` lists them)"
                )
    for zone in opts.zone_subnet_ids:
        if zone not in zones:
            raise ConfigError(f"zone_subnet_ids: no node of the cluster is in zone {zone!r} (the tiers' zones: "
                              f"{', '.join(zones) or 'none'}); leave its subnets out, or pin a tier there with {ZONE_LABEL}")
    return zones


def _placement(job: JobConfig, opts: LauncherOptions) -> dict[str, Any]:
    region = shared_label(job, REGION_LABEL)
    if opts.region and region and opts.region != region:
        raise ConfigError(f"region: {opts.region!r} differs from the tiers' {REGION_LABEL} {region!r}")
    region, zones = opts.region or region, cluster_zones(job, opts)
    _check_names(opts.cloud, region, None)
    for zone in zones:
        _check_names(opts.cloud, None, zone)
        # A zone's name starts with its region's on both clouds (us-east-1a, us-west-2-lax-1a; us-central1-a).
        if region and not zone.startswith(region):
            raise ConfigError(f"zone: {zone!r} is not in region {region!r}; a zone's name starts with its region's, e.g. "
                              f"{region}{'-a' if opts.cloud is VmCloud.GCP else 'a'}")
        region = region or _NAMES[opts.cloud][1].match(zone).group(0)  # type: ignore[union-attr]  # checked above
    # Ray's AWS launcher reads a comma-separated list of zones, and checks that every node type's
    # subnets are in one of them; a GCP cluster has one zone.
    zone = ",".join(zones)
    if opts.cloud is VmCloud.GCP:
        if not zone:
            raise ConfigError(f"zone: required on GCP; pass --zone or give the tiers {ZONE_LABEL}")
        if not opts.project_id:
            raise ConfigError("project_id: required on GCP; pass --project-id")
        return {"type": "gcp", "region": region, "availability_zone": zone, "project_id": opts.project_id}
    if not region:
        raise ConfigError(f"region: required; pass --region (or --zone) or give the tiers {REGION_LABEL}")
    provider: dict[str, Any] = {"type": "aws", "region": region}
    if zone:
        provider["availability_zone"] = zone
    # Spot instances cannot be stopped, and stopped on-demand nodes still bill their disks.
    provider["cache_stopped_nodes"] = False
    return provider


def cluster_launcher_config(job: JobConfig, opts: LauncherOptions) -> dict[str, Any]:
    """The ``ray up`` config for ``job`` as a plain dict, ready for YAML."""
    return _config_and_nodes(job, opts)[0]


def _config_and_nodes(job: JobConfig, opts: LauncherOptions) -> tuple[dict[str, Any], list[TierNode]]:
    """``cluster_launcher_config`` and the tiers' nodes (``tier_nodes``) it was built from."""
    job = with_run_name(job, opts.run_name)
    if "://" not in job.storage_path:
        raise ConfigError(
            f"storage_path: {job.storage_path!r} is a local path, which the cluster's nodes do not share; use s3:// or "
            "gs:// storage, or file:///PATH on a filesystem every node mounts (EFS, Filestore, NFS)"
        )
    gpu = job.tiers[0].use_gpu
    image = check_image(opts.image or default_image(gpu, opts.ray_version), opts.ray_version)
    unknown = sorted(set(opts.instance_types) - {t.name for t in job.tiers})
    if unknown:
        raise ConfigError(f"instance_type: no tier named {unknown[0]!r} (tiers: {', '.join(t.name for t in job.tiers)})")
    if opts.head_instance_type and (problem := machine_type_error(opts.cloud.value, opts.head_instance_type, "head_instance_type")
                                    or head_machine_error(opts.head_instance_type, "head_instance_type", HEAD_INSTANCE_TYPES[opts.cloud])):
        raise ConfigError(problem)
    for i, tier in enumerate(job.tiers):
        if tier.name == HEAD_TYPE:
            raise ConfigError(f"tiers[{i}].name: {HEAD_TYPE!r} is the head node type's name; rename the tier")
    node_types: dict[str, Any] = {
        HEAD_TYPE: {
            "resources": {"CPU": 0},
            "labels": {MARKET_LABEL: ON_DEMAND},
            "node_config": _node_config(opts.head_instance_type or HEAD_INSTANCE_TYPES[opts.cloud], ON_DEMAND, False, "head", opts),
        }
    }
    agents = opts.notice_agent and any(_has_agent(t, opts.cloud) for t in job.tiers)
    nodes = tier_nodes(job, opts)
    for i, (tier, node) in enumerate(zip(job.tiers, nodes, strict=True)):
        labels = tier_labels(tier, i)
        if agents and _has_agent(tier, opts.cloud):
            labels[AGENT_LABEL] = "true"
        node_types[tier.name] = {
            "min_workers": 0,
            "max_workers": math.ceil(tier.num_workers / node.per_node),
            "resources": _node_resources(tier, i, node.per_node),
            "labels": labels,
            "node_config": {
                **_node_config(node.instance_type, tier.market, tier.use_gpu, f"tiers[{i}].market", opts),
                **node.accelerators,
            },
        }
        if tier.use_gpu:
            node_types[tier.name]["initialization_commands"] = [gpu_driver_wait()]
        if agents and opts.cloud is VmCloud.GCP and tier.use_gpu:
            # Its agent dates a host-maintenance drain an hour out, as GCE stops GPU VMs (the
            # container's environment reaches the agent, which the start commands run in it).
            node_types[tier.name]["docker"] = {
                "worker_run_options": [f"--env SPOTFALLBACK_GCP_MAINTENANCE_NOTICE_S={GCP_GPU_MAINTENANCE_NOTICE_S:g}"]
            }
    if opts.subnetwork is not None and opts.cloud is not VmCloud.GCP:
        raise ConfigError("subnetwork: a GCP setting, which an aws cluster does not use; leave it out")
    for name, value in (("subnet_ids", opts.subnet_ids), ("zone_subnet_ids", opts.zone_subnet_ids)):
        if value and opts.cloud is not VmCloud.AWS:
            raise ConfigError(f"{name}: AWS subnets, which a gcp cluster does not use; on gcp, subnetwork names the nodes' "
                              "subnet")
    if opts.security_group_ids and opts.cloud is not VmCloud.AWS:
        raise ConfigError("security_group_ids: AWS security groups, which a gcp cluster does not use; on gcp, the "
                          "network's firewall rules apply")
    provider = _placement(job, opts)
    if opts.cloud is VmCloud.GCP:
        subnetwork = opts.subnetwork and gcp_subnetwork(opts.subnetwork, provider["region"])
        _share_network(node_types, subnetwork, external_ips=not opts.internal_ips)
    else:
        _aws_network(node_types, opts)
    _tag_nodes(node_types, opts)
    if opts.internal_ips:
        provider["use_internal_ips"] = True
    config: dict[str, Any] = {
        "cluster_name": k8s_name(job.name, 32),
        "max_workers": sum(t["max_workers"] for name, t in node_types.items() if name != HEAD_TYPE),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": opts.idle_timeout_minutes,
        "provider": provider,
        "auth": {"ssh_user": opts.ssh_user},
        "docker": {
            "image": image,
            "container_name": "ray_container",
            "pull_before_run": True,
            "run_options": ["--ulimit nofile=65536:65536"]
            + ([f"--stop-timeout {GCP_STOP_TIMEOUT_S}"] if opts.cloud is VmCloud.GCP else []),
        },
        "available_node_types": node_types,
        "head_node_type": HEAD_TYPE,
    }
    pip = with_spotfallback(opts.image, opts.pip, job.entrypoint)
    if pip:
        config["setup_commands"] = [shlex.join(["pip", "install", *pip])]
    if agents:
        # Ray Train polls for drains every 5 s by default; a 30 s notice needs a quicker look.
        config["docker"]["run_options"].append("--env RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S=1")
        config["worker_start_ray_commands"] = [*RAY_WORKER_START, notice_agent_command(job, opts.cloud)]
    return config, nodes


def _has_agent(tier: Tier, cloud: VmCloud) -> bool:
    return tier.market == SPOT or (cloud is VmCloud.GCP and tier.use_gpu)


def identity_note(job: JobConfig, opts: LauncherOptions) -> str | None:
    """What the workers' identity needs, or None: the cluster launcher gives only the head one
    (Ray's own role) and every worker writes checkpoints to the storage; a worker profile of
    the user's own needs the head's role to pass it."""
    scheme = job.storage_path.split("://", 1)[0].lower()
    given = opts.instance_profile if opts.cloud is VmCloud.AWS else opts.service_account
    if opts.cloud is VmCloud.AWS and opts.instance_profile:
        # EC2 asks iam:PassRole of whoever launches an instance with a role; Ray's head role
        # (ray-autoscaler-v1: AmazonEC2FullAccess and AmazonS3FullAccess) has none.
        return (f"--instance-profile: the head launches the workers with {opts.instance_profile}, and EC2 lets it only "
                "if the head's role may pass that profile's role (iam:PassRole); Ray's own head role, "
                "ray-autoscaler-v1, may not: grant it, or every worker launch fails (UnauthorizedOperation) and the "
                "run waits out each tier's capacity timeout")
    if scheme == "file" or given:
        return None
    flag = "--instance-profile ARN" if opts.cloud is VmCloud.AWS else "--service-account EMAIL"
    return (f"Storage {job.storage_path}: the worker nodes get no identity for it ({flag} gives them one; Ray's "
            "launcher gives one only to the head): without credentials in the image or environment, the workers "
            "cannot write their checkpoints")


def zone_note(job: JobConfig, opts: LauncherOptions, nodes: list[TierNode]) -> str | None:
    """Why an AWS gang may span zones, or None: with no zone or subnet, Ray's launcher tries the
    default VPC's subnets of every zone of the region, node by node, on any launch error.
    ``nodes`` are the tiers' nodes (``tier_nodes``)."""
    if opts.cloud is not VmCloud.AWS or cluster_zones(job, opts) or opts.subnet_ids or opts.zone_subnet_ids:
        return None
    if all(t.num_workers <= node.per_node for t, node in zip(job.tiers, nodes, strict=True)):
        return None  # every gang fits on one node
    return ("no zone: Ray's launcher tries each node in the subnets of every zone of the region in turn, so a gang "
            "may span zones (its all-reduce crossing them, their traffic billed); pin one with --zone (or --subnet-id)")


def image_note(job: JobConfig, opts: LauncherOptions) -> str | None:
    """Why GPU workers on AWS may not see their GPUs, or None: without ``image_id`` Ray's launcher
    boots every node from its default AMI for the region, a Deep Learning AMI for Ubuntu 18.04 (Ray
    2.x's ``DEFAULT_AMI_NAME``), whose NVIDIA driver predates the newer GPU families."""
    if opts.cloud is not VmCloud.AWS or opts.image_id or not any(worker_shape(t, i)[1] for i, t in enumerate(job.tiers)):
        return None
    return ("GPU nodes boot Ray's default AMI for the region (a Deep Learning AMI for Ubuntu 18.04, no longer "
            "updated), whose NVIDIA driver may not support the GPUs (H100, L4, L40S); pass --image-id with a current "
            "Deep Learning AMI of the region")


def idle_gpu_notes(job: JobConfig, nodes: list[TierNode]) -> list[str]:
    """A tier whose nodes (``tier_nodes``) have more GPUs than the workers they hold use: the
    rest are paid for and idle."""
    notes = []
    for i, (tier, node) in enumerate(zip(job.tiers, nodes, strict=True)):
        cpu, gpu, _ = worker_shape(tier, i)
        per_node, size = node.per_node, machine(node.instance_type)
        if gpu and size is not None and size.gpus > gpu * per_node:
            held = f"{per_node} workers of {gpu}" if per_node > 1 else f"one worker of {gpu}"
            if per_node >= tier.num_workers:
                why, fix = f"the tier has {tier.num_workers}", "give the tier more workers"
            else:
                why = f"its {size.vcpus} vCPUs and {size.memory_gib:g} GiB hold no more of {cpu:g} CPUs"
                fix = "ask for fewer CPUs (or less memory) per worker"
            notes.append(f"tiers[{i}] ({tier.name}): a {node.instance_type} node has {size.gpus} GPUs and holds {held} "
                         f"({why}), so {size.gpus - gpu * per_node} are paid for and idle; {fix}, "
                         f"or name a smaller type with --instance-type {tier.name}=TYPE")
    return notes


def fabric_notes(job: JobConfig, nodes: list[TierNode]) -> list[str]:
    """A tier whose gang spans several nodes of a type built for training across nodes
    (``machines.gpu_fabric``): the file sets up no fabric, so NCCL between them runs over TCP."""
    notes = []
    for i, (tier, node) in enumerate(zip(job.tiers, nodes, strict=True)):
        fabric = gpu_fabric(node.instance_type)
        count = math.ceil(tier.num_workers / node.per_node)
        if fabric is None or count < 2:
            continue
        needs = ("the node type needs an EFA interface on each network card, a security group that admits its own "
                 "members and a cluster placement group, and the image libfabric with the aws-ofi-nccl plugin"
                 if fabric == "EFA" else
                 f"the node type needs the series' extra GPU network interfaces, each on its own VPC, and the image "
                 f"{fabric}'s NCCL plugin")
        notes.append(fabric_note(tier, i, count, node.instance_type, fabric, needs))
    return notes


def launcher_header(job: JobConfig, opts: LauncherOptions, nodes: list[TierNode]) -> list[str]:
    run = opts.run_name or job.name
    job = with_run_name(job, opts.run_name)
    lines = [
        f"Generated by `spotfallback manifest cluster-launcher --cloud {opts.cloud.value}`; do not edit by hand.",
        "Start the cluster: ray up FILE -y (on a running cluster add --no-restart, or Ray restarts and the run's driver stops)",
        f"Start (or RESUME) run {run!r} on it; never reuse a run name by accident:",
        f"  ray exec FILE --tmux {shlex.quote(rayjob_entrypoint(job))}",
        "Once it is done: ray down FILE -y (the head is never scaled down: it bills until then).",
    ]
    if installs_spotfallback(opts.image, opts.pip):
        lines.append(f"The stock Ray image has no spotfallback: the setup commands install {spotfallback_requirement(job.entrypoint)}.")
    if any(t.market == SPOT for t in job.tiers):
        where = "spot nodes (and GPU nodes: host maintenance)" if opts.cloud is VmCloud.GCP else "spot nodes"
        lines.append(
            f"Notice agent: started on {where} after `ray start` (log {AGENT_LOG})."
            if opts.notice_agent
            else "Notice agent: off (--no-notice-agent): spot notices are not drained, so no just-in-time checkpoints."
        )
    note = identity_note(job, opts)
    if note is not None:
        lines.append(note + ".")
    if gvnic := _gvnic_types(opts, nodes):
        lines.append(f"gVNIC is the only network interface of {', '.join(gvnic)}: the boot image must have its driver (gve).")
    if opts.subnetwork:
        lines.append(f"Every node is on subnetwork {opts.subnetwork}: its VPC's firewall must let the nodes reach each other "
                     "(Ray's ports) and let ssh in from where `ray up` runs.")
    elif gvnic:
        lines.append("Every node type is on the project's default network; to use another, pass --subnetwork.")
    subnets, zoned, groups = _aws_network_ids(opts) if opts.cloud is VmCloud.AWS else ([], {}, [])
    if subnets or zoned:
        lines.append(_subnets_line(cluster_zones(job, opts), subnets, zoned)
                     + ("" if opts.internal_ips else ", and give instances a public IP on launch (for a private subnet, "
                        "pass --internal-ips)")
                     + ("." if groups else
                        "; Ray's launcher makes the VPC a security group that lets the nodes reach each other and ssh in."))
    if groups:
        lines.append(f"Every node is in security group{'s' * (len(groups) > 1)} {', '.join(groups)}, and Ray's launcher makes none of its own: the groups must be "
                     "in one VPC (the subnets') and let the nodes reach each other on every port (Ray's) and ssh in from "
                     "where `ray up` runs.")
    if opts.internal_ips:
        lines.append("ray up reaches the nodes by their private IPs (--internal-ips): run it from inside the network (a "
                     "machine in the VPC, or a VPN to it). "
                     + ("The nodes get no external IP: pulling the image and pip packages needs Cloud NAT on the "
                        "subnetwork." if opts.cloud is VmCloud.GCP else
                        "A node in a private subnet pulls the image and pip packages through a NAT gateway."))
    return lines


def _subnets_line(zones: list[str], subnets: list[str], zoned: dict[str, list[str]]) -> str:
    """Where the header says the nodes launch (``_aws_network``), and what Ray's launcher requires of those subnets."""
    def tried(ids: list[str]) -> str:
        first, *rest = ids
        return first + (f" (then {', '.join(rest)}, in that order, where a launch finds no capacity)" if rest else "")

    if not zoned:  # then the cluster has one zone at most (cluster_zones)
        return f"Every node launches in subnet {tried(subnets)}: the subnets must be in one VPC" + "".join(
            f", in zone {zone}" for zone in zones)
    others = f"subnet {tried(subnets)}" if subnets else "any of those subnets, in that order"
    return ("Each zone's nodes launch in its subnets: "
            + "; ".join(f"{zone}, subnet {tried(ids)}" for zone, ids in zoned.items())
            + f"; the head and any tier pinned to no zone, {others}: the subnets must be in one VPC, each zone's in that zone"
            + (f", the others in one of {', '.join(zones)}" if subnets else ""))


def _gvnic_types(opts: LauncherOptions, nodes: list[TierNode]) -> list[str]:
    """The machine types of the file's GCP node types whose series takes gVNIC only."""
    if opts.cloud is not VmCloud.GCP:
        return []
    names = [opts.head_instance_type or HEAD_INSTANCE_TYPES[opts.cloud]] + [n.instance_type for n in nodes]
    return sorted({name for name in names if (series := gcp_series(name)) is not None and series.gvnic})


def cluster_launcher_file(job: JobConfig, opts: LauncherOptions) -> tuple[str, list[TierNode]]:
    """The ``ray up`` config as commented YAML, validated as text first, and the tiers' nodes
    (``tier_nodes``) it was built from, for the notes that read them."""
    if job.ladder.across_clusters:
        raise ConfigError(
            "tiers: this ladder runs across Ray clusters, and one `ray up` file is one cluster; write a job file with "
            "each cluster's tiers (without `cluster`) and generate one file from each, or use `manifest kuberay`"
        )
    config, nodes = _config_and_nodes(job, opts)
    text = to_yaml(config, launcher_header(job, opts, nodes))
    assert_valid_text(text)
    return text, nodes


def render_cluster_launcher(job: JobConfig, opts: LauncherOptions) -> str:
    """The ``ray up`` config as commented YAML, validated as text first."""
    return cluster_launcher_file(job, opts)[0]
