"""Recovery after a preemption on the local spot cluster: plain Ray Train vs spotfallback.

Three scenarios, alternated and repeated on one cluster (head + 3 spot + 2 on-demand
one-CPU nodes, so a spare node of each market is always up and node start-up time does not
enter the comparison):

- ``ray-restart``: plain ``TorchTrainer`` pinned to spot, ``FailureConfig(max_failures=3,
  max_preemption_failures=3)``: a preemption and Ray's own restart on spot.
- ``sf-restart``: ``FallbackTrainer`` with spot ``max_preemptions=3``: same-tier restart.
- ``sf-switch``: ``FallbackTrainer`` with spot ``max_preemptions=0``: the preemption spends
  the budget and the run resumes on the on-demand tier.

Each run trains the DDP example; once it has reached step 8, one spot node that hosts a
worker is preempted (1 s notice, then killed). Recovery is measured from the kill to the
first training step reported after the restart (the first report after a pause of at least
2 s), from a ``UserCallback`` that timestamps every report in the controller.

Usage: ``python bench/bench_recovery.py [--reps 3] [--out docs/recovery.json]``; prints a
markdown table and writes the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers_e2e import Background, apply_env  # noqa: E402

CONFIG = {"total_steps": 24, "checkpoint_every": 4, "step_delay_s": 0.1, "seed": 3}


def report_times_callback():
    import ray.train

    class StepTimes(ray.train.UserCallback):
        """Timestamps every report; lives in the controller, so it writes to a file."""

        def __init__(self, path: str):
            self.path = path

        def after_report(self, run_context, metrics, checkpoint):  # noqa: ANN001
            step = metrics[0].get("step") if metrics else None
            with open(self.path, "a") as f:
                f.write(json.dumps({"t": time.time(), "step": step}) + "\n")

    return StepTimes


def read_steps(path: str) -> list[tuple[float, int]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(d["t"], d["step"]) for d in map(json.loads, f) if d.get("step") is not None]


def one_run(cluster, injector, scenario: str, storage: str) -> dict:
    import ray.train
    from examples.ddp_digits import train_fn
    from ray.train.torch import TorchTrainer

    from spotfallback import FallbackTrainer, Tier

    steps_file = os.path.join(storage, f"{scenario}-{uuid.uuid4().hex[:6]}.jsonl")
    callback = report_times_callback()(steps_file)
    name = f"{scenario}-{uuid.uuid4().hex[:6]}"
    if scenario == "ray-restart":
        trainer = TorchTrainer(
            train_fn,
            train_loop_config=CONFIG,
            scaling_config=ray.train.ScalingConfig(num_workers=2, label_selector={"ray.io/market-type": "spot"}),
            run_config=ray.train.RunConfig(
                storage_path=storage, name=name, callbacks=[callback],
                failure_config=ray.train.FailureConfig(max_failures=3, max_preemption_failures=3),
            ),
        )
    else:
        budget = 3 if scenario == "sf-restart" else 0
        trainer = FallbackTrainer(
            train_fn,
            train_loop_config=CONFIG,
            tiers=[Tier.spot(2, max_preemptions=budget, capacity_timeout_s=120), Tier.on_demand(2)],
            run_config=ray.train.RunConfig(storage_path=storage, name=name, callbacks=[callback]),
        )
    driver = Background(trainer.fit)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        steps = read_steps(steps_file)
        if steps and steps[-1][1] >= 8:
            break
        if driver.done:
            raise RuntimeError(f"{scenario} ended before the fault: {driver.error!r}")
        time.sleep(0.05)
    else:
        raise TimeoutError(f"{scenario}: no progress")
    injector.preempt_one("spot", notice_s=1.0)
    killed = time.time()
    driver.join(300)
    if driver.error is not None:
        raise RuntimeError(f"{scenario} failed: {driver.error!r}")
    # The restart is the first report after a pause of >= 2 s following the kill (reports come
    # every ~0.3 s while training; a restart takes several seconds). Reports of the old gang
    # can still arrive just after the kill, so they count as "before".
    steps = read_steps(steps_file)
    restart = next(
        i for i in range(1, len(steps)) if steps[i][0] > killed and steps[i][0] - steps[i - 1][0] >= 2.0
    )
    first_t, first_step = steps[restart]
    last_before = max(s for _, s in steps[:restart])
    injector.replenish("spot")
    return {
        "scenario": scenario,
        "recovery_s": first_t - killed,
        "redone_steps": last_before - (first_step - 1),
        "last_step_before": last_before,
        "first_step_after": first_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "docs" / "recovery.json"))
    parser.add_argument("--markdown", default=str(REPO / "docs" / "recovery.md"))
    parser.add_argument("--render", action="store_true", help="re-render the markdown from --out and exit")
    args = parser.parse_args()
    if args.render:
        Path(args.markdown).write_text(render(json.loads(Path(args.out).read_text())))
        return
    apply_env()
    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup

    results: list[dict] = []
    scenarios = ["ray-restart", "sf-restart", "sf-switch"]
    storage = tempfile.mkdtemp(prefix="bench-recovery-")
    with LocalSpotCluster([NodeGroup("spot", count=3), NodeGroup("on-demand", count=2)], connect=True) as cluster, Injector(cluster) as injector:
        for rep in range(args.reps):
            order = scenarios if rep % 2 == 0 else scenarios[::-1]
            for scenario in order:
                r = one_run(cluster, injector, scenario, storage)
                r["rep"] = rep
                results.append(r)
                print(json.dumps(r), flush=True)
    machine = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        machine = f"{os.cpu_count()} cores, {model}"
    except (OSError, StopIteration):
        pass
    import ray

    data = {
        "machine": machine,
        "ray": ray.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": f"python bench/bench_recovery.py --reps {args.reps}",
        "results": results,
    }
    Path(args.out).write_text(json.dumps(data, indent=1))
    Path(args.markdown).write_text(render(data))
    print(render(data))


def render(data: dict) -> str:
    """The results page: summary table (medians and ratios) and every run."""
    results = data["results"]
    scenarios = ["ray-restart", "sf-restart", "sf-switch"]
    medians = {s: statistics.median(r["recovery_s"] for r in results if r["scenario"] == s) for s in scenarios}
    lines = [
        "| scenario | recovery median (s) | min–max (s) | ratio to plain Ray restart | steps redone | runs |",
        "|---|---|---|---|---|---|",
    ]
    for s in scenarios:
        xs = [r["recovery_s"] for r in results if r["scenario"] == s]
        redone = [r["redone_steps"] for r in results if r["scenario"] == s]
        lines.append(
            f"| {s} | {medians[s]:.1f} | {min(xs):.1f}–{max(xs):.1f} | {medians[s] / medians['ray-restart']:.2f}× | {redone} | {len(xs)} |"
        )
    runs = "\n".join(
        f"| {r['rep']} | {r['scenario']} | {r['recovery_s']:.2f} | {r['last_step_before']} | {r['first_step_after']} |"
        for r in results
    )
    return (
        "# Recovery after a preemption: plain Ray Train vs spotfallback\n\n"
        "Written by `bench/bench_recovery.py` (do not edit by hand; `python bench/bench_recovery.py --render` "
        "re-renders it from docs/recovery.json). " + (__doc__ or "").split("\n\n", 1)[1].split("\n\nUsage")[0].strip() + "\n\n"
        f"- command: `{data['command']}` (`make bench` runs it)\n"
        f"- machine: {data['machine']}; Ray {data['ray']}; {data['date']}\n"
        "- the machine is shared and other work was running, so compare the ratios within one run, "
        "not absolute seconds across runs\n\n" + "\n".join(lines) + "\n\n"
        "Target for the tier switch: at most 1.1× a plain Ray Train restart. The switch is an ordinary Ray "
        "restart with the next tier's label selector and size, so it costs what a restart costs.\n\n"
        "Every run:\n\n| rep | scenario | recovery (s) | last step before | first step after |\n|---|---|---|---|---|\n"
        f"{runs}\n"
    )

if __name__ == "__main__":
    main()
