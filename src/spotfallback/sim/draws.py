"""The random draws the engines share, and the world sampled with them.

Why shared: the engines are compared run by run, so run ``r``'s ``c``-th wait-and-run cycle
must see the same draws in every engine. ``Draws`` holds one column per cycle, extended in
fixed blocks from a seed, so a run's draws do not depend on how many other runs there are or
how far they got. ``acquire`` and ``interrupt`` are the two questions an engine asks of a
tier's process: when are the workers up, and when is the running gang interrupted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spotfallback.sim.world import RateModel, TraceCapacity


class Draws:
    """Unit exponentials and uniforms per (run, cycle), extended in deterministic blocks."""

    BLOCK = 16

    def __init__(self, runs: int, seed: int):
        self.runs = runs
        self.seed = seed
        self.cols = 0
        self.e_pre = np.empty((runs, 0))
        self.e_fail = np.empty((runs, 0))
        self.u_out = np.empty((runs, 0))
        self.e_out = np.empty((runs, 0))

    def ensure(self, col: int) -> None:
        """Draw every column up to ``col``, a block at a time, each block from its own seed.

        The arrays keep room ahead, doubling when full, so a run of thousands of cycles (a
        large gang on a node trace) copies each column a few times, not once per block.
        """
        if col < self.cols:
            return
        need = (col // self.BLOCK + 1) * self.BLOCK
        if need > self.e_pre.shape[1]:
            room = max(need, 2 * self.e_pre.shape[1])
            for name in ("e_pre", "e_fail", "u_out", "e_out"):
                grown = np.empty((self.runs, room))
                grown[:, :self.cols] = getattr(self, name)[:, :self.cols]
                setattr(self, name, grown)
        while self.cols < need:
            rng = np.random.default_rng([self.seed, 1 + self.cols // self.BLOCK])
            shape, block = (self.runs, self.BLOCK), slice(self.cols, self.cols + self.BLOCK)
            self.e_pre[:, block] = rng.standard_exponential(shape)
            self.e_fail[:, block] = rng.standard_exponential(shape)
            self.u_out[:, block] = rng.random(shape)
            self.e_out[:, block] = rng.standard_exponential(shape)
            self.cols += self.BLOCK


def run_offsets(world: Sequence[object], runs: int, seed: int) -> np.ndarray:
    """Start of each replay in trace time: a uniformly random tick of the first trace."""
    caps = [p for p in world if isinstance(p, TraceCapacity)]
    if not caps:
        return np.zeros(runs)
    rng = np.random.default_rng([seed, 0])
    return rng.integers(0, caps[0].length, size=runs) * caps[0].gap_h


def acquire(proc: RateModel | TraceCapacity, draws: Draws, rows: np.ndarray, cols: np.ndarray, t_abs: np.ndarray, prov: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """When workers are up (trace time), looking from ``t_abs``; > limit means not in time."""
    if isinstance(proc, RateModel):
        outage = np.where(draws.u_out[rows, cols] < proc.outage_probability, draws.e_out[rows, cols] * proc.mean_outage_h, 0.0)
        return t_abs + outage + prov
    found = proc.next_available(t_abs)
    acq = found + prov
    todo = np.isfinite(acq) & (acq <= limit) & ~proc.is_ok(np.where(np.isfinite(acq), acq, 0.0))
    while todo.any():  # capacity vanished while provisioning: look again from then
        found2 = proc.next_available(acq[todo])
        acq[todo] = found2 + prov[todo]
        sub = np.isfinite(acq) & (acq <= limit)
        todo = sub & ~proc.is_ok(np.where(np.isfinite(acq), acq, 0.0))
    return acq


def interrupt(proc: RateModel | TraceCapacity, draws: Draws, rows: np.ndarray, cols: np.ndarray, t_abs: np.ndarray, workers: np.ndarray):
    """(time of the next interruption, True if it is a preemption rather than a node failure)."""
    if isinstance(proc, RateModel):
        with np.errstate(divide="ignore", over="ignore"):  # a rate too small to matter: no interruption (inf)
            lp = proc.preemptions_per_node_hour * workers
            lf = proc.failures_per_node_hour * workers
            tp = np.where(lp > 0, draws.e_pre[rows, cols] / np.where(lp > 0, lp, 1.0), np.inf)
            tf = np.where(lf > 0, draws.e_fail[rows, cols] / np.where(lf > 0, lf, 1.0), np.inf)
        return t_abs + np.minimum(tp, tf), tp <= tf
    return proc.hit(t_abs), np.ones(len(t_abs), dtype=bool)


__all__ = ["Draws", "acquire", "interrupt", "run_offsets"]
