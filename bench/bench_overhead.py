"""Figure 1: the cost of spotfallback when nothing fails, next to plain Ray Train.

The DDP example (2 workers on the spot nodes) runs to completion through ``FallbackTrainer``
(one spot tier) and through a plain ``TorchTrainer`` with the same label selector and
``FailureConfig``, alternating which goes first in each repetition. Measured in the driver:
wall time from building the trainer to ``fit()`` returning; from rank 0's step log: the time
to the first step and the median step. The spotfallback runs also give the harness its
calibration of start-up, step and checkpoint times (figure 7).
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Figure, Measurement, Stat, Target, ratio_pairs, table, values
from bench.runs import (
    Context,
    alternating,
    fallback_trainer,
    median,
    read_jsonl,
    stamps_callback,
    step_intervals,
    torch_trainer,
    unique,
)

CONFIG = {"total_steps": 40, "checkpoint_every": 10, "step_delay_s": 0.1, "seed": 5}
QUICK = {**CONFIG, "total_steps": 30}
VARIANTS = ("ray", "spotfallback")


def config(ctx: Context) -> dict[str, Any]:
    return dict(QUICK if ctx.quick else CONFIG)


def one_run(ctx: Context, variant: str, rep: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from spotfallback import Tier

    log = ctx.path(f"overhead-{variant}", ".steps")
    stamps = ctx.path(f"overhead-{variant}", ".stamps")
    run_cfg = {**cfg, "step_log": str(log)}
    name = unique(f"overhead-{variant}")
    callbacks = [stamps_callback(stamps)]
    t0 = time.time()
    if variant == "spotfallback":
        trainer = fallback_trainer(run_cfg, ctx.storage, name, [Tier.spot(2, max_preemptions=3, max_failures=3)], callbacks=callbacks)
    else:
        trainer = torch_trainer(run_cfg, ctx.storage, name, callbacks=callbacks)
    result = trainer.fit()
    t1 = time.time()
    steps = read_jsonl(log)
    marks = {s["event"]: s["t"] for s in reversed(read_jsonl(stamps))}  # first of each
    plain, ckpt = step_intervals(steps, cfg["checkpoint_every"])
    step_s = median(plain)
    row: dict[str, Any] = {
        "variant": variant,
        "rep": rep,
        "wall_s": t1 - t0,
        "to_first_step_s": steps[0]["t"] - t0 if steps else None,
        # Where the time to the first step goes: until the controller asks for the worker
        # group, until the group is placed and started, until the first step is done.
        "to_acquiring_s": marks["acquiring"] - t0 if "acquiring" in marks else None,
        "to_acquired_s": marks["acquired"] - t0 if "acquired" in marks else None,
        "train_s": steps[-1]["t"] - steps[0]["t"] if steps else None,
        "step_s": step_s,
        "checkpoint_extra_s": median(ckpt) - step_s if ckpt else None,
        "after_last_step_s": t1 - steps[-1]["t"] if steps else None,
        "steps": len(steps),
        "weights": (result.metrics or {}).get("weights_sha256", "")[:16],
    }
    if variant == "spotfallback":
        records = trainer.ledger.read()
        times = {r.event.kind: r.t for r in reversed(records)}  # first of each kind
        started, acquired, finished = times.get("run_started"), times.get("workers_acquired"), None
        finished = next((r.t for r in records if r.event.kind == "finished"), None)
        if started:
            row["to_run_started_s"] = started - t0  # the driver's own work: lease, ledger, replay
        if started and acquired and steps:
            row["startup_wait_s"] = acquired - started  # unbilled: placing the gang
            row["first_overhead_s"] = steps[0]["t"] - step_s - acquired  # billed: workers up -> first step starts
        if finished and steps:
            row["teardown_s"] = finished - steps[-1]["t"]  # billed: last step -> run recorded finished
        done = {s["step"]: s["t"] for s in steps}
        lags = [r.t - done[r.event.step] for r in records if r.event.kind == "checkpoint_committed" and r.event.step in done]
        if lags:
            row["commit_lag_s"] = median(lags)  # step computed -> its checkpoint recorded in the ledger
    return row


def run(ctx: Context) -> list[dict[str, Any]]:
    cfg = config(ctx)
    rows = []
    for rep in range(ctx.reps(4, 2)):
        order = alternating(VARIANTS, rep)
        for variant in order:
            row = one_run(ctx, variant, rep, cfg)
            ctx.log(f"overhead {variant} rep {rep}: {row['wall_s']:.1f} s, step {row['step_s']:.3f} s")
            rows.append(row)
    return rows


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    return [
        Figure(1, "No-failure overhead: `fit()` wall time, spotfallback / plain Ray Train", "×",
               Target("≤ 1.02×", max=1.02), Stat.of(ratio_pairs(rows, "rep", "spotfallback", "ray", "wall_s")), 3),
        Figure(1, "No-failure overhead: median step time, spotfallback / plain Ray Train", "×",
               Target("≤ 1.02×", max=1.02), Stat.of(ratio_pairs(rows, "rep", "spotfallback", "ray", "step_s")), 3),
        Figure(1, "No-failure overhead: time to the first step, spotfallback − plain Ray Train", "s",
               Target("report"), Stat.of(_differences(rows, "to_first_step_s")), 2),
    ]


def _differences(rows: list[dict[str, Any]], value: str) -> list[float]:
    by_rep: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get(value) is not None:
            by_rep.setdefault(r["rep"], {})[r["variant"]] = r[value]
    return [d["spotfallback"] - d["ray"] for d in by_rep.values() if len(d) == 2]


def describe(rows: list[dict[str, Any]]) -> str:
    steps = rows[0]["steps"] if rows else "?"
    same = len({r["weights"] for r in rows}) == 1
    nan = float("nan")
    body = [
        (r["rep"], r["variant"], r["wall_s"], r.get("to_acquiring_s", nan), r.get("to_acquired_s", nan), r["to_first_step_s"],
         r["train_s"], r["step_s"], r.get("checkpoint_extra_s", nan), r["after_last_step_s"], r["weights"])
        for r in rows
    ]
    walls = {v: Stat.of(values(rows, "wall_s", variant=v)).median for v in VARIANTS}
    return (
        (__doc__ or "").split("\n\n", 1)[1].strip()
        + f"\n\nEach run trains {steps} steps. Median `fit()` wall time: plain Ray Train {walls['ray']:.1f} s, "
        f"spotfallback {walls['spotfallback']:.1f} s. Final weights identical across all runs: {same}.\n\n"
        + table(
            ["rep", "variant", "fit() wall (s)", "→ worker group requested (s)", "→ workers started (s)", "→ first step (s)",
             "first→last step (s)", "median step (s)", "checkpoint extra (s)", "last step→fit() returns (s)", "weights"],
            body,
        )
    )


def explain(rows: list[dict[str, Any]]) -> str:
    """Why the wall-time ratio misses, from the rows: spotfallback's fixed start-up against the job's length."""
    pre = Stat.of(values(rows, "to_run_started_s", variant="spotfallback")).median
    wall = Stat.of(values(rows, "wall_s", variant="ray")).median
    step = Stat.of(ratio_pairs(rows, "rep", "spotfallback", "ray", "step_s")).median
    first = Stat.of(_differences(rows, "to_first_step_s"))
    return (
        f"Why: training is not slower (median step ratio {step:.3f}×); the difference is fixed start-up. spotfallback's "
        f"driver spends {pre:.2f} s (median) between `fit()` and the run's start, nearly all of it in "
        "`DriverLease.acquire` (`src/spotfallback/store/lease.py`): it writes the run's lease, then sleeps `settle_s` = "
        "min(1 s, lease TTL / 10) before reading it back, so that of two drivers started on one run at the same "
        f"moment exactly one goes on (the wall-time profile below shows the driver waiting there). On this "
        f"{wall:.0f}-second job that is {pre / wall:.1%} by itself; on a one-hour job {pre / 3600:.2%}. Ray Train's "
        f"own start-up varies by more than that from run to run here: the time to the first step differed by "
        f"{first.lo:+.1f} to {first.hi:+.1f} s between the paired runs. Why it stays: the settle is what lets two "
        "drivers started at the same instant agree on one winner (`tests/e2e/test_reliability_drivers.py` starts two); "
        "it must outlast the other driver's read-then-write of the lease, which a loaded machine or a slow object "
        "store stretches, so it is not cut to fit a benchmark job. Overlapping it with Ray Train's start-up would "
        "let a losing driver start a cluster's worth of workers before it learns it lost. The target is met on "
        "step time, which is what a real (hour-long) job's wall time is made of."
    )


MEASUREMENT = Measurement(
    name="overhead", items=(1,), title="No-failure overhead", run=run, figures=figures, describe=describe,
    explain=explain,
)


def profile(ctx: Context) -> str:
    """Where the driver's wall time goes in one spotfallback run (py-spy, waiting included)."""
    from bench.profiling import record

    return record(lambda: one_run(ctx, "spotfallback", -1, config(ctx)), wall=True)
