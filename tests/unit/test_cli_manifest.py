"""`spotfallback manifest ...` on a fresh Typer app (the commands register themselves)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from spotfallback.cli import manifest as cli_manifest
from spotfallback.deploy import validate_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kuberay"
JOB = """\
name: churn-model
storage_path: s3://ml-runs/spotfallback
entrypoint: churn.train:train_func
tiers:
  - {name: spot, market: spot, num_workers: 2}
  - {name: on-demand, market: on-demand, num_workers: 2}
"""


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Root, so `manifest` stays a subcommand as in the real CLI."""

    cli_manifest.register(app)
    return app


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def run(app: typer.Typer, *args: str | Path):
    return CliRunner().invoke(app, ["manifest", *map(str, args)])


@pytest.mark.parametrize("cloud", ["eks-karpenter", "eks-managed", "aks", "aks-nap", "gke"])
@pytest.mark.parametrize("kind", ["rayjob", "raycluster"])
def test_kuberay_writes_a_valid_file(app: typer.Typer, job_file: Path, tmp_path: Path, cloud: str, kind: str) -> None:
    out = tmp_path / "out.yaml"
    result = run(app, "kuberay", "--cloud", cloud, "--kind", kind, "--job", job_file, "--storage-secret", "creds", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr
    assert validate_file(out).ok
    assert yaml.safe_load(out.read_text())["metadata"]["name"] == "churn-model"


@pytest.mark.parametrize(
    "command",
    [["kuberay", "--cloud", "gke", "--storage-secret", "creds"], ["nodepools", "--cloud", "eks-karpenter"],
     ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]],
)
def test_out_never_replaces_a_file_unless_forced(app: typer.Typer, job_file: Path, tmp_path: Path, command: list[str]) -> None:
    """A deployment file may have been edited by hand: a second write keeps it, and says how to replace it."""
    out = tmp_path / "deploy.yaml"
    out.write_text("# edited by hand\n")
    kept = run(app, *command, "--job", job_file, "--out", out)
    assert kept.exit_code == 2 and kept.stderr == f"error: --out: '{out}' already exists; pass --force to overwrite it\n"
    assert out.read_text() == "# edited by hand\n"
    assert run(app, *command, "--job", job_file, "--out", out, "--force").exit_code == 0 and validate_file(out).ok
    folder = run(app, *command, "--job", job_file, "--out", tmp_path)
    assert folder.exit_code == 2 and folder.stderr == f"error: --out: '{tmp_path}' is a directory; give a file name\n"
    json_out = run(app, *command, "--job", job_file, "--out", tmp_path / "deploy.json")
    assert json_out.exit_code == 2 and json_out.stderr == f"error: --out: '{tmp_path / 'deploy.json'}' must end in .yaml or .yml\n"
    assert not list(tmp_path.glob(".*.tmp"))
    # --force replaces an old manifest, never the job file it is made from (through a link, too).
    before = job_file.read_text()
    link = tmp_path / "job-link.yaml"
    link.symlink_to(job_file)
    for target in (job_file, link):
        same = run(app, *command, "--job", job_file, "--out", target, "--force")
        assert same.exit_code == 2 and same.stderr == (
            f"error: --out: '{target}' is the --job file; write to another path\n")
    assert job_file.read_text() == before


def test_cluster_launcher_refuses_the_other_clouds_identity_and_notes_a_missing_one(app: typer.Typer, job_file: Path) -> None:
    aws = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--service-account", "a@b.iam.gserviceaccount.com")
    assert aws.exit_code == 2 and aws.stderr == "error: --service-account: a GCP service account; on aws give the workers --instance-profile ARN\n"
    gcp = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
              "--instance-profile", "arn:aws:iam::1:instance-profile/x")
    assert gcp.exit_code == 2 and "error: --instance-profile: an AWS instance profile" in gcp.stderr
    bare = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file)
    assert bare.exit_code == 0 and "note: Storage s3://" in bare.stderr and "the workers cannot write their checkpoints" in bare.stderr


@pytest.mark.parametrize(
    "command",
    [["kuberay", "--cloud", "gke", "--storage-secret", "creds"], ["kuberay", "--cloud", "gke", "--kind", "raycluster"],
     ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]],
)
def test_a_job_files_ray_address_the_cluster_does_not_use_is_noted(app: typer.Typer, tmp_path: Path, command: list[str]) -> None:
    """The driver runs on the cluster's head and joins it: an address in the job file is not used, and says so."""
    for address, noted in (("ray://head:10001", True), ("local", False), ("auto", False)):
        job = tmp_path / "job.yaml"
        job.write_text(JOB + f"ray_address: {address}\n")
        result = run(app, *command, "--job", job)
        assert result.exit_code == 0, result.output
        note = f"note: ray_address {address!r} is not used here: the driver runs on the cluster's head and joins that cluster (auto)\n"
        assert (note in result.stderr) is noted, result.stderr



@pytest.mark.parametrize("command", [["kuberay", "--cloud", "gke"], ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]])
def test_a_tier_whose_gang_and_nodes_are_an_earlier_tiers_is_noted(app: typer.Typer, tmp_path: Path,
                                                                  command: list[str]) -> None:
    """Two spot tiers selecting the same nodes with the same gang: the fall between them changes
    nothing but budgets. A smaller gang there, or another zone, is a fall of its own."""
    twins = JOB.replace("  - {name: on-demand", "  - {name: spot-2, market: spot, num_workers: 2}\n  - {name: on-demand")
    job = tmp_path / "job.yaml"
    for text, noted in ((twins, True), (twins.replace("spot-2, market: spot, num_workers: 2", "spot-2, market: spot, num_workers: 1"), False),
                        (twins.replace("spot-2, market: spot,", "spot-2, market: spot, label_selector: {ray.io/availability-zone: us-east-1b},"), False),
                        (JOB, False)):
        job.write_text(text)
        result = run(app, *command, "--job", job)
        assert result.exit_code == 0, result.output
        notes = [line for line in result.stderr.splitlines() if "selects the same nodes" in line]
        assert notes == ([
            "note: tiers[1] (spot-2) selects the same nodes as tiers[0] (spot), {'ray.io/market-type': 'spot'}, with the "
            "same gang, so falling from "
            "one to the other stays in the pool whose capacity just failed; give each a label_selector of its own pool "
            "(e.g. ray.io/availability-zone), or drop one"] if noted else []), result.stderr


@pytest.mark.parametrize("command", [["kuberay", "--cloud", "gke"], ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]])
def test_tiers_of_their_own_placements_but_one_label_selector_are_noted(app: typer.Typer, tmp_path: Path,
                                                                        command: list[str]) -> None:
    """Their worker groups differ, their selectors do not: Ray places either gang on the other's nodes."""
    types = {"kuberay": ("n2-standard-8", "c3-standard-8"), "cluster-launcher": ("m5.2xlarge", "c5.2xlarge")}[command[0]]
    twins = JOB.replace("  - {name: on-demand", "  - {name: spot-2, market: spot, num_workers: 2}\n  - {name: on-demand")
    twins = twins.replace("{name: spot, market: spot,", f"{{name: spot, market: spot, placement: {{instance_type: {types[0]}}},")
    twins = twins.replace("{name: spot-2, market: spot,", f"{{name: spot-2, market: spot, placement: {{instance_type: {types[1]}}},")
    job = tmp_path / "job.yaml"
    for text, noted in ((twins, True), (twins.replace("{name: spot-2, market: spot,", "{name: spot-2, market: spot, label_selector: {pool: b},"), False)):
        job.write_text(text)
        result = run(app, *command, "--job", job)
        assert result.exit_code == 0, result.output
        notes = [line for line in result.stderr.splitlines() if "one label selector" in line]
        assert len(notes) == noted and (not noted or notes[0].startswith(
            "note: tiers[1] (spot-2) and tiers[0] (spot) get worker groups of their own placements but one label "
            "selector, {'ray.io/market-type': 'spot'}: Ray places either tier's gang on the other's nodes")), result.stderr

def test_kuberay_to_stdout_and_validate_it(app: typer.Typer, job_file: Path, tmp_path: Path) -> None:
    result = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--name", "churn-v2")
    assert result.exit_code == 0 and result.stderr.startswith("run name: churn-v2 (from --name); ")
    manifest = yaml.safe_load(result.stdout)
    assert json.loads(shlex.split(manifest["spec"]["entrypoint"])[3])["name"] == "churn-v2"
    saved = tmp_path / "rayjob.yaml"
    saved.write_text(result.stdout)
    checked = run(app, "validate", saved)
    assert checked.exit_code == 0 and checked.stdout == f"{saved}: ok (RayJob)\n"


def test_kuberay_labels_and_priority_class(app: typer.Typer, job_file: Path) -> None:
    base = ("kuberay", "--cloud", "eks-karpenter", "--job", job_file)
    result = run(app, *base, "--label", "team=ml", "--label", "example.com/cost-center=", "--priority-class", "training")
    assert result.exit_code == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    labels = {"spotfallback/run": "churn-model", "team": "ml", "example.com/cost-center": ""}
    assert manifest["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "spotfallback", **labels}
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"] == labels and head["spec"]["priorityClassName"] == "training"
    for args, message in (
        (("--label", "team"), "--label: expected KEY=VALUE, got 'team'"),
        (("--label", "team=ml", "--label", "team=ops"), "--label: 'team' is given twice ('ml' and 'ops')"),
        (("--label", "ray.io/group=x"), "--label: 'ray.io/group' is a key the file, KubeRay or Kubernetes sets itself"),
        (("--label", "team=ml ops"), "--label: team=ml ops: invalid label value 'ml ops'"),
        (("--priority-class", "Training"), "--priority-class: 'Training' is not a Kubernetes object name"),
        (("--priority-class", "system-node-critical"), "--priority-class: 'system-node-critical': system-... classes"),
    ):
        bad = run(app, *base, *args)
        assert bad.exit_code == 2 and not bad.stdout and bad.stderr.startswith(f"error: {message}"), bad.stderr


def test_a_large_gangs_head_is_sized_in_both_files(app: typer.Typer, job_file: Path) -> None:
    """--head-cpu / --head-memory size the head pod, and the head's NodePool holds its node twice."""
    result = run(app, "kuberay", "--cloud", "eks-karpenter", "--job", job_file, "--head-cpu", "8", "--head-memory", "32Gi")
    assert result.exit_code == 0, result.stderr
    head = yaml.safe_load(result.stdout)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["resources"] == {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}}
    pools = run(app, "nodepools", "--cloud", "eks-karpenter", "--job", job_file, "--head-cpu", "8", "--head-memory", "32Gi")
    assert pools.exit_code == 0, pools.stderr
    head_pool = [p for p in yaml.safe_load_all(pools.stdout) if p["metadata"]["name"].endswith("-head")]
    assert [p["spec"]["limits"] for p in head_pool] == [{"cpu": "32"}]  # a 16-vCPU node and its replacement
    for command in (("kuberay", "--cloud", "gke"), ("nodepools", "--cloud", "aks-nap")):
        for args, message in (
            (("--head-cpu", "0.5"), "--head-cpu: '0.5' is too little for a Ray head"),
            (("--head-cpu", "two"), "--head-cpu: 'two' is not a Kubernetes CPU quantity"),
            (("--head-memory", "4Gi"), "--head-memory: '4Gi' is too little for a Ray head"),
            (("--head-memory", "lots"), "--head-memory: 'lots' is not a Kubernetes memory quantity"),
        ):
            bad = run(app, *command, "--job", job_file, *args)
            assert bad.exit_code == 2 and not bad.stdout and bad.stderr.startswith(f"error: {message}"), bad.stderr


def test_unique_name_makes_a_new_run(app: typer.Typer, job_file: Path) -> None:
    result = run(app, "kuberay", "--cloud", "aks", "--job", job_file, "--unique-name")
    assert result.exit_code == 0
    name = result.stderr.split("run name: ")[1].split()[0]
    assert name.startswith("churn-model-") and name != "churn-model"
    manifest = yaml.safe_load(result.stdout)
    assert manifest["metadata"]["annotations"]["spotfallback/run-name"] == name


@pytest.mark.parametrize("command", [["kuberay", "--cloud", "aks"], ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]])
def test_every_generation_says_the_same_name_resumes(app: typer.Typer, job_file: Path, tmp_path: Path, command: list[str]) -> None:
    result = run(app, *command, "--job", job_file, "--out", tmp_path / "out.yaml")
    assert result.exit_code == 0
    assert result.stderr.splitlines()[-1] == (
        "run name: churn-model (from the job file); if s3://ml-runs/spotfallback/churn-model already holds a run, "
        "this file RESUMES it: for a new run, pass --unique-name or another --name"
    )


IMAGE = "registry.example.com/ml/churn-train:1.4"


def _containers(text: str) -> list[list[str]]:
    """Each worker group's containers, native sidecars (init containers) last."""
    groups = yaml.safe_load(text)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    specs = [g["template"]["spec"] for g in groups]
    return [[c["name"] for c in [*p["containers"], *p.get("initContainers", [])]] for p in specs]


def test_notice_agent_switch(app: typer.Typer, job_file: Path) -> None:
    stock = run(app, "kuberay", "--cloud", "gke", "--job", job_file)
    assert _containers(stock.stdout) == [["ray-worker"], ["ray-worker"]]
    own = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--image", IMAGE, "--spot-grace", "12")
    assert _containers(own.stdout) == [["ray-worker", "notice-agent"], ["ray-worker"]]
    assert "within a 12 s grace" in own.stdout and "note:" not in own.output
    longer = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--image", IMAGE, "--spot-grace", "90")
    assert longer.exit_code == 0 and "note: a 90 s spot grace needs a GKE Standard node pool" in longer.stderr
    off = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--image", IMAGE, "--no-notice-agent")
    assert _containers(off.stdout) == [["ray-worker"], ["ray-worker"]] and "# Notice agent: off (--no-notice-agent)" in off.stdout
    vm = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file)
    assert "spotfallback notice-agent --cloud aws" in yaml.safe_load(vm.stdout)["worker_start_ray_commands"][-1]
    vm_off = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--no-notice-agent")
    assert "worker_start_ray_commands" not in yaml.safe_load(vm_off.stdout)


NO_MARKET = JOB.replace("{name: spot, market: spot, num_workers: 2}", "{name: spot, num_workers: 2}")


@pytest.mark.parametrize(
    ("args", "job_text", "message"),
    [
        (["--cloud", "gce"], JOB, "error: --cloud: 'gce' is not one of: eks-karpenter, eks-managed, aks, aks-nap, gke"),
        (["--cloud", "gke", "--kind", "deployment"], JOB, "error: --kind: 'deployment' is not one of: rayjob, raycluster"),
        (["--cloud", "gke"], NO_MARKET, "tiers[0].market: required field is missing"),
        (["--cloud", "gke", "--image", "rayproject/ray:2.60.0 py311"], JOB, "error: --image: 'rayproject/ray:2.60.0 py311' is not a container image"),
        (["--cloud", "gke", "--name", "a/b"], JOB, "error: --name: run name 'a/b'"),
        (["--cloud", "gke", "--storage-secret", "Bad_Secret"], JOB, "error: --storage-secret: 'Bad_Secret' is not a Kubernetes object name"),
        (["--cloud", "gke", "--storage-pvc", "runs"], JOB, "error: --storage-pvc: storage_path 's3://ml-runs/spotfallback' is remote storage"),
        (["--cloud", "gke"], JOB.replace("s3://ml-runs/spotfallback", "/tmp/runs"), "job.yaml: storage_path: '/tmp/runs' is a local path"),
        (["--cloud", "gke"], JOB.replace("market: spot", "market: reserved"), "job.yaml: tiers[0].market: 'reserved' has no node selection on gke"),
        (["--cloud", "gke", "--notice-agent"], JOB, "error: --notice-agent: the sidecar runs `spotfallback notice-agent` from the image"),
        (["--cloud", "gke", "--image", IMAGE, "--spot-grace", "0"], JOB, "error: --spot-grace: must be at least 6"),
        (["--cloud", "eks-karpenter", "--image", IMAGE, "--spot-grace", "300"], JOB, "error: --spot-grace: 300 s is longer than the spot notice on eks-karpenter (120 s)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_file(app: typer.Typer, tmp_path: Path, args: list[str], job_text: str, message: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(job_text)
    out = tmp_path / "out.yaml"
    out.write_text("previous content\n")
    result = run(app, "kuberay", "--job", job, "--out", out, "--force", *args)  # even --force keeps it on bad input
    assert result.exit_code == 2
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert message in result.stderr, result.stderr
    assert out.read_text() == "previous content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "out.yaml"]


def test_missing_job_file_and_missing_out_directory(app: typer.Typer, job_file: Path, tmp_path: Path) -> None:
    missing = run(app, "kuberay", "--cloud", "gke", "--job", tmp_path / "nope.yaml")
    assert missing.exit_code == 2 and "error: --job: " in missing.stderr and "cannot read the job file" in missing.stderr
    nowhere = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--out", tmp_path / "no" / "x.yaml")
    assert nowhere.exit_code == 2 and nowhere.stderr.startswith("error: --out: directory")


@pytest.mark.parametrize(("cloud", "where"), [("aws", ["--region", "us-east-1"]), ("gcp", ["--zone", "us-central1-a", "--project-id", "ml-project"])])
def test_cluster_launcher_writes_a_valid_file(app: typer.Typer, job_file: Path, tmp_path: Path, cloud: str, where: list[str]) -> None:
    out = tmp_path / "cluster.yaml"
    result = run(app, "cluster-launcher", "--cloud", cloud, "--job", job_file, *where, "--instance-type", "spot=m5.4xlarge" if cloud == "aws" else "spot=n2-standard-16", "--out", out)
    assert result.exit_code == 0, result.output
    report = validate_file(out)
    assert report.ok and report.kinds == ("cluster-launcher",)
    spot = yaml.safe_load(out.read_text())["available_node_types"]["spot"]["node_config"]
    assert spot.get("InstanceType", spot.get("machineType")) in ("m5.4xlarge", "n2-standard-16")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cloud", "azure"], "error: --cloud: 'azure' is not one of: aws, gcp"),
        (["--cloud", "aws"], "error: --region: required"),
        (["--cloud", "aws", "--region", "us-east-1", "--instance-type", "m5.large"], "error: --instance-type: expected TIER=TYPE, got 'm5.large'"),
        (["--cloud", "aws", "--region", "us-east-1", "--instance-type", "gpu=p4d.24xlarge"], "error: --instance-type: no tier named 'gpu'"),
        (["--cloud", "aws", "--region", "us-east-1", "--instance-type", "spot=m5.large", "--instance-type", "spot=m5.xlarge"],
         "error: --instance-type: tier 'spot' is given twice ('m5.large' and 'm5.xlarge')"),
        (["--cloud", "aws", "--region", "us-east-1", "--head-instance-type", ""], "error: --head-instance-type: empty;"),
        (["--cloud", "aws", "--region", "us-east-1", "--head-instance-type", "t2.micro"], "error: --head-instance-type: "
         "'t2.micro' has 1 GiB of memory, too little for a Ray head node, which runs the GCS, the dashboard, the autoscaler "
         "and the job driver; name a type with at least 7.5 GiB (such as 't2.large'), or leave it out for the default "
         "'m5.2xlarge'"),
        (["--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--head-instance-type", "m5.large"],
         "error: --head-instance-type: 'm5.large' is not a Compute Engine machine type"),
        (["--cloud", "gcp", "--zone", "us-central1-a"], "error: --project-id: required on GCP"),
        (["--cloud", "aws", "--region", "not a region"], "error: --region: 'not a region' is not an AWS region name; give one "
         "such as 'us-east-1'"),
        (["--cloud", "aws", "--region", "us-west-2", "--zone", "us-west-2zz"], "error: --zone: 'us-west-2zz' is not an AWS "
         "zone name; give one such as 'us-east-1a'"),
        (["--cloud", "gcp", "--zone", "us-central1a", "--project-id", "my-project"], "error: --zone: 'us-central1a' is not a GCP zone"),
        (["--cloud", "aws", "--region", "us-east-1", "--image", "my image"], "error: --image: 'my image' is not a container image"),
    ],
)
def test_cluster_launcher_bad_input(app: typer.Typer, job_file: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "cluster.yaml"
    result = run(app, "cluster-launcher", "--job", job_file, "--out", out, *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(message), result.stderr
    assert not out.exists()


def test_validate_reports_errors_with_field_paths(app: typer.Typer, tmp_path: Path) -> None:
    ok = run(app, "validate", FIXTURES / "ray-cluster-label-selector.yaml")
    assert ok.exit_code == 0 and ok.stdout.endswith(": ok (RayCluster, ConfigMap (not checked))\n")
    assert "warning: " in ok.stderr and "[doc 1]: spec.workerGroupSpecs[1]" in ok.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text((FIXTURES / "ray-job.sample.yaml").read_text().replace("  entrypoint:", "  backofLimit: 2\n  entrypoint:", 1))
    bad = run(app, "validate", broken)
    assert bad.exit_code == 1
    assert f"{broken}[doc 1]: spec.backofLimit: unknown field; did you mean 'backoffLimit'?" in bad.stderr
    missing = run(app, "validate", tmp_path / "nope.yaml")
    assert missing.exit_code == 2


def test_validate_refuses_a_generated_file_whose_container_lost_its_image(app: typer.Typer, job_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "rayjob.yaml"
    assert run(app, "kuberay", "--cloud", "eks-karpenter", "--job", job_file, "--out", out).exit_code == 0
    assert run(app, "validate", out).exit_code == 0
    doc = yaml.safe_load(out.read_text())
    doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = ""
    out.write_text(yaml.safe_dump(doc))
    bad = run(app, "validate", out)
    assert bad.exit_code == 1
    assert bad.stderr == (f"{out}: spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].image: required; name "
                          f"the container's image\n{out}: 1 error(s)\n")


def test_validate_refuses_fields_an_older_stated_operator_would_drop(app: typer.Typer, job_file: Path, tmp_path: Path) -> None:
    """Before KubeRay 1.5.0 the API server drops group labels/resources and SidecarMode silently:
    no ray.io/market-type on any node, so no tier would ever find its workers; before 1.5.1 the
    autoscaler's scaling of a group for a label selector is not fully supported."""
    out = tmp_path / "rayjob.yaml"
    assert run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--out", out).exit_code == 0
    assert "KubeRay >= 1.5.1" in out.read_text()
    assert run(app, "validate", out, "--kuberay-version", "1.5.1").exit_code == 0
    assert run(app, "validate", out).exit_code == 0  # no version stated: the file alone is checked
    almost = run(app, "validate", out, "--kuberay-version", "1.5.0")
    assert almost.exit_code == 1, almost.stderr
    assert (
        "spec.rayClusterSpec.workerGroupSpecs[0].labels: KubeRay 1.5.0 does not fully support scaling a worker group for a "
        "label selector: a tier's group at zero replicas may never get nodes (it first appears in 1.5.1; upgrade the "
        "operator to 1.5.1 or later)"
    ) in almost.stderr
    assert "SidecarMode" not in almost.stderr
    old = run(app, "validate", out, "--kuberay-version", "v1.4.2")
    assert old.exit_code == 1, old.stderr
    assert (
        "spec.submissionMode: SidecarMode: KubeRay 1.4.2 does not know this mode and would never submit the job "
        "(it first appears in 1.5.0; upgrade the operator to 1.5.0 or later)"
    ) in old.stderr
    assert (
        "spec.rayClusterSpec.workerGroupSpecs[0].labels: KubeRay 1.4.2 drops group labels silently: no node gets "
        "ray.io/market-type, so no tier finds its workers (it first appears in 1.5.0; upgrade the operator to 1.5.0 or later)"
    ) in old.stderr
    assert "spec.rayClusterSpec.headGroupSpec.resources: KubeRay 1.4.2 drops this field silently" in old.stderr
    # The file says what it needs, and validate reads it back.
    assert (
        'metadata.annotations["spotfallback/min-kuberay-version"]: the file needs KubeRay 1.5.1, the operator is 1.4.2'
    ) in old.stderr
    bad = run(app, "validate", out, "--kuberay-version", "latest")
    assert bad.exit_code == 2 and "error: --kuberay-version: 'latest' is not a version such as 1.5.0" in bad.stderr


def test_a_ladder_across_clusters_writes_one_raycluster_per_cluster_and_says_where_the_mover_runs(
    app: typer.Typer, tmp_path: Path
) -> None:
    job = tmp_path / "across.yaml"
    job.write_text(yaml.safe_dump({
        "name": "llama-ft", "storage_path": "s3://bucket/runs", "entrypoint": "mypkg.train:train_fn",
        "tiers": [
            {"name": "spot-east", "market": "spot", "num_workers": 2, "cluster": {"address": "http://h-east:8265", "name": "east"}},
            {"name": "spot-west", "market": "spot", "num_workers": 2, "cluster": {"address": "http://h-west:8265", "name": "west"}},
        ],
    }))
    out = tmp_path / "clusters.yaml"
    result = run(app, "kuberay", "--cloud", "eks-karpenter", "--job", job, "--out", out)  # no --kind: RayClusters
    assert result.exit_code == 0, result.output
    assert "2 RayClusters, one per cluster" in result.stderr and "the moving driver: run `spotfallback run JOB.yaml`" in result.stderr
    assert validate_file(out).ok
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out.read_text())] == ["llama-ft-east", "llama-ft-west"]
    refused = run(app, "kuberay", "--cloud", "eks-karpenter", "--kind", "rayjob", "--job", job)
    assert refused.exit_code == 2 and "one RayCluster per cluster (--kind raycluster)" in refused.stderr
    assert refused.stderr.startswith("error: --kind: "), refused.stderr  # the option typed, not the library's field
    launcher = run(app, "cluster-launcher", "--cloud", "aws", "--job", job)
    assert launcher.exit_code == 2 and "one `ray up` file is one cluster" in launcher.stderr


@pytest.mark.parametrize("command", [["kuberay", "--cloud", "gke", "--storage-secret", "creds"], ["nodepools", "--cloud", "eks-karpenter"]])
def test_an_out_that_cannot_be_written_is_one_line_and_keeps_the_old_file(
    app: typer.Typer, job_file: Path, tmp_path: Path, command: list[str], request: pytest.FixtureRequest,
) -> None:
    """A write that fails midway (here: the disk fills as the file is synced) leaves the deployed file as it was."""
    out = tmp_path / "deploy.yaml"
    out.write_text("# deployed\n")
    dangling = tmp_path / "gone.yaml"
    dangling.symlink_to("/nonexistent/x.yaml")
    gone = run(app, *command, "--job", job_file, "--out", dangling)
    assert gone.exit_code == 2 and gone.stderr == (f"error: --out: '{dangling}' links to '/nonexistent/x.yaml', "
                                                   "whose directory does not exist\n")

    request.getfixturevalue("disk_full_on_sync")
    failed = run(app, *command, "--job", job_file, "--out", out, "--force")
    assert failed.exit_code == 2 and "Traceback" not in failed.output
    assert failed.stderr == (f"error: --out: cannot write '{out}': No space left on device; free some space or give "
                             "another path\n"), failed.stderr
    assert out.read_text() == "# deployed\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.yaml", "gone.yaml", "job.yaml"]


@pytest.mark.parametrize("command", [["kuberay", "--cloud", "gke"], ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]])
def test_an_empty_pip_package_is_refused_rather_than_written(app: typer.Typer, job_file: Path, command: list[str]) -> None:
    """`pip install ''` fails on every node at start; said here, it is one line before anything is deployed."""
    r = run(app, *command, "--job", job_file, "--pip", "torch==2.3.1", "--pip", " ")
    assert r.exit_code == 2 and r.stderr.startswith("error: --pip: an empty package;") and not r.stdout


@pytest.mark.parametrize(("package", "problem"), [
    ("torch>=", "error: --pip: 'torch>=' is not a pip requirement (Expected semicolon (after name with no version "
                "specifier) or end); give one such as 'torch==2.3.1'"),
    ("--extra-index-url", "error: --pip: '--extra-index-url' is a pip option; give one requirement, wheel or URL each"),
])
def test_a_pip_package_pip_would_refuse_on_every_node_is_refused_here(app: typer.Typer, job_file: Path, package: str,
                                                                      problem: str) -> None:
    r = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--pip", package)
    assert r.exit_code == 2 and r.stderr.startswith(problem) and not r.stdout, r.stderr


def test_requirements_wheels_and_urls_are_all_taken_by_pip(app: typer.Typer, job_file: Path) -> None:
    packages = ["transformers>=4.40,<5", "numpy; python_version > '3.10'", "./dist/mylib-1.0-py3-none-any.whl",
                "git+https://github.com/me/mylib@v1"]
    r = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file,
            *[x for p in packages for x in ("--pip", p)])
    assert r.exit_code == 0, r.stderr
    assert all(p in r.stdout or shlex.quote(p) in r.stdout for p in packages), r.stdout


@pytest.mark.parametrize("package", ["torch; rm -rf /", "torch --index-url http://x", "my lib.whl"])
def test_a_pip_value_with_a_space_is_checked_as_a_requirement_not_passed_as_a_path(app: typer.Typer, job_file: Path, package: str) -> None:
    r = run(app, "kuberay", "--cloud", "gke", "--job", job_file, "--pip", package)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --pip: {package!r} is not a pip requirement") and not r.stdout


@pytest.mark.parametrize("option", ["--backoff-limit", "--active-deadline", "--ttl"])
def test_a_rayjob_setting_is_refused_for_a_raycluster_and_bounded_for_a_rayjob(app: typer.Typer, job_file: Path, option: str) -> None:
    """A RayCluster has no such field: the value would be dropped without a word. Kubernetes holds it in 32 bits."""
    cluster = run(app, "kuberay", "--cloud", "gke", "--kind", "raycluster", "--job", job_file, option, "60")
    assert cluster.exit_code == 2 and cluster.stderr.startswith(f"error: {option}: a RayJob's setting"), cluster.stderr
    huge = run(app, "kuberay", "--cloud", "gke", "--job", job_file, option, str(2**31))
    assert huge.exit_code == 2 and huge.stderr.startswith(f"error: {option}: must be at most 2147483647"), huge.stderr
    job = yaml.safe_load(run(app, "kuberay", "--cloud", "gke", "--job", job_file, option, "60").stdout)
    field = {"--backoff-limit": "backoffLimit", "--active-deadline": "activeDeadlineSeconds", "--ttl": "ttlSecondsAfterFinished"}[option]
    assert job["spec"][field] == 60


@pytest.mark.parametrize(("args", "message"), [
    (["--project-id", "my-project"], "error: --project-id: a GCP setting, which an aws cluster does not use"),
    (["--source-image", "img"], "error: --source-image: a GCP setting, which an aws cluster does not use"),
    (["--subnetwork", "ray-subnet"], "error: --subnetwork: a GCP setting, which an aws cluster does not use"),
    (["--instance-profile", "ray-worker"], "error: --instance-profile: 'ray-worker' is not an instance profile ARN"),
    (["--instance-profile", "arn:aws:iam::123456789012:role/ray"], "error: --instance-profile: 'arn:aws:iam::123456789012:role/ray' is not"),
])
def test_an_aws_cluster_refuses_gcp_settings_and_a_profile_that_is_no_arn(app: typer.Typer, job_file: Path, args: list[str], message: str) -> None:
    r = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, *args)
    assert r.exit_code == 2 and r.stderr.startswith(message) and not r.stdout, r.stderr
    arn = "arn:aws-us-gov:iam::123456789012:instance-profile/ml/ray-worker"
    ok = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--instance-profile", arn)
    assert ok.exit_code == 0 and f"Arn: {arn}" in ok.stdout, ok.stderr


def test_a_gcp_subnetwork_in_another_region_is_one_error_line_naming_the_option(app: typer.Typer, job_file: Path) -> None:
    r = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
            "--subnetwork", "projects/host/regions/europe-west4/subnetworks/s")
    assert r.exit_code == 2 and not r.stdout, r.stderr
    assert r.stderr.startswith("error: --subnetwork: 'projects/host/regions/europe-west4/subnetworks/s' is in region "
                               "'europe-west4', but the nodes are in 'us-central1'"), r.stderr
    ok = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
             "--subnetwork", "ray-subnet")
    assert ok.exit_code == 0 and "subnetwork: regions/us-central1/subnetworks/ray-subnet" in ok.stdout, ok.stderr


def test_a_ladder_across_aws_zones_takes_each_zones_subnets(app: typer.Typer, tmp_path: Path) -> None:
    job = tmp_path / "zones.yaml"
    job.write_text(JOB.replace("{name: spot, market: spot, num_workers: 2}", "{name: spot-a, market: spot, num_workers: 2, "
                               "label_selector: {ray.io/market-type: spot, ray.io/availability-zone: us-east-1a}}\n"
                               "  - {name: spot-b, market: spot, num_workers: 2, label_selector: {ray.io/market-type: spot, "
                               "ray.io/availability-zone: us-east-1b}}"))
    base = ("cluster-launcher", "--cloud", "aws", "--job", job)
    r = run(app, *base, "--subnet-id", "us-east-1a=subnet-0000000a", "--subnet-id", "us-east-1b=subnet-0000000b",
            "--subnet-id", "subnet-0000000c")
    assert r.exit_code == 0, r.stderr
    config = yaml.safe_load(r.stdout)
    assert config["provider"]["availability_zone"] == "us-east-1a,us-east-1b"
    assert {name: node["node_config"]["SubnetIds"] for name, node in config["available_node_types"].items()} == {
        "head": ["subnet-0000000c"], "spot-a": ["subnet-0000000a"], "spot-b": ["subnet-0000000b"],
        "on-demand": ["subnet-0000000c"]}
    missing = run(app, *base, "--subnet-id", "us-east-1a=subnet-0000000a")
    assert missing.exit_code == 2 and not missing.stdout, missing.stderr
    assert missing.stderr.startswith(f"error: {job}: tiers[1].label_selector.ray.io/availability-zone: 'us-east-1b': the tiers "
                                     "name several zones"), missing.stderr
    for entry, message in (("us-east-1a=", "--subnet-id: expected ID or ZONE=ID, got 'us-east-1a='"),
                           ("us-east-1c=subnet-0000000c", "--subnet-id: no node of the cluster is in zone 'us-east-1c'")):
        bad = run(app, *base, "--subnet-id", "us-east-1a=subnet-0000000a", "--subnet-id", "us-east-1b=subnet-0000000b",
                  "--subnet-id", entry)
        assert bad.exit_code == 2 and bad.stderr.startswith(f"error: {message}"), bad.stderr


def test_aws_networks_tags_and_internal_ips_reach_the_file_and_a_bad_value_is_one_error_line(app: typer.Typer, job_file: Path) -> None:
    base = ("cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file)
    r = run(app, *base, "--subnet-id", "subnet-0123456789abcdef0", "--subnet-id", "subnet-89abcdef", "--internal-ips")
    assert r.exit_code == 0, r.stderr
    config = yaml.safe_load(r.stdout)
    assert config["provider"]["use_internal_ips"] is True
    assert {tuple(node["node_config"]["SubnetIds"]) for node in config["available_node_types"].values()} == {
        ("subnet-0123456789abcdef0", "subnet-89abcdef")}
    bad = run(app, *base, "--subnet-id", "vpc-0123456789abcdef0")
    assert bad.exit_code == 2 and not bad.stdout, bad.stderr
    assert bad.stderr.startswith("error: --subnet-id: 'vpc-0123456789abcdef0' is not a subnet ID"), bad.stderr
    gcp = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
              "--subnet-id", "subnet-89abcdef")
    assert gcp.exit_code == 2 and gcp.stderr.startswith("error: --subnet-id: an AWS subnet; on gcp name the nodes' "
                                                        "subnetwork with --subnetwork"), gcp.stderr
    groups = run(app, *base, "--security-group-id", "sg-89abcdef")
    assert groups.exit_code == 0 and "SecurityGroupIds:\n      - sg-89abcdef" in groups.stdout, groups.stderr
    tagged = yaml.safe_load(run(app, *base, "--tag", "team=ml", "--tag", "note=a=b").stdout)
    assert tagged["available_node_types"]["head"]["node_config"]["TagSpecifications"][0]["Tags"] == [
        {"Key": "team", "Value": "ml"}, {"Key": "note", "Value": "a=b"}]
    for entry, message in (("team", "expected KEY=VALUE, got 'team'"), ("Name=x", "'Name' is one of Ray's own tags")):
        bad = run(app, *base, "--tag", entry)
        assert bad.exit_code == 2 and bad.stderr.startswith(f"error: --tag: {message}"), bad.stderr
    twice = run(app, *base, "--tag", "team=ml", "--tag", "team=ops")
    assert twice.exit_code == 2 and "'team' is given twice ('ml' and 'ops')" in twice.stderr, twice.stderr
    bad = run(app, *base, "--security-group-id", "sg-1")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --security-group-id: 'sg-1' is not a security group ID"), bad.stderr


@pytest.mark.parametrize(("account", "ok"), [
    ("notanemail", False), ("ray worker@p.iam.gserviceaccount.com", False),
    ("ray-worker@my-project.iam.gserviceaccount.com", True), ("123456-compute@developer.gserviceaccount.com", True),
])
def test_a_gcp_service_account_must_be_an_email(app: typer.Typer, job_file: Path, account: str, ok: bool) -> None:
    """GCE takes a service account by its email; anything else fails only at ray up's first launch."""
    r = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
            "--service-account", account)
    if ok:
        assert r.exit_code == 0 and f"email: {account}" in r.stdout, r.stderr
    else:
        assert r.exit_code == 2 and r.stderr.startswith(f"error: --service-account: {account!r} is not a service account's email")


def test_a_launcher_node_with_gpus_holds_as_many_one_gpu_workers_as_it_can_and_idle_ones_are_noted(
    app: typer.Typer, tmp_path: Path
) -> None:
    """Ray Train trains each worker (one process) on one GPU: eight one-GPU workers share a
    p5.48xlarge; four leave half of one idle, and so do workers too large in CPUs to fit eight."""
    job = tmp_path / "gpu.yaml"
    h100 = "use_gpu: true, label_selector: {ray.io/accelerator-type: H100}"
    job.write_text("name: llm\nstorage_path: file:///mnt/runs\nentrypoint: m:f\ntiers:\n"
                   f"  - {{name: spot, market: spot, num_workers: 16, resources_per_worker: {{CPU: 8, GPU: 1}}, {h100}}}\n"
                   f"  - {{name: small, market: on-demand, num_workers: 4, resources_per_worker: {{CPU: 8, GPU: 1}}, {h100}}}\n"
                   f"  - {{name: wide, market: on-demand, num_workers: 8, resources_per_worker: {{CPU: 90, GPU: 1}}, {h100}}}\n")
    r = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job)
    assert r.exit_code == 0, r.stderr
    config = yaml.safe_load(r.stdout)
    nodes = {name: (t["max_workers"], t["resources"]) for name, t in config["available_node_types"].items() if name != "head"}
    assert nodes == {"spot": (2, {"CPU": 64, "GPU": 8}), "small": (1, {"CPU": 32, "GPU": 4}), "wide": (4, {"CPU": 180, "GPU": 2})}
    assert config["max_workers"] == 7
    notes = [line for line in r.stderr.splitlines() if "idle" in line]
    assert notes == [
        "note: tiers[1] (small): a p5.48xlarge node has 8 GPUs and holds 4 workers of 1 (the tier has 4), so 4 are paid "
        "for and idle; give the tier more workers, or name a smaller type with --instance-type small=TYPE",
        "note: tiers[2] (wide): a p5.48xlarge node has 8 GPUs and holds 2 workers of 1 (its 192 vCPUs and 2048 GiB hold no "
        "more of 90 CPUs), so 6 are paid for and idle; ask for fewer CPUs (or less memory) per worker, or name a smaller "
        "type with --instance-type wide=TYPE",
    ]


@pytest.mark.parametrize("command", ["kuberay", "cluster-launcher"])
def test_a_worker_of_several_gpus_is_noted_as_one_process_on_one_gpu(app: typer.Typer, tmp_path: Path, command: str) -> None:
    job = tmp_path / "gpu8.yaml"
    job.write_text("name: llm\nstorage_path: s3://b/runs\nentrypoint: m:f\ntiers:\n"
                   "  - {name: spot, market: spot, num_workers: 8, use_gpu: true, resources_per_worker: {CPU: 90, GPU: 8},"
                   " label_selector: {ray.io/accelerator-type: H100}}\n")
    where = ["--cloud", "gke"] if command == "kuberay" else ["--cloud", "aws", "--region", "us-east-1"]
    r = run(app, command, *where, "--job", job)
    assert r.exit_code == 0, r.stderr
    assert ("note: tiers[0] (spot): each worker is one Ray Train process with 8 GPUs, and ray.train.torch trains on one "
            "of them (get_device, prepare_model); unless your training function uses all 8, give the tier 8x the workers "
            "with GPU: 1 (a node of 8 GPUs then holds 8 of them)") in r.stderr.splitlines()


def test_image_id_is_an_aws_option_and_named_when_it_is_no_ami(app: typer.Typer, job_file: Path) -> None:
    gcp = run(app, "cluster-launcher", "--cloud", "gcp", "--zone", "us-central1-a", "--project-id", "my-project", "--job", job_file,
              "--image-id", "ami-0123456789abcdef0")
    assert gcp.exit_code == 2 and gcp.stderr.startswith("error: --image-id: an AWS AMI; on gcp give the nodes' boot image "
                                                        "with --source-image"), gcp.stderr
    bad = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--image-id", "ubuntu")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --image-id: 'ubuntu' is not an AMI id"), bad.stderr
    ok = run(app, "cluster-launcher", "--cloud", "aws", "--region", "us-east-1", "--job", job_file, "--image-id", "ami-0123456789abcdef0")
    assert ok.exit_code == 0 and ok.stdout.count("ImageId: ami-0123456789abcdef0") == len(yaml.safe_load(ok.stdout)["available_node_types"])
