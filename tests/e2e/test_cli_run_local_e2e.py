"""`spotfallback run` with `ray_address: local`: the embedded local spot cluster, end to end.

The job file's default address starts a small labelled cluster inside the command
(``cli_run`` -> ``LocalSpotCluster.for_ladder``: one node per worker of each tier), trains,
and stops every process it started. Run here as a user would, from a directory holding the
repository's `examples/`, with no PYTHONPATH and no cluster of the test's own, and with
`--json`, so the JSON lines a machine reads are checked too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.helpers_e2e import E2E_ENV  # noqa: E402

pytestmark = pytest.mark.ray

JOB = """\
name: tiny-local
storage_path: ./runs
entrypoint: spotfallback.examples.ddp_digits:train_fn
train_loop_config: {total_steps: 12, checkpoint_every: 4}
ray_address: local
tiers:
  - {name: spot, market: spot, num_workers: 1, max_preemptions: 1, price_per_worker_hour: 0.92}
  - {name: on-demand, market: on-demand, num_workers: 1, price_per_worker_hour: 3.06}
"""


def test_a_job_on_the_embedded_local_cluster_runs_to_the_end_with_json_lines(tmp_path):
    workdir = tmp_path / "user"
    workdir.mkdir()
    (workdir / "job.yaml").write_text(JOB)
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPOTFALLBACK_RAY_ADDRESS", "RAY_ADDRESS")}
    env.update({k: v for k, v in E2E_ENV.items() if k != "PYTHONPATH"})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    done = subprocess.run(["spotfallback", "run", "job.yaml", "--json"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"spotfallback run with ray_address: local took {took:.1f}s")

    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(done.stdout.splitlines()), done.stdout  # stdout is JSON lines only
    result = lines[-1]
    assert result["type"] == "result" and result["status"] == "finished" and result["metrics"]["step"] == 12
    assert result["run"] == f"{workdir}/runs/tiny-local"
    events = [o for o in lines[:-1] if o["type"] == "event"]
    assert [e["kind"] for e in events if e["kind"] != "checkpoint_committed"] == [
        "run_started", "workers_acquired", "finished"]
    assert [e["step"] for e in events if e["kind"] == "checkpoint_committed"] == [4, 8, 12]
    assert all(e["tier"] == "spot" for e in events)
    statuses = [o for o in lines[:-1] if o["type"] == "status"]
    assert statuses[-1]["status"] == "finished" and statuses[-1]["progress"]["total"] == 12
    assert statuses[-1]["spend"] > 0 and statuses[-1]["workers_wanted"] == 1

    # The embedded cluster is gone with the command; `status` reads the run from storage.
    status = subprocess.run(["spotfallback", "status", "runs/tiny-local", "--json"], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "finished", status.stderr
