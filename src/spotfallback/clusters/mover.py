"""The driver that moves one run between Ray clusters: each part of the ladder runs on its cluster as a Ray job.

Why a driver outside the clusters: a Ray cluster lives in one region, and a run that must
leave the region cannot be moved by a process that dies with it. The mover holds no state of
its own: the run's ledger (in object storage, beside the checkpoints) says which tier the run
is on, so the mover reads it, makes sure nothing of the run is active on any other cluster
(stopping what is), and attaches to the run's job on the tier's cluster or submits one:
``spotfallback run --on-cluster NAME``, which runs the ladder there until the policy moves
the run to a tier on another cluster (exit 8), finishes or gives up. When the cluster's
Jobs API stops answering for the cluster's ``unreachable_timeout_s``, the mover writes
``ClusterUnreachable`` to the ledger, and the policy sends the run to the next tier on
another cluster. While the run is below a ``climb_back`` tier on another cluster, the mover
looks at that tier's capacity there (``looks.py``) and, when the pure policy says the climb
pays (priced with the run's own measured move), stops the job just after a checkpoint is
committed and writes the climb: the run resumes on the higher tier's cluster.

Safe to kill at any moment: everything it decided is in the ledger or on a cluster, so the
same command finds the job a killed mover submitted and carries on. A second mover is
refused by the mover lease; the run's own driver lease (held by the job's driver) keeps a
job on a cluster that is out of reach but still alive from training beside the next one:
the mover submits only once that lease is free.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from spotfallback.clusters.jobs import GONE, TERMINAL, ClusterJobs
from spotfallback.clusters.looks import DEFAULT_LOOK_WAIT_S, CapacityLooks
from spotfallback.config import JobConfig, env_seconds
from spotfallback.errors import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USER_CODE,
    ClusterUnreachableError,
    ConfigError,
    DriverLeaseLostError,
    LadderExhaustedError,
    LedgerError,
    RunFailedError,
    RunFatalError,
    SpotfallbackError,
)
from spotfallback.events import CapacityObserved, ClimbBack, ClusterUnreachable, LedgerRecord
from spotfallback.policy import (
    CLIMB_AFTER_CHECKPOINT_S,
    FallbackPolicy,
    PolicyState,
    RestartClock,
    RunEstimates,
    commit_in_sight,
    committed_since,
    probe_target,
)
from spotfallback.store.lease import DriverLease, LeaseInfo
from spotfallback.store.ledger import Ledger, LedgerTail
from spotfallback.store.location import RunLocation, resolve_run

logger = logging.getLogger("spotfallback")

MOVER_LEASE_FILE = "mover-lease.json"
# A job that ends without the ledger moving on is retried this many times before the mover gives up.
MAX_FRUITLESS_JOBS = 3
# How often the mover looks at a higher tier's capacity on another cluster while the run is below it.
DEFAULT_LOOK_EVERY_S = 60.0
# How often a climb asks again to stop the run's job while it has not ended (Ray stops it asynchronously).
STOP_AGAIN_S = 60.0
# How long the mover waits for a job it stopped on another cluster to end before it goes on (its
# driver's lease, not this wait, keeps it from training beside the next job).
STOP_ELSEWHERE_WAIT_S = 60.0
# How often the mover looks again for the run's jobs on the other clusters while it follows one:
# a cluster cut off for a while may answer again with a driver of the run still on it.
STOP_ELSEWHERE_EVERY_S = 60.0


@dataclass(frozen=True)
class MoveOutcome:
    """How a run across clusters ended: the exit code, a message, the result line of the last job."""

    exit_code: int
    message: str
    result: dict[str, object] | None = None


class ClusterMover:
    """Moves the run of ``job`` between the clusters its tiers name, until it finishes or gives up."""

    def __init__(
        self,
        job: JobConfig,
        *,
        retry_failed: bool = False,
        poll_s: float = 2.0,
        lease_ttl_s: float | None = None,
        say: Callable[[str], None] | None = None,
        look_every_s: float | None = None,
        look_wait_s: float | None = None,
    ):
        self.ladder = job.ladder
        if not self.ladder.across_clusters:
            raise ConfigError("tiers: no tier names a cluster; run the job with `spotfallback run` on its cluster")
        self.job = _paths_of_this_machine(job)
        self.policy = FallbackPolicy(self.ladder)
        self.location: RunLocation = resolve_run(self.job.storage_path, job.name, None)
        self.ledger = Ledger(self.location, writer=f"mvr{uuid.uuid4().hex[:6]}")
        self.retry_failed = retry_failed
        self.poll_s = poll_s
        self.lease_ttl_s = lease_ttl_s
        self.say = say or (lambda line: logger.info("%s", line))
        self.clusters = {key: ClusterJobs(ref) for key, ref in self.ladder.clusters.items()}
        self._last_log = ""  # the end of the last finished job's log, for an error that needs it
        self._last_why = ""  # Ray's reason for the last job that failed or was stopped (``RunJob.why``)
        self._stopped: set[str] = set()  # the jobs this mover stopped for a climb: not an operator's stop
        self._lease_said = ""  # the token of the driver lease the mover last said it waits for
        # Climbing back across clusters: looks at a higher tier's capacity, at most one in flight.
        self.look_every_s = env_seconds("SPOTFALLBACK_CLIMB_LOOK_S", DEFAULT_LOOK_EVERY_S) if look_every_s is None else look_every_s
        self.look_wait_s = DEFAULT_LOOK_WAIT_S if look_wait_s is None else look_wait_s
        self.after_checkpoint_s = env_seconds("SPOTFALLBACK_CLIMB_AFTER_CHECKPOINT_S", CLIMB_AFTER_CHECKPOINT_S)
        self.looks = CapacityLooks(self.clusters, self.location.uri(), self.location.name)
        self._last_look = -math.inf
        self._seen: tuple[int, int, float] | None = None  # (tier, workers counted, when) of the latest look
        self._tail = LedgerTail(self.location)  # the ledger as the looks read it, incrementally
        self._fold = LedgerFold(self.policy)
        self._submitting: dict[str, str] = {}  # cluster -> the id of a submission not yet known to have reached it
        self._lease: DriverLease | None = None  # the mover's own, while it runs

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> MoveOutcome:
        """Run to the end; the same call resumes after a crash of a previous mover."""
        lease = DriverLease(self.location, ttl_s=self.lease_ttl_s, file=MOVER_LEASE_FILE)
        self._lease = lease
        self.ledger.ensure_dirs()
        lease.acquire()
        try:
            self._check_ladder()
            self._check_one_address_each()
            retry = self.retry_failed
            fruitless = 0
            result: dict[str, object] | None = None
            while True:
                state = self.state()
                if state.status == "finished":
                    return MoveOutcome(EXIT_OK, f"run {self.location.uri()} finished", result)
                if state.status == "failed" and not retry:
                    return self._ended(state)
                key = self.ladder.cluster_key(state.tier)
                assert key is not None
                self._stop_elsewhere(key)
                outcome, result = self._run_on(key, retry=state.status == "failed")
                retry = False
                if outcome == "STOPPED":  # the mover stops a job only to move the run, and then says so
                    return MoveOutcome(EXIT_ERROR, f"the run's job on cluster {key!r} was stopped from outside the mover "
                                                   f"(`ray job stop`, or its RayJob deleted); run {self.location.uri()} "
                                                   "is kept where its ledger says: run the same command to resume it", result)
                if outcome in ("unreachable", "climbed") or _moved_on(state, self.state()):
                    fruitless = 0
                    continue
                fruitless += 1
                if fruitless >= MAX_FRUITLESS_JOBS:
                    return MoveOutcome(EXIT_ERROR, f"{fruitless} jobs of this run on cluster {key!r} ended without the "
                                                   f"run moving on; the last one's status: {outcome}"
                                                   f"{f' ({self._last_why})' if self._last_why else ''}; the end of its log:\n{self._last_log}")
        finally:
            self.looks.cancel()
            lease.release()

    def state(self) -> PolicyState:
        return self.policy.replay(r.event for r in self.ledger.read())

    def _check_ladder(self) -> None:
        stored = self.ledger.read_ladder()
        if stored is None:
            self.ledger.write_meta(self.ladder, {"name": self.location.name, "created": time.time()})
        elif [t.name for t in stored.tiers] != [t.name for t in self.ladder.tiers]:
            raise ConfigError(
                f"tiers: run {self.location.uri()!r} was started with tiers {[t.name for t in stored.tiers]}, "
                f"not {[t.name for t in self.ladder.tiers]}; resume it with the same tiers or use a new run name"
            )

    def _check_one_address_each(self) -> None:
        """Refuse two of the ladder's cluster addresses that reach one Ray cluster (one session).

        The mover stops the run's jobs on every cluster but the one the run is on: under two
        addresses, it would stop the run's own job as another cluster's at every start. A cluster
        that does not answer now is not checked (it is, at the next start of the mover).
        """
        seen: dict[str, str] = {}
        for key, jobs in self.clusters.items():
            try:
                session = jobs.session()
            except ClusterUnreachableError:
                continue
            if session is None:
                continue
            if session in seen:
                first = self.clusters[seen[session]]
                raise ConfigError(
                    f"tiers: clusters {seen[session]!r} ({first.ref.address}) and {key!r} ({jobs.ref.address}) are one Ray "
                    f"cluster (session {session}): give the tiers on one cluster the same cluster address, or point each "
                    "at its own cluster")
            seen[session] = key

    def _ended(self, state: PolicyState) -> MoveOutcome:
        give_up = state.give_up
        reason = give_up.reason if give_up else "unknown"
        error: SpotfallbackError
        if give_up is not None and give_up.cause == "exhausted":
            error = LadderExhaustedError(f"run {self.location.uri()!r} stopped: {reason}")
        elif give_up is not None and give_up.cause == "fatal":
            error = RunFatalError(f"run {self.location.uri()!r} stopped: {reason}")
        else:
            error = RunFailedError(f"run {self.location.uri()!r} gave up: {reason}")
            if give_up is not None and give_up.cause == "application":
                return MoveOutcome(EXIT_USER_CODE, f"the training function failed: {reason}")
        return MoveOutcome(error.exit_code, str(error))

    # -- one cluster ------------------------------------------------------------------------

    def _stop_elsewhere(self, key: str) -> None:
        """Stop the run's active jobs on every other cluster that answers, and wait until they have stopped."""
        for other, jobs in self.clusters.items():
            if other == key:
                continue
            try:
                for j in jobs.jobs_of(self.location.uri()):
                    if j.active:
                        self.say(f"stopping job {j.submission_id} on cluster {other!r}: the run is on cluster {key!r} now")
                        jobs.stop(j.submission_id)
                        self._wait_terminal(jobs, j.submission_id, timeout_s=STOP_ELSEWHERE_WAIT_S)
            except ClusterUnreachableError as e:
                logger.debug("%s", e)  # its driver's lease keeps it from training beside the next job

    def _wait_terminal(self, jobs: ClusterJobs, submission_id: str, timeout_s: float | None = None,
                       waiting: Callable[[str], None] | None = None) -> str:
        """The job's status once it has ended, or after ``timeout_s`` (None: no limit) whatever it is then;
        ``waiting(status)`` is called at every look that finds it still going."""
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = jobs.status(submission_id)
            if status in TERMINAL or time.monotonic() > deadline:
                return status
            if waiting is not None:
                waiting(status)
            time.sleep(min(self.poll_s, 1.0))

    def _run_on(self, key: str, retry: bool) -> tuple[str, dict[str, object] | None]:
        """Attach to or submit the run's job on cluster ``key``; watch it to its end.

        Returns the job's final status, ``"unreachable"`` after ``ClusterUnreachable`` was
        written, or ``"climbed"`` once the job was stopped for a climb back to another cluster,
        and the job's result line when it printed one.
        """
        jobs = self.clusters[key]
        ref = jobs.ref
        lost_since: float | None = None
        submission_id: str | None = None
        looked_elsewhere = time.monotonic()
        said_waiting = False
        while True:
            self._check_lease()
            try:
                if time.monotonic() - looked_elsewhere >= STOP_ELSEWHERE_EVERY_S:
                    looked_elsewhere = time.monotonic()
                    self._stop_elsewhere(key)
                if submission_id is None:
                    active = jobs.active_job(self.location.uri())
                    if active is not None:
                        submission_id = active.submission_id
                        self.say(f"following job {submission_id} on cluster {key!r}")
                    else:
                        if not self._driver_lease_free():
                            time.sleep(self.poll_s)
                            continue
                        submission_id = self._submit(jobs, retry)
                status = jobs.status(submission_id)
                lost_since = None
                if status in TERMINAL:
                    result = self._result_line(jobs, submission_id)
                    if status == "STOPPED" and submission_id in self._stopped:  # its climb was cut short by an outage
                        self.say(f"job {submission_id} on cluster {key!r}: STOPPED by this mover for a climb it could not "
                                 "finish; the run goes on where its ledger says")
                        return "climbed", None
                    gone = " (the cluster no longer knows it: its head restarted)" if status == GONE else ""
                    self._last_why = self._why(jobs, submission_id, status)
                    why = f": {self._last_why}" if self._last_why else ""
                    self.say(f"job {submission_id} on cluster {key!r}: {status}{gone}{why}")
                    return status, result
                if status == "RUNNING" and self._climb_across(key, jobs, submission_id):
                    return "climbed", None
            except ClusterUnreachableError as e:
                now = time.time()
                lost_since = lost_since if lost_since is not None else now
                waited = now - lost_since
                logger.info("%s (for %.0fs)", e, waited)
                if waited >= ref.unreachable_timeout_s:
                    try:
                        state, renewing = self.state(), self._live_driver() is not None
                    except (LedgerError, OSError) as storage:  # the mover's own network down: nothing to write with
                        logger.info("cannot read the run's ledger either: %s", storage)
                        time.sleep(self.poll_s)
                        continue
                    if self.ladder.cluster_key(state.tier) != key or state.is_terminal:
                        return "moved on", None  # its driver moved the run on, or ended it, while the mover could not see
                    if renewing:
                        # The run's driver there still renews its lease: the run trains, and what is down is the
                        # way to the Jobs API (the mover's network, the dashboard), not the cluster.
                        if not said_waiting:
                            said_waiting = True
                            self.say(f"cluster {key!r} has not answered for {waited:.0f}s, but the run's driver there "
                                     "renews its lease: waiting")
                    else:
                        self._cluster_lost(key, waited)
                        return "unreachable", None
            time.sleep(self.poll_s)

    def _check_lease(self) -> None:
        """``DriverLeaseLostError`` once another mover took this one's lease (this one was cut off from the
        storage past its TTL, a laptop asleep): two movers would submit and stop each other's jobs."""
        holder = self._lease.lost if self._lease is not None else None
        if holder is not None:
            raise DriverLeaseLostError(f"another mover (host {holder.host}, pid {holder.pid}) took run "
                                       f"{self.location.uri()} while this one could not renew its lease: this one stops")

    def _live_driver(self) -> LeaseInfo | None:
        """The run's driver lease, while a live driver holds it (its holder renews it)."""
        lease = DriverLease(self.location, ttl_s=self.lease_ttl_s)
        current = lease.read()
        return current if current is not None and lease.holder_is_live(current) else None

    def _driver_lease_free(self) -> bool:
        """Whether no live driver holds the run (a job on an unreachable cluster may still): then submitting is safe.

        Says once per holder what the next job waits for: the wait lasts until the holder lets go or
        its lease, no longer renewed, expires.
        """
        current = self._live_driver()
        if current is None:
            return True
        if current.token != self._lease_said:
            self._lease_said = current.token
            self.say(f"waiting for the run's driver (host {current.host}, pid {current.pid}) to let go of its lease "
                     f"before the next job is submitted (it expires in {max(0.0, current.expires_at - time.time()):.0f}s "
                     "unless renewed)")
        return False

    def _submit(self, jobs: ClusterJobs, retry: bool) -> str:
        """Submit the run's job to ``jobs``' cluster. A submission whose answer was lost is retried under its own id,
        so one that reached the cluster is found there, not doubled."""
        submission_id = self._submitting.setdefault(jobs.name, f"spotfallback-{self.location.name}-{uuid.uuid4().hex[:8]}")
        options = ["--on-cluster", jobs.name, *(["--retry-failed"] if retry else [])]
        jobs.submit(submission_id, self.job.run_command(*options, ray_address="auto"), self.location.uri())
        del self._submitting[jobs.name]
        region = f" ({jobs.ref.region})" if jobs.ref.region else ""
        self.say(f"submitted job {submission_id} to cluster {jobs.name!r}{region}")
        return submission_id

    @staticmethod
    def _why(jobs: ClusterJobs, submission_id: str, status: str) -> str:
        """Ray's reason for a job that failed or was stopped, or ``""``.

        Ray's message tells a runtime environment that failed to set up, a supervisor actor that died
        or could not be scheduled, from the entrypoint's own exit, which the log's end alone does not.
        """
        if status not in ("FAILED", "STOPPED"):
            return ""
        try:
            return jobs.job(submission_id).why
        except ClusterUnreachableError as e:
            logger.info("%s", e)
            return ""

    def _result_line(self, jobs: ClusterJobs, submission_id: str) -> dict[str, object] | None:
        """The job's result line, if it printed one (keeping the end of its log)."""
        try:
            logs = jobs.logs(submission_id)
        except ClusterUnreachableError:
            return None
        self._last_log = "\n".join(logs.splitlines()[-20:])
        for line in reversed(logs.splitlines()):
            if line.startswith('{"type": "result"'):
                try:
                    parsed = json.loads(line)
                except ValueError:
                    return None
                return parsed if isinstance(parsed, dict) else None
        return None

    # -- climbing back across clusters --------------------------------------------------------

    def _climb_across(self, key: str, jobs: ClusterJobs, submission_id: str) -> bool:
        """Look at a higher tier's capacity on another cluster; climb there when the policy says it pays.

        A look runs as a Ray job on that cluster; what it saw is weighed just after the running
        gang's next commit, with the run's own measurements from the ledger, by the same
        ``CapacityObserved`` rule a driver applies within its cluster. True once the run's job
        was stopped for a climb (written to the ledger, unless the policy changed its mind).
        """
        now = time.time()
        if self.looks.pending is not None and not self._collect_look(now):
            return False
        if self._seen is None and now - self._last_look < self.look_every_s:
            return False
        try:
            running = self._running_on(key)
        except (LedgerError, OSError) as e:  # storage trouble: look again later, the run goes on
            logger.info("cannot read the ledger to weigh a climb: %s", e)
            return False
        if running is None:
            self._seen = None
            return False
        state, estimates = running
        assert state.running_since is not None
        target = probe_target(self.policy, state, now, self.look_wait_s, estimates, across=True)
        if self._seen is not None:
            to, workers, seen_at = self._seen
            if to != target or workers < self.ladder.tiers[to].fewest_workers or now - seen_at > self.look_every_s:
                self._seen = None
            elif not committed_since(state.last_checkpoint_t, state.running_since, now, self.after_checkpoint_s):
                return False  # wait for the gang's next commit, so that stopping it loses little work
            else:
                self._seen = None
                event = CapacityObserved(t=now, tier=to, available_workers=workers,
                                         remaining_work_s=estimates.remaining_work_s, restart_s=estimates.restart_s,
                                         checkpoint_interval_s=estimates.checkpoint_interval_s)
                if isinstance(self.policy.decide(state, event).decision, ClimbBack):
                    return self._climb(key, jobs, submission_id, event)
        if self._seen is None and now - self._last_look >= self.look_every_s:
            self._last_look = now  # the ledger is read again only at the next look
            # A look brings the tier's nodes up: only ahead of a commit, where a climb can come.
            if target is None or not commit_in_sight(state.last_checkpoint_t, state.checkpoint_interval_s,
                                                     state.running_since, now, self.look_wait_s + self.look_every_s,
                                                     self.after_checkpoint_s):
                return False
            to_key = self.ladder.cluster_key(target)
            assert to_key is not None
            try:
                self.looks.start(target, self.ladder.tiers[target], to_key, now, self.look_wait_s)
                logger.info("looking at %r's capacity on cluster %r", self.ladder.tiers[target].name, to_key)
            except ClusterUnreachableError as e:
                logger.info("cannot look at cluster %r: %s", to_key, e)
        return False

    def _running_on(self, key: str, records: Sequence[LedgerRecord] | None = None) -> tuple[PolicyState, RunEstimates] | None:
        """Where the run stands and what a climb is weighed with; None unless a gang of it runs on cluster ``key``.

        From ``records`` (the whole ledger), or else from the ledger's tail: only the records
        new since the last look are read and folded in, so a look at a run of weeks costs what
        one at a new run does.
        """
        if records is None:
            state, clock = self._fold.update(self._tail.poll(), self._tail.fresh)
        else:
            state, clock = LedgerFold(self.policy).update(records, records)
        if state.is_terminal or state.running_since is None or self.ladder.cluster_key(state.tier) != key:
            return None
        return state, RunEstimates(state.remaining_work_s, clock.restart_s, state.checkpoint_interval_s or 0.0)

    def _collect_look(self, now: float) -> bool:
        """Whether the pending look has ended (what it saw kept in ``_seen``); a silent cluster ends it with nothing."""
        look = self.looks.pending
        assert look is not None
        try:
            workers = self.looks.collect(self.ladder.tiers[look.tier])
        except ClusterUnreachableError as e:  # the look's cluster, not the run's: no capacity seen there
            logger.info("%s", e)
            self.looks.pending = None
            return True
        if workers is None:
            return False
        self._seen = (look.tier, workers, now)
        return True

    def _climb(self, key: str, jobs: ClusterJobs, submission_id: str, seen: CapacityObserved) -> bool:
        """Stop the run's job on ``key`` and, once it has ended and let go of the run (``_let_go``), write the climb
        the policy decides on the ledger as it stands."""
        tier = self.ladder.tiers[seen.tier]
        to_key = self.ladder.cluster_key(seen.tier)
        self.say(f"capacity back on {tier.name!r} on cluster {to_key!r} ({seen.available_workers} workers): "
                 f"stopping job {submission_id} on cluster {key!r} to climb back")
        self._stopped.add(submission_id)
        jobs.stop(submission_id)
        if not self._let_go(key, jobs, submission_id):
            self.say(f"no climb to {tier.name!r}: the run goes on where its ledger says, on cluster {key!r}, once its "
                     "lease is free")
            return True
        records = self.ledger.read()  # waits out a storage outage: what is written next must follow every record
        running = self._running_on(key, records)
        if running is None:
            return True
        state, estimates = running
        event = replace(seen, t=time.time(), remaining_work_s=estimates.remaining_work_s, restart_s=estimates.restart_s,
                        checkpoint_interval_s=estimates.checkpoint_interval_s)
        step = self.policy.decide(state, event)
        if not isinstance(step.decision, ClimbBack):
            self.say(f"no climb to {tier.name!r} after all: the run goes on on cluster {key!r}")
            return True
        self.ledger.append(event, state.tier, step.decision.to_json(), {"tier": tier.name, "cluster": to_key})
        self.say(f"climbing back to {tier.name!r} on cluster {to_key!r}: {step.decision.reason}")
        return True

    def _let_go(self, key: str, jobs: ClusterJobs, submission_id: str) -> bool:
        """Wait until the stopped job has ended and no live driver holds the run's lease; say what is waited for.

        A climb writes the ledger only then: a driver that might still write it, or one that might
        still train, would otherwise run beside the job on the higher cluster. Ray ends a stopped
        job after SIGTERM and, a few seconds on, SIGKILL, so its driver rarely lets go of the lease
        itself: the lease, no longer renewed, expires at its own ``expires_at`` (its writer's TTL,
        whatever that is), and the wait lasts that long, not a fixed time. False when the lease is
        renewed after the job ended: a driver of the run other than that job holds it (no climb).
        ``ClusterUnreachableError`` when the cluster stops answering: the job is followed as any job.
        """
        asked, said = time.monotonic(), False

        def waiting(status: str) -> None:  # the mover's lease still held; the stop said once, asked again each minute
            nonlocal asked, said
            self._check_lease()
            if not said:
                said = True
                self.say(f"waiting for job {submission_id} on cluster {key!r} to stop (it is {status})")
            if time.monotonic() - asked >= STOP_AGAIN_S:
                asked = time.monotonic()
                jobs.stop(submission_id)

        status = self._wait_terminal(jobs, submission_id, waiting=waiting)
        ended: LeaseInfo | None = None  # the lease as it stood once the job had ended
        while (holder := self._live_driver()) is not None:
            self._check_lease()
            if ended is None:
                ended = holder
                self.say(f"job {submission_id} on cluster {key!r} ended {status}, but its driver (host {holder.host}, "
                         f"pid {holder.pid}) did not let go of the run's lease: waiting for it to expire in "
                         f"{max(0.0, holder.expires_at - time.time()):.0f}s")
            elif (holder.token, holder.renewed_at) != (ended.token, ended.renewed_at):
                self.say(f"the run's lease was renewed after job {submission_id} ended, by host {holder.host}, "
                         f"pid {holder.pid}: another driver of the run holds it")
                return False
            time.sleep(self.poll_s)
        return True

    def _cluster_lost(self, key: str, waited_s: float) -> None:
        state = self.state()
        if self.ladder.cluster_key(state.tier) != key or state.is_terminal:
            return  # the run moved on or ended meanwhile
        event = ClusterUnreachable(t=time.time(), cluster=key, waited_s=waited_s)
        step = self.policy.decide(state, event)
        self.ledger.append(event, state.tier, step.decision.to_json(), {"address": self.clusters[key].ref.address})
        self.say(f"cluster {key!r} did not answer for {waited_s:.0f}s: {step.decision.to_json()}")


class LedgerFold:
    """The run's state and latest restart, folded from the ledger's records as a driver folds its events.

    ``update`` folds in only the records new since the last call when they come after every
    record already folded (a ledger read again from its tail), and all of them again otherwise.
    """

    def __init__(self, policy: FallbackPolicy):
        self.policy = policy
        self.state = policy.initial_state()
        self.clock = RestartClock()
        self.count = 0  # records folded

    def update(self, records: Sequence[LedgerRecord], fresh: Sequence[LedgerRecord]) -> tuple[PolicyState, RestartClock]:
        """Fold ``records`` (the whole ledger, in order), of which ``fresh`` are new since the last call."""
        kept = len(records) - len(fresh)
        if kept != self.count or any(a is not b for a, b in zip(records[kept:], fresh, strict=True)):
            self.state, self.clock, kept = self.policy.initial_state(), RestartClock(), 0  # one came before the folded
        for r in records[kept:]:
            self.state = self.policy.decide(self.state, r.event).state
            self.clock = self.clock.after(r.event, str((r.decision or {}).get("action", "")))
        self.count = len(records)
        return self.state, self.clock


def _paths_of_this_machine(job: JobConfig) -> JobConfig:
    """``job`` with a relative storage path and entrypoint file made absolute, where every cluster is on this machine.

    A Ray job starts in the directory its cluster was started in (``ray start``), not the
    mover's; on one machine the absolute path is the one directory both mean. (Across machines a
    relative storage path is refused when the job is read, and a relative entrypoint file is the
    cluster's own, in its image.)
    """
    if not all(ref.on_this_machine for ref in job.ladder.clusters.values()):
        return job
    update: dict[str, str] = {}
    if "://" not in job.storage_path and not os.path.isabs(os.path.expanduser(job.storage_path)):
        update["storage_path"] = os.path.abspath(job.storage_path)
    target, _, function = job.entrypoint.rpartition(":")
    if target.endswith(".py") and not os.path.isabs(os.path.expanduser(target)):
        update["entrypoint"] = f"{os.path.abspath(target)}:{function}"
    return job.model_copy(update=update) if update else job


def _moved_on(before: PolicyState, after: PolicyState) -> bool:
    """Whether a job changed where the run stands: another tier or status, or a new checkpoint."""
    return (before.tier, before.status, before.checkpoints) != (after.tier, after.status, after.checkpoints)


def run_across_clusters(job: JobConfig, **kwargs: object) -> MoveOutcome:
    """Run ``job``, whose tiers name Ray clusters, to its end, moving it between clusters (``ClusterMover``)."""
    return ClusterMover(job, **kwargs).run()  # type: ignore[arg-type]


__all__ = ["MOVER_LEASE_FILE", "ClusterMover", "LedgerFold", "MoveOutcome", "run_across_clusters"]
