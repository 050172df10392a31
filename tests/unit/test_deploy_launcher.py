"""Ray cluster-launcher (`ray up`) config generation.

Golden files: tests/golden/launcher-<cloud>.yaml, reviewed by eye once. Regenerate after an
intended change with:  UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_deploy_launcher.py
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotfallback import __version__
from spotfallback.config import JobConfig
from spotfallback.deploy import (
    LauncherOptions,
    VmCloud,
    cluster_launcher_config,
    rayjob_entrypoint,
    render_cluster_launcher,
    validate_text,
)
from spotfallback.errors import ConfigError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

SPOT_A = {"name": "spot-a", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 4}}
SPOT_B = {"name": "spot-b", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 8}, "label_selector": {"ray.io/market-type": "spot", "team": "ml"}}
ON_DEMAND = {"name": "on-demand", "market": "on-demand", "num_workers": 2, "resources_per_worker": {"CPU": 4}}
LADDERS = {1: [SPOT_A], 2: [SPOT_A, ON_DEMAND], 3: [SPOT_A, SPOT_B, ON_DEMAND]}
WHERE = {
    VmCloud.AWS: {"region": "us-east-1"},
    VmCloud.GCP: {"zone": "us-central1-a", "project_id": "ml-project"},
}


def make_job(tiers: list[dict[str, Any]], **extra: Any) -> JobConfig:
    data = {"name": "churn-model", "storage_path": "s3://ml-runs/spotfallback", "entrypoint": "churn.train:train_func", "tiers": tiers}
    return JobConfig.model_validate({**data, **extra})


def opts(cloud: VmCloud, **kw: Any) -> LauncherOptions:
    return LauncherOptions(cloud=cloud, **{**WHERE[cloud], **kw})


def is_spot(cloud: VmCloud, node_config: dict[str, Any]) -> bool:
    if cloud is VmCloud.AWS:
        return node_config.get("InstanceMarketOptions") == {"MarketType": "spot"}
    return node_config["scheduling"]["provisioningModel"] == "SPOT"


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("cloud", list(VmCloud))
def test_every_cloud_and_ladder_validates(cloud: VmCloud, n: int) -> None:
    text = render_cluster_launcher(make_job(LADDERS[n]), opts(cloud))
    report = validate_text(text)
    assert report.ok and not report.warnings, [str(f) for f in report.findings]
    config = yaml.safe_load(text)
    types = config["available_node_types"]
    assert list(types) == ["head", *(t["name"] for t in LADDERS[n])]
    assert config["max_workers"] == 2 * n
    head = types["head"]
    assert head["resources"] == {"CPU": 0} and head["labels"] == {"ray.io/market-type": "on-demand"}
    assert not is_spot(cloud, head["node_config"])
    for tier in LADDERS[n]:
        node = types[tier["name"]]
        assert is_spot(cloud, node["node_config"]) == (tier["market"] == "spot")
        assert node["labels"]["ray.io/market-type"] == tier["market"]
        assert (node["min_workers"], node["max_workers"]) == (0, tier["num_workers"])


def test_market_keys_per_cloud() -> None:
    aws = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS))["available_node_types"]
    assert aws["spot-a"]["node_config"] == {"InstanceType": "m5.xlarge", "InstanceMarketOptions": {"MarketType": "spot"}}
    assert aws["on-demand"]["node_config"] == {"InstanceType": "m5.xlarge"}
    gcp = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP))["available_node_types"]
    assert gcp["spot-a"]["node_config"]["scheduling"] == {
        "provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE", "automaticRestart": False,
    }
    assert gcp["on-demand"]["node_config"]["scheduling"] == {"provisioningModel": "STANDARD"}
    assert gcp["head"]["node_config"]["scheduling"] == {"provisioningModel": "STANDARD"}


def test_labels_resources_and_instance_types() -> None:
    tiers = [
        {"name": "small", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 1.5, "slot": 0.5}},
        {"name": "big", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 8}, "label_selector": {"ray.io/market-type": "spot", "team": "ml"}},
        {"name": "pinned", "market": "on-demand", "num_workers": 1},
    ]
    config = cluster_launcher_config(make_job(tiers), opts(VmCloud.AWS, instance_types={"pinned": "c7i.large"}))
    types = config["available_node_types"]
    assert types["small"]["resources"] == {"CPU": 2, "slot": 1}  # whole numbers, rounded up
    assert types["small"]["node_config"]["InstanceType"] == "m5.large"
    assert types["big"]["node_config"]["InstanceType"] == "m5.2xlarge"
    # The tier's labels, and the mark of a node type that starts the notice agent.
    assert types["big"]["labels"] == {"ray.io/market-type": "spot", "team": "ml", "spotfallback/notice-agent": "true"}
    assert types["pinned"]["node_config"]["InstanceType"] == "c7i.large"
    with pytest.raises(ConfigError, match="^instance_type: no tier named 'nope'"):
        cluster_launcher_config(make_job(tiers), opts(VmCloud.AWS, instance_types={"nope": "m5.large"}))
    # Another cloud's machine type would name a node type the provider cannot launch.
    with pytest.raises(ConfigError, match="^instance_type: pinned: 'a2-highgpu-8g' is not an EC2 instance type"):
        cluster_launcher_config(make_job(tiers), opts(VmCloud.AWS, instance_types={"pinned": "a2-highgpu-8g"}))
    with pytest.raises(ConfigError, match="^head_instance_type: 'm5.large' is not a Compute Engine machine type"):
        cluster_launcher_config(make_job(tiers), opts(VmCloud.GCP, head_instance_type="m5.large"))
    # A head of too little memory never runs the GCS, the dashboard, the autoscaler and the driver: refused,
    # naming a larger type and the default; a type the machine table does not know is taken as it is.
    with pytest.raises(ConfigError, match=r"^head_instance_type: 't2\.micro' has 1 GiB of memory, too little for a Ray head "
                                          r"node.*at least 7\.5 GiB \(such as 't2\.large'\), or leave it out for the "
                                          r"default 'm5\.2xlarge'$"):
        cluster_launcher_config(make_job(tiers), opts(VmCloud.AWS, head_instance_type="t2.micro"))
    with pytest.raises(ConfigError, match=r"^head_instance_type: 'e2-medium' has 4 GiB .*\(such as 'e2-standard-2'\), or "
                                          r"leave it out for the default 'n2-standard-8'$"):
        cluster_launcher_config(make_job(tiers), opts(VmCloud.GCP, head_instance_type="e2-medium"))
    for head in ("t2.large", "m5.large", "c7i.large"):
        config = cluster_launcher_config(make_job(tiers), opts(VmCloud.AWS, head_instance_type=head))
        assert config["available_node_types"]["head"]["node_config"]["InstanceType"] == head
    huge = make_job([{"name": "huge", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 500}}])
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.resources_per_worker: .*--instance-type huge=TYPE"):
        cluster_launcher_config(huge, opts(VmCloud.GCP))


def test_gpu_tiers() -> None:
    job = make_job([{"name": "gpu", "market": "spot", "num_workers": 1, "use_gpu": True, "resources_per_worker": {"CPU": 8, "GPU": 1}}])
    aws = cluster_launcher_config(job, opts(VmCloud.AWS))
    assert aws["available_node_types"]["gpu"]["node_config"]["InstanceType"] == "g5.2xlarge"
    assert aws["available_node_types"]["gpu"]["resources"] == {"CPU": 8, "GPU": 1}
    assert aws["docker"]["image"].endswith("-gpu")
    with pytest.raises(ConfigError, match="^source_image"):
        cluster_launcher_config(job, opts(VmCloud.GCP))
    gcp = cluster_launcher_config(job, opts(VmCloud.GCP, source_image="projects/p/global/images/gpu-image"))
    node = gcp["available_node_types"]["gpu"]["node_config"]
    assert node["machineType"] == "g2-standard-8"
    assert node["disks"][0]["initializeParams"]["sourceImage"] == "projects/p/global/images/gpu-image"


def test_region_and_zone_come_from_tiers_or_options() -> None:
    zoned = [
        {**SPOT_A, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-central1-b"}},
        ON_DEMAND,  # no zone: fits the cluster's zone
    ]
    gcp = cluster_launcher_config(make_job(zoned), LauncherOptions(cloud=VmCloud.GCP, project_id="my-project"))
    assert gcp["provider"] == {"type": "gcp", "region": "us-central1", "availability_zone": "us-central1-b", "project_id": "my-project"}
    clash = [zoned[0], {**ON_DEMAND, "label_selector": {"ray.io/market-type": "on-demand", "ray.io/availability-zone": "us-central1-c"}}]
    with pytest.raises(ConfigError, match=r"^tiers\[1\]\.label_selector\.ray\.io/availability-zone"):
        cluster_launcher_config(make_job(clash), LauncherOptions(cloud=VmCloud.GCP, project_id="my-project"))
    with pytest.raises(ConfigError, match="^zone: 'us-central1-a' differs"):
        cluster_launcher_config(make_job(zoned), LauncherOptions(cloud=VmCloud.GCP, project_id="my-project", zone="us-central1-a"))
    with pytest.raises(ConfigError, match="^project_id"):
        cluster_launcher_config(make_job(zoned), LauncherOptions(cloud=VmCloud.GCP))
    with pytest.raises(ConfigError, match="^zone: 'us-west-2a' is not in region 'us-east-1'; a zone's name starts with its region's"):
        cluster_launcher_config(make_job(LADDERS[2]), LauncherOptions(cloud=VmCloud.AWS, region="us-east-1", zone="us-west-2a"))
    with pytest.raises(ConfigError, match="^region: required"):
        cluster_launcher_config(make_job(LADDERS[1]), LauncherOptions(cloud=VmCloud.AWS))
    regional = [{**SPOT_A, "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-region": "eu-west-1"}}]
    aws = cluster_launcher_config(make_job(regional), LauncherOptions(cloud=VmCloud.AWS))
    assert aws["provider"] == {"type": "aws", "region": "eu-west-1", "cache_stopped_nodes": False}


@pytest.mark.parametrize(("cloud", "region", "zone"), [
    (VmCloud.AWS, "us-gov-west-1", "us-gov-west-1b"), (VmCloud.AWS, "us-west-2", "us-west-2-lax-1a"),
    (VmCloud.AWS, "ap-southeast-4", None), (VmCloud.GCP, "europe-west10", "europe-west10-c"),
    (VmCloud.GCP, None, "northamerica-northeast1-a"), (VmCloud.AWS, None, "us-east-1a"), (VmCloud.AWS, None, "us-west-2-lax-1a"),
])
def test_each_clouds_region_and_zone_names_are_taken(cloud, region, zone) -> None:
    """A zone alone names its region: the region's name is the start of the zone's."""
    opts = LauncherOptions(cloud=cloud, region=region, zone=zone, project_id="my-project")
    provider = cluster_launcher_config(make_job(LADDERS[1]), opts)["provider"]
    derived = {"us-east-1a": "us-east-1", "us-west-2-lax-1a": "us-west-2", "northamerica-northeast1-a": "northamerica-northeast1"}
    assert provider.get("availability_zone") == zone and provider["region"] == (region or derived[zone])


@pytest.mark.parametrize(("cloud", "region", "zone", "problem"), [
    (VmCloud.AWS, "us-central1", None, "^region: 'us-central1' is not an AWS region name; give one such as 'us-east-1'"),
    (VmCloud.AWS, "us-west-2", "us-west-2zz", "^zone: 'us-west-2zz' is not an AWS zone name; give one such as 'us-east-1a'"),
    (VmCloud.GCP, "us-east-1", "us-east-1a", "^region: 'us-east-1' is not a GCP region name"),
    (VmCloud.GCP, None, "US-CENTRAL1-A", "^zone: 'US-CENTRAL1-A' is not a GCP zone name"),
])
def test_a_region_or_zone_of_another_shape_is_refused_before_ray_up(cloud, region, zone, problem) -> None:
    """`ray up` would fail on it only after the file is written and handed on."""
    with pytest.raises(ConfigError, match=problem):
        cluster_launcher_config(make_job(LADDERS[1]), LauncherOptions(cloud=cloud, region=region, zone=zone, project_id="my-project"))


def test_storage_identity_goes_on_workers_only() -> None:
    arn = "arn:aws:iam::123456789012:instance-profile/ml-runs"
    types = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, instance_profile=arn))["available_node_types"]
    assert "IamInstanceProfile" not in types["head"]["node_config"]  # Ray's autoscaler profile stays
    assert types["spot-a"]["node_config"]["IamInstanceProfile"] == {"Arn": arn}
    email = "trainer@ml-project.iam.gserviceaccount.com"
    gcp = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, service_account=email))["available_node_types"]
    assert "serviceAccounts" not in gcp["head"]["node_config"]
    assert gcp["on-demand"]["node_config"]["serviceAccounts"][0]["email"] == email


def test_a_header_line_says_when_the_workers_have_no_identity_for_the_storage() -> None:
    """Ray's launcher gives only the head a role: the workers, which write the checkpoints, need one given."""
    job = make_job(LADDERS[2])
    note = "Storage s3://ml-runs/spotfallback: the worker nodes get no identity for it (--instance-profile ARN gives them one"
    assert note in render_cluster_launcher(job, opts(VmCloud.AWS))
    arn = "arn:aws:iam::123456789012:instance-profile/ml-runs"
    assert "no identity" not in render_cluster_launcher(job, opts(VmCloud.AWS, instance_profile=arn))
    assert "--service-account EMAIL gives them one" in render_cluster_launcher(job, opts(VmCloud.GCP))


@pytest.mark.parametrize("path", ["./runs", "/mnt/runs", "runs"])
def test_a_local_storage_path_is_refused_as_the_nodes_do_not_share_it(path: str) -> None:
    with pytest.raises(ConfigError, match=rf"^storage_path: '{re.escape(path)}' is a local path, which the cluster's nodes do not share"):
        cluster_launcher_config(make_job(LADDERS[2], storage_path=path), opts(VmCloud.AWS))
    # A filesystem every node mounts, said so with file://, is the user's call.
    assert cluster_launcher_config(make_job(LADDERS[2], storage_path="file:///mnt/efs/runs"), opts(VmCloud.AWS))


def test_header_tells_how_to_start_and_resume_the_run() -> None:
    job = make_job(LADDERS[2])
    text = render_cluster_launcher(job, opts(VmCloud.AWS, pip=("churn==1.2",), run_name="churn-v2"))
    command_line = next(line for line in text.splitlines() if line.startswith("#   ray exec FILE --tmux "))
    quoted = command_line.removeprefix("#   ray exec FILE --tmux ")
    assert shlex.split(quoted) == [rayjob_entrypoint(job.model_copy(update={"name": "churn-v2"}))]
    config = yaml.safe_load(text)
    # The stock image has no spotfallback, which the driver and the agent run: installed first.
    assert config["setup_commands"] == [f"pip install spotfallback=={__version__} churn==1.2"]
    assert f"# The stock Ray image has no spotfallback: the setup commands install spotfallback=={__version__}." in text
    assert config["cluster_name"] == "churn-v2"


@pytest.mark.parametrize(("entrypoint", "extra"), [
    ("spotfallback.examples.ddp_digits:train_fn", "[torch]"),
    ("spotfallback.examples.keras_digits:train_fn", "[tensorflow]"),
    ("churn.train:main", ""),
])
def test_a_shipped_example_on_the_stock_image_gets_the_extra_it_imports(entrypoint: str, extra: str) -> None:
    """`spotfallback init`'s job runs the PyTorch example, which the stock Ray image cannot import
    without torch: the requirement carries the example's extra."""
    job = make_job(LADDERS[2]).model_copy(update={"entrypoint": entrypoint})
    requirement = f"spotfallback{extra}=={__version__}"
    assert cluster_launcher_config(job, opts(VmCloud.AWS))["setup_commands"] == [shlex.join(["pip", "install", requirement])]
    assert f"the setup commands install {requirement}." in render_cluster_launcher(job, opts(VmCloud.AWS))


def test_every_shipped_example_has_the_extra_of_the_framework_it_imports() -> None:
    import ast
    import tomllib

    from spotfallback.deploy.common import EXAMPLE_EXTRAS

    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    examples = sorted((root / "src/spotfallback/examples").glob("[!_]*.py"))
    assert {f"spotfallback.examples.{p.stem}" for p in examples} == set(EXAMPLE_EXTRAS)
    for path in examples:
        imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                    for alias in (node.names if isinstance(node, ast.Import) else [])}
        imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.ImportFrom) and node.module}
        extra = EXAMPLE_EXTRAS[f"spotfallback.examples.{path.stem}"]
        assert extra in imported, path.name  # torch / tensorflow, the extra's name
        assert any(r.startswith(extra) for r in extras[extra]), path.name
        # Nothing else the stock Ray image lacks: the standard library, spotfallback (and what it
        # requires), Ray and the extra's framework (Keras comes with TensorFlow).
        others = imported - set(sys.stdlib_module_names) - {"spotfallback", "ray", "numpy", extra, "keras"}
        assert not others, (path.name, others)


@pytest.mark.parametrize(
    ("image", "pip", "installed"),
    [
        (None, (), [f"pip install spotfallback=={__version__}"]),
        (None, ("spotfallback[torch]==0.1.0",), ["pip install 'spotfallback[torch]==0.1.0'"]),
        (None, ("./dist/spotfallback-0.1.0-py3-none-any.whl",), ["pip install ./dist/spotfallback-0.1.0-py3-none-any.whl"]),
        ("registry.example.com/ml/train:1", (), None),
        ("rayproject/ray:2.60.0-py311-gpu", (), [f"pip install spotfallback=={__version__}"]),  # the stock image, named
    ],
)
def test_the_stock_image_gets_spotfallback_installed_unless_pip_or_the_image_has_it(
    image: str | None, pip: tuple[str, ...], installed: list[str] | None
) -> None:
    """Without it `ray exec ... spotfallback run` and the agent's `nohup spotfallback ...` fail on every node."""
    config = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, image=image, pip=pip))
    assert config.get("setup_commands") == installed


def test_gcp_containers_get_the_whole_soft_off_window_to_stop() -> None:
    """GCE gives a preempted guest 30 s; Docker's default stop timeout (10 s) would end the container first."""
    gcp = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP))
    assert "--stop-timeout 30" in gcp["docker"]["run_options"]
    aws = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS))
    assert not any(o.startswith("--stop-timeout") for o in aws["docker"]["run_options"])


def test_gpu_node_types_wait_for_their_driver_and_gcp_ones_ask_for_it() -> None:
    from spotfallback.deploy.launcher import GCP_DRIVER_METADATA, gpu_driver_wait

    ladder = [{**SPOT_A, "use_gpu": True}, {**ON_DEMAND, "use_gpu": True}]
    for cloud, extra in ((VmCloud.AWS, {}), (VmCloud.GCP, {"source_image": "projects/x/global/images/gpu"})):
        nodes = cluster_launcher_config(make_job(ladder), opts(cloud, **extra))["available_node_types"]
        waits = {name: t.get("initialization_commands") for name, t in nodes.items()}
        assert waits == {"head": None, "spot-a": [gpu_driver_wait()], "on-demand": [gpu_driver_wait()]}  # the head has no GPU
        metadata = {name: t["node_config"].get("metadata") for name, t in nodes.items()}
        driver = GCP_DRIVER_METADATA if cloud is VmCloud.GCP else None  # AWS's Deep Learning AMIs come with it
        assert metadata == {"head": None, "spot-a": driver, "on-demand": driver}
    cpu = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS))["available_node_types"]
    assert not any("initialization_commands" in t for t in cpu.values())


def test_the_driver_wait_passes_once_nvidia_smi_answers_and_fails_the_set_up_saying_why(tmp_path: Path) -> None:
    import subprocess

    from ray.autoscaler._private.command_runner import _with_interactive

    from spotfallback.deploy.launcher import gpu_driver_wait

    def run_as_ray_does(command: str) -> subprocess.CompletedProcess[str]:
        # Ray 2.60's launcher hands each initialization command to ssh wrapped in a login shell
        # that sources ~/.bashrc; ssh runs the joined words in the node's shell.
        return subprocess.run(["bash", "-c", " ".join(_with_interactive(command))], env={**os.environ, "HOME": str(home)},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)

    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    (home / ".bashrc").write_text(f"export PATH={bin_dir}:$PATH\n")  # after the login profile, which resets PATH
    calls = tmp_path / "calls"
    smi = bin_dir / "nvidia-smi"  # answers on its third call, as a driver that finishes installing
    smi.write_text(f'#!/bin/sh\necho x >> {calls}\n[ "$(wc -l < {calls})" -ge 3 ]\n')
    smi.chmod(0o755)
    done = run_as_ray_does(gpu_driver_wait(10, 0.05))
    assert done.returncode == 0 and len(calls.read_text().split()) == 3
    smi.unlink()  # an image without a driver
    failed = run_as_ray_does(gpu_driver_wait(0.3, 0.05))
    assert failed.returncode == 1
    assert "no NVIDIA driver answered nvidia-smi within 0.005 minutes" in failed.stderr and "Deep Learning" in failed.stderr


def test_a_gang_across_nodes_built_for_a_gpu_fabric_is_told_the_file_sets_none_up() -> None:
    from spotfallback.deploy.launcher import cluster_launcher_file, fabric_notes, tier_nodes

    def notes(workers: int, cloud: VmCloud, instance_type: str) -> list[str]:
        job = make_job([{"name": "gpu", "market": "spot", "num_workers": workers, "use_gpu": True,
                         "resources_per_worker": {"CPU": 8, "GPU": 1}}])
        options = opts(cloud, instance_types={"gpu": instance_type},
                       **({"source_image": "projects/x/global/images/gpu"} if cloud is VmCloud.GCP else {}))
        # The file and its notes read the same nodes, resolved once.
        text, nodes = cluster_launcher_file(job, options)
        assert text == render_cluster_launcher(job, options) and nodes == tier_nodes(job, options)
        return fabric_notes(job, nodes)

    (efa,) = notes(64, VmCloud.AWS, "p5.48xlarge")
    assert efa.startswith("tiers[0] (gpu): its gang spans 8 p5.48xlarge nodes") and "no EFA" in efa and "aws-ofi-nccl" in efa
    (tcpx,) = notes(16, VmCloud.GCP, "a3-highgpu-8g")
    assert "2 a3-highgpu-8g nodes" in tcpx and "no GPUDirect-TCPX" in tcpx
    assert notes(8, VmCloud.AWS, "p4d.24xlarge") == []  # one node: NVLink inside it, no fabric needed
    assert notes(16, VmCloud.AWS, "g5.2xlarge") == []  # not a type built for training across nodes
    assert notes(4, VmCloud.GCP, "a3-highgpu-1g") == []


def test_on_gcp_gpu_on_demand_nodes_run_the_agent_for_host_maintenance() -> None:
    ladder = [{**SPOT_A, "use_gpu": True}, {"name": "on-demand", "market": "on-demand", "num_workers": 1, "use_gpu": True}]
    marked = {
        cloud: {name: "spotfallback/notice-agent" in t["labels"] for name, t in cfg["available_node_types"].items()}
        for cloud, cfg in (
            (VmCloud.GCP, cluster_launcher_config(make_job(ladder), opts(VmCloud.GCP, source_image="projects/x/global/images/gpu"))),
            (VmCloud.AWS, cluster_launcher_config(make_job(ladder), opts(VmCloud.AWS))),
        )
    }
    assert marked[VmCloud.GCP] == {"head": False, "spot-a": True, "on-demand": True}
    assert marked[VmCloud.AWS] == {"head": False, "spot-a": True, "on-demand": False}


def test_tier_named_like_the_head_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"^tiers\[0\]\.name: 'head'"):
        cluster_launcher_config(make_job([{**SPOT_A, "name": "head"}]), opts(VmCloud.AWS))


@pytest.mark.parametrize("cloud", list(VmCloud))
def test_golden(cloud: VmCloud) -> None:
    text = render_cluster_launcher(make_job(LADDERS[3]), opts(cloud))
    path = GOLDEN / f"launcher-{cloud.value}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; review, then regenerate with UPDATE_GOLDEN=1"


def gpu_job(*tiers: tuple[str, str, int, int]) -> JobConfig:
    """A GPU ladder of (name, Ray's GPU type, CPUs, GPUs) spot tiers."""
    return make_job([
        {"name": name, "market": "spot", "num_workers": 1, "use_gpu": True, "resources_per_worker": {"CPU": cpu, "GPU": gpus},
         "label_selector": {"ray.io/market-type": "spot", "ray.io/accelerator-type": kind}}
        for name, kind, cpu, gpus in tiers
    ])


GPU_IMAGE = "projects/p/global/images/gpu-image"


def test_gcp_gpu_series_get_a_boot_disk_and_nic_they_take() -> None:
    """Without a diskType the API gives pd-standard, which A3 and G2 refuse; A3 has only gVNIC interfaces."""
    job = gpu_job(("h100", "H100", 100, 8), ("a100", "A100", 8, 1), ("l4", "L4", 8, 1))
    nodes = cluster_launcher_config(job, opts(VmCloud.GCP, source_image=GPU_IMAGE))["available_node_types"]
    machine_types = {name: node["node_config"]["machineType"] for name, node in nodes.items()}
    assert machine_types == {"head": "n2-standard-8", "h100": "a3-highgpu-8g", "a100": "a2-highgpu-1g", "l4": "g2-standard-8"}
    disk_types = {name: node["node_config"]["disks"][0]["initializeParams"].get("diskType") for name, node in nodes.items()}
    assert disk_types == {"head": None, "h100": "pd-balanced", "a100": "pd-balanced", "l4": "pd-balanced"}
    external = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    assert nodes["h100"]["node_config"]["networkInterfaces"] == [{"accessConfigs": external, "nicType": "GVNIC"}]
    # Ray fills no interface once one node type has its own: all share the default network.
    for name in ("head", "a100", "l4"):
        assert nodes[name]["node_config"]["networkInterfaces"] == [{"accessConfigs": external}]
    text = render_cluster_launcher(job, opts(VmCloud.GCP, source_image=GPU_IMAGE))
    assert "# gVNIC is the only network interface of a3-highgpu-8g: the boot image must have its driver" in text


def test_gcp_without_gvnic_series_leaves_the_network_to_ray() -> None:
    job = gpu_job(("a100", "A100", 8, 1), ("l4", "L4", 8, 1))
    nodes = cluster_launcher_config(job, opts(VmCloud.GCP, source_image=GPU_IMAGE))["available_node_types"]
    assert not any("networkInterfaces" in node["node_config"] for node in nodes.values())
    assert "gVNIC" not in render_cluster_launcher(job, opts(VmCloud.GCP, source_image=GPU_IMAGE))


@pytest.mark.parametrize(("given", "named"), [
    ("ray-subnet", "regions/us-central1/subnetworks/ray-subnet"),
    ("projects/host-project/regions/us-central1/subnetworks/shared", "projects/host-project/regions/us-central1/subnetworks/shared"),
    ("https://www.googleapis.com/compute/v1/projects/host-project/regions/us-central1/subnetworks/shared",
     "https://www.googleapis.com/compute/v1/projects/host-project/regions/us-central1/subnetworks/shared"),
])
def test_a_gcp_subnetwork_puts_every_node_on_it(given: str, named: str) -> None:
    """A project without a default network (an organisation policy often skips it), or a Shared VPC."""
    job = gpu_job(("h100", "H100", 100, 8), ("l4", "L4", 8, 1))
    options = opts(VmCloud.GCP, source_image=GPU_IMAGE, subnetwork=given)
    nodes = cluster_launcher_config(job, options)["available_node_types"]
    assert {name: node["node_config"]["networkInterfaces"][0]["subnetwork"] for name, node in nodes.items()} == dict.fromkeys(
        ("head", "h100", "l4"), named)
    assert nodes["h100"]["node_config"]["networkInterfaces"][0]["nicType"] == "GVNIC"
    text = render_cluster_launcher(job, options)
    assert f"# Every node is on subnetwork {given}: its VPC's firewall must let the nodes reach each other" in text
    assert "default network" not in text
    assert validate_text(text).ok
    # Without gVNIC the subnetwork is still set on every node, where Ray would have picked the region's first.
    cpu = cluster_launcher_config(make_job(LADDERS[3]), opts(VmCloud.GCP, subnetwork=given))["available_node_types"]
    assert all(node["node_config"]["networkInterfaces"][0]["subnetwork"] == named for node in cpu.values())


@pytest.mark.parametrize(("given", "message"), [
    ("regions/us-east1/subnetworks/s", "subnetwork: 'regions/us-east1/subnetworks/s' is in region 'us-east1', but the "
                                      "nodes are in 'us-central1'; a VM's subnetwork must be in its zone's region"),
    ("Ray_Subnet", "subnetwork: 'Ray_Subnet' is not a subnetwork; give its name (such as 'ray-subnet', in region "
                   "us-central1) or its path, projects/HOST_PROJECT/regions/us-central1/subnetworks/NAME"),
    ("global/networks/default", "subnetwork: 'global/networks/default' is not a subnetwork"),
])
def test_a_gcp_subnetwork_elsewhere_or_misspelt_is_refused(given: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cluster_launcher_config(make_job(LADDERS[3]), opts(VmCloud.GCP, subnetwork=given))


def test_a_subnetwork_on_aws_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^subnetwork: a GCP setting"):
        cluster_launcher_config(make_job(LADDERS[3]), opts(VmCloud.AWS, subnetwork="ray-subnet"))


def test_aws_subnets_are_every_nodes_in_the_order_given() -> None:
    """An account without a default VPC, or a team's own subnets: Ray tries them in order."""
    subnets = ("subnet-0123456789abcdef0", "subnet-89abcdef")
    options = opts(VmCloud.AWS, zone="us-east-1a", subnet_ids=subnets)
    config = cluster_launcher_config(make_job(LADDERS[3]), options)
    assert {name: node["node_config"]["SubnetIds"] for name, node in config["available_node_types"].items()} == dict.fromkeys(
        ("head", "spot-a", "spot-b", "on-demand"), list(subnets))
    assert "use_internal_ips" not in config["provider"]
    text = render_cluster_launcher(make_job(LADDERS[3]), options)
    assert ("# Every node launches in subnet subnet-0123456789abcdef0 (then subnet-89abcdef, in that order, where a launch "
            "finds no capacity): the subnets must be in one VPC, in zone us-east-1a, and give instances a public IP on "
            "launch (for a private subnet, pass --internal-ips)") in text
    assert validate_text(text).ok
    # Without subnets Ray's launcher picks the default VPC's, so no node config names one.
    one = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, subnet_ids="subnet-89abcdef"))
    assert one["available_node_types"]["head"]["node_config"]["SubnetIds"] == ["subnet-89abcdef"]
    assert "# Every node launches in subnet subnet-89abcdef: " in render_cluster_launcher(
        make_job(LADDERS[2]), opts(VmCloud.AWS, subnet_ids="subnet-89abcdef"))
    plain = cluster_launcher_config(make_job(LADDERS[3]), opts(VmCloud.AWS))
    assert not any("SubnetIds" in node["node_config"] for node in plain["available_node_types"].values())


@pytest.mark.parametrize(("subnets", "message"), [
    (("subnet-123",), "subnet_ids: 'subnet-123' is not a subnet ID; give one such as 'subnet-0123456789abcdef0'"),
    (("sg-0123456789abcdef0",), "subnet_ids: 'sg-0123456789abcdef0' is not a subnet ID"),
    (("subnet-89abcdef", "subnet-89abcdef"), "subnet_ids: 'subnet-89abcdef' is given twice; give each once"),
])
def test_an_aws_subnet_that_is_no_subnet_id_or_given_twice_is_refused(subnets: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, subnet_ids=subnets))


def zoned(tier: dict[str, Any], zone: str) -> dict[str, Any]:
    return {**tier, "label_selector": {"ray.io/market-type": tier["market"], "ray.io/availability-zone": zone}}


ACROSS_ZONES = [zoned(SPOT_A, "us-east-1a"), zoned({**SPOT_B, "name": "spot-b"}, "us-east-1b"), ON_DEMAND]
ZONE_SUBNETS = {"us-east-1a": ["subnet-0000000a"], "us-east-1b": ["subnet-0000000b", "subnet-0000000c"]}


def test_an_aws_ladder_across_zones_pins_each_tier_to_its_zones_subnets() -> None:
    """Spot in one zone, then another, then on-demand: one cluster in the region, each zone's
    tier launching only in that zone's subnets, the head and the unpinned tier in any of them."""
    job = make_job(ACROSS_ZONES)
    options = LauncherOptions(cloud=VmCloud.AWS, zone_subnet_ids=ZONE_SUBNETS)
    config = cluster_launcher_config(job, options)
    assert config["provider"]["region"] == "us-east-1"
    assert config["provider"]["availability_zone"] == "us-east-1a,us-east-1b"
    everywhere = ["subnet-0000000a", "subnet-0000000b", "subnet-0000000c"]
    assert {name: node["node_config"]["SubnetIds"] for name, node in config["available_node_types"].items()} == {
        "head": everywhere, "spot-a": ["subnet-0000000a"], "spot-b": ["subnet-0000000b", "subnet-0000000c"],
        "on-demand": everywhere}
    text = render_cluster_launcher(job, options)
    assert validate_text(text).ok and not validate_text(text).warnings
    assert ("# Each zone's nodes launch in its subnets: us-east-1a, subnet subnet-0000000a; us-east-1b, subnet "
            "subnet-0000000b (then subnet-0000000c, in that order, where a launch finds no capacity); the head and any "
            "tier pinned to no zone, any of those subnets, in that order: the subnets must be in one VPC, each zone's in "
            "that zone, and give instances a public IP on launch") in text
    # Subnets without a zone are the head's and the unpinned tiers'; they must be in one of the zones.
    both = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, zone_subnet_ids=ZONE_SUBNETS,
                                                        subnet_ids=("subnet-0000000d",)))["available_node_types"]
    assert [both[name]["node_config"]["SubnetIds"] for name in ("head", "spot-a", "on-demand")] == [
        ["subnet-0000000d"], ["subnet-0000000a"], ["subnet-0000000d"]]
    assert "; the head and any tier pinned to no zone, subnet subnet-0000000d: the subnets must be in one VPC, each " \
           "zone's in that zone, the others in one of us-east-1a, us-east-1b," in render_cluster_launcher(
               job, LauncherOptions(cloud=VmCloud.AWS, zone_subnet_ids=ZONE_SUBNETS, subnet_ids=("subnet-0000000d",)))
    # One zone: its subnets, given by zone, are every node's as before.
    one = cluster_launcher_config(make_job([zoned(SPOT_A, "us-east-1a"), ON_DEMAND]),
                                  LauncherOptions(cloud=VmCloud.AWS, zone_subnet_ids={"us-east-1a": "subnet-0000000a"}))
    assert one["provider"]["availability_zone"] == "us-east-1a"
    assert {tuple(n["node_config"]["SubnetIds"]) for n in one["available_node_types"].values()} == {("subnet-0000000a",)}


@pytest.mark.parametrize(("tiers", "options", "message"), [
    (ACROSS_ZONES, {}, "tiers[0].label_selector.ray.io/availability-zone: 'us-east-1a': the tiers name several zones "
                       "(us-east-1a, us-east-1b), so each tier's nodes launch in its zone's subnets; give us-east-1a's "
                       "(--subnet-id us-east-1a=SUBNET; `aws ec2 describe-subnets --filters "
                       "Name=availability-zone,Values=us-east-1a` lists them)"),
    (ACROSS_ZONES, {"zone_subnet_ids": {"us-east-1a": ["subnet-0000000a"]}},
     "tiers[1].label_selector.ray.io/availability-zone: 'us-east-1b': the tiers name several zones"),
    (ACROSS_ZONES, {"zone_subnet_ids": ZONE_SUBNETS, "zone": "us-east-1a"},
     "zone: the tiers name several zones (us-east-1a, us-east-1b), which the cluster spans; leave the zone out"),
    (ACROSS_ZONES, {"zone_subnet_ids": {**ZONE_SUBNETS, "us-east-1c": ["subnet-0000000e"]}},
     "zone_subnet_ids: no node of the cluster is in zone 'us-east-1c' (the tiers' zones: us-east-1a, us-east-1b); leave "
     "its subnets out, or pin a tier there with ray.io/availability-zone"),
    (LADDERS[2], {"zone_subnet_ids": {"us-east-1a": ["subnet-0000000a"]}},
     "zone_subnet_ids: no node of the cluster is in zone 'us-east-1a' (the tiers' zones: none)"),
    (ACROSS_ZONES, {"zone_subnet_ids": {"us-east-1a": ["subnet-0000000a"], "us-east-1b": ["subnet-0000000a"]}},
     "zone_subnet_ids: 'subnet-0000000a' is given for us-east-1a and for us-east-1b; a subnet is in one zone"),
    (ACROSS_ZONES, {"zone_subnet_ids": {"us-east-1a": ["subnet-a"], "us-east-1b": ["subnet-0000000b"]}},
     "zone_subnet_ids: 'subnet-a' is not a subnet ID"),
    (ACROSS_ZONES, {"zone_subnet_ids": {"us-east-1a": [], "us-east-1b": ["subnet-0000000b"]}},
     "zone_subnet_ids: zone 'us-east-1a' has no subnet; give its subnets, or leave the zone out"),
    ([zoned(SPOT_A, "us-east-1a"), zoned(ON_DEMAND, "us-west-2a")],
     {"zone_subnet_ids": {"us-east-1a": ["subnet-0000000a"], "us-west-2a": ["subnet-0000000b"]}},
     "zone: 'us-west-2a' is not in region 'us-east-1'"),
])
def test_a_ladder_across_zones_without_each_zones_subnets_or_with_stray_ones_is_refused(tiers, options, message) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cluster_launcher_config(make_job(tiers), LauncherOptions(cloud=VmCloud.AWS, **options))


def test_a_gcp_ladder_across_zones_and_zone_subnets_on_gcp_are_refused() -> None:
    """A GCP launcher cluster lives in one zone (Ray's GCP provider takes one)."""
    with pytest.raises(ConfigError, match=r"^tiers\[1\]\.label_selector\.ray\.io/availability-zone: 'us-central1-b' "
                                          r"differs from tiers\[0\]'s 'us-central1-a'"):
        cluster_launcher_config(make_job([zoned(SPOT_A, "us-central1-a"), zoned(ON_DEMAND, "us-central1-b")]),
                                LauncherOptions(cloud=VmCloud.GCP, project_id="my-project"))
    with pytest.raises(ConfigError, match=r"^zone_subnet_ids: AWS subnets, which a gcp cluster does not use"):
        cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, zone_subnet_ids={"us-central1-a": ["subnet-0000000a"]}))


def test_aws_subnets_on_gcp_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^subnet_ids: AWS subnets, which a gcp cluster does not use"):
        cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, subnet_ids=("subnet-89abcdef",)))


def test_aws_security_groups_are_every_nodes_and_the_header_says_what_they_must_allow() -> None:
    groups = ("sg-0123456789abcdef0", "sg-89abcdef")
    options = opts(VmCloud.AWS, subnet_ids=("subnet-89abcdef",), security_group_ids=groups)
    config = cluster_launcher_config(make_job(LADDERS[2]), options)
    assert {name: node["node_config"]["SecurityGroupIds"] for name, node in config["available_node_types"].items()} == dict.fromkeys(
        ("head", "spot-a", "on-demand"), list(groups))
    text = render_cluster_launcher(make_job(LADDERS[2]), options)
    assert ("# Every node is in security groups sg-0123456789abcdef0, sg-89abcdef, and Ray's launcher makes none of its "
            "own: the groups must be in one VPC (the subnets') and let the nodes reach each other on every port") in text
    assert "makes the VPC a security group" not in text and validate_text(text).ok
    with pytest.raises(ConfigError, match=r"^security_group_ids: 'subnet-89abcdef' is not a security group ID; give one "
                                          r"such as 'sg-0123456789abcdef0'"):
        cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, security_group_ids=("subnet-89abcdef",)))
    with pytest.raises(ConfigError, match=r"^security_group_ids: AWS security groups, which a gcp cluster does not use"):
        cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, security_group_ids=groups))


def test_tags_go_on_every_aws_instance_and_volume_and_every_gcp_node() -> None:
    """Cost allocation, or an organisation policy that refuses untagged instances."""
    tags = {"team": "ml", "cost-center": "4201"}
    aws = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, tags=tags))["available_node_types"]
    expected = [{"Key": "team", "Value": "ml"}, {"Key": "cost-center", "Value": "4201"}]
    assert {name: node["node_config"]["TagSpecifications"] for name, node in aws.items()} == dict.fromkeys(
        ("head", "spot-a", "on-demand"), [{"ResourceType": "instance", "Tags": expected}, {"ResourceType": "volume", "Tags": expected}])
    gcp = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, tags=tags))["available_node_types"]
    assert all(node["node_config"]["labels"] == tags for node in gcp.values())
    for cloud in VmCloud:
        assert validate_text(render_cluster_launcher(make_job(LADDERS[2]), opts(cloud, tags=tags))).ok
    untagged = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS))["available_node_types"]
    assert not any("TagSpecifications" in node["node_config"] for node in untagged.values())


@pytest.mark.parametrize(("cloud", "tags", "message"), [
    (VmCloud.AWS, {"ray-node-type": "x"}, "tags: 'ray-node-type' is one of Ray's own tags"),
    (VmCloud.AWS, {"Name": "x"}, "tags: 'Name' is one of Ray's own tags"),
    (VmCloud.GCP, {"ray-cluster-name": "x"}, "tags: 'ray-cluster-name' is one of Ray's own tags"),
    (VmCloud.AWS, {"aws:team": "ml"}, "tags: aws:team=ml is refused by the cloud: an AWS tag's key has 1-128"),
    (VmCloud.AWS, {"team": "a|b"}, "tags: team=a|b is refused by the cloud"),
    (VmCloud.AWS, {"k" * 129: "x"}, "tags: " + "k" * 129 + "=x is refused by the cloud"),
    (VmCloud.GCP, {"Team": "ml"}, "tags: Team=ml is refused by the cloud: a GCP label's key has 1-63 lowercase letters"),
    (VmCloud.GCP, {"team": "ML"}, "tags: team=ML is refused by the cloud"),
    (VmCloud.GCP, {"1team": "ml"}, "tags: 1team=ml is refused by the cloud"),
    (VmCloud.GCP, {"team": "m.l"}, "tags: team=m.l is refused by the cloud"),
])
def test_a_tag_the_cloud_or_ray_would_refuse_is_refused(cloud: VmCloud, tags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cluster_launcher_config(make_job(LADDERS[2]), opts(cloud, tags=tags))


def test_tags_the_clouds_allow_beyond_ascii_are_kept() -> None:
    assert cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, tags={"équipe": "données", "empty": ""}))
    assert cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, tags={"Équipe": "Données / ML", "empty": ""}))


def test_internal_ips_on_aws_let_private_subnets_in_and_say_where_ray_up_runs() -> None:
    options = opts(VmCloud.AWS, subnet_ids=("subnet-89abcdef",), internal_ips=True)
    config = cluster_launcher_config(make_job(LADDERS[2]), options)
    assert config["provider"]["use_internal_ips"] is True
    text = render_cluster_launcher(make_job(LADDERS[2]), options)
    assert "# Every node launches in subnet subnet-89abcdef: the subnets must be in one VPC; Ray's launcher" in text
    assert "# ray up reaches the nodes by their private IPs (--internal-ips): run it from inside the network" in text
    assert "through a NAT gateway" in text and validate_text(text).ok


def test_internal_ips_on_gcp_leave_every_node_without_an_external_ip() -> None:
    """Ray fills an interface with an external IP only where a node type has none, so every one gets its own."""
    job = gpu_job(("h100", "H100", 100, 8), ("l4", "L4", 8, 1))
    for subnetwork in (None, "ray-subnet"):
        options = opts(VmCloud.GCP, source_image=GPU_IMAGE, internal_ips=True, subnetwork=subnetwork)
        config = cluster_launcher_config(job, options)
        assert config["provider"]["use_internal_ips"] is True
        interfaces = {name: node["node_config"]["networkInterfaces"] for name, node in config["available_node_types"].items()}
        assert set(interfaces) == {"head", "h100", "l4"}
        assert not any("accessConfigs" in interface for found in interfaces.values() for interface in found), interfaces
        assert interfaces["h100"][0]["nicType"] == "GVNIC"
        assert all(found[0].get("subnetwork") == (subnetwork and "regions/us-central1/subnetworks/ray-subnet")
                   for found in interfaces.values())
        text = render_cluster_launcher(job, options)
        assert "The nodes get no external IP: pulling the image and pip packages needs Cloud NAT" in text
        assert validate_text(text).ok
    cpu = cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.GCP, internal_ips=True))["available_node_types"]
    assert all(node["node_config"]["networkInterfaces"] == [{}] for node in cpu.values())


@pytest.mark.parametrize(("machine_type", "disk_type"), [("a3-ultragpu-8g", "hyperdisk-balanced"), ("a3-megagpu-8g", "pd-balanced")])
def test_a_pinned_gcp_gpu_type_gets_its_series_boot_disk(machine_type: str, disk_type: str) -> None:
    job = gpu_job(("h100", "H100", 100, 8))
    config = cluster_launcher_config(job, opts(VmCloud.GCP, source_image=GPU_IMAGE, instance_types={"h100": machine_type}))
    node = config["available_node_types"]["h100"]["node_config"]
    assert node["disks"][0]["initializeParams"]["diskType"] == disk_type
    assert node["networkInterfaces"][0]["nicType"] == "GVNIC"
    assert validate_text(render_cluster_launcher(job, opts(VmCloud.GCP, source_image=GPU_IMAGE,
                                                            instance_types={"h100": machine_type}))).ok


def test_launcher_options_refuse_values_ray_up_cannot_take_and_read_one_pip_string_as_one_package():
    """A NaN idle timeout and a negative disk were written as they came; 'torch' installed letter by letter."""
    for field, value in (("idle_timeout_minutes", float("nan")), ("idle_timeout_minutes", -1), ("disk_size_gb", 0),
                         ("disk_size_gb", True)):
        with pytest.raises(ConfigError, match=rf"^{field}: must be a whole number"):
            opts(VmCloud.GCP, **{field: value})
    with pytest.raises(ConfigError, match=r"^cloud: 'amazon' is not one of: "):
        LauncherOptions(cloud="amazon")  # type: ignore[arg-type]
    # The display name or the project number would reach the file and fail only at `ray up`.
    for project in ("My Project", "123456789012", "proj", "my-project-", "a" * 31):
        with pytest.raises(ConfigError, match=r"^project_id: .* is not a GCP project id"):
            LauncherOptions(cloud=VmCloud.GCP, project_id=project)
    for project in ("my-project-123", "example.com:my-project"):
        assert LauncherOptions(cloud=VmCloud.GCP, project_id=project).project_id == project
    config = yaml.safe_load(render_cluster_launcher(make_job(LADDERS[2]), opts("aws", pip="churn==1.2")))  # type: ignore[arg-type]
    assert config["setup_commands"] == [f"pip install spotfallback=={__version__} churn==1.2"]


def test_an_ami_goes_on_every_aws_node_and_gpu_nodes_without_one_get_a_note() -> None:
    """Without ImageId Ray boots its default AMI (a Deep Learning AMI for Ubuntu 18.04), whose driver predates newer GPUs."""
    from spotfallback.deploy.launcher import image_note

    gpu_tier = {**ON_DEMAND, "use_gpu": True, "resources_per_worker": {"CPU": 8, "GPU": 1}}
    gpu_job, cpu_job = make_job([{**SPOT_A, **gpu_tier, "name": "spot-a", "market": "spot"}, gpu_tier]), make_job(LADDERS[2])
    note = image_note(gpu_job, opts(VmCloud.AWS))
    assert note is not None and "pass --image-id with a current Deep Learning AMI" in note
    assert image_note(cpu_job, opts(VmCloud.AWS)) is None  # CPU nodes need no driver
    assert image_note(gpu_job, opts(VmCloud.GCP, source_image="img")) is None  # GCP asks for --source-image itself
    given = opts(VmCloud.AWS, image_id="ami-0123456789abcdef0")
    assert image_note(gpu_job, given) is None
    text = render_cluster_launcher(gpu_job, given)
    assert validate_text(text).ok
    types = yaml.safe_load(text)["available_node_types"]
    assert {t["node_config"]["ImageId"] for t in types.values()} == {"ami-0123456789abcdef0"}  # the head too
    for bad in ("Deep Learning AMI GPU PyTorch", "ami-123", "AMI-0123456789ABCDEF0"):
        with pytest.raises(ConfigError, match=r"^image_id: .* is not an AMI id"):
            opts(VmCloud.AWS, image_id=bad)


def test_a_worker_instance_profile_is_said_to_need_pass_role_for_the_head() -> None:
    """EC2 asks iam:PassRole of whoever launches an instance with a role, and Ray's head role
    (AmazonEC2FullAccess, AmazonS3FullAccess) has none: every worker launch would fail."""
    from spotfallback.deploy.launcher import identity_note

    arn = "arn:aws:iam::123456789012:instance-profile/ray-worker"
    job = make_job(LADDERS[2], storage_path="s3://b/runs")
    note = identity_note(job, opts(VmCloud.AWS, instance_profile=arn))
    assert note is not None and "(iam:PassRole)" in note and "ray-autoscaler-v1" in note
    assert f"# {note[:60]}" in render_cluster_launcher(job, opts(VmCloud.AWS, instance_profile=arn))
    email = "ray-worker@ml-project.iam.gserviceaccount.com"
    assert identity_note(job, opts(VmCloud.GCP, service_account=email)) is None  # Ray's GCP head may act as it


def test_an_aws_gang_of_several_nodes_with_no_zone_is_said_to_span_zones() -> None:
    from spotfallback.deploy.launcher import tier_nodes, zone_note

    def note(job: JobConfig, options: LauncherOptions) -> str | None:
        return zone_note(job, options, tier_nodes(job, options))

    job = make_job(LADDERS[2])
    assert "--zone" in str(note(job, opts(VmCloud.AWS)))
    assert note(job, opts(VmCloud.AWS, zone="us-east-1a")) is None
    assert note(job, opts(VmCloud.AWS, subnet_ids=("subnet-0123456789abcdef0",))) is None
    single = make_job([{**SPOT_A, "num_workers": 1}, {**ON_DEMAND, "num_workers": 1}])
    assert note(single, opts(VmCloud.AWS)) is None  # each gang is one node
    assert note(job, opts(VmCloud.GCP)) is None  # a GCP launcher cluster has one zone


def test_the_login_user_is_an_option_and_checked() -> None:
    assert cluster_launcher_config(make_job(LADDERS[2]), opts(VmCloud.AWS, ssh_user="ec2-user"))["auth"] == {"ssh_user": "ec2-user"}
    with pytest.raises(ConfigError, match=r"^ssh_user: 'ec2 user' is not a login name"):
        opts(VmCloud.AWS, ssh_user="ec2 user")


def test_the_header_says_how_to_stop_paying_for_the_head() -> None:
    text = render_cluster_launcher(make_job(LADDERS[2]), opts(VmCloud.AWS))
    assert "# Once it is done: ray down FILE -y (the head is never scaled down: it bills until then)." in text
    assert "on a running cluster add --no-restart, or Ray restarts and the run's driver stops" in text
