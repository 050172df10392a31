"""docs/walkthrough.md, executed: init, edit, run with two injected spot preemptions, status, report.

Every command of the walk-through's ```bash blocks runs as written, in order, in a fresh
directory, with the installed `spotfallback` script. The one difference from a user's
machine: `spotfallback run` joins this test's local spot cluster (SPOTFALLBACK_RAY_ADDRESS,
the documented override of the job's ray_address) so that the test can preempt spot nodes
while it trains. Ray local nodes can only be removed from the thread that started them, so
the injections happen here, on the main thread. The final `status` and `report` outputs are
checked against the run's ledger: hours per tier x price = spend shown, to the cent.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers_e2e import E2E_ENV, REPO, checkpoints_since, wait_for  # noqa: E402

pytestmark = pytest.mark.ray

WALKTHROUGH = REPO / "docs" / "walkthrough.md"
CORE = ("run_started", "workers_acquired", "preempted", "node_failed", "application_failed",
        "capacity_timed_out", "finished")


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
    assert heads == ["spotfallback init", "sed -i.bak", "spotfallback run", "spotfallback status",
                     "spotfallback report", "spotfallback status", "spotfallback report"], cmds


@pytest.mark.slow
def test_walkthrough_end_to_end_with_injected_preemptions(tmp_path):
    os.environ.update(E2E_ENV)  # before the cluster starts: raylets inherit it
    from spotfallback.accounting import summarize
    from spotfallback.config import JobConfig
    from spotfallback.ledger import Ledger
    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup
    from spotfallback.progress import money
    from spotfallback.storage import resolve_run

    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "spotfallback").exists(), "install the package: pip install -e ."
    workdir = tmp_path / "user"
    workdir.mkdir()
    commands = walkthrough_commands()

    def shell(command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{command!r} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        return done

    with LocalSpotCluster([NodeGroup("spot", count=2), NodeGroup("on-demand", count=2)], connect=True) as cluster, \
            Injector(cluster) as injector:
        env = {
            **os.environ, **E2E_ENV,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "SPOTFALLBACK_RAY_ADDRESS": cluster.address,
            "SPOTFALLBACK_STATUS_EVERY_S": "5",
            "COLUMNS": "200",
        }
        # 1-2: init and edit, as written.
        run_at = commands.index("spotfallback run job.yaml")
        for command in commands[:run_at]:
            shell(command)
        job = JobConfig.from_yaml(workdir / "job.yaml")
        assert job.name == "digits-walkthrough" and job.tiers[0].max_preemptions == 1
        assert job.train_loop_config["total_steps"] == 60
        ledger = Ledger(resolve_run(str(workdir / job.storage_path), job.name))

        # 3: run, while this thread preempts spot nodes.
        out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")  # noqa: SIM115
        run = subprocess.Popen(["bash", "-c", commands[run_at]], cwd=workdir, env=env, stdout=out, stderr=err, text=True)
        try:
            wait_for(ledger, lambda rs: checkpoints_since(rs, "workers_acquired", tier=0) >= 1, 180)
            injector.preempt_one("spot", notice_s=1.0)
            injector.replenish("spot")  # a replacement spot node: the run restarts on spot once
            wait_for(ledger, lambda rs: kinds(rs)[-2:] == ["preempted", "workers_acquired"]
                     and checkpoints_since(rs, "workers_acquired") >= 1, 180)
            # `status` works while the run goes.
            live = json.loads(shell(f"spotfallback status {job.storage_path}/{job.name} --json").stdout)
            assert live["status"] in ("running", "waiting") and live["preemptions"] == 1, live
            assert live["driver"] is not None and live["tier"] == "spot"
            injector.preempt_one("spot", notice_s=1.0)  # the second preemption spends the budget
            assert run.wait(300) == 0, (tmp_path / "run.err").read_text()[-4000:]
        finally:
            if run.poll() is None:
                run.kill()
            out.close()
            err.close()
        result = json.loads((tmp_path / "run.out").read_text().strip().splitlines()[-1])
        assert result["status"] == "finished" and result["metrics"]["step"] == 60

    # 4-6: status and report, as written, after the run (the cluster is gone: storage only).
    outputs = {c: shell(c).stdout for c in commands[run_at + 1 :]}

    records = ledger.read()
    assert kinds(records) == ["run_started", "workers_acquired", "preempted", "workers_acquired", "preempted",
                              "workers_acquired", "finished"]
    summary = summarize(job.ladder, records)
    assert summary.tiers[0].preemptions == 2 and summary.state.tier == 1 and summary.status == "finished"

    progress_log = (tmp_path / "run.err").read_text()
    assert "preemption on spot → restart on spot" in progress_log
    assert "fall back to on-demand" in progress_log and "finished on on-demand" in progress_log
    assert "step 60/60" in progress_log

    # status (text and JSON) against the ledger.
    status_text = next(v for c, v in outputs.items() if c.startswith("spotfallback status") and "--json" not in c)
    assert "finished" in status_text and f"{money(summary.spend)} so far" in status_text
    status = json.loads((workdir / "status.json").read_text())
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
    cost = json.loads((workdir / "cost.json").read_text())
    for tier, usage in zip(cost["tiers"], summary.tiers, strict=True):
        assert tier["running_h"] * tier["price_per_hour"] == pytest.approx(tier["spend"])
        assert tier["spend"] == pytest.approx(usage.spend) and tier["preemptions"] == usage.preemptions
    assert cost["spend"] == pytest.approx(summary.spend) and cost["on_demand_spend"] == pytest.approx(summary.on_demand_spend)
    assert cost["alpha"] == pytest.approx(summary.spot_fraction) and 0 < cost["alpha"] < 1
    assert cost["interruptions"] == 2 and cost["tier_switches"] == 1
    seed = cost["seed"]
    assert seed["interruptions"] == 2 and seed["predicted"] == pytest.approx(
        (seed["work_h"] + 2 * seed["overhead_h"]) * seed["on_demand_price"] * (1 - seed["discount"] * seed["alpha"]))

    from PIL import Image

    with Image.open(workdir / "timeline.png") as image:
        image.verify()
    with Image.open(workdir / "timeline.png") as image:
        assert 900 <= image.width <= 2000 and 450 <= image.height <= 1400
    assert "data:image/png;base64," in (workdir / "report.html").read_text()
    if os.environ.get("SPOTFALLBACK_KEEP_WALKTHROUGH"):  # to refresh docs/timeline.png from a real run
        import shutil

        shutil.copytree(tmp_path, os.environ["SPOTFALLBACK_KEEP_WALKTHROUGH"], dirs_exist_ok=True)
