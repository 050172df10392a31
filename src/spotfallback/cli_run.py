"""`spotfallback run`: run (or resume) a job file on a ladder, with exit codes a scheduler can use."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from .config import ConfigError, JobConfig, format_validation_error

if TYPE_CHECKING:
    from .progress import RunWatcher

# Exit codes a scheduler can act on.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_USER_CODE = 3
EXIT_LADDER_EXHAUSTED = 4
EXIT_DRIVER_LIVE = 5
EXIT_REFUSED = 6

err_console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


def load_job(job_file: Path | None, job_json: str | None, overrides: dict[str, Any]) -> JobConfig:
    """The job from a YAML file or an inline JSON string (what a RayJob entrypoint carries)."""
    if (job_file is None) == (job_json is None):
        raise ConfigError("give a job file or --job-json, not both and not neither")
    try:
        if job_json is not None:
            data = json.loads(job_json)
            if not isinstance(data, dict):
                raise ConfigError("--job-json: expected a JSON object")
            source = "--job-json"
        else:
            base = JobConfig.from_yaml(job_file)  # type: ignore[arg-type]
            data = base.model_dump(mode="json")
            source = str(job_file)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return JobConfig.model_validate(data)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--job-json: not valid JSON: {e}") from None
    except ValidationError as e:
        raise ConfigError(f"{source}:\n{format_validation_error(e)}") from None


def setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s spotfallback %(message)s", "%H:%M:%S"))
    log = logging.getLogger("spotfallback")
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    if not verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def run_job(
    job: JobConfig, *, retry_failed: bool = False, verbose: bool = False, progress: RunWatcher | None = None
) -> int:
    """Run ``job`` to the end; returns the exit code (also used by `demo` and the tests).

    ``progress`` watches the run's ledger while it trains (see ``progress.watcher_for_job``).
    """
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    from ray.train.v2.api.exceptions import TrainingFailedError

    from .errors import LadderExhaustedError, RunAlreadyFinishedError, RunFailedError
    from .lease import DriverAlreadyRunningError
    from .ledger import LedgerError
    from .runner import FallbackTrainer

    cluster = None
    try:
        trainer = FallbackTrainer.from_job(job, retry_failed=retry_failed)  # ConfigError: a bad entrypoint
        import ray

        if job.ray_address == "local":
            from .local import LocalSpotCluster

            cluster = LocalSpotCluster.for_ladder(job.ladder, connect=True, verbose=verbose).start()
        elif not ray.is_initialized():
            ray.init(address=job.ray_address, log_to_driver=verbose, include_dashboard=False,
                     logging_level=logging.INFO if verbose else logging.WARNING)
        with progress.watch(trainer.location) if progress is not None else contextlib.nullcontext():
            result = trainer.fit()
    except DriverAlreadyRunningError as e:
        raise fail(str(e), EXIT_DRIVER_LIVE) from None
    except (RunAlreadyFinishedError, RunFailedError) as e:
        raise fail(str(e), EXIT_REFUSED) from None
    except LadderExhaustedError as e:
        raise fail(str(e), EXIT_LADDER_EXHAUSTED) from None
    except ConfigError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    except TrainingFailedError as e:
        raise fail(f"training failed: {e}", EXIT_ERROR) from None
    except LedgerError as e:  # storage unreachable past its limit, or a damaged ledger: not the user's code
        raise fail(str(e), EXIT_ERROR) from None
    except Exception as e:  # the training function's own error, after its retries
        err_console.print(f"[bold red]the training function failed:[/] {type(e).__name__}: {e}")
        for note in getattr(e, "__notes__", []):
            err_console.print(note, markup=False, highlight=False)
        raise typer.Exit(EXIT_USER_CODE) from None
    finally:
        if cluster is not None:
            cluster.shutdown()
    metrics = {k: v for k, v in (result.metrics or {}).items() if not isinstance(v, dict)}
    print(json.dumps({"status": "finished", "run": trainer.location.uri(), "metrics": metrics}, default=str))
    return EXIT_OK


def register(app: typer.Typer) -> None:
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
    ) -> None:
        """Run a job on its tier ladder; the same command resumes it after a crash.

        Progress goes to stderr: a live panel on a terminal, quiet lines otherwise (--json: JSON
        lines on stdout). The last stdout line is the result as JSON.

        Exit codes: 0 finished, 2 bad input, 3 the training function failed, 4 every tier
        was left (ladder exhausted), 5 another driver is running this run, 6 the run
        already finished or gave up earlier (see --retry-failed), 1 anything else.
        """
        setup_logging(verbose)
        try:
            job = load_job(job_file, job_json, {"ray_address": ray_address, "name": name, "storage_path": storage_path})
            from .progress import WatchOptions, watcher_for_job

            watcher = watcher_for_job(job, WatchOptions(mode="json" if json_lines else None, mlflow=mlflow))
        except ConfigError as e:
            raise fail(str(e)) from None
        raise typer.Exit(run_job(job, retry_failed=retry_failed, verbose=verbose, progress=watcher))

    @app.command("demo")
    def demo_cmd(
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's own logs.")] = False,
        keep: Annotated[bool, typer.Option("--keep", help="Keep the run's checkpoints and ledger.")] = False,
    ) -> None:
        """Train the PyTorch example on a local spot cluster, preempt it onto on-demand, show the cost."""
        from .demo import run_demo

        raise typer.Exit(run_demo(verbose=verbose, keep=keep))
