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
    from spotfallback.cli import (
        manifest,  # deployment: `spotfallback manifest ...`
        notice,  # notices: `spotfallback notice-agent`
        plan,  # planner: `spotfallback plan`
        run,  # `spotfallback run`, `spotfallback demo`
        status,  # `spotfallback status`, `report`, `init`
    )

    run.register(app)
    plan.register(app)
    manifest.register(app)
    notice.register(app)
    status.register(app)


def main() -> None:
    _register_subcommands()
    app()


if __name__ == "__main__":
    main()
