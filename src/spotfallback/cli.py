"""The `spotfallback` command line: a thin typer shell over the library."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="spotfallback",
    help="Run Ray Train jobs on spot capacity with a tiered fallback ladder.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_subcommands() -> None:
    # Each feature module adds its own commands; keep one line per module here.
    from . import (
        cli_manifest,  # deployment: `spotfallback manifest ...`
        cli_notice,  # notices: `spotfallback notice-agent`
        cli_plan,  # planner: `spotfallback plan`
        cli_run,  # `spotfallback run`, `spotfallback demo`
        cli_status,  # `spotfallback status`, `report`, `init`
    )

    cli_run.register(app)
    cli_plan.register(app)
    cli_manifest.register(app)
    cli_notice.register(app)
    cli_status.register(app)


def main() -> None:
    _register_subcommands()
    app()


if __name__ == "__main__":
    main()
