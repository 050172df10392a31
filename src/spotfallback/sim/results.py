"""What a simulation returns: per-run outcomes of one policy, and their summaries.

Why a module of its own: every engine (the policy engine, the vectorised engine, the
Uniform Progress baseline) fills the same arrays, and the planner, the CLI and the
benchmarks read them without caring which engine ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from spotfallback.sim.job import EPS

FINISHED, FAILED, STUCK = 1, 2, 3
STATUS_NAMES = {FINISHED: "finished", FAILED: "failed", STUCK: "stuck"}


@dataclass(frozen=True)
class Distribution:
    """Mean and tail percentiles of one outcome over the simulated runs."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(v, [50, 90, 99])
        return cls(float(v.mean()), float(p50), float(p90), float(p99))


METRICS = ("wall_h", "spend", "lost_work_h", "alpha", "interruptions", "preemptions", "failures", "switches")


@dataclass
class SimResult:
    """Per-run outcomes of one policy; arrays of length ``runs``."""

    label: str
    status: np.ndarray
    wall_h: np.ndarray
    spend: np.ndarray
    lost_work_h: np.ndarray
    billed_h: np.ndarray
    spot_h: np.ndarray
    work_on_spot_h: np.ndarray
    preemptions: np.ndarray
    failures: np.ndarray
    switches: np.ndarray
    capacity_timeouts: np.ndarray
    final_tier: np.ndarray
    deadline_h: float | None = None

    @classmethod
    def empty(cls, label: str, runs: int, deadline_h: float | None) -> SimResult:
        """All zeros, for an engine to fill in."""
        z = np.zeros(runs)
        zi = np.zeros(runs, dtype=np.int64)
        return cls(label, zi.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy(),
                   zi.copy(), zi.copy(), zi.copy(), zi.copy(), zi.copy(), deadline_h)

    @property
    def runs(self) -> int:
        return len(self.status)

    @property
    def alpha(self) -> np.ndarray:
        """Spot share of billed hours: the alpha that makes the seed's formula exact."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.billed_h > 0, self.spot_h / np.where(self.billed_h > 0, self.billed_h, 1.0), 0.0)

    @property
    def interruptions(self) -> np.ndarray:
        return self.preemptions + self.failures

    @property
    def finished(self) -> np.ndarray:
        return self.status == FINISHED

    @property
    def finished_fraction(self) -> float:
        return float(self.finished.mean())

    def met_deadline(self, deadline_h: float | None = None) -> np.ndarray:
        d = self.deadline_h if deadline_h is None else deadline_h
        return self.finished if d is None else self.finished & (self.wall_h <= d + EPS)

    def deadline_probability(self, deadline_h: float | None = None) -> float:
        return float(self.met_deadline(deadline_h).mean())

    @property
    def mean_spend(self) -> float:
        return float(self.spend.mean())

    def summary(self) -> dict[str, Distribution]:
        return {m: Distribution.of(getattr(self, m)) for m in METRICS}

    @classmethod
    def concat(cls, parts: Sequence[SimResult], label: str | None = None) -> SimResult:
        """The runs of several results as one (e.g. one policy on several traces)."""
        first = parts[0]
        arrays = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)
                  if f.name not in ("label", "deadline_h")}
        return cls(label=first.label if label is None else label, deadline_h=first.deadline_h, **arrays)

    def outcome(self, i: int) -> dict[str, float | int | str]:
        """One run's outcome, for comparisons and debugging."""
        return {
            "status": STATUS_NAMES[int(self.status[i])],
            "wall_h": float(self.wall_h[i]),
            "spend": float(self.spend[i]),
            "lost_work_h": float(self.lost_work_h[i]),
            "billed_h": float(self.billed_h[i]),
            "spot_h": float(self.spot_h[i]),
            "work_on_spot_h": float(self.work_on_spot_h[i]),
            "preemptions": int(self.preemptions[i]),
            "failures": int(self.failures[i]),
            "switches": int(self.switches[i]),
            "capacity_timeouts": int(self.capacity_timeouts[i]),
            "final_tier": int(self.final_tier[i]),
        }


__all__ = ["FAILED", "FINISHED", "METRICS", "STATUS_NAMES", "STUCK", "Distribution", "SimResult"]
