"""Moving a run to another Ray cluster vs a tier switch within one: kill -> first step, and its parts.

`.venv/bin/python -m bench.bench_clusters [--reps 2] [--out rows.json]`, or item 13 of
`python -m bench` (`--only clusters`), which runs this module in a process of its own: one
Ray driver per process, and the harness's own cluster stays connected.

Two local Ray clusters side by side with their Jobs APIs (`LocalSpotCluster(jobs_api=True)`),
the run's storage on the local S3 server (moto), the moving driver (`ClusterMover`) in this
process, the DDP example (1 worker, a checkpoint every 4 steps). In one session, alternated:

- **across**: spot on cluster A, then on-demand on cluster B; A's spot node killed (no notice)
  after step 6: the driver on A records the failure and stops (exit 8), the mover submits
  the run to B, which resumes from the checkpoint of step 4.
- **within**: the same two tiers, both on cluster B (the same mover, one Ray job); B's spot
  node killed after step 6: Ray Train's controller restarts the gang on B's on-demand node.

Parts, from the example's step log, the ledger and the Jobs API: *detect* (kill -> the failure
in the ledger), *stop* (-> A's job ended), *submit* (-> B's job started: the mover's poll and
the submission), *driver* (-> `run_started`: the job's process, imports, `ray.init`, the
lease), *workers* (-> `workers_acquired` on B), *restore + step* (-> the first step after
the kill's, restored from the checkpoint). Every run's final weights are compared with an
uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import REPO, Figure, Measurement, Stat, Target, cpu_model, table, values
from bench.runs import Context, alternating

CONFIG = {"total_steps": 24, "checkpoint_every": 4, "step_delay_s": 0.3, "seed": 7}
KILL_AFTER_STEP = 6
SCENARIOS = ("across", "within")
BIN = Path(sys.executable).parent


def _job(s3: Any, name: str, step_log: Path, spot: str, on_demand: str, a_name: str, b_name: str) -> Any:
    from spotfallback.config import JobConfig

    return JobConfig.model_validate({
        "name": name,
        "storage_path": s3.uri("bench"),
        "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
        "train_loop_config": {**CONFIG, "step_log": str(step_log)},
        "tiers": [
            {"name": "spot", "market": "spot", "num_workers": 1, "max_preemptions": 0, "max_failures": 0,
             "capacity_timeout_s": 60, "cluster": {"address": spot, "name": a_name}},
            {"name": "on-demand", "market": "on-demand", "num_workers": 1, "capacity_timeout_s": 60,
             "cluster": {"address": on_demand, "name": b_name}},
        ],
    })


def _steps(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(what: str, check: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(poll_s)


def one_run(scenario: str, s3: Any, a: Any, b: Any, workdir: Path, reference: str) -> dict[str, Any]:
    """One run of ``scenario``: kill the spot node after step ``KILL_AFTER_STEP``, time each part."""
    from spotfallback.clusters import ClusterMover
    from spotfallback.local import Injector

    spot_cluster = a if scenario == "across" else b
    log = workdir / f"{scenario}-{uuid.uuid4().hex[:6]}.steps"
    name = f"bench-{scenario}-{uuid.uuid4().hex[:6]}"
    a_name = "a" if scenario == "across" else "b"
    job = _job(s3, name, log, spot_cluster.jobs_address, b.jobs_address, a_name, "b")
    mover = ClusterMover(job, poll_s=0.25)
    result: dict[str, Any] = {}

    def go() -> None:
        result["outcome"] = mover.run()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    _wait("the kill step", lambda: any(s["step"] >= KILL_AFTER_STEP for s in _steps(log)), 180)
    with Injector(spot_cluster) as injector:
        killed_at = time.time()
        assert injector.kill_one("spot") is not None
        thread.join(300)
        injector.replenish("spot")  # for the next run
    outcome = result["outcome"]
    assert outcome.exit_code == 0, outcome.message
    records = mover.ledger.read()
    steps = _steps(log)
    failure = next(r for r in records if r.event.kind in ("node_failed", "preempted") and r.t >= killed_at - 1)
    acquired = [r for r in records if r.event.kind == "workers_acquired" and r.t > failure.t]
    # The new gang's first step (the killed process may log one more step while it dies).
    resumed = next(s for s in steps if s["t"] > acquired[0].t)
    last_before = max(s["step"] for s in steps if s["t"] < failure.t)
    row: dict[str, Any] = {
        "scenario": scenario,
        "kill_to_step_s": resumed["t"] - killed_at,
        "detect_s": failure.t - killed_at,
        "workers_s": acquired[0].t - failure.t,
        "restore_step_s": resumed["t"] - acquired[0].t,
        "redone_steps": last_before - resumed["step"] + 1,
        "identical": (outcome.result or {}).get("metrics", {}).get("weights_sha256") == reference,
    }
    if scenario == "across":
        uri = mover.location.uri()
        ended_a = max(j.end_time or 0.0 for j in mover.clusters["a"].jobs_of(uri))
        started_b = min(j.start_time for j in mover.clusters["b"].jobs_of(uri))
        run_started_b = next(r for r in records if r.event.kind == "run_started" and r.t > failure.t)
        row.update(stop_s=ended_a - failure.t, submit_s=started_b - ended_a, driver_s=run_started_b.t - started_b,
                   workers_s=acquired[0].t - run_started_b.t)
    return row


def measure(reps: int, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``reps`` runs of each scenario on the same two clusters, alternated."""
    import ray.train
    from tests.support.helpers_e2e import E2E_ENV
    from tests.support.s3server import S3Server

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn
    from spotfallback.local import LocalSpotCluster, NodeGroup

    workdir = Path(tempfile.mkdtemp(prefix="sf-bench-clusters-"))
    rows: list[dict[str, Any]] = []
    with S3Server() as s3:
        os.environ.update({**E2E_ENV, **s3.env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                           "SPOTFALLBACK_LEASE_TTL_S": "6"})
        os.environ.pop("RAY_ADDRESS", None)
        a = LocalSpotCluster([NodeGroup("spot", count=1)], jobs_api=True).start()
        b = LocalSpotCluster([NodeGroup("spot", count=1), NodeGroup("on-demand", count=1)], jobs_api=True).start()
        try:
            with b.driver():
                ref = FallbackTrainer(train_fn, train_loop_config=CONFIG, tiers=[Tier.on_demand(1)],
                                      run_config=ray.train.RunConfig(storage_path=str(workdir / "ref"), name="ref")).fit()
            reference = str(ref.metrics["weights_sha256"])
            for rep in range(reps):
                for scenario in alternating(SCENARIOS, rep):
                    row = one_run(scenario, s3, a, b, workdir, reference)
                    row["rep"] = rep
                    log(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
                    rows.append(row)
        finally:
            a.shutdown()
            b.shutdown()
    return rows


def run(ctx: Context) -> list[dict[str, Any]]:
    """The measurement in a child process (its two clusters and their drivers), its rows read back."""
    out = ctx.path("clusters", ".json")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run([sys.executable, "-m", "bench.bench_clusters", "--reps", str(ctx.reps(2)), "--out", str(out)],
                   cwd=REPO, env=env, check=True, stdout=sys.stderr)
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return [{**r, "variant": r["scenario"]} for r in rows]


def _extra(rows: list[dict[str, Any]]) -> list[float]:
    """Per repetition: the move's kill -> first step less the switch's."""
    by_rep: dict[Any, dict[str, float]] = {}
    for r in rows:
        by_rep.setdefault(r["rep"], {})[r["scenario"]] = float(r["kill_to_step_s"])
    return [d["across"] - d["within"] for d in by_rep.values() if set(SCENARIOS) <= d.keys()]


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    report = Target("report")
    return [
        Figure(13, "Kill → first step on the next tier, moved to another cluster (spot node killed without notice)", "s",
               report, Stat.of(values(rows, "kill_to_step_s", scenario="across")), 1),
        Figure(13, "Kill → first step on the next tier, switched within one cluster", "s", report,
               Stat.of(values(rows, "kill_to_step_s", scenario="within")), 1),
        Figure(13, "A move's time over a switch within one cluster, per repetition", "s", report, Stat.of(_extra(rows)), 1),
        Figure(13, "Runs whose final weights equal an uninterrupted run's", "share", Target("every run", min=1.0),
               Stat.of([float(bool(r["identical"])) for r in rows]), 2, worst=True),
    ]


def describe(rows: list[dict[str, Any]]) -> str:
    parts = ["kill_to_step_s", "detect_s", "stop_s", "submit_s", "driver_s", "workers_s", "restore_step_s", "redone_steps"]
    body = [(r["rep"], r["scenario"], *("–" if r.get(k) is None else round(float(r[k]), 2) for k in parts), r["identical"])
            for r in rows]
    return ((__doc__ or "").split("\n\n", 2)[2].strip() + "\n\n"
            + table(["rep", "scenario", "kill → step (s)", "detect (s)", "stop (s)", "submit (s)", "driver (s)", "workers (s)",
                     "restore + step (s)", "steps redone", "weights identical"], body))


MEASUREMENT = Measurement(
    name="clusters", items=(13,), title="A move to another cluster against a switch within one", run=run, figures=figures,
    describe=describe, cluster=False,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="Write the rows as JSON here.")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = measure(args.reps, log=lambda line: print(line, flush=True))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    for scenario in SCENARIOS:
        mine = [r for r in rows if r["scenario"] == scenario]
        keys = [k for k in mine[0] if k.endswith("_s")]
        print(f"{scenario}: " + ", ".join(f"{k} {sorted(round(r[k], 2) for r in mine)}" for k in keys)
              + f", identical {[r['identical'] for r in mine]}")


if __name__ == "__main__":
    main()
