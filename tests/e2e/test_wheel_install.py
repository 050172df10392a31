"""What a user installs: the built wheel, in a clean venv, runs plan, backtest, the demo and a job.

``scripts/wheel_smoke.sh`` builds the sdist and the wheel, installs the wheel with its torch extra
into a fresh venv and runs ``spotfallback plan`` and ``backtest`` on a made-up trace, ``spotfallback
demo`` and ``spotfallback init && spotfallback run job.yaml`` in an empty directory outside the
checkout. The rest of the suite imports the package from the source tree (an editable install);
only this catches a wheel that lacks a file, or code that reaches for the checkout.

It runs as the suite's first test, beside the cluster tests: about four minutes, most of them
waits (pip, the demo's preemptions), that a step before the suite would add to its time whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # the demo and the job each start a local Ray cluster

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wheel_smoke.sh"
# The script takes about 4 minutes alone; beside two cluster modules on 2 cores, twice that.
TIMEOUT_S = 1500
_SUITE_PREFIXES = ("RAY_", "SPOTFALLBACK_", "PYTEST_", "HYPOTHESIS_")


def a_users_environment() -> dict[str, str]:
    """This process's environment less what the suite set for its own clusters and runs.

    A user's shell has none of the suite's Ray settings; the wheel must work without them.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith(_SUITE_PREFIXES) and k != "PYTHONPATH"}


def test_the_built_wheel_installs_and_runs_plan_the_demo_and_a_job_from_an_empty_directory():
    env = {**a_users_environment(), "BUILD_PYTHON": sys.executable}
    # Its own session, so that a timeout stops the script and every process it started.
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"scripts/wheel_smoke.sh still running after {TIMEOUT_S} s:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    assert out.rstrip().endswith("wheel-smoke: passed"), out[-6000:]
