"""The preemption-notice agent in the generated files: KubeRay sidecar and `ray up` start command.

Both are parsed by the real `spotfallback notice-agent` command (typer), with the environment
the file gives it, so the generator and the agent's options cannot drift apart. The launcher's
start command is executed by bash in the environment Ray's node updater gives it (exported
with Ray's own function), with a recording `spotfallback` on PATH: it starts the agent on spot
nodes only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from spotfallback.cli import notice as cli_notice
from spotfallback.config import JobConfig
from spotfallback.deploy import (
    K8sCloud,
    Kind,
    KubeRayOptions,
    LauncherOptions,
    VmCloud,
    cluster_launcher_config,
    kuberay_manifest,
    render_cluster_launcher,
    render_kuberay,
    validate_text,
)
from spotfallback.deploy.clouds import DRAIN_MARGIN_S, SPOT_SHUTDOWN
from spotfallback.deploy.kuberay import kuberay_header, spot_grace_note
from spotfallback.errors import ConfigError

IMAGE = "registry.example.com/ml/churn-train:1.4"
SPOT = {"name": "spot", "market": "spot", "num_workers": 2}
SPOT_B = {"name": "spot-b", "market": "spot", "num_workers": 2, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-east-1b"}}
ON_DEMAND = {"name": "on-demand", "market": "on-demand", "num_workers": 2}


def make_job(*tiers: dict[str, Any]) -> JobConfig:
    return JobConfig.model_validate(
        {"name": "churn-model", "storage_path": "s3://ml-runs/spotfallback", "entrypoint": "churn.train:f", "tiers": list(tiers)}
    )


def pods(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"].get("rayClusterSpec", manifest["spec"])
    return [g["template"]["spec"] for g in spec["workerGroupSpecs"]]


def head_pod(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"].get("rayClusterSpec", manifest["spec"])
    return spec["headGroupSpec"]["template"]["spec"]


@pytest.fixture(scope="module")
def agent_command() -> Any:
    """The real `notice-agent` command, as the installed CLI registers it."""
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Root, so `notice-agent` stays a subcommand as in the real CLI."""

    cli_notice.register(app)
    return typer.main.get_command(app).commands["notice-agent"]  # type: ignore[attr-defined]


def parse(command: Any, argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The options `spotfallback notice-agent ARGV` gets under ``env`` (nothing is run)."""
    assert argv[:2] == ["spotfallback", "notice-agent"], argv
    for key in [k for k in os.environ if k.startswith("SPOTFALLBACK_") or k == "RAY_ADDRESS"]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with command.make_context("notice-agent", argv[2:]) as ctx:
        return dict(ctx.params)


# --- KubeRay ------------------------------------------------------------------------------------


def _agents(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod.get("initContainers", [])]


def test_default_is_on_with_an_image_and_off_with_the_stock_image() -> None:
    job = make_job(SPOT, ON_DEMAND)

    def agents(opts: KubeRayOptions) -> list[list[str]]:
        return [_agents(pod) for pod in pods(kuberay_manifest(job, opts))]

    assert agents(KubeRayOptions(cloud=K8sCloud.GKE)) == [[], []]
    assert agents(KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE)) == [["notice-agent"], []]
    assert agents(KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE, notice_agent=False)) == [[], []]
    with pytest.raises(ConfigError, match=r"^notice_agent: .*stock rayproject/ray image has no spotfallback"):
        KubeRayOptions(cloud=K8sCloud.GKE, notice_agent=True)
    off = render_kuberay(job, KubeRayOptions(cloud=K8sCloud.GKE))
    assert "# Notice agent: off (the stock Ray image has no spotfallback; pass --image): only the SIGTERM drain" in off


@pytest.mark.parametrize("agent", [False, True])
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_spot_pods_let_ray_drain_on_sigterm_inside_the_grace_period(cloud: K8sCloud, agent: bool) -> None:
    """Ray 2.60 drains its node on SIGTERM for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S: with or
    without the agent, a spot pod's window closes DRAIN_MARGIN_S before its grace period ends."""
    job = make_job(SPOT, ON_DEMAND)
    manifest = kuberay_manifest(job, KubeRayOptions(cloud=cloud, image=IMAGE if agent else None))
    spot, on_demand = pods(manifest)
    grace = SPOT_SHUTDOWN[cloud].grace_s
    assert spot["terminationGracePeriodSeconds"] == grace
    env = {e["name"]: e["value"] for e in spot["containers"][0]["env"]}
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == str(grace - DRAIN_MARGIN_S)
    # Nothing postpones the SIGTERM any more: Ray's own drain starts at once.
    assert "lifecycle" not in spot["containers"][0]
    assert "terminationGracePeriodSeconds" not in on_demand
    assert all(e["name"] != "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S" for e in on_demand["containers"][0].get("env", []))
    # Ray Train's controller (on the head) looks for drains every second instead of every 5 s.
    assert {"name": "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "value": "1"} in head_pod(manifest)["containers"][0]["env"]


def test_a_drain_window_longer_than_the_grace_is_refused() -> None:
    text = render_kuberay(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=K8sCloud.GKE))
    doc = yaml.safe_load(text)
    pod = pods(doc)[0]
    pod["containers"][0]["env"] = [e for e in pod["containers"][0]["env"] if e["name"] != "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"]
    # Ray's default window (30 s) outlasts GKE's 15 s grace: the kubelet kills mid-checkpoint.
    report = validate_text(yaml.safe_dump(doc))
    assert report.ok and any("30 s by default" in str(w) for w in report.warnings), [str(f) for f in report.findings]
    pod["containers"][0]["env"].append({"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "15"})
    report = validate_text(yaml.safe_dump(doc))
    assert [str(e) for e in report.errors] == [
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].env[0].value: Ray's SIGTERM drain window "
        "(15 s) does not end before the pod's grace (15 s): the kubelet would kill the workers mid-checkpoint; set "
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S a few seconds below terminationGracePeriodSeconds (15 s)"
    ]


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_agent_is_a_native_sidecar_sharing_tmp_ray(cloud: K8sCloud, kind: Kind) -> None:
    job = make_job(SPOT, SPOT_B, ON_DEMAND)
    text = render_kuberay(job, KubeRayOptions(cloud=cloud, kind=kind, image=IMAGE, storage_secret="creds"))
    report = validate_text(text)
    assert report.ok and not report.warnings, [str(f) for f in report.findings]
    assert "Kubernetes >= 1.29 (the notice agent is a native sidecar)" in text
    manifest = yaml.safe_load(text)
    for pod in pods(manifest)[:2]:
        (ray,), (agent,) = pod["containers"], pod["initContainers"]
        # An init container with restartPolicy Always runs beside the others and is restarted if
        # it exits, although the pod's restartPolicy is Never (which autoscaler v2 requires).
        assert agent["restartPolicy"] == "Always" and pod["restartPolicy"] == "Never"
        assert {"name": "ray-tmp", "emptyDir": {}} in pod["volumes"]
        assert {"name": "ray-tmp", "mountPath": "/tmp/ray"} in ray["volumeMounts"]
        assert {"name": "ray-tmp", "mountPath": "/tmp/ray"} in agent["volumeMounts"]
        assert agent["image"] == ray["image"] == IMAGE
        # It records notices in the run: the same storage credentials as the Ray container.
        secrets = [e for e in agent["env"] if "valueFrom" in e]
        assert secrets and secrets == [e for e in ray["env"] if "valueFrom" in e]
    assert "initContainers" not in pods(manifest)[2]


def _agent_errors(doc: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate_text(yaml.safe_dump(doc)).errors]


def test_validate_refuses_an_agent_that_would_stay_dead_or_block_the_pod() -> None:
    """Under autoscaler v2 every Ray pod has restartPolicy Never: a plain agent container that
    exits stays dead and the pod's evictions go undrained without a word; an init container
    without restartPolicy Always must exit before Ray starts, which the agent never does."""
    text = render_kuberay(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=K8sCloud.EKS_KARPENTER, image=IMAGE))
    at = "spec.rayClusterSpec.workerGroupSpecs[0].template.spec"
    plain = yaml.safe_load(text)
    pod = pods(plain)[0]
    agent = pod.pop("initContainers")[0]
    del agent["restartPolicy"]
    pod["containers"].append(agent)  # what the files had: a second plain container
    assert _agent_errors(plain) == [
        f"{at}.containers[1]: runs the notice agent as a plain container, which is never restarted in a pod with "
        "restartPolicy Never (what autoscaler v2 and SidecarMode require): if it exits, this pod's evictions go "
        "undrained; make it a native sidecar: an initContainers entry with restartPolicy: Always (Kubernetes >= 1.29)"
    ]
    blocking = yaml.safe_load(text)
    del pods(blocking)[0]["initContainers"][0]["restartPolicy"]
    assert _agent_errors(blocking) == [
        f"{at}.initContainers[0].restartPolicy: the notice agent never exits, and an init container must exit before "
        "the Ray container starts: the pod would never start; set restartPolicy: Always (a native sidecar, Kubernetes >= 1.29)"
    ]


def test_validate_refuses_an_agent_that_cannot_see_its_ray_node() -> None:
    text = render_kuberay(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=K8sCloud.AKS, image=IMAGE))
    lonely = yaml.safe_load(text)
    agent = pods(lonely)[0]["initContainers"][0]
    agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["mountPath"] != "/tmp/ray"]
    assert _agent_errors(lonely) == [
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.initContainers[0].volumeMounts: the agent finds its Ray "
        "node through ray_current_cluster, which `ray start` writes in the Ray container's $RAY_TMPDIR/ray (/tmp/ray): "
        "mount one volume (an emptyDir) at /tmp/ray in both containers"
    ]
    # One volume mounted above it (and RAY_TMPDIR pointing into it) is the same directory...
    agent["volumeMounts"].append({"name": "ray-tmp", "mountPath": "/scratch"})
    agent["env"].append({"name": "RAY_TMPDIR", "value": "/scratch"})
    pods(lonely)[0]["containers"][0]["volumeMounts"] = [{"name": "ray-tmp", "mountPath": "/tmp"}]
    pods(lonely)[0]["containers"][0]["env"].append({"name": "RAY_TMPDIR", "value": "/tmp/"})
    assert _agent_errors(lonely) == [], "/scratch/ray on ray-tmp is /tmp/ray on ray-tmp"
    # ...and an agent told the cluster's address needs no shared file.
    told = yaml.safe_load(text)
    agent = pods(told)[0]["initContainers"][0]
    agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["mountPath"] != "/tmp/ray"]
    agent["env"].append({"name": "RAY_ADDRESS", "value": "head-svc:6379"})
    assert _agent_errors(told) == []


def test_on_gke_gpu_on_demand_pods_get_the_agent_for_host_maintenance() -> None:
    gpu_od = {**ON_DEMAND, "use_gpu": True}
    for cloud, expected in ((K8sCloud.GKE, [["notice-agent"], ["notice-agent"]]), (K8sCloud.EKS_KARPENTER, [["notice-agent"], []])):
        manifest = kuberay_manifest(make_job({**SPOT, "use_gpu": True}, gpu_od), KubeRayOptions(cloud=cloud, image=IMAGE))
        assert [_agents(p) for p in pods(manifest)] == expected, cloud
    cpu = kuberay_manifest(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE))
    assert [_agents(p) for p in pods(cpu)] == [["notice-agent"], []]


@pytest.mark.parametrize(("grace", "preemption_s"), [(None, 30.0), (20, 30.0), (120, 120.0)])
def test_gke_agents_are_told_the_notices_of_their_vms(
    grace: int | None, preemption_s: float, agent_command: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GCE stops a GPU VM an hour after its host-maintenance notice (60 s for other VMs), and a
    Spot VM whose node pool extends its notice (``--spot-grace`` past 30 s) that much after its
    preemption notice: the agent dates its drain by them, as Ray Train keeps the earliest deadline."""
    gpu_spot, gpu_od = {**SPOT, "use_gpu": True}, {**ON_DEMAND, "use_gpu": True}
    manifest = kuberay_manifest(make_job(gpu_spot, gpu_od), KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE, spot_grace_seconds=grace))
    told = []
    for pod in pods(manifest):
        (agent,) = pod["initContainers"]
        params = parse(agent_command, agent["command"], {e["name"]: e["value"] for e in agent["env"]}, monkeypatch)
        told.append((params["gcp_notice"], params["gcp_maintenance_notice"]))
    assert told == [(preemption_s, 3600.0), (30.0, 3600.0)]
    cpu = kuberay_manifest(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE))
    (agent,) = pods(cpu)[0]["initContainers"]
    assert parse(agent_command, agent["command"], {e["name"]: e["value"] for e in agent["env"]}, monkeypatch)[
        "gcp_maintenance_notice"] == 60.0


def test_the_header_says_what_the_nodes_need_for_the_agent_to_read_their_metadata() -> None:
    """IMDSv2 answers a pod only past one hop; the GKE metadata server (Workload Identity) is
    reported not to serve instance/preempted. The agent then only says metadata-failing."""
    def header(cloud: K8sCloud, **kw: Any) -> str:
        return "\n".join(kuberay_header(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=cloud, image=IMAGE, **kw), "x"))

    assert "EC2NodeClass's (whose default is 1) metadataOptions.httpPutResponseHopLimit must be 2" in header(K8sCloud.EKS_KARPENTER)
    assert "launch template's (EC2's default for one is 1)" in header(K8sCloud.EKS_MANAGED)
    assert "Under Workload Identity pods see the GKE metadata server" in header(K8sCloud.GKE)
    assert "Under Workload Identity (--service-account is one)" in header(K8sCloud.GKE, service_account="ksa")
    assert "metadata" not in header(K8sCloud.AKS) and "metadata" not in header(K8sCloud.GKE, notice_agent=False)


@pytest.mark.parametrize("cloud", list(K8sCloud))
def test_sidecar_command_and_env_parse_as_the_real_agent(
    cloud: K8sCloud, agent_command: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = kuberay_manifest(make_job(SPOT, ON_DEMAND), KubeRayOptions(cloud=cloud, image=IMAGE, spot_grace_seconds=20))
    (agent,) = pods(manifest)[0]["initContainers"]
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert set(env) <= {p.envvar for p in agent_command.params}, "the agent reads no such variable"
    params = parse(agent_command, agent["command"] + agent.get("args", []), env, monkeypatch)
    # The cloud's own notice, earlier than the pod's SIGTERM (which Ray drains on by itself).
    assert params["cloud"] == {"gke": "gcp", "aks": "azure", "aks-nap": "azure"}.get(cloud.value, "aws")
    assert params["run"] == "s3://ml-runs/spotfallback/churn-model"
    # Found through /tmp/ray (shared with the Ray container, which starts at the same time:
    # in a pod the agent waits for it until the pod stops) and the pod's IP.
    assert params["address"] is None and params["node_id"] is None and params["ray_wait"] is None
    assert not params["dry_run"] and not params["once"]


def test_grace_bounds() -> None:
    with pytest.raises(ConfigError, match="^spot_grace_seconds: must be at least 6"):
        KubeRayOptions(cloud=K8sCloud.AKS, spot_grace_seconds=5)
    # Each cloud's own notice bounds the grace: AKS evicts 30 s after its Preempt event, AWS
    # 2 minutes after its warning, GKE Standard can stretch a Spot VM's shutdown to 120 s.
    with pytest.raises(ConfigError, match=r"^spot_grace_seconds: 45 s is longer than the spot notice on aks \(30 s\)"):
        KubeRayOptions(cloud=K8sCloud.AKS, spot_grace_seconds=45)
    with pytest.raises(ConfigError, match=r"^spot_grace_seconds: 121 s is longer than the spot notice on eks-managed \(120 s\)"):
        KubeRayOptions(cloud=K8sCloud.EKS_MANAGED, spot_grace_seconds=121)
    assert KubeRayOptions(cloud=K8sCloud.GKE, spot_grace_seconds=120).grace_seconds == 120
    # From Python a number given as text, or a flag, is named rather than failing in a comparison.
    with pytest.raises(ConfigError, match=r"^spot_grace_seconds: must be a whole number of seconds, such as 6 \(got '30'\)"):
        KubeRayOptions(cloud=K8sCloud.GKE, spot_grace_seconds="30")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^backoff_limit: must be a whole number of retries, such as 1 \(got True\)"):
        KubeRayOptions(cloud=K8sCloud.GKE, backoff_limit=True)


def test_a_gke_grace_past_its_default_shutdown_names_the_node_pool_it_needs() -> None:
    """GKE gives ordinary pods 15 s of a Spot VM's shutdown unless a Standard node pool extends
    it; a longer grace is allowed (such pools exist) but said, in the file and by the command."""
    job = make_job(SPOT, ON_DEMAND)
    longer = KubeRayOptions(cloud=K8sCloud.GKE, image=IMAGE, spot_grace_seconds=60)
    note = spot_grace_note(job, longer)
    assert note is not None and note.startswith("a 60 s spot grace needs a GKE Standard node pool")
    assert "1.35.0-gke.1171000" in note and "15 s after the preemption notice" in note
    assert f"# Spot grace: {note}." in "\n".join(f"# {line}" for line in kuberay_header(job, longer, "x"))
    # The default, a grace within it, other clouds, and a ladder with no spot tier: nothing to say.
    for cloud, grace in ((K8sCloud.GKE, None), (K8sCloud.GKE, 15), (K8sCloud.EKS_KARPENTER, 110), (K8sCloud.AKS, 30)):
        assert spot_grace_note(job, KubeRayOptions(cloud=cloud, image=IMAGE, spot_grace_seconds=grace)) is None
    assert spot_grace_note(make_job(ON_DEMAND), longer) is None


def test_every_clouds_default_grace_fits_its_notice_and_leaves_ray_a_window() -> None:
    for cloud, shutdown in SPOT_SHUTDOWN.items():
        assert DRAIN_MARGIN_S < shutdown.grace_s <= shutdown.notice_s, cloud
        KubeRayOptions(cloud=cloud, spot_grace_seconds=shutdown.grace_s)  # the default passes its own check


# --- ray up --------------------------------------------------------------------------------------


def launcher(cloud: VmCloud, *tiers: dict[str, Any], **kw: Any) -> dict[str, Any]:
    where = {"region": "us-east-1"} if cloud is VmCloud.AWS else {"zone": "us-central1-a", "project_id": "ml-project"}
    return cluster_launcher_config(make_job(*tiers), LauncherOptions(cloud=cloud, **where, **kw))


@pytest.mark.parametrize("cloud", list(VmCloud))
def test_launcher_starts_the_agent_after_ray_start(cloud: VmCloud, agent_command: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    config = launcher(cloud, SPOT, ON_DEMAND)
    stop, start, agent = config["worker_start_ray_commands"]
    # Ray's own default worker start, then the agent.
    assert (stop, start) == ("ray stop", "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076")
    argv = shlex.split(agent.split("nohup ", 1)[1].split(" >", 1)[0])
    params = parse(agent_command, argv, {}, monkeypatch)
    assert params["cloud"] == cloud.value
    assert params["run"] == "s3://ml-runs/spotfallback/churn-model"
    assert "--env RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S=1" in config["docker"]["run_options"]


def test_launcher_gpu_nodes_on_gcp_tell_their_agent_of_the_hour_of_maintenance_notice(
    agent_command: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = launcher(VmCloud.GCP, {**SPOT, "use_gpu": True}, {**ON_DEMAND, "use_gpu": True}, source_image="projects/p/global/images/gpu")
    gpu, head = config["available_node_types"]["spot"], config["available_node_types"]["head"]
    assert "docker" not in head and config["available_node_types"]["on-demand"]["docker"] == gpu["docker"]
    assert "docker" not in launcher(VmCloud.GCP, SPOT, ON_DEMAND)["available_node_types"]["spot"]
    # Ray's updater runs a node type's worker_run_options with the global run_options: the
    # container's environment, which the agent started inside it reads.
    (option,) = gpu["docker"]["worker_run_options"]
    name, value = option.removeprefix("--env ").split("=")
    argv = shlex.split(config["worker_start_ray_commands"][-1].split("nohup ", 1)[1].split(" >", 1)[0])
    assert parse(agent_command, argv, {name: value}, monkeypatch)["gcp_maintenance_notice"] == 3600.0
    where = {"zone": "us-central1-a", "project_id": "ml-project", "source_image": "projects/p/global/images/gpu"}
    rendered = render_cluster_launcher(make_job({**SPOT, "use_gpu": True}, {**ON_DEMAND, "use_gpu": True}),
                                       LauncherOptions(cloud=VmCloud.GCP, **where))
    assert validate_text(rendered).ok  # Ray's schema takes a node type's docker options


def test_launcher_switch_and_ladders_without_spot() -> None:
    assert "worker_start_ray_commands" not in launcher(VmCloud.AWS, SPOT, ON_DEMAND, notice_agent=False)
    assert "worker_start_ray_commands" not in launcher(VmCloud.GCP, ON_DEMAND)


def _recording_spotfallback(bin_dir: Path) -> None:
    bin_dir.mkdir()
    script = bin_dir / "spotfallback"
    script.write_text('#!/bin/sh\nprintf \'%s\\n\' "$@" > "$HOME/argv.tmp" && mv "$HOME/argv.tmp" "$HOME/argv"\n')
    script.chmod(0o755)


@pytest.mark.parametrize(
    ("node_type", "starts"), [("spot", True), ("spot-b", True), ("on-demand", False)]
)
def test_launcher_agent_runs_on_spot_node_types_only(tmp_path: Path, node_type: str, starts: bool) -> None:
    from ray.autoscaler._private.command_runner import _with_environment_variables

    config = launcher(VmCloud.AWS, SPOT, SPOT_B, ON_DEMAND)
    labels = config["available_node_types"][node_type]["labels"]
    # What Ray's node updater runs for this node type (the labels exported as it exports them).
    command = _with_environment_variables(config["worker_start_ray_commands"][-1], {"RAY_OVERRIDE_LABELS": labels})
    home = tmp_path / "home"
    home.mkdir()
    _recording_spotfallback(tmp_path / "bin")
    env = {"HOME": str(home), "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    argv = home / "argv"
    deadline = time.monotonic() + 10
    while starts and not argv.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert argv.exists() == starts
    assert (home / "spotfallback-notice-agent.pid").exists() == starts
    if starts:
        assert argv.read_text().split() == ["notice-agent", "--cloud", "aws", "--run", "s3://ml-runs/spotfallback/churn-model"]
