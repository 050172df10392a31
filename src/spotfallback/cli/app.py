"""The `spotfallback` command line: a thin typer shell over the library, one module per command."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="spotfallback",
    help="Run Ray Train jobs on spot capacity with a tiered fallback ladder.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # joins a docstring's wrapped lines, so --help reflows to any terminal width
)


def _register_subcommands() -> None:
    # One module per command, each adding itself; `spotfallback --help` lists them in this order.
    from spotfallback.cli import backtest, demo, init, manifest, notice, plan, report, run, status

    for command in (run, demo, plan, backtest, manifest, notice, status, report, init):
        command.register(app)


def main() -> None:
    _register_subcommands()
    try:
        app()
    except MemoryError as e:  # numpy refuses an array past the machine's memory at once
        typer.echo(f"error: the command needs more memory than this machine has ({e}); inputs far past the usual "
                   "(hours of work, a deadline, a window, a trace's times or tick) are the usual cause", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
