"""docs/walkthrough.md, executed: init, edit, run with two injected spot preemptions, status, report.

Every command of the walk-through's ```bash blocks runs as written, in order, with the
installed `spotfallback` script, in a fresh empty directory (the example training function is
installed with the package, as `spotfallback.examples.ddp_digits`; no PYTHONPATH). The
one difference from a user's machine: `spotfallback run` joins this module's local spot
cluster (SPOTFALLBACK_RAY_ADDRESS, the documented environment form of `--ray-address`) so
that the test can preempt spot nodes while it trains. The final `status` and `report` outputs
are checked against the run's ledger: hours per tier x price = spend shown, to the cent.

The same cluster then pins the exit codes that need a training run: 3 (the training function
fails) and 4 (every tier left). The embedded `ray_address: local` path is
test_cli_run_local_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import (  # noqa: E402
    E2E_ENV,
    REPO,
    SLOW_UNDER_LOAD,
    checkpoints_since,
    local_cluster,
    wait_for,
)

pytestmark = pytest.mark.ray

WALKTHROUGH = REPO / "docs" / "walkthrough.md"
CORE = ("run_started", "workers_acquired", "preempted", "node_failed", "application_failed",
        "capacity_timed_out", "finished")
# What a user's shell has: Ray Train V2 and quick failure detection, but no PYTHONPATH.
USER_ENV = {k: v for k, v in E2E_ENV.items() if k != "PYTHONPATH"}
NOTICE_S = 4.0  # a notice long enough for a just-in-time checkpoint (2 steps + one write)


def kinds(records: list) -> list[str]:
    """The events that move the run (informational ones such as notices are left out)."""
    return [r.event.kind for r in records if r.event.kind in CORE]


def walkthrough_commands() -> list[str]:
    """The commands of the ```bash blocks, continuation lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", WALKTHROUGH.read_text(), flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            commands.append((pending + line).strip())
            pending = ""
    return commands


def test_walkthrough_commands_are_what_the_test_expects():
    cmds = walkthrough_commands()
    heads = [" ".join(shlex.split(c)[:2]) for c in cmds]
    assert heads == ["spotfallback init", "sed -i.bak", "spotfallback run", "spotfallback run",
                     "spotfallback status", "spotfallback report", "spotfallback status", "spotfallback report"], cmds
    assert cmds[2] == "spotfallback run job.yaml"


@pytest.fixture(scope="module")
def cluster():
    # A user's environment: no repository on PYTHONPATH (the example comes with the package).
    with local_cluster(env=USER_ENV, unset=["PYTHONPATH"], e2e_env=False) as c:
        yield c


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A fresh empty directory, as a user's would be: the example comes with the package."""
    workdir = tmp_path / "user"
    workdir.mkdir()
    return workdir


def user_env(cluster) -> dict[str, str]:
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "spotfallback").exists(), "install the package: pip install -e ."
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {
        **env, **USER_ENV,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPOTFALLBACK_RAY_ADDRESS": cluster.address,
        "SPOTFALLBACK_STATUS_EVERY_S": "5",
        "COLUMNS": "200",
    }


class Process:
    """A `spotfallback run` subprocess as ``wait_for`` watches a driver: stop waiting once it ended."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    @property
    def done(self) -> bool:
        return self.popen.poll() is not None

    @property
    def error(self) -> str:
        return f"exit code {self.popen.returncode}"


def shell(command: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command!r} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@SLOW_UNDER_LOAD
def test_walkthrough_end_to_end_with_injected_preemptions(cluster, checkout, tmp_path):
    from spotfallback.accounting import summarize
    from spotfallback.config import JobConfig
    from spotfallback.local import Injector
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import resolve_run
    from spotfallback.view.text import money

    env = user_env(cluster)
    commands = walkthrough_commands()
    phases: dict[str, float] = {}
    t_start = time.monotonic()

    # 1-2: init and edit, as written.
    run_at = commands.index("spotfallback run job.yaml")
    for command in commands[:run_at]:
        shell(command, checkout, env)
    job = JobConfig.from_yaml(checkout / "job.yaml")
    assert job.name == "digits-walkthrough" and job.tiers[0].max_preemptions == 1
    assert job.train_loop_config["total_steps"] == 60 and job.ray_address == "local"
    location = resolve_run(str(checkout / job.storage_path), job.name)
    ledger = Ledger(location)

    # 3: run, while this thread preempts spot nodes (a notice, then the node goes).
    err_path = tmp_path / "run.err"
    with open(tmp_path / "run.out", "w") as out, open(err_path, "w") as err, \
            Injector(cluster, run=location) as injector:
        run = subprocess.Popen(["bash", "-c", commands[run_at]], cwd=checkout, env=env, stdout=out, stderr=err,
                               text=True)
        driver = Process(run)

        def diagnose() -> str:
            records = ledger.read() if location.fs.get_file_info(location.state_dir).type.name == "Directory" else []
            return f"ledger: {[r.event.kind for r in records]}\nrun stderr:\n{err_path.read_text()[-3000:]}"

        try:
            try:
                wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 240, driver)
                phases["first spot checkpoint"] = time.monotonic() - t_start
                injector.preempt_one("spot", notice_s=NOTICE_S)
                injector.replenish("spot")  # a replacement spot node: the run restarts on spot once
                wait_for(ledger, lambda rs: kinds(rs)[-2:] == ["preempted", "workers_acquired"]
                         and checkpoints_since(rs, "workers_acquired") >= 1, 240, driver)
                phases["back on spot"] = time.monotonic() - t_start
                # `status` works while the run goes.
                live = json.loads(shell(f"spotfallback status {job.storage_path}/{job.name} --json", checkout,
                                        env).stdout)
                assert live["status"] in ("running", "waiting") and live["preemptions"] == 1, live
                assert live["driver"] is not None and live["tier"] == "spot"
                assert live["progress"]["total"] == 60  # from the run's metadata, not the job file
                injector.preempt_one("spot", notice_s=NOTICE_S)  # the second preemption spends the budget
                assert run.wait(300) == 0, diagnose()
                phases["finished"] = time.monotonic() - t_start
            except (AssertionError, TimeoutError) as e:
                raise AssertionError(f"{e}\n{diagnose()}") from None
        finally:
            if run.poll() is None:
                run.kill()
    result = json.loads((tmp_path / "run.out").read_text().strip().splitlines()[-1])
    assert result["status"] == "finished" and result["metrics"]["step"] == 60

    # The rest, as written, after the run (storage only; the same command again is refused).
    outputs = {c: shell(c, checkout, env).stdout for c in commands[run_at + 1 :]}
    phases["status and report"] = time.monotonic() - t_start
    print(f"walk-through phases (s since start): { {k: round(v, 1) for k, v in phases.items()} }")

    records = ledger.read()
    assert kinds(records) == ["run_started", "workers_acquired", "preempted", "workers_acquired", "preempted",
                              "workers_acquired", "finished"]
    summary = summarize(job.ladder, records)
    assert summary.tiers[0].preemptions == 2 and summary.state.tier == 1 and summary.status == "finished"
    assert sum(1 for r in records if r.event.kind == "preemption_notice") == 2

    again = next(v for c, v in outputs.items() if c.startswith("spotfallback run"))
    assert again.strip().endswith("exit code 6"), again

    progress_log = err_path.read_text()
    assert "preemption on spot → restart on spot" in progress_log
    assert "fall back to on-demand" in progress_log and "finished on on-demand" in progress_log
    assert "step 60/60" in progress_log and "preemption notice" in progress_log
    if os.environ.get("SPOTFALLBACK_KEEP_WALKTHROUGH"):  # to refresh the sample output in the doc
        import shutil

        shutil.copytree(tmp_path, os.environ["SPOTFALLBACK_KEEP_WALKTHROUGH"], dirs_exist_ok=True, symlinks=True)

    # status (text and JSON) against the ledger.
    status_text = next(v for c, v in outputs.items() if c.startswith("spotfallback status") and "--json" not in c)
    assert "finished" in status_text and f"{money(summary.spend)} so far" in status_text
    assert "step 60/60  (100%)" in status_text  # the total and the bar, as in the live view
    spot_row = next(line.split() for line in status_text.splitlines() if line.split()[:2] == ["spot", "spot"])
    assert spot_row[3:6] == ["2", "0", "0"] and "Whole run: preempted" in status_text  # as the walk-through shows
    status = json.loads((checkout / "status.json").read_text())
    assert status["status"] == "finished" and status["tier"] == "on-demand"
    assert status["spend"] == pytest.approx(summary.spend, abs=1e-9)
    assert status["checkpoints"] == len(summary.checkpoints) and status["progress"]["value"] == 60

    # report: each tier's hours x price = the spend shown, to the cent, and both match the ledger.
    report_text = next(v for c, v in outputs.items() if c.startswith("spotfallback report") and "--json" not in c)
    rows = re.findall(r"│ (spot|on-demand)\s+│ \S+\s+│\s+\$([\d.]+)/h │\s+([\d.]+) h │\s+\$([\d.]+) │", report_text)
    assert [r[0] for r in rows] == ["spot", "on-demand"], report_text
    for (_, price, hours, spend), usage in zip(rows, summary.tiers, strict=True):
        assert float(price) == pytest.approx(usage.price_per_hour)
        # Agree to the cent: shown hours (4 decimals) x price is within half a cent of the spend shown,
        # and the spend shown is the ledger's, rounded as displayed.
        assert abs(float(hours) * float(price) - float(spend)) < 0.005
        assert spend == money(usage.spend).lstrip("$")
        assert float(hours) == pytest.approx(usage.running_s / 3600, abs=5e-5)
    assert "2 preemption notices" in report_text
    cost = json.loads((checkout / "cost.json").read_text())
    for tier, usage in zip(cost["tiers"], summary.tiers, strict=True):
        assert tier["running_h"] * tier["price_per_hour"] == pytest.approx(tier["spend"])
        assert tier["spend"] == pytest.approx(usage.spend) and tier["preemptions"] == usage.preemptions
    assert cost["spend"] == pytest.approx(summary.spend) and cost["on_demand_spend"] == pytest.approx(summary.on_demand_spend)
    assert cost["alpha"] == pytest.approx(summary.spot_fraction) and 0 < cost["alpha"] < 1
    assert cost["interruptions"] == 2 and cost["tier_switches"] == 1 and cost["notices"] == 2
    seed = cost["seed"]
    assert seed["interruptions"] == 2 and seed["predicted"] == pytest.approx(
        (seed["work_h"] + 2 * seed["overhead_h"]) * seed["on_demand_price"] * (1 - seed["discount"] * seed["alpha"]))

    from PIL import Image

    with Image.open(checkout / "timeline.png") as image:
        image.verify()
    with Image.open(checkout / "timeline.png") as image:
        assert 900 <= image.width <= 2000 and 450 <= image.height <= 1400
    assert "data:image/png;base64," in (checkout / "report.html").read_text()


# ---------------------------------------------------------------------------------------
# Exit codes that need a training run, through the installed command on the same cluster.


def write_job(workdir: Path, name: str, tiers: str, config: str) -> None:
    (workdir / "job.yaml").write_text(
        f"name: {name}\nstorage_path: ./runs\nentrypoint: spotfallback.examples.ddp_digits:train_fn\n"
        f"train_loop_config: {config}\nray_address: local\ntiers:\n{tiers}"
    )


def test_a_failing_training_function_exits_3_with_its_traceback(cluster, checkout):
    write_job(checkout, "bug", "  - {name: on-demand, market: on-demand, num_workers: 1, max_failures: 0}\n",
              "{total_steps: 10, raise_at_step: 2}")
    done = subprocess.run(["spotfallback", "run", "job.yaml"], cwd=checkout, env=user_env(cluster),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "error: the training function failed: ValueError: injected application error at step 2" in done.stderr
    assert "On the worker:" in done.stderr and "_maybe_raise" in done.stderr  # the worker's own traceback
    assert '"status": "finished"' not in done.stdout


def test_a_ladder_with_no_capacity_anywhere_exits_4_naming_each_tier(cluster, checkout):
    nowhere = ('  - {name: spot-mars, market: spot, num_workers: 1, capacity_timeout_s: 2,\n'
               '     label_selector: {ray.io/market-type: spot, ray.io/availability-zone: "in(mars-1a,mars-1b)"}}\n')
    write_job(checkout, "nowhere", nowhere, "{total_steps: 10}")
    done = subprocess.run(["spotfallback", "run", "job.yaml"], cwd=checkout, env=user_env(cluster),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 4, done.stderr[-3000:]
    assert "error: run" in done.stderr and "spot-mars" in done.stderr and "--retry-failed" in done.stderr
    # Refused at once afterwards (exit 6) until asked to retry: nothing is silently restarted.
    again = subprocess.run(["spotfallback", "run", "job.yaml"], cwd=checkout, env=user_env(cluster),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 6 and "gave up earlier" in again.stderr, again.stderr
