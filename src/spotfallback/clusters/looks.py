"""Looking at a higher tier's capacity on another Ray cluster: what a climb back across clusters needs.

Why a Ray job: the Jobs API is all the moving driver reaches of a cluster. A look is a short
job on the tier's cluster, `spotfallback look-capacity`, which counts the gang's capacity as a
driver counts it within its own cluster and, while the gang does not fit, asks that
cluster's autoscaler for it under the run's own requester id, as a driver's climb-back
probe does (``runtime.probe.look_capacity``); it prints one result line. Looks carry their
own metadata key, so neither the mover nor ``status`` ever takes one for a job of the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import uuid
from dataclasses import dataclass

from spotfallback.clusters.jobs import TERMINAL, ClusterJobs
from spotfallback.config import Tier
from spotfallback.errors import ClusterUnreachableError

logger = logging.getLogger("spotfallback")

LOOK_KEY = "spotfallback_look"  # the job metadata naming the run a look is for
LOOK_RESULT = "capacity"  # the result line's type
# How long one look waits for the autoscaler to bring the gang's nodes: a new cloud VM takes about two minutes.
DEFAULT_LOOK_WAIT_S = 150.0


def look_command(tier: Tier, requester_id: str, wait_s: float) -> str:
    """The shell command of a look at ``tier``'s capacity (the tier travels as one JSON argument)."""
    return shlex.join(["spotfallback", "look-capacity", "--tier-json", tier.model_dump_json(exclude_unset=True),
                       "--requester", requester_id, "--wait-s", f"{wait_s:g}"])


def look_result(tier: Tier, available_workers: int) -> str:
    """The one line a look prints, which ``CapacityLooks`` reads back from the job's log."""
    return json.dumps({"type": LOOK_RESULT, "tier": tier.name, "available_workers": available_workers})


def parse_look(logs: str, tier: Tier) -> int | None:
    """The workers a finished look counted for ``tier``, from its log; None without a result line."""
    for line in reversed(logs.splitlines()):
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("type") == LOOK_RESULT and found.get("tier") == tier.name:
            count = found.get("available_workers")
            return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
    return None


@dataclass(frozen=True)
class PendingLook:
    """A look submitted as a Ray job: which tier, on which cluster, when."""

    tier: int
    cluster: str
    submission_id: str
    submitted_at: float


class CapacityLooks:
    """At most one look in flight at a time, for the run ``run_uri``: submit one, then collect what it saw."""

    def __init__(self, clusters: dict[str, ClusterJobs], run_uri: str, run_name: str):
        self.clusters = clusters
        self.run_uri = run_uri
        self.requester_id = f"spotfallback-climb-look-{run_name}"
        self.pending: PendingLook | None = None
        self._failed_on: set[str] = set()  # clusters whose look failed (said once each)

    def start(self, index: int, tier: Tier, cluster: str, now: float, wait_s: float = DEFAULT_LOOK_WAIT_S) -> None:
        """Submit a look at tier ``index`` (``tier``) on ``cluster``; ``ClusterUnreachableError`` if it cannot."""
        submission_id = f"spotfallback-look-{uuid.uuid4().hex[:8]}"
        self.clusters[cluster].submit(submission_id, look_command(tier, self.requester_id, wait_s), self.run_uri,
                                      key=LOOK_KEY)
        self.pending = PendingLook(index, cluster, submission_id, now)

    def collect(self, tier: Tier) -> int | None:
        """Once the pending look's job has ended: the workers it counted (0 when it printed nothing), and
        no look is pending any more; None while it runs. ``ClusterUnreachableError`` if its cluster does not answer."""
        look = self.pending
        assert look is not None
        jobs = self.clusters[look.cluster]
        ended = jobs.job(look.submission_id)  # with Ray's reason, should it end without a result
        if ended.status not in TERMINAL:
            return None
        self.pending = None
        logs = jobs.logs(look.submission_id)
        found = parse_look(logs, tier)
        if found is None and look.cluster not in self._failed_on:  # e.g. no spotfallback in that cluster's image
            self._failed_on.add(look.cluster)
            tail = " | ".join(logs.strip().splitlines()[-3:])
            why = f" ({ended.why})" if ended.why else ""
            logger.warning("a look at %r's capacity on cluster %r ended %s%s without a result (counted as no capacity; "
                           "said once): %s", tier.name, look.cluster, ended.status, why, tail or "no log")
        return found or 0

    def cancel(self) -> None:
        """Stop the pending look, if any (best effort: it ends on its own within its wait)."""
        look, self.pending = self.pending, None
        if look is None:
            return
        with contextlib.suppress(ClusterUnreachableError, RuntimeError):  # a look left running ends after its wait
            self.clusters[look.cluster].stop(look.submission_id)


__all__ = ["DEFAULT_LOOK_WAIT_S", "LOOK_KEY", "LOOK_RESULT", "CapacityLooks", "PendingLook", "look_command",
           "look_result", "parse_look"]
