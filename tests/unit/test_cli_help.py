"""Every command's --help on an 80-column terminal: the description reflows, no line broken where the source was,
and every option is spelt out in full."""

from __future__ import annotations

import importlib

import click
import pytest
import typer
from typer.testing import CliRunner

COMMANDS = ["run", "demo", "plan", "backtest", "notice-agent", "status", "report", "init", "manifest kuberay",
            "manifest nodepools", "manifest cluster-launcher", "manifest validate"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_text_reflows_to_an_80_column_terminal(cli, command):
    r = CliRunner().invoke(cli, [*command.split(), "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    # The description: the lines after the usage line, before the list of arguments or options.
    text = lines[next(i for i, ln in enumerate(lines) if "Usage:" in ln) + 1:]
    text = text[:next((i for i, ln in enumerate(text) if ln in ("Arguments:", "Options:")), len(text))]
    paragraphs: list[list[str]] = [[]]
    for line in text:
        if line.strip():
            paragraphs[-1].append(line.rstrip())
        elif paragraphs[-1]:
            paragraphs.append([])
    for para in paragraphs:
        for line, after in zip(para, para[1:], strict=False):  # a line ends short only where the next word would not fit
            assert len(line) + 1 + len(after.split()[0]) > 78, (command, line, r.output)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_on_an_80_column_terminal_names_every_option_in_full(cli, command):
    """A help that cuts ``--head-instance-type`` to ``--head-instance-…`` hides the option it documents."""
    r = CliRunner().invoke(cli, [*command.split(), "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    cmd = typer.main.get_command(cli)
    for word in command.split():
        cmd = cmd.get_command(click.Context(cmd), word)
    names = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}
    assert names
    words = set(r.output.replace(",", " ").replace("/", " ").split())
    assert names <= words, (command, sorted(names - words))


@pytest.mark.parametrize("command", COMMANDS)
def test_a_repeatable_option_shows_what_one_value_is_not_a_python_type(cli, command):
    """``--label <list[str]>`` reads as if the option took a list; each use takes one KEY=VALUE."""
    r = CliRunner().invoke(cli, [*command.split(), "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "list[" not in r.output, r.output


def test_a_command_out_of_memory_says_so_in_one_line_not_a_traceback(monkeypatch, capsys):
    """numpy refuses an array past the machine's memory at once (a deadline of a billion hours, a trace's
    tick of milliseconds): that is an input to fix, said as such."""
    cli_app = importlib.import_module("spotfallback.cli.app")  # the module; the package's `app` is the Typer

    def too_large() -> None:
        raise MemoryError("Unable to allocate 44.7 GiB for an array with shape (6000000001,) and data type int64")

    monkeypatch.setattr(cli_app, "_register_subcommands", lambda: None)
    monkeypatch.setattr(cli_app, "app", too_large)
    with pytest.raises(SystemExit) as exit_:
        cli_app.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the command needs more memory than this machine has (Unable to allocate 44.7 GiB")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("group", "ending"), [([], "resumes it after a crash."), (["manifest"], "one worker group per tier.")])
def test_a_groups_help_lists_each_command_with_its_whole_summary(cli, group, ending):
    r = CliRunner().invoke(cli, [*group, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    commands = r.output.split("\nCommands:\n")[1]
    assert "..." not in commands and "…" not in commands
    assert ending in " ".join(commands.split())


def test_version_is_the_release_the_deployment_files_pin(cli):
    """One version: the package metadata reads ``spotfallback.__version__``, and so do the
    ``spotfallback==`` pins of the files ``manifest`` writes for the stock Ray image."""
    import tomllib
    from pathlib import Path

    from spotfallback import __version__
    from spotfallback.deploy.common import spotfallback_requirement

    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output == f"spotfallback {__version__}\n", r.output
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "spotfallback.__version__"}
    assert spotfallback_requirement() == f"spotfallback=={__version__}"
