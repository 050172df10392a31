"""`spotfallback run` without a cluster: what it refuses before Ray starts, and its exit codes.

Everything refused here is refused *before* a cluster is started or joined (the job files say
``ray_address: local``; tripwires on starting that cluster and on ``ray.init`` fail the test
if the command gets that far) and before any progress sink, such as an MLflow run, is created.
The exit codes that need a training run (0, 3, 4) are pinned end to end in
test_cli_run_local_e2e.py; here ``exit_for`` maps each real error type to its code.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import socket
import sys
import types
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from spotfallback.cli import run as cli_run
from spotfallback.config import JobConfig
from spotfallback.errors import ConfigError
from spotfallback.events import Finished, NodeFailed, RunStarted, WorkersAcquired
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    """Tripwires: nothing in this module may start or join a Ray cluster."""
    import ray

    from spotfallback.local import LocalSpotCluster

    def tripped(*args, **kwargs):
        raise AssertionError("the command went on to start or join a cluster instead of refusing")

    monkeypatch.setattr(LocalSpotCluster, "for_ladder", classmethod(tripped))
    monkeypatch.setattr(ray, "init", tripped)


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.callback()(lambda: None)  # a group, so `run` is a subcommand as in the real CLI, not the app itself
    cli_run.register(app)
    return app


def job_file(tmp_path, name: str = "r1", **extra: str) -> str:
    (tmp_path / "mytrain.py").write_text("def train_fn(config):\n    pass\n")
    lines = [
        f"name: {name}",
        f"storage_path: {tmp_path / 'runs'}",
        f"entrypoint: {tmp_path / 'mytrain.py'}:train_fn",
        "ray_address: local",
        "tiers:",
        "  - {name: spot, market: spot, num_workers: 1, max_preemptions: 0, max_failures: 0}",
        "  - {name: on-demand, market: on-demand, num_workers: 1, max_failures: 0}",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def seed(tmp_path, path: str, events) -> Ledger:
    """The run's ledger as an earlier driver left it."""
    job = JobConfig.from_yaml(path)
    ledger = Ledger(resolve_run(job.storage_path, job.name), writer="earlier")
    ledger.ensure_dirs()
    ledger.write_meta(job.ladder)
    policy = FallbackPolicy(job.ladder)
    state = policy.initial_state()
    for ev in events:
        step = policy.decide(state, ev)
        ledger.append(ev, state.tier, step.decision.to_json())
        state = step.state
    return ledger


def invoke(app, *args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def assert_refused(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("error: "), result.output
    for needle in needles:
        assert needle in " ".join(result.output.split()), result.output


def test_a_finished_run_is_refused_with_exit_6(app, tmp_path):
    path = job_file(tmp_path)
    ledger = seed(tmp_path, path, [RunStarted(1), WorkersAcquired(2, num_workers=1), Finished(3)])
    before = len(ledger.read())
    assert_refused(invoke(app, "run", path), 6, "already finished", "new run name")
    assert len(ledger.read()) == before  # nothing written


def test_a_failed_run_is_refused_with_exit_6_unless_retry_failed(app, tmp_path):
    path = job_file(tmp_path)
    seed(tmp_path, path, [RunStarted(1), NodeFailed(2), NodeFailed(3)])
    assert_refused(invoke(app, "run", path), 6, "gave up earlier", "--retry-failed")


def test_a_run_with_a_live_driver_is_refused_with_exit_5(app, tmp_path):
    from spotfallback.store.lease import DriverLease

    path = job_file(tmp_path)
    ledger = seed(tmp_path, path, [RunStarted(1)])
    with DriverLease(ledger.location, ttl_s=30):
        assert_refused(invoke(app, "run", path), 5, "another driver is running this run")


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"entrypoint": "nosuchmodule_xyz:train_fn"}, ["entrypoint: cannot import module 'nosuchmodule_xyz'"]),
        ({"tiers": "[{name: spot, market: spot, num_workers: 1, max_preemption: 1}]"},
         ["tiers[0].max_preemption: unknown field; did you mean 'max_preemptions'?"]),
        ({"tiers": "[{name: spot, market: spot, num_workers: 0}, {name: od, market: on-demand, num_workers: 0}]"},
         ["tiers[0].num_workers: Input should be greater than 0; tiers[1].num_workers: Input should be greater than 0"]),
    ],
)
def test_bad_job_files_are_one_line_and_exit_2(app, tmp_path, change, needles):
    path = job_file(tmp_path)
    text = Path(path).read_text()
    for key, value in change.items():
        text = re.sub(rf"^{key}:.*?(?=^\w|\Z)", f"{key}: {value}\n", text, flags=re.M | re.S)
    Path(path).write_text(text)
    r = invoke(app, "run", path)
    assert_refused(r, 2, *needles)
    assert len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--storage-path", ""], "error: --storage-path: storage_path: empty"),
        (["--storage-path", "ftp://host/runs"], "error: --storage-path: storage_path:"),
        (["--name", "a/b"], "error: --name: name: run name 'a/b'"),
    ],
)
def test_a_bad_override_names_the_option_not_the_job_file(app, tmp_path, args, needle):
    r = invoke(app, "run", job_file(tmp_path), *args)
    assert_refused(r, 2, needle)
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_another_ladder_for_the_same_run_is_refused_with_exit_2(app, tmp_path):
    path = job_file(tmp_path)
    seed(tmp_path, path, [RunStarted(1)])
    Path(path).write_text(Path(path).read_text().replace("name: on-demand", "name: od"))
    assert_refused(invoke(app, "run", path), 2, "tiers: run", "was started with tiers")


# ---------------------------------------------------------------------------------------
# Exit codes of errors that end a run (each a real error type the runner raises).


def test_exit_codes_of_run_errors():
    from ray.train.v2.api.exceptions import TrainingFailedError

    from spotfallback.errors import (
        EXIT_FATAL,
        DriverAlreadyRunningError,
        JitHoldExpiredError,
        LadderExhaustedError,
        LedgerError,
        RunAlreadyFinishedError,
        RunFailedError,
        RunFatalError,
        StorageUnavailableError,
    )

    cases = [
        (DriverAlreadyRunningError("another driver"), None, 5),
        (RunAlreadyFinishedError("finished"), None, 6),
        (RunFailedError("gave up"), None, 6),
        (RunFailedError("gave up"), "application", 6),  # the cause is the earlier run's
        (LadderExhaustedError("every tier was left"), "exhausted", 4),
        (ConfigError("entrypoint: bad"), None, 2),
        (ConfigError("entrypoint: bad"), "application", 2),
        (LedgerError("storage unreachable"), None, 1),
        (StorageUnavailableError("storage unavailable for 121s"), None, 1),
        (TrainingFailedError("controller gone"), None, 1),
        (TrainingFailedError("controller gone"), "application", 1),
        (ValueError("the user's bug"), "application", 3),
    ]
    for error, cause, code in cases:
        assert cli_run.exit_for(error, cause)[0] == code, error
    assert cli_run.exit_for(LedgerError("x: not valid JSON"), None)[1] == "x: not valid JSON"
    # A config/access error retrying cannot fix has its own code and says so (it used to be
    # reported as "the training function failed", exit 3).
    code, message = cli_run.exit_for(RunFatalError("run 'x' stopped: PermissionError: denied"), "fatal")
    assert code == EXIT_FATAL == 7
    assert "not retried" in message and "--retry-failed" in message and "training function" not in message
    # Any other exception is the training function's only when the ledger says so.
    code, message = cli_run.exit_for(ValueError("boom"), None)
    assert code == 1 and message == "unexpected error: ValueError: boom"
    code, message = cli_run.exit_for(ValueError("boom"), "application")
    assert message == "the training function failed: ValueError: boom"
    # PreemptionWatch raises this inside the training function: it ends a run as the function's failure.
    code, message = cli_run.exit_for(JitHoldExpiredError("still running"), "application")
    assert (code, message) == (3, "the training function failed: JitHoldExpiredError: still running")


def test_help_lists_every_exit_code(app):
    r = invoke(app, "run", "--help")
    flat = " ".join(r.output.split())
    for code in ("0 finished", "1 anything else", "2 bad input", "3 the training function failed",
                 "4 every tier was left", "5 another driver", "6 the run already finished", "7 an error retrying"):
        assert code in flat, code


# ---------------------------------------------------------------------------------------
# MLflow: created only for an accepted run; an unreachable server is one clear error.


class RecordingClient:
    """The few MlflowClient calls the sink makes, recorded; ``fail`` makes them raise like a dead server."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.created: list[str] = []

    def _check(self):
        if self.fail:
            raise ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded\nmore detail")

    def search_runs(self, experiment_ids, filter_string, max_results):
        self._check()
        return []

    def create_run(self, experiment_id, run_name=None, tags=None):
        self._check()
        self.created.append(run_name)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r0"))


@pytest.fixture()
def fake_mlflow(monkeypatch):
    def install(client):
        module = types.ModuleType("mlflow")
        module.MlflowClient = lambda: client
        module.active_run = lambda: None
        monkeypatch.setitem(sys.modules, "mlflow", module)
        return client

    return install


def test_a_refused_run_creates_no_mlflow_run(app, tmp_path, fake_mlflow):
    client = fake_mlflow(RecordingClient())
    path = job_file(tmp_path)
    seed(tmp_path, path, [RunStarted(1), WorkersAcquired(2, num_workers=1), Finished(3)])
    assert_refused(invoke(app, "run", path, "--mlflow"), 6, "already finished")
    assert client.created == []


def test_an_unreachable_mlflow_server_is_one_line_and_exit_2(app, tmp_path, fake_mlflow, monkeypatch):
    fake_mlflow(RecordingClient(fail=True))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    r = invoke(app, "run", job_file(tmp_path), "--mlflow")
    assert_refused(r, 2, "--mlflow: cannot use the MLflow tracking server (http://127.0.0.1:9)", "ConnectionError",
                   "run without --mlflow")
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_mlflow_not_installed_is_one_line_and_exit_2(app, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow -> ImportError
    assert_refused(invoke(app, "run", job_file(tmp_path), "--mlflow"), 2, "mlflow is not installed")


# ---------------------------------------------------------------------------------------
# How progress is shown: live panel on a terminal, plain lines otherwise, JSON lines on request.


def test_progress_mode_follows_the_terminal_and_json_option(tmp_path):
    from spotfallback.view.watcher import (
        JsonSink,
        LiveSink,
        PlainSink,
        WatchOptions,
        watcher_for_job,
    )

    job = JobConfig.from_yaml(job_file(tmp_path))
    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            terminal = Console(file=tty)
            assert terminal.is_terminal  # a real pseudo-terminal, as a user's shell gives
            sinks = watcher_for_job(job, WatchOptions(), console=terminal).sinks
            assert [type(s) for s in sinks] == [LiveSink]
            sinks = watcher_for_job(job, WatchOptions(mode="json"), console=terminal, out=io.StringIO()).sinks
            assert [type(s) for s in sinks] == [JsonSink]  # --json wins on a terminal too
    finally:
        os.close(leader)
        os.close(follower)
    ci_log = Console(file=io.StringIO())  # a pipe or a file: CI logs
    sinks = watcher_for_job(job, WatchOptions(plain_every_s=5), console=ci_log).sinks
    assert [type(s) for s in sinks] == [PlainSink] and sinks[0].every_s == 5
    watcher = watcher_for_job(job.model_copy(update={"train_loop_config": {"total_steps": 9}}), console=ci_log)
    assert watcher.config == {"total_steps": 9}  # where the progress bar's total comes from


def test_json_option_prints_events_and_status_lines(tmp_path):
    from spotfallback.view.watcher import WatchOptions, watcher_for_job

    path = job_file(tmp_path)
    ledger = seed(tmp_path, path, [RunStarted(1), WorkersAcquired(2, num_workers=1), Finished(3)])
    out = io.StringIO()
    watcher = watcher_for_job(JobConfig.from_yaml(path), WatchOptions(mode="json"), out=out)
    watcher.interval_s = 0.05
    with watcher.watch(ledger.location):
        pass
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [o["kind"] for o in lines if o["type"] == "event"] == ["run_started", "workers_acquired", "finished"]
    assert lines[-1]["type"] == "status" and lines[-1]["status"] == "finished"
    assert lines[-1]["event_count"] == 3 and "events" not in lines[-1]  # "events" is status --json's list


# ---------------------------------------------------------------------------------------
# Layout: one module per command, sharing only cli.common (no command imports another).


def test_each_command_is_a_module_that_imports_no_other_command():
    import ast

    import spotfallback.cli

    folder = Path(spotfallback.cli.__file__).parent
    commands = {"run", "demo", "init", "status", "report", "plan", "backtest", "manifest", "notice", "look"}
    assert commands <= {p.stem for p in folder.glob("*.py")}
    for name in commands:
        tree = ast.parse((folder / f"{name}.py").read_text())
        cli_imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and (n.module or "").startswith("spotfallback.cli")}
        assert cli_imports <= {"spotfallback.cli.common"}, (name, cli_imports)
    registered = ast.parse((folder / "app.py").read_text())
    imported = {a.name for n in ast.walk(registered) if isinstance(n, ast.ImportFrom)
                and n.module == "spotfallback.cli" for a in n.names}
    assert imported == commands


def test_a_cluster_that_cannot_be_joined_is_one_error_line_naming_ray_address(app, tmp_path, monkeypatch):
    import ray

    def unreachable(**_: object) -> None:  # what ray.init raises where no cluster answers at the address
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to.")

    monkeypatch.setattr(ray, "init", unreachable)
    path = Path(job_file(tmp_path))
    path.write_text(path.read_text().replace("ray_address: local", "ray_address: auto"))
    assert_refused(invoke(app, "run", str(path)), 2,
                   "ray_address: cannot connect to Ray at 'auto' (ConnectionError: Could not find",
                   "start the cluster, or use 'local'")


def test_a_head_address_where_nothing_listens_is_refused_without_rays_retries(app, tmp_path, monkeypatch):
    """ray.init retries such an address for minutes; one connection attempt is refused at once."""
    import ray

    def retried(**_: object) -> None:
        raise AssertionError("ray.init was called: it would retry the address for minutes")

    monkeypatch.setattr(ray, "init", retried)
    with socket.socket() as s:  # a loopback port that was free a moment ago, so nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = Path(job_file(tmp_path))
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        path.write_text(re.sub(r"ray_address: .*", f"ray_address: {address}", path.read_text()))
        assert_refused(invoke(app, "run", str(path)), 2,
                       f"ray_address: cannot connect to Ray at '{address}' (nothing accepts connections at 127.0.0.1:{port}",
                       "start the cluster, or use 'local'")


@pytest.mark.parametrize(("source", "needle"), [
    ("raise RuntimeError('boom at import')\n", "importing module 'broken_at_import' failed: RuntimeError: boom at import"),
    ("def train_fn(config:\n", "importing module 'broken_at_import' failed: SyntaxError:"),
])
def test_an_entrypoint_whose_module_fails_as_it_loads_is_one_line_naming_the_entrypoint_and_exit_2(app, tmp_path, source, needle):
    """The user's code to fix, not infrastructure to retry (exit 1 said the latter)."""
    (tmp_path / "broken_at_import.py").write_text(source)
    path = Path(job_file(tmp_path))
    path.write_text(path.read_text().replace(f"{tmp_path / 'mytrain.py'}:", f"{tmp_path / 'broken_at_import.py'}:"))
    r = invoke(app, "run", str(path))
    assert_refused(r, 2, f"entrypoint: {needle}")
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_an_entrypoint_file_named_like_a_module_python_has_is_refused_not_swapped(app, tmp_path, monkeypatch):
    """``json.py:train_fn`` loaded the standard library's json (and said it has no train_fn)."""
    # The loader puts the file's directory on sys.path, where the processes this worker spawns
    # later (with its sys.path) would find this json.py before the standard library's.
    monkeypatch.setattr(sys, "path", [*sys.path])
    (tmp_path / "json.py").write_text("def train_fn(config):\n    pass\n")
    path = Path(job_file(tmp_path))
    path.write_text(path.read_text().replace(f"{tmp_path / 'mytrain.py'}:", f"{tmp_path / 'json.py'}:"))
    assert_refused(invoke(app, "run", str(path)), 2, "is named like the module 'json'", "rename the file")


def test_job_json_nested_past_the_json_reader_is_one_line(app):
    deep = '{"a":' * 20000 + "1" + "}" * 20000
    assert_refused(invoke(app, "run", "--job-json", deep), 2, "--job-json: its values nest deeper")
