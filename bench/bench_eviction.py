"""Figure 5: work redone per eviction, with and without a preemption notice, next to plain Ray Train.

The scenarios are ``bench/bench_notices.py``'s, run on the harness's cluster: the DDP
example (2 workers, 30 steps, a checkpoint every 5 steps) is evicted once rank 0 has
completed step 8, on the node of rank 1. *With a notice*: a drain with reason PREEMPTION and
a 4 s deadline, then the kill (what ``spotfallback notice-agent`` turns a cloud's notice
into); *without*: the kill alone. ``spotfallback+jit`` is ``FallbackTrainer`` with the
example's just-in-time checkpoint (``PreemptionWatch``, asking Ray every second); ``ray`` is
plain ``TorchTrainer`` with periodic checkpoints only. Steps redone = last step completed
before the eviction − first step after it + 1; seconds redone = the time the evicted gang
spent on those steps (rank 0's step log). Every run's final weights are compared with an
uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bench.harness import Figure, Measurement, Stat, Target, table, values
from bench.runs import Context, alternating, read_jsonl

# 4 s: longer than the just-in-time checkpoint takes to notice (Ray polls every 1 s, the example asks every
# 1 s) and write, shorter than what is left of the 30-step run when it comes at step 8.
NOTICE_S = 4.0
AT_STEP = 8
SCENARIOS: tuple[tuple[str, float | None], ...] = (
    ("spotfallback+jit", NOTICE_S),
    ("spotfallback+jit", None),
    ("ray", NOTICE_S),
    ("ray", None),
)


def checkpoint_every() -> int:
    from bench.bench_notices import CONFIG

    return int(CONFIG["checkpoint_every"])


def redone_seconds(log: Path | None, last_before: int, resumed_at: int) -> float | None:
    """Time the evicted gang spent on the steps that were redone, from rank 0's step log."""
    if log is None:
        return None
    steps = read_jsonl(log)
    old = {s["step"]: s["t"] for s in steps if s["pid"] == steps[0]["pid"]} if steps else {}
    if last_before < resumed_at:
        return 0.0
    start = old.get(resumed_at - 1, old.get(resumed_at))
    end = old.get(last_before)
    return None if start is None or end is None else end - start


def trained_into_notice(log: Path, last_before: int, injector: Any) -> float | None:
    """Seconds the gang trained on after the drain: with just-in-time checkpoints, how long the notice took to act on."""
    drains = injector.actions("drain")
    steps = {s["step"]: s["t"] for s in read_jsonl(log)}
    if not drains or last_before not in steps:
        return None
    return steps[last_before] - drains[-1].wall_time


def run(ctx: Context) -> list[dict[str, Any]]:
    from bench import bench_notices

    reference = bench_notices.make_fit("spotfallback", ctx.storage, "eviction-reference", dict(bench_notices.CONFIG))()
    ref_hash = reference.metrics["weights_sha256"]
    rows = []
    for rep in range(ctx.reps(2, 1)):
        order = alternating(SCENARIOS, rep)
        for scenario, notice in order:
            before = set(ctx.storage.glob("*.steps"))
            try:
                row = bench_notices.run_scenario(
                    ctx.cluster, ctx.injector, ctx.storage, scenario, notice, AT_STEP, 1, ref_hash
                )
            finally:
                logs = sorted(set(ctx.storage.glob(f"{scenario}-*.steps")) - before, key=lambda p: p.stat().st_mtime)
                if logs and ctx.quick:  # what the scenario saw, for the harness's log
                    steps = read_jsonl(logs[-1])
                    ctx.log(f"{scenario} {notice}: " + " ".join(f"{s['step']}@{s['pid']}" for s in steps))
                    ctx.log(ctx.injector.timeline()[-600:])
            d = dataclasses.asdict(row)
            d.update(variant=scenario, notice_s=notice, rep=rep,
                     redone_s=redone_seconds(logs[-1] if logs else None, row.last_before, row.resumed_at))
            if notice is not None and logs:
                d["trained_into_notice_s"] = trained_into_notice(logs[-1], row.last_before, ctx.injector)
            ctx.log(f"eviction {d['scenario']} rep {rep}: {row.redone} steps redone")
            rows.append(d)
    return rows


def _label(variant: str, notice: float | None) -> str:
    who = "spotfallback + just-in-time checkpoint" if variant == "spotfallback+jit" else "plain Ray Train"
    return f"{who}, {'with an ' + format(notice, 'g') + ' s notice' if notice is not None else 'kill without notice'}"


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    every = checkpoint_every()
    out = []
    for variant, notice in SCENARIOS:
        steps = values(rows, "redone", variant=variant, notice_s=notice)
        secs = Stat.of(values(rows, "redone_s", variant=variant, notice_s=notice))
        if variant == "spotfallback+jit":
            target = Target("0 steps", max=0) if notice is not None else Target(f"≤ checkpoint interval ({every} steps)", max=every)
        else:
            target = Target("report (comparison)")
        note = f"{secs.median:.1f} s of work" if secs.n else ""
        out.append(Figure(5, f"Work redone per eviction: {_label(variant, notice)}", "steps", target, Stat.of(steps), 1,
                          note=note, worst=target.max is not None))
    return out


def describe(rows: list[dict[str, Any]]) -> str:
    body = [
        (r["rep"], r["scenario"], r["last_before"], r["resumed_at"], r["redone"],
         r["redone_s"] if r["redone_s"] is not None else float("nan"), r["stall_s"], r["kill_to_new_s"], r["weights_ok"])
        for r in rows
    ]
    return (__doc__ or "").split("\n\n", 1)[1].strip() + "\n\n" + table(
        ["rep", "scenario", "last step before", "resumed at", "steps redone", "seconds redone", "stall (s)",
         "kill → new step (s)", "weights bit-identical"],
        body,
    )


def explain(rows: list[dict[str, Any]]) -> str:
    every = checkpoint_every()
    kills = [r for r in rows if r["variant"] == "spotfallback+jit" and r["notice_s"] is None and r["redone"] > every]
    jit = [r for r in rows if r["variant"] == "spotfallback+jit" and r["notice_s"] is not None and r["redone"] > 0]
    out = []
    if kills:
        r = kills[0]
        out.append(
            f"Why (kill without notice): the gang went on training after the kill until step {r['last_before']} "
            f"(the killed node's worker lives on for a moment, and rank 0 until its next collective), and the "
            f"checkpoint of step {(r['last_before'] // every) * every} it reported was not yet committed when the "
            f"node went, so the run resumed at step {r['resumed_at']}. Work since the last *committed* checkpoint is "
            "at most one interval plus the steps a checkpoint takes to be committed (the controller's poll); Ray "
            "commits a checkpoint only once every rank's report has reached the controller, so this cannot be "
            "closed from outside Ray, only by a notice (first row)."
        )
    if jit:
        out.append(
            f"Why (with a notice): in {len(jit)} run(s) the just-in-time checkpoint did not make it before the node "
            "went; see docs/notices.md for the notice length this needs."
        )
    return "\n\n".join(out)


MEASUREMENT = Measurement(
    name="notices", items=(5,), title="Work redone per eviction", run=run, figures=figures, describe=describe,
    explain=explain,
)
