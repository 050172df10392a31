"""The Ray internals spotfallback relies on, pinned, so a Ray upgrade fails here and not mid-run.

The hooks subclass Ray Train V2's ``FailurePolicy`` and ``FixedScalingPolicy`` and its
callbacks, call the trainer's ``_initialize_and_run_controller``, read the private fields of
its exceptions, set the worker-group start timeout through its environment variable, and the
drains and the local cluster use ``ray._raylet.GcsClient``, the autoscaler and GCS protobufs
and ``ray.cluster_utils``. None of it is public API. Each test below names what a module uses
and what it expects of it: names, signatures, decision values, fields. Run this file first on
a new Ray (with ``SPOTFALLBACK_ALLOW_UNTESTED_RAY=1``); widen ``ray_support``'s range and the
``ray[train]`` requirement only once it and the end-to-end suite pass. No cluster is started.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import spotfallback.runtime.ray_support as ray_support

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "spotfallback"


def params(func) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values() if p.name != "_ray_trace_ctx"]


# Once a class has been made a Ray actor in this process (any earlier cluster test), Ray's
# tracing hook adds a keyword-only ``_ray_trace_ctx`` to its methods: not part of the contract.


def names(func) -> list[str]:
    return [name for name in inspect.signature(func).parameters if name != "_ray_trace_ctx"]


def call_keywords(source: str, callee: str) -> set[str]:
    """The keyword names of every call to ``*.callee(...)`` in ``source``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == callee:
            found.update(k.arg for k in node.keywords if k.arg)
    return found


# -- the supported range ---------------------------------------------------------------------


def test_the_requirement_and_the_runtime_check_name_the_same_range():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ray_req = [d for d in deps if d.startswith("ray[")]
    assert ray_req == [f"ray[train]{ray_support.SUPPORTED_RAY}"]


def test_the_installed_ray_is_supported():
    import ray

    assert ray_support.is_supported(ray.__version__), ray.__version__
    ray_support.check_ray_version()


@pytest.mark.parametrize("version", ["2.58.0", "2.59.1", "2.61.0", "3.0.0", "3.0.0.dev0", "2.60.0.dev0", "nightly"])
def test_an_unsupported_ray_is_refused_with_the_supported_range(monkeypatch, version):
    import ray

    monkeypatch.delenv(ray_support.ALLOW_ENV, raising=False)
    monkeypatch.setattr(ray, "__version__", version)
    with pytest.raises(ray_support.UnsupportedRayError) as err:
        ray_support.check_ray_version()
    assert isinstance(err.value, ImportError)
    message = str(err.value)
    assert f"ray[train]{ray_support.SUPPORTED_RAY}" in message and f"ray {version}" in message
    assert ray_support.ALLOW_ENV in message


@pytest.mark.parametrize("version", ["2.60.0", "2.60.1", "2.60.0rc1"])
def test_a_supported_ray_passes(monkeypatch, version):
    import ray

    monkeypatch.setattr(ray, "__version__", version)
    ray_support.check_ray_version()


def test_the_override_turns_the_refusal_into_a_warning(monkeypatch):
    monkeypatch.setenv(ray_support.ALLOW_ENV, "1")
    with pytest.warns(RuntimeWarning, match=r"ray 2\.61\.0"):
        ray_support.check_ray_version("2.61.0")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in os.environ.items() if k != ray_support.ALLOW_ENV} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120)


def test_the_ray_shell_refuses_to_load_on_an_unsupported_ray_and_the_core_does_not_care():
    """The check runs before any Ray internal is imported; the core and the planner never run it."""
    refused = _python("import ray; ray.__version__ = '2.59.0'; import spotfallback.runtime.hooks")
    assert refused.returncode != 0
    assert "UnsupportedRayError" in refused.stderr and f"ray[train]{ray_support.SUPPORTED_RAY}" in refused.stderr
    assert "ray 2.59.0" in refused.stderr
    light = _python(
        "import sys\n"
        "import spotfallback, spotfallback.config, spotfallback.policy, spotfallback.sim.planner\n"
        "assert 'spotfallback.runtime' not in sys.modules, 'the core loaded the Ray shell'\n"
        "assert 'ray' not in sys.modules, 'import spotfallback or the planner imported Ray'\n"
    )
    assert light.returncode == 0, light.stderr


# -- runtime/hooks.py: the failure policy -----------------------------------------------------


def test_failure_policy_contract():
    from ray.train.v2._internal.execution.failure_handling import FailureDecision, FailurePolicy

    from spotfallback.runtime.hooks import TierFailurePolicy

    # TierFailurePolicy returns RETRY (the policy retries or moves tier: a Ray restart) or RAISE.
    assert {d.name: d.value for d in FailureDecision} == {"RETRY": "RETRY", "RAISE": "RAISE", "NOOP": "NOOP"}
    assert names(FailurePolicy.__init__) == ["self", "failure_config"]
    assert names(FailurePolicy.make_decision) == ["self", "training_failed_error"]
    assert params(TierFailurePolicy.make_decision) == params(FailurePolicy.make_decision)


# -- runtime/hooks.py: the scaling policy -----------------------------------------------------


def test_scaling_policy_contract():
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.callback import ControllerCallback
    from ray.train.v2._internal.execution.scaling_policy import (
        FixedScalingPolicy,
        NoopDecision,
        ResizeDecision,
        ScalingDecision,
        ScalingPolicy,
    )
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        TrainAutoscalingCoordinatorClient,
    )

    # The controller asks the scaling policy for the label selector: it is one of its callbacks.
    assert issubclass(ScalingPolicy, ControllerCallback) and issubclass(FixedScalingPolicy, ScalingPolicy)
    expected = {
        "__init__": ["self", "scaling_config"],
        "make_decision_for_non_running_worker_group": ["self"],
        "make_decision_for_running_worker_group": ["self", "worker_group_state", "worker_group_status"],
        "_get_num_workers_for_resource_request": ["self"],
        "_send_resource_request": ["self"],
        "_maybe_send_resource_request": ["self"],
        "on_controller_start_worker_group": ["self", "scaling_config", "num_workers"],
    }
    assert {m: names(getattr(FixedScalingPolicy, m)) for m in expected} == expected
    assert inspect.signature(FixedScalingPolicy.on_controller_start_worker_group).parameters["num_workers"].kind == inspect.Parameter.KEYWORD_ONLY
    # What the overrides touch on the instance Ray built.
    policy = FixedScalingPolicy(ScalingConfig(num_workers=2))
    assert policy.scaling_config.num_workers == 2 and policy._coordinator_client is None
    for method in ("send_resource_request", "maybe_send_resource_request"):
        assert names(getattr(TrainAutoscalingCoordinatorClient, method)) == ["self", "scaling_config", "num_workers"]
    # The decisions the overrides return.
    resize = ResizeDecision(num_workers=3, resources_per_worker={"CPU": 1.0})
    assert (resize.num_workers, resize.resources_per_worker) == (3, {"CPU": 1.0})
    assert isinstance(resize, ScalingDecision) and isinstance(NoopDecision(), ScalingDecision)
    assert ScalingConfig(num_workers=1, label_selector={"ray.io/market-type": "spot"}).label_selector == {"ray.io/market-type": "spot"}


@pytest.mark.parametrize(
    ("use_gpu", "resources"),
    [(False, None), (True, None), (True, {"CPU": 8}), (True, {"CPU": 8, "GPU": 2}), (False, {"CPU": 4, "GPU": 0, "memory": 2**30})],
)
def test_a_tiers_worker_resources_are_what_ray_train_requests(use_gpu, resources):
    """The runtime hands ``Tier.worker_resources`` to each worker group it starts (a ResizeDecision)
    and the deploy files size pods and nodes by it: with ``use_gpu`` and a CPU count only, Ray
    still asks for a GPU, so a tier that dropped it would start its workers without one."""
    from ray.train import ScalingConfig

    from spotfallback import Tier

    tier = Tier(name="t", market="spot", num_workers=2, use_gpu=use_gpu, resources_per_worker=resources)
    ray_rule = ScalingConfig(num_workers=2, use_gpu=use_gpu, resources_per_worker=resources)._resources_per_worker_not_none
    assert tier.worker_resources() == ray_rule


def test_the_worker_group_start_timeout_is_read_from_the_environment_at_each_start():
    """The scaling policy bounds each placement wait by setting this variable before a start."""
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.worker_group import worker_group

    assert constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR == "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
    assert isinstance(constants.DEFAULT_WORKER_GROUP_START_TIMEOUT_S, int | float)
    readers = [
        node.name
        for node in ast.walk(ast.parse(inspect.getsource(worker_group)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(isinstance(n, ast.Name) and n.id == "WORKER_GROUP_START_TIMEOUT_S_ENV_VAR" for n in ast.walk(node))
    ]
    assert readers, "the worker group no longer reads its start timeout inside a function (at each start)"


def test_every_hook_override_matches_a_ray_method():
    """An override whose Ray method was renamed or re-signed would silently never be called."""
    from spotfallback.runtime.hooks import LedgerCallback, TierFailurePolicy, TierScalingPolicy

    own = {"tier_scaling_config", "_runtime"}  # TierScalingPolicy's helpers, not overrides
    for cls in (TierFailurePolicy, TierScalingPolicy, LedgerCallback):
        for name, member in vars(cls).items():
            # Our constructors take the run spec too; the bases' are pinned above.
            if not inspect.isfunction(member) or name in own or name.startswith("__"):
                continue
            base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
            assert base is not None, f"{cls.__name__}.{name} overrides nothing in Ray"
            ours = [n for n in names(member) if n != "self"]
            theirs = [n for n in names(vars(base)[name]) if n != "self"]
            assert ours == theirs, f"{cls.__name__}.{name}{ours} vs {base.__name__}{theirs}"


# -- runtime/hooks.py: the callbacks ----------------------------------------------------------


def test_callback_contract():
    from ray.train.v2._internal.execution.callback import (
        ControllerCallback,
        ReportCallback,
        WorkerGroupCallback,
    )
    from ray.train.v2._internal.execution.training_report import _TrainingReport
    from ray.train.v2._internal.execution.worker_group import WorkerGroup
    from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata, Worker

    assert names(WorkerGroupCallback.after_worker_group_start) == ["self", "worker_group"]
    assert names(ReportCallback.after_report) == ["self", "training_report", "metrics"]
    assert callable(ControllerCallback.on_controller_start_worker_group)
    # LedgerCallback: worker_group.get_workers()[i].metadata.node_id, training_report.checkpoint.path.
    assert names(WorkerGroup.get_workers) == ["self"]
    assert "metadata" in {f.name for f in dataclasses.fields(Worker)}
    assert "node_id" in {f.name for f in dataclasses.fields(ActorMetadata)}
    assert _TrainingReport(checkpoint=None, metrics={}, validation=False).checkpoint is None


# -- runtime/trainer.py: the controller entry point ---------------------------------------------


def test_trainer_contract(tmp_path):
    from ray.train import Result, RunConfig, ScalingConfig  # noqa: F401  (imported by the trainer)
    from ray.train.v2._internal.execution.controller import TrainController
    from ray.train.v2._internal.util import ObjectRefWrapper
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from ray.train.v2.tensorflow.tensorflow_trainer import TensorflowTrainer
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    assert issubclass(TorchTrainer, DataParallelTrainer) and issubclass(TensorflowTrainer, DataParallelTrainer)
    assert params(DataParallelTrainer._initialize_and_run_controller) == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("controller_init_kwargs", inspect.Parameter.VAR_KEYWORD),
    ]
    controller_args = set(names(TrainController.__init__)) - {"self"}
    ray_passes = call_keywords(inspect.getsource(DataParallelTrainer.fit), "_initialize_and_run_controller")
    we_pass = call_keywords((SRC / "runtime" / "trainer.py").read_text(), "_initialize_and_run_controller")
    assert ray_passes == controller_args, "Ray's own fit hands the controller other arguments now"
    assert we_pass == ray_passes
    assert names(ObjectRefWrapper.__init__) == ["self", "obj"]
    trainer = DataParallelTrainer(
        lambda: None, scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(storage_path=str(tmp_path), name="x")
    )
    for attr in ("scaling_config", "run_config", "train_run_context", "validation_config"):
        assert hasattr(trainer, attr), attr
    assert callable(trainer._get_train_func()) and isinstance(trainer._create_default_callbacks(), list)
    # store/retry.ray_run_config replaces fields of the RunConfig dataclass.
    assert {"name", "storage_path", "storage_filesystem", "failure_config"} <= {f.name for f in dataclasses.fields(RunConfig)}


def test_ray_train_torch_is_the_v2_trainer_when_v2_is_enabled():
    probe = _python(
        "import ray.train.torch, ray.train.v2.torch.torch_trainer as v2\n"
        "assert ray.train.torch.TorchTrainer is v2.TorchTrainer\n",
        RAY_TRAIN_V2_ENABLED="1",
    )
    assert probe.returncode == 0, probe.stderr


# -- runtime/classify.py, store/retry.py: the failures -------------------------------------------


def test_failure_types_contract():
    from ray.exceptions import ActorDiedError, RayActorError
    from ray.train.v2._internal.exceptions import (
        InsufficientClusterResourcesError,
        UserExceptionWithTraceback,
        WorkerGroupStartupFailedError,
        WorkerGroupStartupTimeoutError,
        WorkerHealthCheckFailedError,
        WorkerHealthCheckTimeoutError,
    )
    from ray.train.v2._internal.execution.worker_group.poll import _is_preempted_actor
    from ray.train.v2.api.exceptions import (
        ControllerError,
        PreemptionError,
        TrainingFailedError,
        WorkerGroupError,
    )

    for cls in (ControllerError, PreemptionError, WorkerGroupError):
        assert issubclass(cls, TrainingFailedError)
    assert ControllerError(ValueError("x")).controller_failure.args == ("x",)
    bug = ValueError("bad")
    assert WorkerGroupError("failed", {0: bug}).worker_failures == {0: bug}
    assert UserExceptionWithTraceback(bug, "Traceback ...")._base_exc is bug
    died = ActorDiedError()
    assert WorkerHealthCheckFailedError("died", died).health_check_failure is died
    assert names(WorkerGroupStartupTimeoutError.__init__) == ["self", "num_workers"]
    for cls in (InsufficientClusterResourcesError, WorkerGroupStartupFailedError, WorkerHealthCheckTimeoutError):
        assert isinstance(cls("x"), Exception)
    # A preempted worker: a health-check failure around a RayActorError with preempted=True.
    assert names(_is_preempted_actor) == ["error"]
    assert "preempted" in names(RayActorError.__init__)
    assert _is_preempted_actor(WorkerHealthCheckFailedError("gone", RayActorError(preempted=True)))
    assert not _is_preempted_actor(WorkerHealthCheckFailedError("gone", RayActorError()))
    assert not died.preempted


# -- notices/jit.py: preemption settings and the worker-side API ---------------------------------


def test_preemption_api_contract(tmp_path):
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero
    from ray.train.v2._internal.execution.storage import StorageContext
    from ray.train.v2.api.config import FailureConfig
    from ray.train.v2.api.context import TrainContext

    assert {"max_failures", "max_preemption_failures", "preemption_grace_s", "relax_collectives_on_preemption"} <= set(
        names(FailureConfig)
    )
    assert callable(ray.train.get_preemption_info) and callable(broadcast_from_rank_zero)
    assert callable(TrainContext.get_storage) and callable(TrainContext.get_world_rank)
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="run")
    assert storage.experiment_dir_name == "run" and storage.storage_fs_path and storage.storage_filesystem is not None


# -- store/checkpoints.py: Ray's checkpoint manager snapshot --------------------------------------


def test_checkpoint_manager_snapshot_contract():
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
        _CheckpointManagerState,
        _TrainingResultState,
    )

    from spotfallback.store.checkpoints import SNAPSHOT_NAME

    assert constants.CHECKPOINT_MANAGER_SNAPSHOT_FILENAME == SNAPSHOT_NAME
    # The repairer rewrites these keys of the snapshot and writes results as {version: 0, ...}.
    assert {
        "checkpoint_results",
        "checkpoint_report_indices",
        "latest_checkpoint_result",
        "pending_training_results",
        "pending_validation_specs",
        "validated_checkpoint_dir_names",
        "timed_out_validation_checkpoint_dir_names",
        "failed_validation_checkpoint_dir_names",
    } <= set(_CheckpointManagerState.model_fields)
    assert set(_TrainingResultState.model_fields) == {"version", "checkpoint_dir_name", "metrics"}
    assert _TrainingResultState.model_fields["version"].default == 0


# -- notices/drain.py, notices/agent.py, runtime/: the GCS -----------------------------------------


def test_gcs_contract():
    import ray._raylet
    from ray._common.utils import get_ray_address_file
    from ray._private.services import canonicalize_bootstrap_address, get_node_ip_address
    from ray.core.generated import autoscaler_pb2, gcs_pb2

    from spotfallback.notices.drain import PREEMPTION_REASON

    inner = ray._raylet.InnerGcsClient  # GcsClient forwards every call to it
    assert names(inner.drain_node)[:5] == ["self", "node_id", "reason", "reason_message", "deadline_timestamp_ms"]
    assert names(inner.get_draining_nodes)[:2] == ["self", "timeout"]
    assert names(inner.get_all_node_info)[:2] == ["self", "timeout"]
    # hooks.job_is_dead: a killed driver's job, dead in the job table before its actors are destroyed.
    assert names(inner.get_all_job_info) == ["self", "job_or_submission_id", "skip_submission_job_info_field",
                                             "skip_is_running_tasks_field", "timeout"]
    assert {"job_id", "is_dead"} <= set(gcs_pb2.JobTableData.DESCRIPTOR.fields_by_name)
    assert autoscaler_pb2.DrainNodeReason.Value(PREEMPTION_REASON) > 0
    node = gcs_pb2.GcsNodeInfo
    assert {"state", "labels", "death_info", "node_manager_address"} <= set(node.DESCRIPTOR.fields_by_name)
    assert node.GcsNodeState.Value("ALIVE") is not None
    death = node.DESCRIPTOR.fields_by_name["death_info"].message_type
    assert {"reason", "reason_message"} <= set(death.fields_by_name) and "Reason" in death.enum_types_by_name
    assert names(get_ray_address_file) == ["temp_dir"]
    assert names(canonicalize_bootstrap_address)[:1] == ["addr"] and names(get_node_ip_address) == ["address"]


# -- local/cluster.py: real raylets on one machine ---------------------------------------------------


def test_local_cluster_contract():
    from ray._private import ray_constants
    from ray._private.client_mode_hook import disable_client_hook  # noqa: F401
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    from ray._private.state import GlobalState
    from ray.cluster_utils import Cluster

    assert {"shutdown_at_exit"} <= set(names(Cluster.__init__))
    assert names(Cluster.add_node) == ["self", "wait", "node_args"]
    assert names(Cluster.remove_node) == ["self", "node", "allow_graceful"]
    assert names(Cluster._wait_for_node)[:2] == ["self", "node"]
    assert names(Node.__init__)[:5] == ["self", "ray_params", "head", "shutdown_at_exit", "spawn_reaper"]
    fields = ("num_cpus", "num_gpus", "min_worker_port", "max_worker_port", "redis_address", "gcs_address",
              "include_log_monitor", "node_manager_port", "labels", "resources", "env_vars", "temp_dir")
    assert set(fields) <= set(names(RayParams.__init__))
    ray_params = RayParams()
    assert hasattr(ray_params, "dashboard_agent_listen_port") and callable(ray_params.update_if_absent)
    assert ray_constants.PROCESS_TYPE_RAYLET == "raylet"
    assert callable(GlobalState.get_draining_nodes) and "actor_state_name" in names(GlobalState.actor_table)


def test_jobs_api_contract():
    """clusters/jobs.py times every request out through the client's one request method; a local
    cluster's jobs find their cluster through the address file of the head's temp dir."""
    from ray._private.utils import write_ray_address
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor
    from ray.job_submission import JobDetails, JobSubmissionClient

    assert names(SubmissionClient._do_request)[:3] == ["self", "method", "endpoint"]
    assert "**kwargs" in inspect.getsource(SubmissionClient._do_request).split("response = requests.request(", 1)[1]
    assert issubclass(JobSubmissionClient, SubmissionClient)
    assert {"entrypoint", "submission_id", "metadata", "runtime_env"} <= set(names(JobSubmissionClient.submit_job))
    fields = {"submission_id", "status", "metadata", "start_time", "end_time", "message", "error_type", "driver_exit_code"}
    assert fields <= set(JobDetails.model_fields) and names(JobSubmissionClient.get_job_info) == ["self", "job_id"]
    assert names(write_ray_address) == ["ray_address", "temp_dir"]
    assert "_ray_params.temp_dir" in inspect.getsource(JobSupervisor._get_driver_env_vars)


def test_the_replacement_request_joins_ray_trains_own_autoscaling_coordinator():
    """``notices.placement.request_gang`` finds the coordinator Ray Train creates by name and adds a request."""
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coord

    from spotfallback.notices.placement import COORDINATOR_NAME

    source = inspect.getsource(coord.get_or_create_autoscaling_coordinator)
    assert f'name="{COORDINATOR_NAME}"' in source and f'namespace="{COORDINATOR_NAME}"' in source
    params = inspect.signature(coord._AutoscalingCoordinatorActor.request_resources).parameters
    assert {"requester_id", "resources", "expire_after_s", "priority", "label_selectors"} <= set(params)
    assert coord.ResourceRequestPriority.HIGH in coord.ResourceRequestPriority


def test_the_launchers_node_providers_are_rays():
    """manifest validate refuses a provider.type Ray's launcher does not know: the same list as Ray's."""
    from ray.autoscaler._private.providers import _NODE_PROVIDERS

    from spotfallback.deploy.validate import RAY_NODE_PROVIDERS

    assert set(_NODE_PROVIDERS) == RAY_NODE_PROVIDERS


def test_the_launchers_default_node_types_are_rays():
    """manifest validate refuses a head_node_type outside the node types ``ray up`` takes from its provider's
    defaults.yaml when a config lists none, and fills a missing one from there: the same as Ray's."""
    from ray.autoscaler._private.providers import _get_default_config

    from spotfallback.deploy.validate import RAY_DEFAULT_NODE_TYPES, RAY_PROVIDER_DEFAULTS

    assert RAY_DEFAULT_NODE_TYPES.keys() == RAY_PROVIDER_DEFAULTS.keys()
    for provider, names in RAY_DEFAULT_NODE_TYPES.items():
        defaults = _get_default_config({"type": provider})
        assert tuple(defaults["available_node_types"]) == names, provider
        assert defaults["head_node_type"] == RAY_PROVIDER_DEFAULTS[provider]["head_node_type"], provider
        assert defaults["max_workers"] == RAY_PROVIDER_DEFAULTS[provider]["max_workers"], provider


def define_from_ray_source(relative: str, names: set[str], scope: dict, within: str | None = None) -> None:
    """Define Ray's functions ``names`` (methods of class ``within``, as plain functions) in
    ``scope`` from the source of ``relative`` under ray/, for modules whose imports (boto3,
    Google's client libraries) are not installed here; ``scope`` gives the names they use."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec("ray").origin).parent / relative
    body = ast.parse(source.read_text()).body
    if within is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within).body
    funcs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {f.name for f in funcs} == names, f"{relative} no longer defines {sorted(names - {f.name for f in funcs})}"
    for func in funcs if within is not None else ():
        func.decorator_list = []  # staticmethod: a plain function here
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(source), "exec"), scope)


def test_rays_gcp_launcher_keeps_the_network_interfaces_a_generated_file_sets():
    """launcher._share_network: Ray's _configure_subnet (run by ray up; gcp/config.py, which needs
    Google's client libraries to import, so it is run from its source here) fills networkInterfaces
    only where a node config has none, and looks up no subnet when every one has its own."""
    import copy

    from spotfallback.config import JobConfig
    from spotfallback.deploy.launcher import LauncherOptions, VmCloud, cluster_launcher_config

    subnet = {"selfLink": "projects/p/regions/us-central1/subnetworks/ray-pick"}
    scope = {"copy": copy, "_list_subnets": lambda config, compute: [subnet]}
    define_from_ray_source("autoscaler/_private/gcp/config.py", {"_configure_subnet"}, scope)
    tier = {"name": "h100", "market": "spot", "num_workers": 1, "use_gpu": True, "resources_per_worker": {"CPU": 100, "GPU": 8},
            "label_selector": {"ray.io/market-type": "spot", "ray.io/accelerator-type": "H100"}}
    job = JobConfig.model_validate({"name": "j", "storage_path": "gs://bkt/r", "entrypoint": "m:f", "tiers": [tier]})
    opts = LauncherOptions(cloud=VmCloud.GCP, zone="us-central1-a", project_id="my-project", source_image="projects/p/global/images/g")
    config = cluster_launcher_config(job, opts)
    assert scope["_configure_subnet"](config, None) == config
    del config["available_node_types"]["head"]["node_config"]["networkInterfaces"]
    filled = scope["_configure_subnet"](config, None)["available_node_types"]
    assert filled["head"]["node_config"]["networkInterfaces"][0]["subnetwork"] == subnet["selfLink"]
    assert filled["h100"]["node_config"]["networkInterfaces"][0]["nicType"] == "GVNIC"
    # --subnetwork: every node type names it, so Ray keeps it, gVNIC or not.
    cpu = {**tier, "use_gpu": False, "resources_per_worker": {"CPU": 4}, "label_selector": {"ray.io/market-type": "spot"}}
    job = JobConfig.model_validate({"name": "j", "storage_path": "gs://bkt/r", "entrypoint": "m:f", "tiers": [cpu]})
    config = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.GCP, zone="us-central1-a", project_id="my-project",
                                                          subnetwork="ray-subnet"))
    kept = scope["_configure_subnet"](copy.deepcopy(config), None)
    assert kept == config
    assert {node["node_config"]["networkInterfaces"][0]["subnetwork"] for node in kept["available_node_types"].values()} == {
        "regions/us-central1/subnetworks/ray-subnet"}


def test_rays_aws_launcher_keeps_the_subnets_a_generated_file_names_on_the_terms_its_header_gives():
    """launcher's subnet_ids, security_group_ids and internal_ips: Ray's _configure_subnet and
    _configure_security_group (run by ray up; aws/config.py, which needs boto3 to import, so they
    are run from its source here) keep a node type's SubnetIds only if they are in one VPC, the
    security groups' VPC, in one of the provider's zones, and map public IPs on launch unless
    use_internal_ips is set (otherwise ray up stops before launching anything), and make no
    security group where every node type names its own."""
    import copy
    import functools
    import typing
    from collections import Counter
    from types import SimpleNamespace

    import click
    from ray.autoscaler._private.cli_logger import cli_logger

    from spotfallback.config import JobConfig
    from spotfallback.deploy.launcher import LauncherOptions, VmCloud, cluster_launcher_config

    def subnet(name: str, zone: str, vpc: str = "vpc-1", public: bool = True) -> SimpleNamespace:
        return SimpleNamespace(subnet_id=name, availability_zone=zone, vpc_id=vpc, state="available",
                               map_public_ip_on_launch=public)

    region = [subnet("subnet-0000000a", "us-east-1a"), subnet("subnet-0000000b", "us-east-1b"),
              subnet("subnet-0000000c", "us-east-1a", public=False), subnet("subnet-0000000d", "us-east-1a", vpc="vpc-2"),
              subnet("subnet-0000000e", "us-east-1c")]
    class Subnets:  # boto3's ec2.subnets collection
        def all(self) -> list[SimpleNamespace]:
            return list(region)

        def filter(self, Filters: list[dict]) -> list[SimpleNamespace]:  # noqa: N803 (boto3's name)
            return [s for s in region if s.subnet_id in Filters[0]["Values"]]

    groups = [SimpleNamespace(id="sg-0000000a", vpc_id="vpc-1"), SimpleNamespace(id="sg-0000000d", vpc_id="vpc-2")]

    class SecurityGroups:  # boto3's ec2.security_groups collection
        def filter(self, Filters: list[dict]) -> list[SimpleNamespace]:  # noqa: N803 (boto3's name)
            return [g for g in groups if g.id in Filters[0]["Values"]]

    class EC2:  # hashable, as _get_subnets_or_die's lru_cache needs
        subnets = Subnets()
        security_groups = SecurityGroups()

    ec2 = EC2()
    scope = {**{name: getattr(typing, name) for name in ("Any", "List", "Optional", "Set", "Tuple")}, "Counter": Counter,
             "lru_cache": functools.lru_cache,
             "cli_logger": cli_logger, "_resource": lambda name, config: ec2, "_set_config_info": lambda **kw: None}
    define_from_ray_source("autoscaler/_private/aws/config.py", {
        "_configure_subnet", "_usable_subnet_ids", "_get_subnets_or_die", "_get_vpc_id_of_sg", "_configure_security_group"}, scope)
    tier = {"name": "spot", "market": "spot", "num_workers": 2, "resources_per_worker": {"CPU": 4},
            "label_selector": {"ray.io/market-type": "spot"}}
    job = JobConfig.model_validate({"name": "j", "storage_path": "s3://b/r", "entrypoint": "m:f", "tiers": [tier]})

    def configured(*subnets: str, internal_ips: bool = False, groups: tuple[str, ...] = ()) -> dict:
        config = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, zone="us-east-1a", subnet_ids=subnets,
                                                              security_group_ids=groups, internal_ips=internal_ips))
        assert scope["_configure_subnet"](copy.deepcopy(config)) == config
        if groups:  # Ray makes no group of its own where every node type names some
            assert scope["_configure_security_group"](copy.deepcopy(config)) == config
        return config

    assert {tuple(n["node_config"]["SubnetIds"]) for n in configured("subnet-0000000a")["available_node_types"].values()} == {
        ("subnet-0000000a",)}
    configured("subnet-0000000c", "subnet-0000000a", internal_ips=True)  # a private subnet, with internal IPs
    for refused in (("subnet-0000000c",), ("subnet-0000000b",), ("subnet-0000000a", "subnet-0000000d")):
        with pytest.raises(click.ClickException):  # private without internal IPs; another zone; another VPC
            configured(*refused)
    configured("subnet-0000000a", groups=("sg-0000000a",))
    with pytest.raises(click.ClickException):  # a group in another VPC than the subnet's
        configured("subnet-0000000a", groups=("sg-0000000d",))

    # A ladder across zones: the provider lists both, and each tier keeps its zone's subnets.
    across = JobConfig.model_validate({"name": "j", "storage_path": "s3://b/r", "entrypoint": "m:f", "tiers": [
        {**tier, "name": f"spot-{zone[-1]}", "label_selector": {"ray.io/market-type": "spot", "ray.io/availability-zone": zone}}
        for zone in ("us-east-1a", "us-east-1b")]})

    def across_zones(**zone_subnets: str) -> dict:
        config = cluster_launcher_config(across, LauncherOptions(cloud=VmCloud.AWS, zone_subnet_ids={
            f"us-east-1{zone}": [subnet] for zone, subnet in zone_subnets.items()}))
        assert scope["_configure_subnet"](copy.deepcopy(config)) == config
        return config

    kept = across_zones(a="subnet-0000000a", b="subnet-0000000b")["available_node_types"]
    assert {name: node["node_config"]["SubnetIds"] for name, node in kept.items()} == {
        "head": ["subnet-0000000a", "subnet-0000000b"], "spot-a": ["subnet-0000000a"], "spot-b": ["subnet-0000000b"]}
    with pytest.raises(click.ClickException):  # a subnet in a zone the provider does not list
        across_zones(a="subnet-0000000a", b="subnet-0000000e")


def test_rays_aws_node_provider_adds_a_generated_files_tags_to_its_own():
    """launcher's tags: AWSNodeProvider._merge_tag_specs (aws/node_provider.py, which needs boto3
    to import, so it is run from its source here) adds the node config's instance tags to Ray's
    own, replacing a Ray tag of the same key (hence ray-... and Name are refused), and launches
    the other resource types' specs (the volumes') as they are."""
    import typing

    from spotfallback.config import JobConfig
    from spotfallback.deploy.launcher import LauncherOptions, VmCloud, cluster_launcher_config

    scope = {name: getattr(typing, name) for name in ("List", "Dict", "Any")}  # the annotations in its signature
    define_from_ray_source("autoscaler/_private/aws/node_provider.py", {"_merge_tag_specs"}, scope, within="AWSNodeProvider")
    tier = {"name": "spot", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 4},
            "label_selector": {"ray.io/market-type": "spot"}}
    job = JobConfig.model_validate({"name": "j", "storage_path": "s3://b/r", "entrypoint": "m:f", "tiers": [tier]})
    config = cluster_launcher_config(job, LauncherOptions(cloud=VmCloud.AWS, region="us-east-1", tags={"team": "ml"}))
    rays = [{"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "j"}, {"Key": "Name", "Value": "ray-j-worker"}]}]
    scope["_merge_tag_specs"](rays, config["available_node_types"]["spot"]["node_config"]["TagSpecifications"])
    assert rays == [
        {"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "j"}, {"Key": "Name", "Value": "ray-j-worker"},
                                              {"Key": "team", "Value": "ml"}]},
        {"ResourceType": "volume", "Tags": [{"Key": "team", "Value": "ml"}]},
    ]


def test_nothing_ray_private_is_imported_without_a_pin_here():
    """A new private Ray import anywhere in the package must come with a pin in this file."""
    pinned = {
        "ray._common.utils", "ray._private", "ray._private.client_mode_hook", "ray._private.node",
        "ray._private.parameter", "ray._private.services", "ray._private.utils", "ray._raylet", "ray.core.generated",
        "ray.train.v2._internal.constants", "ray.train.v2._internal.exceptions",
        "ray.train.v2._internal.execution.callback", "ray.train.v2._internal.execution.failure_handling",
        "ray.train.v2._internal.execution.scaling_policy", "ray.train.v2._internal.execution.worker_group.poll",
        "ray.train.v2._internal.util", "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator",
        "ray.autoscaler._private.fake_multi_node.node_provider",  # local/autoscaling.py, pinned in test_probe_ray_contract.py
        # runtime/probe.look_capacity's client, pinned in test_probe_ray_contract.py
        "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client",
    }
    private = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            private.update(m for m in modules if m.startswith("ray.") and ("._" in m or m.startswith("ray.core.")))
    assert private <= pinned, f"pin these in tests/unit/test_ray_contract.py: {sorted(private - pinned)}"


def test_rays_default_aws_ami_is_the_ubuntu_18_04_deep_learning_ami_the_image_note_names():
    """`manifest cluster-launcher` notes that GPU nodes without --image-id boot it: the note must stay true."""
    from ray.autoscaler._private.aws.config import DEFAULT_AMI_NAME

    assert "Deep Learning AMI" in DEFAULT_AMI_NAME and "Ubuntu 18.04" in DEFAULT_AMI_NAME
