"""Generated spot-availability traces, of families the shared traces do not hold.

Each family alternates runs of capacity and runs of none, their lengths drawn at random around
the family's own means (exponential, or log-normal for heavy tails) and sampled every
``gap_s``, as the SkyPilot traces are: calm zones, flaky ones, long outages, spot that is mostly
absent, finer and coarser sampling. Planning on the shared traces and replaying the
recommendation on these measures the planner on inputs it never saw and nobody tuned it to;
the seed fixes them, so the figures repeat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spotfallback.sim.traces import SpotTrace


@dataclass(frozen=True)
class Family:
    """Alternating runs with and without capacity: mean hours of each, the tick, and the runs' spread."""

    name: str
    up_h: float
    down_h: float
    gap_s: float = 600.0
    sigma: float | None = None  # log-normal spread of the run lengths (same mean); None = exponential

    def trace(self, seed: int, days: float = 30.0) -> SpotTrace:
        """``days`` of one instance's availability, 1 or 0 per tick; the same ``seed`` gives the same trace."""
        rng = np.random.default_rng([seed, *self.name.encode()])
        ticks = int(days * 86400 / self.gap_s)
        up = bool(rng.random() < self.up_h / (self.up_h + self.down_h))  # the long-run share at a random start
        runs: list[np.ndarray] = []
        total = 0
        while total < ticks:
            mean = self.up_h if up else self.down_h
            hours = (rng.exponential(mean) if self.sigma is None
                     else rng.lognormal(np.log(mean) - self.sigma ** 2 / 2, self.sigma))
            n = max(1, round(hours * 3600 / self.gap_s))  # a run lasts at least a tick, as a sampler sees it
            runs.append(np.full(n, int(up), dtype=np.int64))
            total += n
            up = not up
        available = np.concatenate(runs)[:ticks]
        available.setflags(write=False)
        return SpotTrace(f"generated {self.name}", self.gap_s, available)


FAMILIES: tuple[Family, ...] = (
    Family("calm", up_h=20.0, down_h=0.5),
    Family("flaky", up_h=1.0, down_h=0.5),
    Family("long outages", up_h=6.0, down_h=6.0),
    Family("heavy-tailed", up_h=3.0, down_h=2.0, sigma=1.5),
    Family("mostly absent", up_h=0.5, down_h=4.0),
    Family("rare long outages", up_h=40.0, down_h=10.0),
    Family("5-minute ticks", up_h=2.0, down_h=1.0, gap_s=300.0),
    Family("hourly ticks", up_h=4.0, down_h=2.0, gap_s=3600.0),
)
