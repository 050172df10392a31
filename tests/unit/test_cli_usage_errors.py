"""Usage errors typer finds (a bad option value, a missing option or argument, an unknown option,
a bad environment value) read as the commands' own errors do: one ``error:`` line naming the
option, exit 2; help is still help."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["manifest", "kuberay", "--cloud", "gke", "--job", "j.yaml", "--spot-grace", "soon"], {}, ["'--spot-grace'"]),
        (["manifest", "kuberay", "--job", "j.yaml"], {}, ["'--cloud'"]),
        (["manifest", "validate", "/nonexistent/x.yaml"], {}, ["'file'", "/nonexistent/x.yaml", "does not exist"]),
        (["plan", "--bogus"], {}, ["--bogus"]),
        (["report"], {}, ["STORAGE_PATH/NAME"]),
        (["notice-agent", "--interval", "0"], {}, ["'--interval'"]),
        (["notice-agent"], {"SPOTFALLBACK_IN_POD": "maybe"}, ["SPOTFALLBACK_IN_POD"]),
    ],
)
def test_a_usage_error_is_one_line_naming_the_option_exit_2(cli, args, env, names):
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.strip()]
    assert line.startswith("error: "), line
    for name in names:
        assert name in line, line
    assert line.endswith("--help` lists the options)"), line


def test_help_still_prints_the_help_and_exits_0(cli):
    result = CliRunner().invoke(cli, ["plan", "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output and "--hours" in result.output


@pytest.mark.parametrize(("args", "path", "commands"), [
    (["manifest"], "spotfallback manifest", "kuberay, cluster-launcher, nodepools, validate"),
    ([], "spotfallback", "run, demo, plan, backtest,"),
])
def test_no_command_prints_the_help_and_one_error_line_naming_the_commands(cli, args, path, commands):
    result = CliRunner().invoke(cli, args, prog_name="spotfallback")
    assert result.exit_code == 2
    assert "Usage:" in result.stdout and "error:" not in result.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: missing command: give one of {commands}"), line
    assert line.endswith(f"(`{path} --help` says what each does)"), line


@pytest.mark.parametrize(("args", "path", "hint"), [
    (["look"], "spotfallback", "No such command 'look'"),
    (["manifest", "kubray"], "spotfallback manifest", "Did you mean 'kuberay'?"),
])
def test_an_unknown_command_is_one_line_pointing_at_the_list_of_commands(cli, args, path, hint):
    result = CliRunner().invoke(cli, args, prog_name="spotfallback")
    assert result.exit_code == 2
    [line] = [ln for ln in result.output.splitlines() if ln.strip()]
    assert hint in line and line.endswith(f"(`{path} --help` lists the commands)"), line
