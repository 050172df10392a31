"""Figure 6: checkpoint cost, synchronous vs. Ray's ``CheckpointUploadMode.ASYNC``.

The example's model and full training state (``examples/ddp_digits.py``: weights,
optimizer, LR scheduler, every rank's RNG stream gathered to rank 0, a manifest with
SHA-256 of each file) are checkpointed every 10 steps by a loop that reports metrics at
the same steps, 2 workers on the spot nodes through plain ``TorchTrainer``, storage on the
local disk. Three variants alternate: no checkpoints (the same reports without one),
``SYNC`` (Ray's default: the report returns once the checkpoint is copied to storage) and
``ASYNC`` (the copy and the report run on a background thread; the next report waits for
them). The loop is *blocked* by a checkpoint for the time rank 0 spends in the
checkpointing section (gather, write, manifest, ``ray.train.report``) and in later reports
waiting for it, over what the same reports cost without a checkpoint; per checkpoint, and as
a share of the training time between two checkpoints.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import Figure, Measurement, Stat, Target, table, values
from bench.runs import Context, alternating, torch_trainer, unique

STEPS = 81  # checkpoints at 10, 20, ..., 80; step 81 reports once more, so ASYNC's last copy is waited for
EVERY = 10
STEP_DELAY_S = 0.1
MODES = ("none", "SYNC", "ASYNC")


def train_fn(config: dict[str, Any]) -> None:
    """The example's training step and checkpoint, timed by rank 0 (runs on the Ray workers)."""
    import ray.train
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ray.train import CheckpointUploadMode
    from torch import nn

    from spotfallback.examples.ddp_digits import (
        _gather,
        _Rank,
        _save,
        load_digits_split,
        make_model,
    )
    from spotfallback.store.checkpoints import write_manifest

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y, _, _ = load_digits_split(seed=0)
    model = make_model(64, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    stream = _Rank(len(y), rank, world, 0, 32)
    ddp: nn.Module = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() and world > 1 else model
    mode = config["mode"]
    upload = None if mode == "none" else CheckpointUploadMode[mode]
    log: list[dict[str, Any]] = []
    t_loop = time.perf_counter()
    for step in range(1, config["steps"] + 1):
        idx = stream.next_batch()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x[idx], generator=stream.generator), y[idx]).backward()
        optimizer.step()
        scheduler.step()
        time.sleep(config["step_delay_s"])
        metrics = {"step": step}
        if step % config["every"] and step != config["steps"]:
            continue
        t0 = time.perf_counter()
        if upload is None or step % config["every"]:
            ray.train.report(metrics)
            kind = "report"
        else:
            states = _gather(stream.state())  # a collective: every rank calls it
            if rank == 0:
                d = tempfile.mkdtemp(prefix="bench-ckpt-")  # ASYNC deletes it after the copy; SYNC leaves it
                _save(Path(d), model, optimizer, scheduler, states, step, metrics)
                write_manifest(d)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d), checkpoint_upload_mode=upload)
            else:
                ray.train.report(metrics, checkpoint_upload_mode=upload)
            kind = "checkpoint"
        log.append({"step": step, "kind": kind, "s": time.perf_counter() - t0})
    loop_s = time.perf_counter() - t_loop
    if rank == 0:
        with open(config["log"], "w") as f:
            json.dump({"mode": mode, "loop_s": loop_s, "sections": log, "pid": os.getpid()}, f)


def one_run(ctx: Context, mode: str, rep: int, steps: int) -> dict[str, Any]:
    log = ctx.path(f"ckpt-{mode}", ".json")
    cfg = {"mode": mode, "steps": steps, "every": EVERY, "step_delay_s": STEP_DELAY_S, "log": str(log)}
    torch_trainer(cfg, ctx.storage, unique(f"ckpt-{mode}"), train_fn=train_fn).fit()
    data = json.loads(log.read_text())
    sections = data["sections"]
    ckpts = [s["s"] for s in sections if s["kind"] == "checkpoint"]
    return {
        "variant": mode,
        "rep": rep,
        "loop_s": data["loop_s"],
        "sections_s": sum(s["s"] for s in sections),  # all reports and checkpoints
        "checkpoints": len(ckpts),
        "reports": len(sections),
        "call_s": sum(ckpts) / len(ckpts) if ckpts else None,  # the checkpointing call alone
        "step_s": (data["loop_s"] - sum(s["s"] for s in sections)) / steps,  # compute + sleep per step
    }


def run(ctx: Context) -> list[dict[str, Any]]:
    steps = 41 if ctx.quick else STEPS
    rows = []
    for rep in range(ctx.reps(3, 1)):
        order = alternating(MODES, rep)
        for mode in order:
            row = one_run(ctx, mode, rep, steps)
            ctx.log(f"checkpoint {mode} rep {rep}: sections {row['sections_s']:.2f} s, loop {row['loop_s']:.1f} s")
            rows.append(row)
    return rows


def blocked_per_checkpoint(rows: list[dict[str, Any]], mode: str) -> list[float]:
    """Per repetition: (this mode's reporting time − the same reports without checkpoints) / checkpoints."""
    out = []
    for rep in sorted({r["rep"] for r in rows}):
        mine = [r for r in rows if r["rep"] == rep and r["variant"] == mode]
        base = [r for r in rows if r["rep"] == rep and r["variant"] == "none"]
        if mine and base and mine[0]["checkpoints"]:
            out.append((mine[0]["sections_s"] - base[0]["sections_s"]) / mine[0]["checkpoints"])
    return out


def share(rows: list[dict[str, Any]], mode: str) -> list[float]:
    """Blocked time per checkpoint over the training time between two checkpoints."""
    step = {r["rep"]: r["step_s"] for r in rows if r["variant"] == "none"}
    blocked = dict(zip(sorted({r["rep"] for r in rows}), blocked_per_checkpoint(rows, mode), strict=False))
    return [100.0 * b / (EVERY * step[rep]) for rep, b in blocked.items() if rep in step]


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    return [
        Figure(6, "Checkpoint cost: training loop blocked per checkpoint, SYNC (Ray's default)", "s", Target("report"),
               Stat.of(blocked_per_checkpoint(rows, "SYNC")), 3),
        Figure(6, "Checkpoint cost: training loop blocked per checkpoint, ASYNC", "s", Target("report"),
               Stat.of(blocked_per_checkpoint(rows, "ASYNC")), 3),
        Figure(6, f"Checkpoint cost as a share of the training time between checkpoints ({EVERY} steps), SYNC", "%",
               Target("report"), Stat.of(share(rows, "SYNC")), 1),
        Figure(6, f"Checkpoint cost as a share of the training time between checkpoints ({EVERY} steps), ASYNC", "%",
               Target("report"), Stat.of(share(rows, "ASYNC")), 1),
    ]


def describe(rows: list[dict[str, Any]]) -> str:
    body = [(r["rep"], r["variant"], r["checkpoints"], r["reports"], r["sections_s"], r["call_s"] if r["call_s"] is not None else float("nan"),
             r["step_s"], r["loop_s"]) for r in rows]
    step = Stat.of(values(rows, "step_s", variant="none")).median
    return (
        (__doc__ or "").split("\n\n", 1)[1].strip()
        + f"\n\nA training step (compute plus a {STEP_DELAY_S:g} s sleep standing in for a larger model) took {step:.3f} s "
        "(median of the runs without checkpoints).\n\n"
        + table(["rep", "variant", "checkpoints", "reports", "reporting + checkpointing (s)", "checkpoint call (s)",
                 "step (s)", "loop (s)"], body)
    )


MEASUREMENT = Measurement(
    name="checkpoint", items=(6,), title="Checkpoint cost: SYNC vs ASYNC upload", run=run, figures=figures, describe=describe
)
