"""The job a simulation runs, and the progress arithmetic every engine shares.

Why one place: the engines must agree on what ``x`` hours of computing commits and how long
the rest takes, to the last float, or their run-by-run comparisons mean nothing. The
functions are numpy ufunc chains, so they work on scalars and on arrays of runs alike.
Hours throughout (the policy's events are in seconds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from spotfallback.config import NumbersNotBooleans
from spotfallback.notice_window import save_lead_s

NEVER_H = 1e12  # "no periodic checkpoint": an interval no job reaches
EPS = 1e-9
# Hours, as a float or an array: the cycle formulas broadcast (numpy) and give an array where any
# argument is one, so the vector engine and the event engine share them.
Hours = Any
# How often a simulated shell looks at a higher tier's capacity when it can ask the gang for a
# checkpoint (``JobSpec.checkpoint_on_request``). The runtime looks every few seconds; a coarser
# grid keeps the engines fast and makes a simulated climb come at most this late.
LOOK_EVERY_H = 5.0 / 60.0


# Longer than any training run (eleven years). Past it a simulation or a plan takes hours, and a deadline
# near the largest float overflows the simulation's count of steps.
MAX_HOURS = 100_000.0


class JobSpec(NumbersNotBooleans):
    """What is being trained and what each interruption costs it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    work_h: float = Field(gt=0, le=MAX_HOURS, description="Hours of training on an uninterrupted gang.")
    checkpoint_interval_h: float | None = Field(
        default=None, gt=0, description="Work between periodic checkpoints (tau); None = never."
    )
    checkpoint_cost_h: float = Field(default=0.0, ge=0, description="Wall time of one checkpoint write (delta).")
    restart_overhead_h: float = Field(default=0.0, ge=0, description="Billed time to resume after a restart (R).")
    provisioning_delay_h: float = Field(default=0.0, ge=0, description="Unbilled time to get workers once capacity exists.")
    notice_s: float = Field(default=0.0, ge=0, description="Preemption notice (AWS: 120 s, GCP/Azure: 30 s).")
    jit_checkpoint: bool = Field(default=True, description="Checkpoint on a preemption notice (no lost work if it fits).")
    checkpoint_on_request: bool = Field(
        default=False,
        description="The gang checkpoints when the controller asks (a PreemptionWatch with answer_requests): a climb "
        "back need not wait for a periodic checkpoint; it costs one write, billed on the gang it leaves.",
    )
    deadline_h: float | None = Field(default=None, gt=0, le=MAX_HOURS, description="Wall-clock deadline, if any.")
    move_restart_h: float = Field(
        default=0.0, ge=0,
        description="Extra billed time of a start on another Ray cluster than the last attempt's (the checkpoint "
        "pulled across regions, the Ray job submitted), on top of the restart.",
    )
    move_cost: float = Field(
        default=0.0, ge=0, description="Cost of each move to another Ray cluster (the checkpoint's egress), in the prices' unit."
    )

    @model_validator(mode="after")
    def _deadline_after_work(self) -> JobSpec:
        if self.deadline_h is not None and self.deadline_h < self.work_h:
            raise ValueError(f"deadline_h ({self.deadline_h:g}) is shorter than work_h ({self.work_h:g}): no run can "
                             "meet it; give a deadline of at least the work, or none")
        return self

    @property
    def tau_h(self) -> float:
        return NEVER_H if self.checkpoint_interval_h is None else self.checkpoint_interval_h

    @property
    def jit_saves(self) -> bool:
        """Whether a preemption notice covers a just-in-time checkpoint write (then no work is lost)."""
        return self.jit_checkpoint and self.notice_s / 3600.0 >= self.checkpoint_cost_h

    @property
    def jit_lead_h(self) -> float:
        """How long before a preemption the just-in-time save begins: the gang trains through the
        notice until the save's lead is left (``notice_window``), or saves at once on a shorter one."""
        return min(self.notice_s, save_lead_s(self.checkpoint_cost_h * 3600.0)) / 3600.0

    def climb_grid_h(self, cycle_h: float) -> float:
        """Hours between the looks at a higher tier's capacity, for a gang whose checkpoint cycle is ``cycle_h``:
        every ``LOOK_EVERY_H`` when it checkpoints on request, else at the end of each checkpoint write."""
        return LOOK_EVERY_H if self.checkpoint_on_request else cycle_h

    @property
    def climb_write_h(self) -> float:
        """Time from a climb's decision to the old gang's end: the requested checkpoint's write, or none at a
        periodic checkpoint's end (it has been written)."""
        return self.checkpoint_cost_h if self.checkpoint_on_request else 0.0

    def with_interval(self, tau_h: float | None) -> JobSpec:
        return self.model_copy(update={"checkpoint_interval_h": tau_h})

    @property
    def least_wall_h(self) -> float:
        """The shortest wall time any run of this job can take: one start on a gang that is never
        interrupted and writes no periodic checkpoint (on-demand only), billed as every engine
        bills a start (``start_to_finish_h``). A deadline shorter than this no run meets."""
        return float(start_to_finish_h(self.work_h, NEVER_H, self.checkpoint_cost_h, self.provisioning_delay_h,
                                       self.restart_overhead_h))


def default_horizon_h(job: JobSpec) -> float:
    """Give up on a run (status 'stuck') after this long: 100x the work, or 10x the deadline."""
    return max(100.0 * job.work_h, 10.0 * (job.deadline_h or 0.0))


def cycle_progress(x: np.ndarray | float, tau: np.ndarray | float, delta: np.ndarray | float) -> tuple[Hours, Hours]:
    """Work done and work committed after ``x`` hours of compute phase (checkpoint every tau)."""
    cyc = np.add(tau, delta)
    k = np.floor(np.divide(x, cyc))
    r = np.subtract(x, np.multiply(k, cyc))
    committed = np.multiply(k, tau)
    done = np.add(committed, np.minimum(r, tau))
    return done, committed


def wall_to_finish(w: np.ndarray | float, tau: np.ndarray | float, delta: np.ndarray | float) -> Hours:
    """Compute-phase hours to do ``w`` more work from a fresh start (no checkpoint at the end)."""
    n = np.maximum(np.ceil(np.divide(w, tau) - EPS) - 1.0, 0.0)
    return np.add(w, np.multiply(n, delta))


def start_to_finish_h(w: np.ndarray | float, tau: np.ndarray | float, delta: np.ndarray | float,
                      provisioning_h: float, restart_h: float) -> Hours:
    """Wall hours from acquiring a gang to finishing ``w`` more work on it uninterrupted: the
    provisioning wait, the restart every start pays (the first included), then the compute phase."""
    return provisioning_h + restart_h + wall_to_finish(w, tau, delta)


__all__ = [
    "EPS",
    "LOOK_EVERY_H",
    "NEVER_H",
    "JobSpec",
    "cycle_progress",
    "default_horizon_h",
    "start_to_finish_h",
    "wall_to_finish",
]
