"""`spotfallback manifest ...`: deployment files for a job's tier ladder, and their validation.

Every generated file is validated before it is written, and bad input (an unknown cloud, a
tier with no market, a malformed image) is one line on stderr, exit code 2, and no file.
Every generation says on stderr which run the file starts, because the same run name
resumes that run: a name reused by accident would continue someone else's training.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer

from spotfallback.cli.common import (
    CommandSummaries,
    one_line,
    output_problem,
    same_file_problem,
    write_output,
)
from spotfallback.config import JobConfig, run_name_error
from spotfallback.deploy.clouds import DRAIN_MARGIN_S, SPOT_SHUTDOWN, K8sCloud, VmCloud
from spotfallback.deploy.common import (
    HEAD_CPU,
    HEAD_MEMORY,
    choice,
    image_error,
    multi_gpu_worker_notes,
    object_name_error,
    same_nodes_notes,
    unique_run_name,
)
from spotfallback.deploy.kuberay import (
    Kind,
    KubeRayOptions,
    pod_fabric_notes,
    render_kuberay,
    spot_grace_note,
)
from spotfallback.deploy.launcher import (
    HEAD_INSTANCE_TYPES,
    LauncherOptions,
    cluster_launcher_file,
    fabric_notes,
    identity_note,
    idle_gpu_notes,
    image_note,
    zone_note,
)
from spotfallback.deploy.machines import HEAD_MIN_MEMORY_GIB
from spotfallback.deploy.nodepools import KarpenterCloud, NodePoolOptions, render_nodepools
from spotfallback.deploy.validate import Report, parse_version, validate_file
from spotfallback.errors import EXIT_BAD_INPUT, EXIT_ERROR, ConfigError, ManifestInvalid

E = TypeVar("E", bound=StrEnum)

# Library field names -> the option that sets them, so errors name what the user typed.
_OPTION_OF = {
    "kind": "--kind",
    "image": "--image",
    "name": "--name",
    "storage_secret": "--storage-secret",
    "storage_pvc": "--storage-pvc",
    "pip": "--pip",
    "region": "--region",
    "zone": "--zone",
    "project_id": "--project-id",
    "instance_type": "--instance-type",
    "head_instance_type": "--head-instance-type",
    "source_image": "--source-image",
    "image_id": "--image-id",
    "ssh_user": "--ssh-user",
    "notice_agent": "--notice-agent",
    "spot_grace_seconds": "--spot-grace",
    "backoff_limit": "--backoff-limit",
    "active_deadline_seconds": "--active-deadline",
    "ttl_seconds_after_finished": "--ttl",
    "instance_profile": "--instance-profile",
    "subnetwork": "--subnetwork",
    "subnet_ids": "--subnet-id",
    "zone_subnet_ids": "--subnet-id",
    "security_group_ids": "--security-group-id",
    "tags": "--tag",
    "labels": "--label",
    "priority_class": "--priority-class",
    "head_cpu": "--head-cpu",
    "head_memory": "--head-memory",
}

# A RayJob's own settings: a RayCluster has none of them (it lives until deleted).
_RAYJOB_FIELDS = ("backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished")
_RAYJOB_DEFAULTS: dict[str, int] = {name: getattr(KubeRayOptions, name) for name in _RAYJOB_FIELDS}  # the dataclass's defaults

# An instance profile's ARN, as EC2 takes it in IamInstanceProfile.Arn (any AWS partition).
_INSTANCE_PROFILE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:instance-profile/[\w+=,.@/-]+")
# A service account is named by its email (user-managed ...@PROJECT.iam.gserviceaccount.com, or Google's own).
_SERVICE_ACCOUNT_EMAIL = re.compile(r"[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.[a-z]+")

JobOpt = Annotated[Path, typer.Option("--job", help="Job file (name, storage_path, entrypoint, tiers).")]
ImageOpt = Annotated[str | None, typer.Option(help="Container image with Ray, spotfallback and your code (default: rayproject/ray matching rayVersion).")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Run name instead of the job file's; the same name RESUMES that run.")]
PoolsNameOpt = Annotated[str | None, typer.Option("--name", help="Run name instead of the job file's, which names the pools (NAME-spot, NAME-on-demand, ...).")]
UniqueOpt = Annotated[bool, typer.Option("--unique-name", help="Append a timestamp and random token to the run name: a new run.")]
PipOpt = Annotated[list[str] | None, typer.Option("--pip", metavar="<str>", help="Package to pip-install at start (repeatable; on KubeRay, a RayJob only).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="YAML file to write (.yaml or .yml); stdout if omitted.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite the --out file if it exists.")]
HeadCpuOpt = Annotated[str, typer.Option(
    "--head-cpu", help="The KubeRay head pod's CPUs (a Kubernetes quantity, at least 1): it runs the GCS, the dashboard, "
    "the driver and Ray Train's controller, so a large gang's head wants more. Give `manifest kuberay` and `manifest "
    "nodepools` the same: the head's NodePool is capped to hold its node and a replacement.")]
HeadMemoryOpt = Annotated[str, typer.Option(
    "--head-memory", help=f"The KubeRay head pod's memory (a Kubernetes quantity, at least {HEAD_MIN_MEMORY_GIB:g} GiB); "
    "the same to `manifest kuberay` and `manifest nodepools`.")]


def _choice(option: str, value: str, enum: type[E]) -> E:
    """Parse a choice here rather than via click, so a wrong value is one line like every other error."""
    try:
        return choice(option, value, enum)
    except ConfigError as e:
        _fail(str(e))


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _config_error(err: ConfigError, job_path: Path) -> NoReturn:
    message = one_line(str(err))
    field, sep, rest = message.partition(":")
    if sep and field in _OPTION_OF:
        _fail(f"{_OPTION_OF[field]}:{rest}")
    if message.startswith(("tiers", "storage_path")):
        _fail(f"{job_path}: {message}")
    _fail(message)


def _check_options(image: str | None, name: str | None, **k8s_names: str | None) -> None:
    if image is not None and (problem := image_error(image)):
        _fail(f"--image: {problem}")
    if name is not None and (problem := run_name_error(name)):
        _fail(f"--name: {problem}")
    for option, value in k8s_names.items():
        if value is not None and (problem := object_name_error(value)):
            _fail(f"--{option.replace('_', '-')}: {problem}")


def _load(job_path: Path, name: str | None, unique: bool) -> tuple[JobConfig, str | None]:
    try:
        job = JobConfig.from_yaml(job_path)
    except ConfigError as e:
        _fail(f"--job: {one_line(str(e))}")
    return job, (unique_run_name(name or job.name) if unique else name)


def _say_run_name(job: JobConfig, name: str | None, unique: bool) -> None:
    """One stderr line, every time, after the file is made: the run it starts, and that the
    same name resumes it (the seed's warning against reusing a name by accident)."""
    if unique:
        typer.echo(f"run name: {name} (a new run)", err=True)
        return
    run = name or job.name
    source = "--name" if name else "the job file"
    typer.echo(
        f"run name: {run} (from {source}); if {job.storage_path.rstrip('/')}/{run} already holds a run, "
        "this file RESUMES it: for a new run, pass --unique-name or another --name",
        err=True,
    )


def _say_ray_address(job: JobConfig) -> None:
    """A note when the job file names a cluster the generated file does not use: its driver runs
    on the cluster's head and joins that cluster (``auto``), whatever address the file gives."""
    if job.ray_address not in ("auto", "local"):
        typer.echo(f"note: ray_address {job.ray_address!r} is not used here: the driver runs on the cluster's head "
                   "and joins that cluster (auto)", err=True)


def _check_out(out: Path | None, force: bool, job: Path) -> None:
    """Before any work: the file --out names can be written, is not one already there, and is
    not the --job file (which --force would replace by its own manifest)."""
    if out is None:
        return
    if (problem := same_file_problem(out, [("--job", job)])) is not None:
        _fail(f"--out: {problem}")
    if (problem := output_problem(out, (".yaml", ".yml"), keep_existing=not force)) is not None:
        _fail(f"--out: {problem}")


def _emit(text: str, out: Path | None, what: str) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    write_output("--out", out, text)  # whole file or none: a half-written manifest must not be applied
    typer.echo(f"wrote {out} ({what}; validated)", err=True)


def kuberay_command(
    cloud: Annotated[str, typer.Option(help="eks-karpenter | eks-managed | aks | aks-nap | gke: decides the spot/on-demand node keys.")],
    job: JobOpt,
    kind: Annotated[str | None, typer.Option(help="rayjob (runs the job, then cleans up) | raycluster (long-lived). Default: rayjob; raycluster, one per cluster, for a ladder across clusters.", show_default=False)] = None,
    image: ImageOpt = None,
    name: NameOpt = None,
    unique_name: UniqueOpt = False,
    namespace: Annotated[str | None, typer.Option(help="Namespace of the object.")] = None,
    service_account: Annotated[str | None, typer.Option(help="Service account of every pod (workload identity for storage).")] = None,
    storage_secret: Annotated[str | None, typer.Option(help="Secret with the storage credentials (s3://, gs://, abfs://).")] = None,
    storage_pvc: Annotated[str | None, typer.Option(help="PVC mounted at a local storage_path on every pod.")] = None,
    pip: PipOpt = None,
    backoff_limit: Annotated[
        int | None,
        typer.Option(help=f"RayJob retries; each retry resumes the run (default {_RAYJOB_DEFAULTS['backoff_limit']}).", show_default=False),
    ] = None,
    active_deadline: Annotated[
        int | None,
        typer.Option(help=f"RayJob wall-clock limit of each attempt, seconds (default "
                     f"{_RAYJOB_DEFAULTS['active_deadline_seconds']}); KubeRay starts it again at every retry.",
                     show_default=False),
    ] = None,
    ttl: Annotated[
        int | None,
        typer.Option(help="Seconds the finished RayJob's cluster is kept for inspection "
                     f"(default {_RAYJOB_DEFAULTS['ttl_seconds_after_finished']}).", show_default=False),
    ] = None,
    notice_agent: Annotated[
        bool | None,
        typer.Option(
            "--notice-agent/--no-notice-agent",
            help="Native sidecar on spot workers (and GKE GPU workers) that drains the Ray node on the cloud's own "
            "notice, earlier than the pod's SIGTERM (on which Ray drains by itself). Default: on with an --image of "
            "your own, off with the stock rayproject/ray image (no spotfallback in it).",
            show_default=False,
        ),
    ] = None,
    spot_grace: Annotated[
        int | None,
        typer.Option(
            help="Spot pods' terminationGracePeriodSeconds, the warning their workers get (Ray drains the node "
            f"on SIGTERM for {DRAIN_MARGIN_S} s less); must fit in the cloud's notice (default: "
            + ", ".join(f"{target.value} {shutdown.grace_s}" for target, shutdown in SPOT_SHUTDOWN.items())
            + ").",
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="KEY=VALUE (repeatable): a label on the object and every pod, beside spotfallback/run, for cost "
                          "allocation or a cluster's policies."),
    ] = None,
    priority_class: Annotated[
        str | None, typer.Option(help="PriorityClass of every pod (priorityClassName): they are scheduled before pods of "
                                      "lower priority, and only pods of higher priority may evict them.")
    ] = None,
    head_cpu: HeadCpuOpt = HEAD_CPU,
    head_memory: HeadMemoryOpt = HEAD_MEMORY,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Write a KubeRay RayJob (or RayCluster): on-demand head, one worker group per tier."""
    k8s_cloud = _choice("--cloud", cloud, K8sCloud)
    _check_out(out, force, job)
    _check_options(image, name, namespace=namespace, service_account=service_account, storage_secret=storage_secret,
                   storage_pvc=storage_pvc, priority_class=priority_class)
    labels = _key_values("--label", label)
    config, run_name = _load(job, name, unique_name)
    default_kind = Kind.RAYCLUSTER if config.ladder.across_clusters else Kind.RAYJOB
    kind_ = default_kind if kind is None else _choice("--kind", kind, Kind)
    rayjob = {"backoff_limit": backoff_limit, "active_deadline_seconds": active_deadline, "ttl_seconds_after_finished": ttl}
    if kind_ is Kind.RAYCLUSTER:
        for field, value in rayjob.items():
            if value is not None:
                _fail(f"{_OPTION_OF[field]}: a RayJob's setting, and this file makes RayClusters, which live "
                      "until deleted; leave the option out (or pass --kind rayjob)")
    chosen = {field: _RAYJOB_DEFAULTS[field] if value is None else value for field, value in rayjob.items()}
    try:
        opts = KubeRayOptions(
            cloud=k8s_cloud,
            kind=kind_,
            image=image,
            run_name=run_name,
            namespace=namespace,
            service_account=service_account,
            storage_secret=storage_secret,
            storage_pvc=storage_pvc,
            pip=tuple(pip or ()),
            backoff_limit=chosen["backoff_limit"],
            active_deadline_seconds=chosen["active_deadline_seconds"],
            ttl_seconds_after_finished=chosen["ttl_seconds_after_finished"],
            notice_agent=notice_agent,
            spot_grace_seconds=spot_grace,
            labels=labels,
            priority_class=priority_class,
            head_cpu=head_cpu,
            head_memory=head_memory,
        )
        text = render_kuberay(config, opts)
    except ConfigError as e:
        _config_error(e, job)
    except ManifestInvalid as e:
        _fail(f"internal error, the generated manifest does not validate: {e}", e.exit_code)
    if config.ladder.across_clusters:
        what = f"{len(config.ladder.clusters)} RayClusters, one per cluster, {len(config.tiers)} worker groups"
    else:
        what = f"{'RayJob' if kind_ is Kind.RAYJOB else 'RayCluster'}, {len(config.tiers)} worker groups"
    _emit(text, out, what)
    if (note := spot_grace_note(config, opts)) is not None:
        typer.echo(f"note: {note}", err=True)
    for note in [*pod_fabric_notes(config, opts), *multi_gpu_worker_notes(config), *same_nodes_notes(config)]:
        typer.echo(f"note: {note}", err=True)
    if not config.ladder.across_clusters:
        _say_ray_address(config)
    else:
        typer.echo("the moving driver: run `spotfallback run JOB.yaml` outside the clusters, where it reaches every "
                   "cluster's Jobs API and the storage (docs/clusters.md)", err=True)
    _say_run_name(config, run_name, unique_name)


def _instance_types(entries: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for entry in entries:
        tier, sep, kind = entry.partition("=")
        if not sep or not tier or not kind or " " in entry:
            _fail(f"--instance-type: expected TIER=TYPE, got {entry!r}")
        if tier in pairs and pairs[tier] != kind:
            _fail(f"--instance-type: tier {tier!r} is given twice ({pairs[tier]!r} and {kind!r}); give each tier once")
        pairs[tier] = kind
    return pairs


def _key_values(option: str, entries: list[str] | None) -> dict[str, str]:
    """The KEY=VALUE entries of a repeatable ``option`` (a value may be empty), each key once."""
    pairs: dict[str, str] = {}
    for entry in entries or ():
        key, sep, value = entry.partition("=")
        if not sep or not key:
            _fail(f"{option}: expected KEY=VALUE, got {entry!r}")
        if key in pairs and pairs[key] != value:
            _fail(f"{option}: {key!r} is given twice ({pairs[key]!r} and {value!r}); give each key once")
        pairs[key] = value
    return pairs


def _zone_subnets(entries: list[str] | None) -> dict[str, list[str]]:
    """The ZONE=ID entries of --subnet-id, each zone's subnets in the order given."""
    zoned: dict[str, list[str]] = {}
    for entry in entries or ():
        zone, sep, subnet = entry.partition("=")
        if sep:
            if not zone or not subnet:
                _fail(f"--subnet-id: expected ID or ZONE=ID, got {entry!r}")
            zoned.setdefault(zone, []).append(subnet)
    return zoned


def launcher_command(
    cloud: Annotated[str, typer.Option(help="aws | gcp: cloud of the VMs.")],
    job: JobOpt,
    image: ImageOpt = None,
    name: NameOpt = None,
    unique_name: UniqueOpt = False,
    region: Annotated[str | None, typer.Option(help="Region (default: the tiers' ray.io/availability-region, else the --zone's).")] = None,
    zone: Annotated[str | None, typer.Option(help="Zone (default: the tiers' ray.io/availability-zone); required on GCP.")] = None,
    project_id: Annotated[str | None, typer.Option(help="GCP project id; required on GCP.")] = None,
    instance_type: Annotated[list[str] | None, typer.Option(metavar="TIER=TYPE", help="TIER=TYPE (repeatable) instead of the default fit.")] = None,
    head_instance_type: Annotated[
        str | None,
        typer.Option(help=f"Head instance/machine type (default: {', '.join(f'{t} on {c}' for c, t in HEAD_INSTANCE_TYPES.items())}); "
                          f"a known type with under {HEAD_MIN_MEMORY_GIB:g} GiB of memory is refused: the head runs the "
                          "GCS, the dashboard, the autoscaler and the job driver."),
    ] = None,
    source_image: Annotated[str | None, typer.Option(help="GCP boot image (required for GPU tiers: one with NVIDIA drivers, "
                                                         "such as a Deep Learning VM image family).")] = None,
    image_id: Annotated[str | None, typer.Option(help="AWS AMI of every node (default: Ray's, a Deep Learning AMI for "
                                                     "Ubuntu 18.04; GPU tiers want a current one).")] = None,
    ssh_user: Annotated[str, typer.Option(help="The user `ray up` logs in to the nodes as: the image's (ec2-user on "
                                                 "Amazon Linux AMIs).")] = "ubuntu",
    instance_profile: Annotated[str | None, typer.Option(help="AWS instance profile ARN for the worker nodes (storage access).")] = None,
    service_account: Annotated[str | None, typer.Option(help="GCP service account email for the worker nodes (storage access).")] = None,
    subnetwork: Annotated[
        str | None,
        typer.Option(help="GCP subnetwork of every node: a name in the cluster's region, or "
                          "projects/HOST_PROJECT/regions/REGION/subnetworks/NAME (Shared VPC). Default: the project's "
                          "default network, or the region's first subnet, which Ray picks."),
    ] = None,
    subnet_id: Annotated[
        list[str] | None,
        typer.Option(metavar="[ZONE=]ID", help="[ZONE=]ID: an AWS subnet ID (repeatable: Ray's launcher uses the first and tries the next "
                          "where a launch finds no capacity); all in one VPC. ZONE=ID is for the tiers pinned to that zone "
                          "(needed where the tiers name several zones), ID for the other nodes (default: all the ZONE=ID "
                          "subnets, or the default VPC's that give instances a public IP)."),
    ] = None,
    security_group_id: Annotated[
        list[str] | None,
        typer.Option(metavar="<str>", help="AWS security group ID for every node (repeatable), instead of the one Ray's launcher makes; "
                          "the groups must let the nodes reach each other on every port and ssh in."),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="KEY=VALUE (repeatable): a tag on every node and its volumes (AWS) or a label on every node "
                          "(GCP), for cost allocation or an organisation's policy."),
    ] = None,
    internal_ips: Annotated[
        bool,
        typer.Option("--internal-ips", help="ray up reaches the nodes by their private IPs, so it must run inside the network: "
                                            "AWS nodes may then be in private subnets, GCP nodes get no external IP."),
    ] = False,
    pip: PipOpt = None,
    notice_agent: Annotated[
        bool,
        typer.Option(
            "--notice-agent/--no-notice-agent",
            help="Start `spotfallback notice-agent` on spot nodes after `ray start` (needs spotfallback in the image or --pip).",
        ),
    ] = True,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Write a `ray up` config: on-demand head, one node type per tier."""
    vm_cloud = _choice("--cloud", cloud, VmCloud)
    _check_out(out, force, job)
    _check_options(image, name)
    if vm_cloud is VmCloud.AWS and service_account:
        _fail("--service-account: a GCP service account; on aws give the workers --instance-profile ARN")
    if vm_cloud is VmCloud.GCP and instance_profile:
        _fail("--instance-profile: an AWS instance profile; on gcp give the workers --service-account EMAIL")
    if vm_cloud is VmCloud.GCP and image_id:
        _fail("--image-id: an AWS AMI; on gcp give the nodes' boot image with --source-image")
    if vm_cloud is VmCloud.GCP and subnet_id:
        _fail("--subnet-id: an AWS subnet; on gcp name the nodes' subnetwork with --subnetwork")
    if vm_cloud is VmCloud.GCP and security_group_id:
        _fail("--security-group-id: an AWS security group; on gcp the network's firewall rules apply")
    if service_account is not None and not _SERVICE_ACCOUNT_EMAIL.fullmatch(service_account):
        _fail(f"--service-account: {service_account!r} is not a service account's email; give one such as "
              "'ray-worker@my-project.iam.gserviceaccount.com'")
    for option, value in (("--project-id", project_id), ("--source-image", source_image), ("--subnetwork", subnetwork)):
        if vm_cloud is VmCloud.AWS and value is not None:
            _fail(f"{option}: a GCP setting, which an aws cluster does not use; leave it out (on aws, --region and "
                  "--instance-type choose the machines)")
    if instance_profile is not None and not _INSTANCE_PROFILE_ARN.fullmatch(instance_profile):
        _fail(f"--instance-profile: {instance_profile!r} is not an instance profile ARN; give one such as "
              "'arn:aws:iam::123456789012:instance-profile/ray-worker' (the role's profile, not the role)")
    types = _instance_types(instance_type or [])
    tags = _key_values("--tag", tag)
    if head_instance_type is not None and not head_instance_type.strip():
        _fail("--head-instance-type: empty; give the head's instance or machine type, or leave the option out for "
              "the default")
    config, run_name = _load(job, name, unique_name)
    try:
        opts = LauncherOptions(
            cloud=vm_cloud,
            image=image,
            run_name=run_name,
            region=region,
            zone=zone,
            project_id=project_id,
            instance_types=types,
            head_instance_type=head_instance_type,
            source_image=source_image,
            image_id=image_id,
            ssh_user=ssh_user,
            instance_profile=instance_profile,
            service_account=service_account,
            pip=tuple(pip or ()),
            notice_agent=notice_agent,
            subnetwork=subnetwork,
            subnet_ids=tuple(s for s in subnet_id or () if "=" not in s),
            zone_subnet_ids=_zone_subnets(subnet_id),
            security_group_ids=tuple(security_group_id or ()),
            tags=tags,
            internal_ips=internal_ips,
        )
        text, nodes = cluster_launcher_file(config, opts)
    except ConfigError as e:
        _config_error(e, job)
    except ManifestInvalid as e:
        _fail(f"internal error, the generated config does not validate: {e}", e.exit_code)
    _emit(text, out, f"{vm_cloud.value} cluster, {len(config.tiers)} worker node types")
    if (note := identity_note(config, opts)) is not None:
        typer.echo(f"note: {note}", err=True)
    for note in (image_note(config, opts), zone_note(config, opts, nodes)):
        if note is not None:
            typer.echo(f"note: {note}", err=True)
    for note in [*idle_gpu_notes(config, nodes), *fabric_notes(config, nodes), *multi_gpu_worker_notes(config),
                 *same_nodes_notes(config)]:
        typer.echo(f"note: {note}", err=True)
    _say_ray_address(config)
    _say_run_name(config, run_name, unique_name)


def _print_report(path: Path, report: Report) -> None:
    many = len(report.kinds) > 1
    for finding in report.findings:
        where = f"{path}[doc {finding.document + 1}]" if many and not finding.of_file else str(path)
        prefix = "warning: " if finding.warning else ""
        typer.echo(f"{prefix}{where}: {finding}", err=True)


def nodepools_command(
    cloud: Annotated[str, typer.Option(help="eks-karpenter | aks-nap (AKS node auto-provisioning, Karpenter on AKS).")],
    job: JobOpt,
    node_class: Annotated[
        str, typer.Option(help="The EC2NodeClass (EKS) or AKSNodeClass (AKS) the pools reference; yours to manage.")
    ] = "default",
    name: PoolsNameOpt = None,
    label: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="KEY=VALUE (repeatable): a label on every NodePool and on the nodes it launches, for cost "
                          "allocation or a cluster's policies."),
    ] = None,
    head_cpu: HeadCpuOpt = HEAD_CPU,
    head_memory: HeadMemoryOpt = HEAD_MEMORY,
    out: OutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Write Karpenter NodePools for the ladder: one per market (and GPU or instance type), matching the KubeRay file's selectors, and the head's.

    A ladder across clusters gets each cluster's pools, labelled spotfallback/cluster=NAME as its
    RayCluster is, in the one file: apply them with `kubectl apply -f FILE -l spotfallback/cluster=NAME`.
    """
    karpenter = _choice("--cloud", cloud, KarpenterCloud)
    _check_out(out, force, job)
    problem = object_name_error(node_class)
    if problem:
        _fail(f"--node-class: {problem}")
    _check_options(None, name)
    labels = _key_values("--label", label)
    config, run_name = _load(job, name, False)
    try:
        text = render_nodepools(config, NodePoolOptions(cloud=karpenter, node_class=node_class, run_name=run_name,
                                                        labels=labels, head_cpu=head_cpu, head_memory=head_memory))
    except ConfigError as e:
        _config_error(e, job)
    except ManifestInvalid as e:
        _fail(f"internal error, the generated NodePools do not validate: {e}", e.exit_code)
    _emit(text, out, f"{text.count('kind: NodePool')} NodePools")


def validate_command(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="RayJob/RayCluster YAML, Karpenter NodePools or ray up config.")
    ],
    kuberay_version: Annotated[
        str | None,
        typer.Option(
            help="The KubeRay operator's version on the target cluster: refuse fields it would drop "
            "(group labels and resources, SidecarMode need 1.5.0; autoscaling a tier's group for its label selector, 1.5.1).",
        ),
    ] = None,
    job: Annotated[
        Path | None,
        typer.Option("--job", help="Job file: check that the file's NodePools let every tier's nodes exist."),
    ] = None,
) -> None:
    """Check a file offline: KubeRay v1 schema (strict) + operator rules, Karpenter's NodePool schema, or Ray's
    launcher schema + each node type's node_config keys against its cloud's fields (AWS, GCP, Azure).

    A NodePool is checked against its provider's CRD (by `nodeClassRef.group`); with `--job`, the file's
    pools are also checked against the ladder, as `manifest nodepools` checks its own. Other documents
    of the file (an EC2NodeClass or AKSNodeClass, a ConfigMap) are listed as not checked. Exit
    codes: 0 valid, 1 invalid (each problem on stderr), 2 bad input.
    """
    if kuberay_version is not None:
        try:
            parse_version(kuberay_version)
        except ValueError as e:
            _fail(str(e))
    config = _load(job, None, False)[0] if job is not None else None
    try:
        report = validate_file(file, kuberay_version, config)
    except ConfigError as e:  # a tier the NodePools cannot be matched against (as `manifest nodepools` says)
        assert job is not None
        _config_error(e, job)
    _print_report(file, report)
    if not report.ok:
        typer.echo(f"{file}: {len(report.errors)} error(s)", err=True)
        raise typer.Exit(EXIT_ERROR)
    typer.echo(f"{file}: ok ({', '.join(report.kinds)})")


def register(app: typer.Typer) -> None:
    """Add the `manifest` command group to ``app``."""
    manifest = typer.Typer(
        cls=CommandSummaries,
        name="manifest",
        help="Deployment files (KubeRay, Karpenter NodePools, ray up) for a job's tier ladder, validated offline.",
        no_args_is_help=True,
        rich_markup_mode=None,  # click's own help, as the main app's: nothing cut short on a narrow terminal
    )
    manifest.command("kuberay")(kuberay_command)
    manifest.command("cluster-launcher")(launcher_command)
    manifest.command("nodepools")(nodepools_command)
    manifest.command("validate")(validate_command)
    app.add_typer(manifest, name="manifest")
