"""`spotfallback run`: run (or resume) a job file on a ladder, with exit codes a scheduler can use."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from spotfallback.cli.common import err_console, fail, join_ray, one_line, setup_logging
from spotfallback.config import JobConfig, validation_config_error
from spotfallback.errors import (
    EXIT_ERROR,
    EXIT_FATAL,
    EXIT_OK,
    EXIT_USER_CODE,
    ConfigError,
    SpotfallbackError,
)

if TYPE_CHECKING:
    from spotfallback.store.location import RunLocation
    from spotfallback.view.watcher import RunWatcher, WatchOptions

FATAL_HINT = (
    "This is not retried (retrying cannot fix it: configuration, access). Checkpoints are "
    "kept: fix the cause, then run again with --retry-failed to resume."
)


def load_job(job_file: Path | None, job_json: str | None, overrides: dict[str, Any]) -> JobConfig:
    """The job from a YAML file or an inline JSON string (what a RayJob entrypoint carries)."""
    if (job_file is None) == (job_json is None):
        raise ConfigError("JOB_FILE: give a job file or --job-json, not both and not neither")
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        if job_json is not None:
            data = json.loads(job_json)
            if not isinstance(data, dict):
                raise ConfigError("--job-json: expected a JSON object")
            source = "--job-json"
        else:
            base = JobConfig.from_yaml(job_file)  # type: ignore[arg-type]
            data = base.model_dump(mode="json", exclude_unset=True)
            source = str(job_file)
        data.update(given)
        return JobConfig.model_validate(data)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--job-json: not valid JSON: {e}") from None
    except RecursionError:
        raise ConfigError("--job-json: its values nest deeper than the JSON reader can follow; flatten them") from None
    except ValidationError as e:
        # A bad value given on the command line is the option's fault, not the file's.
        blamed = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
        if blamed and blamed <= given.keys():
            source = " / ".join("--" + k.replace("_", "-") for k in sorted(blamed))
        raise validation_config_error(source, e) from None


def exit_for(error: BaseException, give_up_cause: str | None = None) -> tuple[int, str]:
    """The exit code and message for an error that ended ``spotfallback run``.

    spotfallback's own errors carry their code (``SpotfallbackError.exit_code``). Anything
    else is Ray's ``TrainingFailedError`` (exit 1) or an exception ``fit()`` re-raised as is:
    ``give_up_cause``, the ledger's reason for stopping (``application``, ``exhausted``,
    ``fatal``) read after the error, makes it the training function's own (exit 3) only when
    it says ``application``.
    """
    from ray.train.v2.api.exceptions import TrainingFailedError

    if isinstance(error, SpotfallbackError):
        code = error.exit_code
    elif isinstance(error, TrainingFailedError):
        return EXIT_ERROR, f"training failed: {error}"
    elif give_up_cause == "application":
        code = EXIT_USER_CODE
    else:
        return EXIT_ERROR, f"unexpected error: {type(error).__name__}: {error}"
    if code == EXIT_USER_CODE:
        return code, f"the training function failed: {type(error).__name__}: {error}"
    if code == EXIT_FATAL:
        return code, f"{error}\n{FATAL_HINT}"
    return code, str(error)


def _give_up_cause(trainer: Any) -> str | None:
    with contextlib.suppress(Exception):
        give_up = trainer.state().give_up
        return give_up.cause if give_up is not None else None
    return None


def _connect(job: JobConfig, verbose: bool) -> Any:
    """Start the embedded local spot cluster (``local``) or join the cluster at ``ray_address``."""
    import ray

    if job.ray_address == "local":
        from spotfallback.local import LocalSpotCluster

        return LocalSpotCluster.for_ladder(job.ladder, connect=True, verbose=verbose).start()
    if not ray.is_initialized() and (why := join_ray(job.ray_address, verbose)) is not None:
        raise ConfigError(f"ray_address: cannot connect to Ray at {job.ray_address!r} ({why}); "
                          "start the cluster, or use 'local' for an embedded one")
    return None


def run_across(job: JobConfig, *, retry_failed: bool, watch: WatchOptions | None) -> int:
    """A ladder across Ray clusters: move the run between them (``clusters.mover``) until it ends."""
    from spotfallback.clusters import ClusterMover

    try:
        mover = ClusterMover(job, retry_failed=retry_failed, say=lambda line: err_console.print(f"[spotfallback] {line}", markup=False, highlight=False))
        watcher = _watcher(job, watch)
        with _watching(watcher, mover.location):
            outcome = mover.run()
    except Exception as e:
        code, message = exit_for(e)
        raise fail(message, code) from None
    if outcome.exit_code != EXIT_OK:
        raise fail(outcome.message, outcome.exit_code)
    print(json.dumps(outcome.result or result_line(mover.location.uri(), {}), default=str))
    return EXIT_OK


def result_line(run: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The last stdout line of `run`: the finished run and its final metrics."""
    return {"type": "result", "status": "finished", "run": run, "metrics": metrics}


def _watcher(job: JobConfig, watch: WatchOptions | None) -> RunWatcher | None:
    """How progress is shown (``view.watcher.watcher_for_job``); None shows none."""
    if watch is None:
        return None
    from spotfallback.view.watcher import watcher_for_job

    return watcher_for_job(job, watch)


def _watching(watcher: RunWatcher | None, location: RunLocation) -> contextlib.AbstractContextManager[Any]:
    return watcher.watch(location) if watcher is not None else contextlib.nullcontext()


def run_job(
    job: JobConfig, *, retry_failed: bool = False, verbose: bool = False, watch: WatchOptions | None = None,
    on_cluster: str | None = None,
) -> int:
    """Run ``job`` to the end; returns the exit code (also used by the tests).

    Everything that can refuse the run (a live driver, a finished or failed run, another
    ladder, a bad entrypoint, an unusable ``--mlflow``) does so before a cluster is started
    or joined and before any progress sink (an MLflow run) is created. ``watch`` chooses how
    progress is shown (``view.watcher.watcher_for_job``); None shows none.
    """
    if job.ladder.across_clusters and on_cluster is None:
        return run_across(job, retry_failed=retry_failed, watch=watch)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    from spotfallback.runtime.trainer import FallbackTrainer

    cluster = None
    trainer = None
    try:
        trainer = FallbackTrainer.from_job(job, retry_failed=retry_failed, on_cluster=on_cluster)  # ConfigError: a bad entrypoint
        trainer.preflight()
        watcher = _watcher(job, watch)
        cluster = _connect(job, verbose)
        with _watching(watcher, trainer.location):
            result = trainer.fit()
    except Exception as e:
        code, message = exit_for(e, _give_up_cause(trainer) if trainer is not None else None)
        exit_ = fail(message, code)
        if code == EXIT_USER_CODE:  # the worker's traceback, attached by the runner
            for note in getattr(e, "__notes__", []):
                err_console.print(note, markup=False, highlight=False)
        raise exit_ from None
    finally:
        if cluster is not None:
            cluster.shutdown()
    metrics = {k: v for k, v in (result.metrics or {}).items() if not isinstance(v, dict)}
    print(json.dumps(result_line(trainer.location.uri(), metrics), default=str))
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Add `run` to the spotfallback CLI."""

    @app.command("run")
    def run_cmd(
        job_file: Annotated[Path | None, typer.Argument(help="Job YAML (see `spotfallback init`).", show_default=False)] = None,
        job_json: Annotated[str | None, typer.Option("--job-json", help="The job as one JSON object instead of a file.")] = None,
        ray_address: Annotated[str | None, typer.Option(help="Override the job's ray_address: 'local', 'auto' or host:port.", envvar="SPOTFALLBACK_RAY_ADDRESS")] = None,
        name: Annotated[str | None, typer.Option(help="Override the job's run name.")] = None,
        storage_path: Annotated[str | None, typer.Option(help="Override the job's storage_path.")] = None,
        retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Resume a run that gave up, with fresh tier budgets.")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's own logs.")] = False,
        json_lines: Annotated[bool, typer.Option("--json", help="Progress as JSON lines on stdout (each event, and the status when it changes).")] = False,
        mlflow: Annotated[bool, typer.Option("--mlflow", help="Log tier switches and spend to MLflow (needs mlflow installed).")] = False,
        on_cluster: Annotated[str | None, typer.Option("--on-cluster", help="For a ladder across clusters: run only its tiers on this cluster (the name its tiers give), here; without it, `run` moves the run between the clusters as Ray jobs.")] = None,
    ) -> None:
        """Run a job on its tier ladder; the same command resumes it after a crash.

        Progress goes to stderr: a live panel on a terminal, quiet lines otherwise (--json: JSON
        lines on stdout). The last stdout line of a finished run is the result as JSON.

        Exit codes: 0 finished, 1 anything else (storage unreachable, damaged ledger), 2 bad
        input, 3 the training function failed, 4 every tier was left (ladder exhausted), 5
        another driver is running this run, 6 the run already finished or gave up earlier
        (see --retry-failed), 7 an error retrying cannot fix (configuration, access), 8 (with
        --on-cluster) the run moved to a tier on another cluster.

        When the tiers name Ray clusters (cluster: {address: http://head:8265}), this command
        moves the run between them: it submits `spotfallback run --on-cluster NAME` to the
        current tier's cluster through its Ray Jobs API, follows the job, and submits to the
        next cluster when the run moves there or the cluster stops answering.
        """
        setup_logging(verbose)
        try:
            job = load_job(job_file, job_json, {"ray_address": ray_address, "name": name, "storage_path": storage_path})
        except ConfigError as e:
            raise fail(one_line(str(e)), e.exit_code) from None
        from spotfallback.view.watcher import WatchOptions

        watch = WatchOptions(mode="json" if json_lines else None, mlflow=mlflow)
        raise typer.Exit(run_job(job, retry_failed=retry_failed, verbose=verbose, watch=watch, on_cluster=on_cluster))
