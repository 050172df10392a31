"""`spotfallback init`: a commented example job file, the shortest way to a first `spotfallback run`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from spotfallback.cli.common import fail, output_problem, write_output
from spotfallback.config import JobConfig

EXAMPLE_JOB = """\
# A spotfallback job. `spotfallback run job.yaml` runs it; running the same command again
# resumes it (same name + storage_path = same run). In Python: FallbackTrainer.from_yaml("job.yaml").fit()
# (there the caller's ray.init() decides the cluster, and ray_address below is not read).

# Unique run name: the run's directory under storage_path, and a good MLflow / W&B run name.
# A new name starts a new run.
name: my-first-run
# Where checkpoints and the run ledger live: a local or NFS path, or s3://bucket/prefix, gs://...
storage_path: ./runs
# The training function, 'package.module:function' or 'path/to/file.py:function': ordinary
# Ray Train V2 code that calls ray.train.get_checkpoint() and ray.train.report(..., checkpoint=...).
# This one is the PyTorch example installed with spotfallback (pip install 'spotfallback[torch]').
entrypoint: spotfallback.examples.ddp_digits:train_fn
# Handed to the training function. Report a `step` metric (and give `total_steps` here or in the
# metrics) and `spotfallback run` / `status` show a progress bar.
train_loop_config:
  total_steps: 200
  checkpoint_every: 5
  step_delay_s: 0.2           # the example is tiny: slow each step so there is something to watch
  preemption_check_every: 2   # look for a preemption notice every 2 steps: train on, checkpoint just in time, move off the node
  remaining_work: true        # report remaining_work_s, which a tier's deadline_guard judges the run by
# 'local' starts a small Ray cluster on this machine (one node per worker of each tier, labelled
# spot / on-demand) to try things out; 'auto' joins the cluster this machine belongs to; or an
# address such as ray://head:10001.
ray_address: local
# The ladder: the run starts on the first tier and walks down (back up only to a tier with
# climb_back: true), resuming from the latest checkpoint. `spotfallback plan --write-yaml`
# recommends budgets, timeouts and a deadline guard.
tiers:
  - name: spot
    market: spot               # workers go to nodes labelled ray.io/market-type=spot
    num_workers: 2
    max_preemptions: 3         # preemptions tolerated here; the next one moves the run down
    max_failures: 3            # node losses without notice; also retries of errors in your code
    capacity_timeout_s: 600    # longest wait for workers, at the start and after each failure
    price_per_worker_hour: 0.92
  - name: on-demand
    market: on-demand
    num_workers: 2
    max_failures: 3
    capacity_timeout_s: 1800
    price_per_worker_hour: 3.06
"""


def register(app: typer.Typer) -> None:
    """Add `init` to the spotfallback CLI."""

    @app.command("init")
    def init_cmd(
        path: Annotated[Path, typer.Argument(help="Job file to write (.yaml or .yml).", metavar="PATH")] = Path("job.yaml"),
        force: Annotated[bool, typer.Option("--force", help="Overwrite the file if it exists.")] = False,
    ) -> None:
        """Write a commented example job file (ladder, storage, entrypoint) that `spotfallback run` accepts."""
        if (problem := output_problem(path, (".yaml", ".yml"), keep_existing=not force)) is not None:
            if problem.endswith("is a directory; give a file name"):
                problem += f" such as {str(path / 'job.yaml')!r}"
            raise fail(f"PATH: {problem}")
        write_output("PATH", path, EXAMPLE_JOB)
        job = JobConfig.from_yaml(path)  # the example must always be a valid job
        typer.echo(f"wrote {path}: run {job.name!r} on {' -> '.join(t.name for t in job.tiers)}. "
                   f"Edit it, then: spotfallback run {shlex.quote(str(path))}")
