"""The `spotfallback` command line: a thin typer shell over the library, one module per command."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from spotfallback.cli.common import CommandSummaries

# Click's exception classes, as the typer installed raises them (its own copy of click, or click):
# BadParameter is exported, and derives from UsageError, which derives from ClickException.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]
_ClickException: type[Exception] = typer.BadParameter.__mro__[2]


class OneLineErrors(CommandSummaries):
    """Usage errors (a bad option value, a missing argument) as one ``error:`` line, exit 2,
    like every error the commands raise themselves, rather than typer's boxed usage text."""

    def main(  # type: ignore[override]  # click's overloads; this keeps its arguments
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _ClickException as e:
            code: int = getattr(e, "exit_code", 2)
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError":  # the group's help, then a line saying what is missing
                if ctx is not None:
                    typer.echo(ctx.get_help())
                typer.echo(f"error: {_missing_command(ctx)}", err=True)
                sys.exit(code)
            message = _sentence(e.format_message())  # type: ignore[attr-defined]
            if isinstance(e, _UsageError) and ctx is not None:
                listed = "commands" if message.startswith("No such command") else "options"
                message += f" (`{ctx.command_path} --help` lists the {listed})"
            typer.echo(f"error: {message}", err=True)
            sys.exit(code)
        except typer.Abort:  # input closed at a prompt
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)  # an int: typer.Exit's code


def _missing_command(ctx: Any) -> str:
    """A group called without its command: the commands it has (those its help lists)."""
    group = getattr(ctx, "command", None)
    if not isinstance(group, TyperGroup):
        return "missing command"
    names = [n for n in group.list_commands(ctx) if not getattr(group.get_command(ctx, n), "hidden", False)]
    return f"missing command: give one of {', '.join(names)} (`{ctx.command_path} --help` says what each does)"


def _sentence(message: str) -> str:
    return " ".join(message.split()).rstrip(".")


app = typer.Typer(
    cls=OneLineErrors,
    name="spotfallback",
    help="Run Ray Train jobs on spot capacity with a tiered fallback ladder.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help: it reflows a docstring's wrapped lines to the terminal and wraps option names
    # onto their own line where they are long; typer's rich boxes cut them short at 80 columns.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from spotfallback import __version__

        typer.echo(f"spotfallback {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the version (the one the deployment files pin on the stock Ray image) and exit.",
    ),
) -> None:
    """Run Ray Train jobs on spot capacity with a tiered fallback ladder."""


def _register_subcommands() -> None:
    # One module per command, each adding itself; `spotfallback --help` lists them in this order.
    from spotfallback.cli import (
        backtest,
        demo,
        init,
        look,
        manifest,
        notice,
        plan,
        report,
        run,
        status,
    )

    for command in (run, demo, plan, backtest, manifest, notice, status, report, init, look):
        command.register(app)


def main() -> None:
    _register_subcommands()
    try:
        app()
    except MemoryError as e:  # numpy refuses an array past the machine's memory at once
        typer.echo(f"error: the command needs more memory than this machine has ({e}); inputs far past the usual "
                   "(--runs, hours of work, a deadline, a window, a trace's times or tick) are the usual cause", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
