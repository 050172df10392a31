"""`spotfallback demo`: the whole idea in two minutes on this machine, without a job file or a cloud."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotfallback.cli.common import check_output


def register(app: typer.Typer) -> None:
    """Add `demo` to the spotfallback CLI."""

    @app.command("demo")
    def demo_cmd(
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Ray's own logs.")] = False,
        keep: Annotated[bool, typer.Option("--keep", help="Keep the run's checkpoints and ledger (a temporary directory).")] = False,
        out: Annotated[Path, typer.Option("--out", help="Where to write the run's timeline picture (PNG; replaced if it exists).")] = Path("spotfallback-demo-timeline.png"),
    ) -> None:
        """Train the PyTorch example on a local spot cluster, preempt it onto on-demand, show the cost.

        Ray's own autoscaler launches the local cluster's spot and on-demand nodes as the run
        asks for them. Each preemption comes with a notice, as a cloud gives one: the replacement
        is launched at once, the example trains on, takes a just-in-time checkpoint once the
        replacement is up and moves onto it, so no step is redone. Prints the events as they happen, the
        tier timeline, the steps redone per eviction, the final accuracy and the spend against
        all-on-demand, and writes the timeline picture. Runs the installed example
        spotfallback.examples.ddp_digits; takes about two minutes on two cores. Exit codes: 0 done,
        1 the run failed, 2 bad input.
        """
        check_output("--out", out, ".png")
        from spotfallback.local.demo import run_demo

        raise typer.Exit(run_demo(verbose=verbose, keep=keep, out=out))
