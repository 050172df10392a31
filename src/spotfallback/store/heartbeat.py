"""The progress heartbeat: the latest metrics a run reported, overwritten in place every few seconds.

Why apart from the views: Ray Train's controller writes it (``runtime/hooks.py``, on each
report), and that process must stay lean: no terminal or plotting library. The views read
it back (``view/snapshot.py``) to show progress between checkpoints. Also here: which
reported metric counts as progress and which keys hold its total, since the driver stores
those totals in the run's metadata for ``status`` on another machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from spotfallback.errors import ConfigError
from spotfallback.events import FORMAT_VERSION, finite_number
from spotfallback.store.location import RunLocation, write_atomically

logger = logging.getLogger("spotfallback")

HEARTBEAT_FILE = "progress.json"
# The controller writes the latest reported metrics at most this often (one small object).
INTERVAL_ENV = "SPOTFALLBACK_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 2.0


def heartbeat_interval_s() -> float:
    """How often the controller writes the heartbeat: ``SPOTFALLBACK_PROGRESS_INTERVAL_S``, else 2 s.

    Read where a run starts, not on import: a bad value is refused there by name, and must not
    break ``status`` or ``report``, which only read the heartbeat.
    """
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{INTERVAL_ENV}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{INTERVAL_ENV}: must be a finite number of seconds, 0 or more, got {raw!r}")
    return value

# Which reported metric counts as progress, and which keys hold its total (metrics first,
# then the train_loop_config). The first progress key present wins.
PROGRESS_KEYS: dict[str, tuple[str, ...]] = {
    "step": ("total_steps", "max_steps", "num_steps"),
    "global_step": ("total_steps", "max_steps", "num_steps"),
    "iteration": ("total_iterations", "max_iterations", "num_iterations"),
    "epoch": ("num_epochs", "epochs", "total_epochs", "max_epochs"),
}


def progress_totals(config: Mapping[str, Any] | None) -> dict[str, float]:
    """The progress totals a ``train_loop_config`` gives (``total_steps``, ``num_epochs``...).

    The run keeps them in its metadata so ``status`` on another machine, without the job file,
    can show a total and a bar.
    """
    keys = {k for totals in PROGRESS_KEYS.values() for k in totals}
    return {
        k: v
        for k, v in (config or {}).items()
        if k in keys and (n := finite_number(v)) is not None and n > 0
    }


def scalar_metrics(metrics: Mapping[str, Any] | None, limit: int = 24) -> dict[str, Any]:
    """The JSON-safe scalars of a metrics dict (numbers, booleans, short strings), at most ``limit``."""
    out: dict[str, Any] = {}
    for key, value in (metrics or {}).items():
        if len(out) >= limit:
            break
        plain = isinstance(value, bool) or finite_number(value) is not None
        if plain or (isinstance(value, str) and len(value) <= 100):
            out[str(key)] = value
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
            with contextlib.suppress(Exception):
                item = value.item()
                if isinstance(item, int | float) and math.isfinite(item):
                    out[str(key)] = item
    return out


def write_heartbeat(location: RunLocation, tier: int, metrics: Mapping[str, Any]) -> None:
    """Overwrite the run's heartbeat; never raises (progress display must not break training)."""
    payload = json.dumps(
        {"v": FORMAT_VERSION, "t": time.time(), "tier": tier, "metrics": scalar_metrics(metrics)}
    ).encode()
    try:
        write_atomically(location.fs, location.path(HEARTBEAT_FILE), payload)
    except Exception:  # one missed heartbeat is harmless; the next report writes again
        logger.debug("could not write the progress heartbeat", exc_info=True)


def read_heartbeat(location: RunLocation) -> dict[str, Any] | None:
    """The latest heartbeat, or None when there is none or it cannot be read.

    Its time must be a finite number and only finite scalars of its metrics are kept: Python's
    JSON reads ``NaN``, and ``status --json`` would print it back, which is not JSON.
    """
    path = location.path(HEARTBEAT_FILE)
    try:
        if location.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        data = json.loads(location.fs.open_input_stream(path).readall())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        return None
    t = data.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        return None
    return {**data, "metrics": scalar_metrics(data["metrics"])}


class HeartbeatThrottle:
    """Lets one heartbeat through per interval; the controller keeps one per run."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S):
        self.interval_s = interval_s
        self._last = -math.inf
        self._lock = threading.Lock()

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last < self.interval_s:
                return False
            self._last = now
            return True
