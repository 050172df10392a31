"""The fallback decision logic: events in, decisions out.

Pure: no Ray, no I/O, no clock. The live runner (inside Ray Train's controller), the ledger
replay after a driver crash and the simulator all drive this one module, so what the
simulator predicts is what the runner does. It stays one module, longer than the others, on
purpose: it is the one place where a decision is made.

Leaving a tier is decided by small composable rules in the manner of tenacity's stop
strategies (``PreemptionBudget(3) | FailureBudget(2)``); the capacity timeout is a deadline
the shell watches (``capacity_deadline``) and reports back as ``CapacityTimedOut``. Two rules
need the run's own measurements, which the state keeps from the events' timestamps and the
``remaining_work_s`` the shell passes with each commit: a tier's ``deadline_guard`` (leave
when behind the start-to-deadline line, climb back when ahead of it: Uniform Progress) and
its ``expected_cost_exit`` (leave when staying is expected to cost more than moving down).
A tier's ``cost_cap`` bounds the waste instead of estimating it: the run drops to the last
tier once its spend could otherwise exceed what the last tier alone costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from spotfallback.config import DeadlineGuard, Ladder, Tier, make_ladder
from spotfallback.events import (
    ApplicationFailed,
    CapacityObserved,
    CapacityTimedOut,
    CheckpointCommitted,
    ClimbBack,
    ClusterUnreachable,
    Complete,
    Continue,
    Decision,
    Event,
    Fatal,
    Finished,
    GiveUp,
    InfoEvent,
    NodeFailed,
    Preempted,
    Resize,
    Retry,
    RunStarted,
    SwitchTier,
    WorkersAcquired,
)

Status = Literal["running", "finished", "failed"]

EXIT_PRIOR_H = 4.0  # calm running hours assumed before the run's own, for the expected-cost exit
RATE_PRIOR_H = 0.25  # calm running hours assumed before a tier's own, for the preemption rate a climb expects
CLIMB_DWELL_DOUBLINGS = 4  # a climb's dwell doubles with each earlier climb to the tier, up to 2**4 = 16x


@dataclass(frozen=True)
class TierStats:
    """What has happened on one tier so far."""

    preemptions: int = 0
    failures: int = 0
    app_errors: int = 0
    capacity_timeouts: int = 0
    left_reason: str | None = None
    preemption_times: tuple[float, ...] = ()  # latest ones, kept only for a max_preemption_rate


@dataclass(frozen=True)
class PolicyState:
    """Everything the policy needs to decide; rebuilt exactly by replaying the ledger."""

    tier: int
    stats: tuple[TierStats, ...]
    waiting_since: float | None = None
    running_since: float | None = None
    checkpoints: int = 0
    status: Status = "running"
    give_up: GiveUp | None = None
    tier_history: tuple[int, ...] = field(default=())
    tier_since: float | None = None  # when the run last changed tier (climb-back dwell)
    workers: int = 0  # size of the gang now running or last run (elastic tiers)
    tier_running_s: tuple[float, ...] = ()  # running time per tier (observed preemption rates)
    # The run's own measurements, for deadline guards and the expected-cost exit:
    started_at: float | None = None  # first RunStarted: deadlines count from here
    remaining_work_s: float | None = None  # latest reported with a committed checkpoint
    remaining_gang: int = 0  # size of the gang that reported it (elastic gangs run slower)
    last_checkpoint_t: float | None = None  # latest commit of the running gang
    first_commit_s: float | None = None  # workers up to the gang's first commit, until the interval is known
    checkpoint_interval_s: float | None = None  # between the last two commits of one gang
    restore_s: float | None = None  # billed restart: first commit of a gang less one interval
    lost_s: float = 0.0  # work lost to interruptions: time since the gang's last commit, summed
    interruptions: int = 0  # interruptions of a running gang, counted for lost_s
    spent: float = 0.0  # billed so far (gangs from their workers' arrival to their end), for cost caps

    @property
    def current(self) -> TierStats:
        return self.stats[self.tier]

    @property
    def is_terminal(self) -> bool:
        return self.status != "running"


# ---------------------------------------------------------------------------------------
# Leave rules: each answers "should the run leave this tier now, and why?"


class LeaveRule:
    """A condition on a tier's stats that makes the run leave the tier."""

    def reason(self, stats: TierStats) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __or__(self, other: LeaveRule) -> LeaveRule:
        return AnyRule((self, other))


@dataclass(frozen=True)
class AnyRule(LeaveRule):
    rules: tuple[LeaveRule, ...]

    def reason(self, stats: TierStats) -> str | None:
        for rule in self.rules:
            why = rule.reason(stats)
            if why:
                return why
        return None

    def __or__(self, other: LeaveRule) -> LeaveRule:
        return AnyRule((*self.rules, other))


@dataclass(frozen=True)
class PreemptionBudget(LeaveRule):
    """Leave after more than ``limit`` preemptions (-1: never)."""

    limit: int

    def reason(self, stats: TierStats) -> str | None:
        if self.limit != -1 and stats.preemptions > self.limit:
            return f"preemption budget spent ({stats.preemptions} preemptions, max_preemptions={self.limit})"
        return None


@dataclass(frozen=True)
class FailureBudget(LeaveRule):
    """Leave after more than ``limit`` node failures without notice (-1: never)."""

    limit: int

    def reason(self, stats: TierStats) -> str | None:
        if self.limit != -1 and stats.failures > self.limit:
            return f"failure budget spent ({stats.failures} node failures, max_failures={self.limit})"
        return None


@dataclass(frozen=True)
class PreemptionBurst(LeaveRule):
    """Leave when ``count`` preemptions fell within ``window_s`` seconds (a sliding window)."""

    count: int
    window_s: float

    def reason(self, stats: TierStats) -> str | None:
        times = stats.preemption_times
        if len(times) >= self.count and times[-1] - times[-self.count] <= self.window_s:
            span = times[-1] - times[-self.count]
            return (
                f"preemption rate too high ({self.count} preemptions within {span:.0f}s, "
                f"max_preemption_rate={self.count} per {self.window_s:g}s)"
            )
        return None


def leave_rule_for(tier: Tier) -> LeaveRule:
    rule = PreemptionBudget(tier.max_preemptions) | FailureBudget(tier.max_failures)
    if tier.max_preemption_rate is not None:
        rule = rule | PreemptionBurst(tier.max_preemption_rate.count, tier.max_preemption_rate.window_s)
    return rule


# The policy's arithmetic, shared with the simulator's vectorised engine, which calls these
# helpers on numpy arrays: plain operators only, in one order, so both engines get the same floats.


def schedule_time(guard: DeadlineGuard, started_at: float, done_s: float) -> float:
    """When the guard's line (``pace`` x the straight line from start to deadline) reaches ``done_s``."""
    if guard.pace <= 0:
        return math.inf
    return schedule_line(started_at, done_s, guard.deadline_h, guard.pace, guard.work_h)


def schedule_line(started_at, done_s, deadline_h, pace, work_h):
    """``schedule_time`` for ``pace > 0``, on floats or arrays."""
    return started_at + done_s * deadline_h / (pace * work_h)


def latest_start(started_at, deadline_h, remaining_s, margin_s):
    """When the slack before the deadline is down to ``margin_s`` with ``remaining_s`` still to run."""
    return started_at + deadline_h * 3600.0 - remaining_s - margin_s


def guard_kept_h(margin_h, reserve_h, with_reserve: bool):
    """Slack a guard keeps when it leaves: its margin, and its reserve for climbing back when leaving; on floats or arrays."""
    return margin_h + (reserve_h if with_reserve else 0.0)


def climbed_cutoff(kept, plain, waiting_since, margin_s, least=min, most=max):
    """When the wait for a climb's gang ends: the cut-off that keeps the reserve (``kept``), but not
    before the margin has passed (the move's provisioning and restore), nor after the margin's own
    cut-off (``plain``). On floats, or on arrays with ``least=np.minimum, most=np.maximum``."""
    return least(plain, most(kept, waiting_since + margin_s))


def waiting_cutoff(leave_at, lead_s):
    """When a guard stops waiting for capacity: ``lead_s`` before it would leave, so a gang started then can commit first."""
    return leave_at - lead_s


def on_gang(work, workers_from, workers_to):
    """Work measured on a gang of ``workers_from``, in time on one of ``workers_to`` (data parallel)."""
    return work * workers_from / workers_to


def observed_rate(count, running_s, prior_h=RATE_PRIOR_H):
    """``count`` events per running hour, smoothed by ``prior_h`` calm hours."""
    return count / (running_s / 3600.0 + prior_h)


def repreemption_cost(restart_s, checkpoint_interval_s, rate_per_h):
    """What one more preemption costs a gang billed ``rate_per_h``: a restart and half an interval redone."""
    return (restart_s / 3600.0 + checkpoint_interval_s / 7200.0) * rate_per_h


def climb_balance(rem_now_h, rem_to_h, rate_now, rate_to, restart_h, preemptions_per_h, per_preemption):
    """(saving, restart cost, expected re-preemption cost) of a climb: it pays when the saving exceeds both costs."""
    saving = rem_now_h * rate_now - rem_to_h * rate_to
    return saving, restart_h * rate_to, preemptions_per_h * rem_to_h * per_preemption


def capped_spend(spent, risk, rate_last, remaining_last_h, restart_h):
    """The most a run can cost if it stays on a cheaper tier for one more attempt and then finishes on the last.

    ``spent`` so far, ``risk`` (one attempt lost on the cheaper tier) and the rest on the
    last tier's gang billed ``rate_last``, with one restart.
    """
    return spent + risk + rate_last * (remaining_last_h + restart_h)


def spend_cap(factor, rate_last, work_h, restart_h):
    """``factor`` times the cost of the whole job on the last tier alone (one start)."""
    return factor * (rate_last * (work_h + restart_h))


def over_cap(most, limit):
    """Whether ``most`` breaks the cap ``limit``; a tie within float rounding does not (spend is summed
    from seconds here and from hours elsewhere, and both must decide alike)."""
    return most > limit + 1e-9 * (1.0 + abs(limit))


def expected_cost(work_h: float, rate_per_h: float, loss_h: float, price_per_h: float) -> float:
    """Billed cost of ``work_h`` hours of work with ``rate_per_h`` interruptions each losing ``loss_h``."""
    useful = 1.0 - rate_per_h * loss_h
    return math.inf if useful <= 0 else price_per_h * work_h / useful


# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    state: PolicyState
    decision: Decision


class FallbackPolicy:
    """Walks a run down the ladder. ``decide`` is a pure function of (state, event)."""

    def __init__(self, tiers: Ladder | Sequence[Tier], rules: Sequence[LeaveRule] | None = None):
        self.ladder = make_ladder(tiers)
        self.rules = tuple(rules) if rules is not None else tuple(leave_rule_for(t) for t in self.ladder.tiers)
        if len(self.rules) != len(self.ladder):
            raise ValueError("one leave rule per tier is required")

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return self.ladder.tiers

    def initial_state(self) -> PolicyState:
        return PolicyState(tier=0, stats=tuple(TierStats() for _ in self.tiers), tier_history=(0,))

    def capacity_deadline(self, state: PolicyState) -> float | None:
        """Time by which the current tier's workers must be up, or None for no deadline.

        The tier's capacity timeout, or earlier when its deadline guard says that waiting
        any longer puts the run behind schedule.
        """
        if state.is_terminal or state.waiting_since is None:
            return None
        timeout = self.tiers[state.tier].capacity_timeout_s
        deadline = None if timeout is None else state.waiting_since + timeout
        guard_at = self._guard_deadline(state)
        if guard_at is not None and (deadline is None or guard_at < deadline):
            return guard_at
        return deadline

    def _guard_deadline(self, state: PolicyState) -> float | None:
        """While waiting: when the current tier's deadline guard says leave (progress is frozen).

        With the guard's reserve kept; but a climb's gang, which the reserve paid for, is given
        the margin (a move's provisioning and restore) to come up, within the margin alone.
        """
        if state.waiting_since is None:
            return None
        limits = self.guard_limits(state, state.tier, with_reserve=True)
        if limits is None:
            return None
        lead = self.guard_lead_s(state.tier)
        at = waiting_cutoff(min(limits), lead)
        if self.just_climbed(state):
            guard = self.tiers[state.tier].deadline_guard
            plain = self.guard_limits(state, state.tier)
            assert guard is not None and plain is not None
            at = climbed_cutoff(at, waiting_cutoff(min(plain), lead), state.waiting_since, guard.margin_h * 3600.0)
        return max(state.waiting_since, at)

    def guard_lead_s(self, tier: int) -> float:
        """How much earlier than its leave time the guard of ``tier`` stops waiting: a new gang's time to its first commit."""
        guard = self.tiers[tier].deadline_guard
        return 0.0 if guard is None else guard.first_commit_h * 3600.0

    def replay(self, events: Iterable[Event], state: PolicyState | None = None) -> PolicyState:
        state = state or self.initial_state()
        for event in events:
            state = self.decide(state, event).state
        return state

    def decide(self, state: PolicyState, event: Event) -> Step:
        if isinstance(event, InfoEvent):
            # Notices and just-in-time checkpoints are for the timeline; the failure they
            # announce arrives as its own Preempted event.
            return Step(state, Continue())
        if isinstance(event, RunStarted) and event.reset:
            # A failed run started again on purpose: fresh budgets, progress kept in checkpoints
            # (and the deadline still counts from the first start).
            fresh = replace(
                self.initial_state(),
                waiting_since=event.t,
                checkpoints=state.checkpoints,
                started_at=state.started_at if state.started_at is not None else event.t,
                remaining_work_s=state.remaining_work_s,
                spent=state.spent,
            )
            return Step(fresh, Continue())
        if state.is_terminal:
            # Late events (a checkpoint commit racing the finish, a straggler failure) change
            # nothing; the terminal decision is repeated so the shell stays idempotent.
            return Step(state, state.give_up if state.give_up else Complete())
        t = event.t
        if isinstance(event, Preempted | NodeFailed | ApplicationFailed | ClusterUnreachable):
            state = self._ran(state, t)
        match event:
            case RunStarted():
                started = state.started_at if state.started_at is not None else t
                return Step(replace(state, waiting_since=t, running_since=None, started_at=started), Continue())
            case WorkersAcquired(num_workers=n):
                new = replace(state, waiting_since=None, running_since=t, workers=n, last_checkpoint_t=None,
                              first_commit_s=None)
                return Step(new, Continue())
            case CapacityObserved():
                return self._observed(state, event)
            case CheckpointCommitted(remaining_work_s=remaining):
                return Step(self._committed(state, t, remaining), Continue())
            case Finished():
                return Step(replace(state, status="finished", waiting_since=None, running_since=None), Complete())
            case Fatal(message=message):
                return self._give_up(state, "fatal", message)
            case ClusterUnreachable():
                return self._cluster_lost(state, event)
            case Preempted():
                return self._infrastructure(state, t, preemptions=1)
            case NodeFailed():
                return self._infrastructure(state, t, failures=1)
            case CapacityTimedOut(waited_s=waited):
                guard_at = self._guard_deadline(state)
                stats = replace(state.current, capacity_timeouts=state.current.capacity_timeouts + 1)
                state = self._with_stats(state, stats)
                timeout = self.tiers[state.tier].capacity_timeout_s
                timeout_at = None if timeout is None or state.waiting_since is None else state.waiting_since + timeout
                if guard_at is not None and (timeout_at is None or guard_at <= timeout_at):
                    lead = self.guard_lead_s(state.tier)
                    why = self.guard_reason(state, max(t, guard_at) + lead) or "deadline guard"
                    if lead:
                        why += f", less a new gang's time to its first commit ({lead / 3600.0:.2f} h)"
                    return self._leave(state, t, f"{why} while waiting for capacity (waited {waited:.1f}s)")
                within = f"within capacity_timeout_s={timeout:g}" if timeout is not None else "(the cluster cannot fit this tier)"
                return self._leave(state, t, f"no capacity {within} (waited {waited:.1f}s)")
            case ApplicationFailed(error_type=etype, message=message):
                stats = replace(state.current, app_errors=state.current.app_errors + 1)
                state = self._with_stats(state, stats)
                limit = self.tiers[state.tier].max_failures
                if limit != -1 and stats.app_errors > limit:
                    return self._give_up(
                        state,
                        "application",
                        f"the training function failed {stats.app_errors} times on tier "
                        f"{self.tiers[state.tier].name!r} (max_failures={limit}): {etype}: {message}",
                    )
                return Step(replace(state, waiting_since=t, running_since=None), Retry(tier=state.tier))
        raise TypeError(f"unknown event {event!r}")

    # -- helpers -------------------------------------------------------------------------

    def _committed(self, state: PolicyState, t: float, remaining: float | None) -> PolicyState:
        """Count a commit and measure from it: remaining work, checkpoint interval, restore time.

        The gang's first commit comes a restore plus one interval after its workers were up;
        the second gives the interval, and so the restore.
        """
        interval, first, restore = state.checkpoint_interval_s, state.first_commit_s, state.restore_s
        if state.running_since is not None:
            if state.last_checkpoint_t is None:
                first = t - state.running_since
            else:
                interval = t - state.last_checkpoint_t
                if first is not None:
                    restore, first = max(0.0, first - interval), None
        return replace(
            state,
            checkpoints=state.checkpoints + 1,
            remaining_work_s=remaining if remaining is not None else state.remaining_work_s,
            remaining_gang=state.workers if remaining is not None else state.remaining_gang,
            last_checkpoint_t=t if state.running_since is not None else None,
            first_commit_s=first,
            checkpoint_interval_s=interval,
            restore_s=restore,
        )

    def _with_stats(self, state: PolicyState, stats: TierStats) -> PolicyState:
        all_stats = list(state.stats)
        all_stats[state.tier] = stats
        return replace(state, stats=tuple(all_stats))

    def _infrastructure(self, state: PolicyState, t: float, preemptions: int = 0, failures: int = 0) -> Step:
        stats = replace(
            state.current,
            preemptions=state.current.preemptions + preemptions,
            failures=state.current.failures + failures,
        )
        state = self._lose_gang(state, t)
        rate = self.tiers[state.tier].max_preemption_rate
        if preemptions and rate is not None:
            stats = replace(stats, preemption_times=(*stats.preemption_times, t)[-rate.count :])
        state = self._with_stats(state, stats)
        why = self.rules[state.tier].reason(stats) or self.guard_reason(state, t) or self.expected_cost_reason(state)
        if why:
            return self._leave(state, t, why)
        why = self.cost_cap_reason(state, state.tier, t)
        if why:
            return self._leave(state, t, why, to=len(self.tiers) - 1)
        return Step(replace(state, waiting_since=t, running_since=None), Retry(tier=state.tier))

    def _lose_gang(self, state: PolicyState, t: float) -> PolicyState:
        """A running gang stopped at ``t`` without meaning to: the work since its last commit is lost
        (billed up to ``t`` already, by ``_ran``); a run that was waiting loses nothing."""
        if state.running_since is None:
            return state
        since = state.last_checkpoint_t if state.last_checkpoint_t is not None else state.running_since
        return replace(state, lost_s=state.lost_s + max(0.0, t - since), interruptions=state.interruptions + 1,
                       running_since=None)

    def _leave(self, state: PolicyState, t: float, why: str, to: int | None = None) -> Step:
        """Down to the next tier (or ``to``), or straight to the last one when the next one's cost cap says so."""
        nxt = state.tier + 1 if to is None else to
        if nxt < len(self.tiers) - 1:
            capped = self.cost_cap_reason(state, nxt, t)
            if capped:
                nxt, why = len(self.tiers) - 1, f"{why}; skipping {self.tiers[nxt].name!r}: {capped}"
        stats = replace(state.current, left_reason=why)
        state = self._with_stats(state, stats)
        if nxt >= len(self.tiers):
            return self._give_up(state, "exhausted", self.exhausted_message(state))
        step_state = replace(
            state,
            tier=nxt,
            waiting_since=t,
            running_since=None,
            tier_history=(*state.tier_history, nxt),
            tier_since=t,
        )
        return Step(step_state, SwitchTier(from_tier=state.tier, to_tier=nxt, reason=why))

    def _cluster_lost(self, state: PolicyState, event: ClusterUnreachable) -> Step:
        """Leave every tier of a cluster that stopped answering: on to the next tier on another cluster.

        The gang there (if one ran) is lost with the work since its last commit, as after a
        node failure; the tiers' budgets are not charged, the cluster's fault is not the tier's.
        An event about a cluster the run is not on changes nothing.
        """
        key = self.ladder.cluster_key(state.tier)
        if key is None or key != event.cluster:
            return Step(state, Continue())
        state = self._lose_gang(state, event.t)
        nxt = next((j for j in range(state.tier + 1, len(self.tiers)) if self.ladder.cluster_key(j) != key), len(self.tiers))
        why = f"cluster {key!r} did not answer for {event.waited_s:.0f}s"
        return self._leave(state, event.t, why, to=nxt)

    def _give_up(self, state: PolicyState, cause: str, reason: str) -> Step:
        decision = GiveUp(cause=cause, reason=reason)  # type: ignore[arg-type]
        return Step(replace(state, status="failed", give_up=decision, waiting_since=None, running_since=None), decision)

    def exhausted_message(self, state: PolicyState) -> str:
        lines = ["every tier of the ladder was left:"]
        for tier, stats in zip(self.tiers, state.stats, strict=True):
            lines.append(f"  - {tier.name} ({tier.market}): {stats.left_reason or 'not reached'}")
        return "\n".join(lines)

    # -- beyond one-way fallback: climbing back and growing elastic tiers -----------------

    def _ran(self, state: PolicyState, t: float) -> PolicyState:
        """Add the attempt that ends at ``t`` to its tier's running time."""
        if state.running_since is None:
            return state
        running = list(state.tier_running_s) or [0.0] * len(self.tiers)
        running[state.tier] += max(0.0, t - state.running_since)
        return replace(state, tier_running_s=tuple(running), spent=self.spent_at(state, t))

    def spent_at(self, state: PolicyState, t: float) -> float:
        """Billed by ``t``: the gangs that ended and the one running, from its workers' arrival."""
        if state.running_since is None:
            return state.spent
        hours = max(0.0, t - state.running_since) / 3600.0
        return state.spent + hours * self.gang_rate(state.tier, state.workers or self.tiers[state.tier].num_workers)

    def climb_dwell_s(self, state: PolicyState, to: int) -> float:
        """``min_dwell_s``, doubled for each earlier climb back to ``to`` (``CLIMB_DWELL_DOUBLINGS`` times at most).

        A run climbs back to a tier again only after it was sent down from it again, so each
        repeat is evidence that the tier's returning capacity does not last.
        """
        hist = state.tier_history
        climbs = sum(1 for a, b in zip(hist, hist[1:], strict=False) if b == to and a > b)
        return self.tiers[to].min_dwell_s * 2 ** min(climbs, CLIMB_DWELL_DOUBLINGS)

    def gang_rate(self, tier: int, workers: int) -> float:
        """Price per hour of ``workers`` workers on ``tier``."""
        return workers * self.tiers[tier].price_per_worker_hour

    def observed_preemption_rate(self, state: PolicyState, tier: int) -> float:
        """Preemptions per running hour seen on ``tier``, as if it had first run ``RATE_PRIOR_H``
        (a quarter of an hour) without one.

        The calm quarter keeps a tier with an early preemption from looking infinitely bad:
        one preemption at the very start counts as four per hour.
        """
        running_s = state.tier_running_s[tier] if state.tier_running_s else 0.0
        return observed_rate(state.stats[tier].preemptions, running_s)

    def observed_interruption_rate(self, state: PolicyState, tier: int, prior_h: float = RATE_PRIOR_H) -> float:
        """Preemptions and node failures per running hour on ``tier``, smoothed by ``prior_h`` calm hours."""
        running_s = state.tier_running_s[tier] if state.tier_running_s else 0.0
        stats = state.stats[tier]
        return observed_rate(stats.preemptions + stats.failures, running_s, prior_h)

    # -- deadline guard: Uniform Progress as a leave rule and a climb test ------------------

    def guard_limits(self, state: PolicyState, tier: int, remaining_s: float | None = None,
                     with_reserve: bool = False) -> tuple[float, float] | None:
        """(when the run falls more than the margin behind schedule, when its slack is down to the margin).

        Both for progress frozen where it is now (``remaining_s`` on ``tier``'s full gang, else
        the latest reported, scaled to it from the gang that ran, else all of the guard's
        ``work_h``). ``with_reserve``: the margin and the guard's ``reserve_h``, as for leaving.
        None without a guard or a start, and on the last tier: with nowhere to send the run, its
        guard could only stop one that would finish late, with its progress kept but unused.
        """
        guard = self.tiers[tier].deadline_guard
        if guard is None or state.started_at is None or tier == len(self.tiers) - 1:
            return None
        work, margin = guard.work_h * 3600.0, guard_kept_h(guard.margin_h, guard.reserve_h, with_reserve) * 3600.0
        rem = remaining_s
        if rem is None and state.remaining_work_s is not None:
            # Reported on the gang that ran; progress is measured on the tier's full gang.
            gang, reported = self.tiers[tier].num_workers, state.remaining_gang
            rem = state.remaining_work_s if reported in (0, gang) else on_gang(state.remaining_work_s, reported, gang)
        rem = work if rem is None else max(rem, 0.0)
        behind = schedule_time(guard, state.started_at, work - rem) + margin
        must_go = latest_start(state.started_at, guard.deadline_h, rem, margin)
        return behind, must_go

    def guard_reason(self, state: PolicyState, t: float, with_reserve: bool = True) -> str | None:
        """Why the deadline guard of the current tier says leave at ``t``, or None.

        ``with_reserve=False`` for a gang that runs: the reserve is slack kept by leaving earlier,
        not a reason to stop a gang that keeps pace (one that has just climbed back spends it).
        """
        limits = self.guard_limits(state, state.tier, with_reserve=with_reserve)
        if limits is None:
            return None
        guard = self.tiers[state.tier].deadline_guard
        assert guard is not None and state.started_at is not None
        behind, must_go = limits
        kept = guard_kept_h(guard.margin_h, guard.reserve_h, with_reserve)
        kept_why = f"margin_h={guard.margin_h:g}" + (f" + reserve_h={guard.reserve_h:g}" if with_reserve and guard.reserve_h else "")
        if t >= must_go:
            slack_h = (must_go - t) / 3600.0 + kept
            return f"deadline slack down to {slack_h:.2f} h ({kept_why}, deadline_h={guard.deadline_h:g})"
        if t >= behind:
            late_h = (t - behind) / 3600.0 + kept
            return f"{late_h:.2f} h behind schedule for deadline_h={guard.deadline_h:g} (pace={guard.pace:g}, {kept_why})"
        return None

    def just_climbed(self, state: PolicyState) -> bool:
        """Whether the run waits for the gang of a climb back (it came up the ladder and has not run since)."""
        h = state.tier_history
        return len(h) > 1 and h[-2] > h[-1] and state.waiting_since is not None and state.waiting_since == state.tier_since

    def guard_allows_climb(self, state: PolicyState, event: CapacityObserved) -> tuple[bool, str]:
        """Climb back to a guarded tier only when ahead of schedule by two restarts and the guard's lead.

        Uniform Progress's hysteresis: the run leaves when behind schedule and returns when
        ahead of it at ``t + 2 * restart``, so capacity that comes and goes cannot make it flap;
        the lead (``guard_lead_s``) lets the climbed gang reach its first commit before the
        guard would stop waiting for it.
        """
        cur, to = state.tier, event.tier
        w_cur = state.workers or self.tiers[cur].num_workers
        w_to = max(min(event.available_workers, self.tiers[to].num_workers), 1)
        rem = event.remaining_work_s if event.remaining_work_s is not None else state.remaining_work_s
        limits = self.guard_limits(state, to, None if rem is None else on_gang(rem, w_cur, w_to))
        if limits is None:
            return False, "no start time"
        guard = self.tiers[to].deadline_guard
        assert guard is not None
        behind, must_go = limits
        ahead_until = min(behind - guard.margin_h * 3600.0, must_go)
        need = event.t + 2.0 * event.restart_s + self.guard_lead_s(to)
        if ahead_until < need:
            return False, f"not ahead of schedule by two restarts and the lead ({(ahead_until - event.t) / 3600.0:.2f} h)"
        return True, f"{(ahead_until - event.t) / 3600.0:.2f} h ahead of schedule"

    # -- expected-cost exit -----------------------------------------------------------------

    def expected_cost_reason(self, state: PolicyState) -> str | None:
        """After a failure: leave when staying is expected to cost more than the next tier.

        Each interruption wastes billed time: the restore of the next gang (measured from its
        first commits) and the work since the last commit (measured at every interruption,
        nothing when a just-in-time checkpoint caught it). At the observed interruption rate
        ``r`` an hour of work then takes ``1 / (1 - r * waste)`` billed hours. The next tier
        is priced the same way from what was seen on it, plus one restore. Waiting for
        capacity is not billed and does not count. The rates count ``EXIT_PRIOR_H`` calm
        running hours before the run's own: leaving is for good on a one-way ladder, and a
        burst that passes is not a rate that lasts for the rest of the work. Needs
        ``remaining_work_s`` reported with checkpoints; without it the run stays.
        """
        k = state.tier
        tier = self.tiers[k]
        if not tier.expected_cost_exit or k + 1 >= len(self.tiers) or state.remaining_work_s is None:
            return None
        rem_h = state.remaining_work_s / 3600.0
        restart_h = (state.restore_s or 0.0) / 3600.0
        loss_h = restart_h + (state.lost_s / state.interruptions if state.interruptions else 0.0) / 3600.0
        w_cur = state.workers or tier.num_workers
        w_next = self.tiers[k + 1].num_workers
        rate_now = self.observed_interruption_rate(state, k, EXIT_PRIOR_H)
        rate_next = self.observed_interruption_rate(state, k + 1, EXIT_PRIOR_H)
        stay = expected_cost(rem_h, rate_now, loss_h, self.gang_rate(k, w_cur))
        move = self.gang_rate(k + 1, w_next) * restart_h + expected_cost(
            on_gang(rem_h, w_cur, w_next), rate_next, loss_h, self.gang_rate(k + 1, w_next)
        )
        if stay > move:
            return f"expected cost of staying {stay:.2f} exceeds {move:.2f} on {self.tiers[k + 1].name!r} (expected_cost_exit)"
        return None

    # -- cost cap -----------------------------------------------------------------------------

    def cost_cap_reason(self, state: PolicyState, tier: int, t: float, remaining_s: float | None = None,
                        gang: int | None = None) -> str | None:
        """Why running on ``tier`` from ``t`` could make the run cost more than its ``cost_cap`` allows, or None.

        The bound holds if the run moves to the last tier as soon as one more lost attempt on
        ``tier`` could break it: each check keeps that attempt's spend in hand, so the move,
        when it comes, still fits. ``remaining_s`` (measured on a gang of ``gang`` workers)
        defaults to the latest reported; unknown remaining work never trips the cap.
        """
        cap, last = self.tiers[tier].cost_cap, len(self.tiers) - 1
        rem = remaining_s if remaining_s is not None else state.remaining_work_s
        if cap is None or tier >= last or rem is None:
            return None
        reported = gang if remaining_s is not None else state.remaining_gang
        w_last = self.tiers[last].num_workers
        rem_last = rem if reported in (None, 0, w_last) else on_gang(rem, reported, w_last)
        rate_last = self.gang_rate(last, w_last)
        risk = self.gang_rate(tier, self.tiers[tier].num_workers) * cap.first_commit_h
        most = capped_spend(self.spent_at(state, t), risk, rate_last, max(rem_last, 0.0) / 3600.0, cap.restart_h)
        limit = spend_cap(cap.factor, rate_last, cap.work_h, cap.restart_h)
        if over_cap(most, limit):
            return (f"spend {most:.2f} if one more attempt on {self.tiers[tier].name!r} is lost would exceed "
                    f"{limit:.2f} (cost_cap: {cap.factor:g} x {self.tiers[last].name!r} alone)")
        return None

    def climb_pays(self, state: PolicyState, event: CapacityObserved) -> tuple[bool, str]:
        """Remaining work x price difference against one restart + expected re-preemption cost."""
        cur, to = state.tier, event.tier
        w_cur = state.workers or self.tiers[cur].num_workers
        w_to = min(event.available_workers, self.tiers[to].num_workers)
        rate_cur, rate_to = self.gang_rate(cur, w_cur), self.gang_rate(to, w_to)
        if event.remaining_work_s is None:
            return rate_to < rate_cur, f"{rate_to:.2f}/h instead of {rate_cur:.2f}/h, remaining work unknown"
        rem_cur_h = event.remaining_work_s / 3600.0
        rem_to_h = on_gang(rem_cur_h, w_cur, max(w_to, 1))
        restart_h = event.restart_s / 3600.0
        per_preemption = repreemption_cost(event.restart_s, event.checkpoint_interval_s, rate_to)
        stats_to = state.stats[to] if self.tiers[to].climb_budgets == "carry" else TierStats()
        if self.rules[to].reason(replace(stats_to, preemptions=stats_to.preemptions + 1)):
            per_preemption += restart_h * rate_cur  # the next preemption sends the run back down
        rate = self.observed_preemption_rate(state, to)
        saving, restart, expected = climb_balance(rem_cur_h, rem_to_h, rate_cur, rate_to, restart_h, rate, per_preemption)
        cost = restart + expected
        why = f"saves {saving:.2f} against {restart:.2f} restart + {expected:.2f} expected re-preemption"
        if event.slack_s is not None:
            # A deadline: the climb and each expected re-preemption (with the fall back down
            # and a wait for capacity) must fit in the slack, or the cheaper tier is a gamble.
            n_pre = rate * rem_to_h
            timeout = self.tiers[to].capacity_timeout_s or 0.0
            lose_s = (rem_to_h - rem_cur_h) * 3600.0
            needed = lose_s + (1.0 + n_pre) * (timeout + 2 * event.restart_s + event.checkpoint_interval_s / 2)
            if event.slack_s < needed:
                return False, f"slack {event.slack_s:.0f}s < {needed:.0f}s needed before the deadline"
        return saving > cost, why

    def _observed(self, state: PolicyState, event: CapacityObserved) -> Step:
        t, to, cur = event.t, event.tier, state.tier
        if state.running_since is None or not 0 <= to < len(self.tiers):
            return Step(state, Continue())
        tier = self.tiers[to]
        if to == cur:
            # A shrunk elastic gang runs slower than the tier's full gang: its guard must be able
            # to send it down while it runs, not only after its next failure.
            state = self._reported(state, event)
            # Only towards a next tier (the last tier has no guard): a running gang is never given up on, only moved.
            why = self.guard_reason(state, t, with_reserve=False)
            if why:
                state = replace(self._ran(state, t), running_since=None)
                return self._leave(state, t, f"{why} (running {state.workers} of {tier.num_workers} workers)")
            return self._grow(state, event)
        since = state.tier_since if state.tier_since is not None else state.running_since
        if (
            to > cur
            or since is None
            or not tier.climb_back
            or event.available_workers < tier.fewest_workers
            or t - since < self.climb_dwell_s(state, to)
        ):
            return Step(state, Continue())
        if tier.deadline_guard is not None:
            # The guard knows the deadline; the slack a shell may pass is not needed.
            ahead, why_ahead = self.guard_allows_climb(state, event)
            if not ahead:
                return Step(state, Continue())
            pays, why = self.climb_pays(state, replace(event, slack_s=None))
            why = f"{why_ahead}; {why}"
        else:
            pays, why = self.climb_pays(state, event)
        if not pays:
            return Step(state, Continue())
        rem, gang = (event.remaining_work_s, state.workers) if event.remaining_work_s is not None else (None, None)
        if self.cost_cap_reason(state, to, t, rem, gang):
            return Step(state, Continue())
        reason = f"capacity back on {tier.name!r} ({event.available_workers} workers): {why}"
        state = self._ran(state, t)
        stats = list(state.stats)
        stats[cur] = replace(stats[cur], left_reason=f"climbed back to {tier.name!r}")
        stats[to] = TierStats() if tier.climb_budgets == "fresh" else replace(stats[to], left_reason=None)
        new = replace(
            state,
            stats=tuple(stats),
            tier=to,
            waiting_since=t,
            running_since=None,
            tier_since=t,
            tier_history=(*state.tier_history, to),
            remaining_work_s=event.remaining_work_s if event.remaining_work_s is not None else state.remaining_work_s,
            remaining_gang=state.workers if event.remaining_work_s is not None else state.remaining_gang,
        )
        return Step(new, ClimbBack(from_tier=cur, to_tier=to, reason=reason))

    def _reported(self, state: PolicyState, event: CapacityObserved) -> PolicyState:
        """The state with the observation's remaining work, if it carries one (it is the freshest)."""
        if event.remaining_work_s is None:
            return state
        return replace(state, remaining_work_s=event.remaining_work_s, remaining_gang=state.workers)

    def _grow(self, state: PolicyState, event: CapacityObserved) -> Step:
        """An elastic gang below its maximum restarts larger when that saves more than a restart."""
        tier = self.tiers[state.tier]
        target = min(event.available_workers, tier.num_workers)
        assert state.running_since is not None
        if not tier.is_elastic or target <= state.workers or event.t - state.running_since < tier.min_dwell_s:
            return Step(state, Continue())
        if event.remaining_work_s is not None:
            saved_s = event.remaining_work_s * (1.0 - state.workers / target)
            if saved_s <= event.restart_s:
                return Step(state, Continue())
        state = replace(self._ran(self._reported(state, event), event.t), waiting_since=event.t, running_since=None)
        return Step(state, Resize(tier=state.tier, num_workers=target))


# A restart's length until the run has measured one of its own (its shells' default).
DEFAULT_RESTART_S = 60.0
# A shell decides a climb only this soon after the running gang's latest commit, so that
# stopping the gang loses little work.
CLIMB_AFTER_CHECKPOINT_S = 30.0
# Decisions that stop the gang and start another one: a restart runs from one to the new gang's workers.
MOVE_ACTIONS = frozenset({Retry.action, SwitchTier.action, ClimbBack.action, Resize.action})


@dataclass(frozen=True)
class RestartClock:
    """The run's latest restart, from a move's decision to its new gang's workers: what its shells price a move with.

    A driver folds the events it applies, the moving driver the ledger's records; both the same way.
    """

    restart_s: float = DEFAULT_RESTART_S
    moved_at: float | None = None  # the latest move's decision, until its gang's workers come

    def after(self, event: Event, action: str) -> RestartClock:
        """The clock once ``event`` was applied and answered with a decision of ``action``."""
        restart_s, moved_at = self.restart_s, self.moved_at
        if isinstance(event, WorkersAcquired) and moved_at is not None:
            restart_s, moved_at = max(0.0, event.t - moved_at), None
        if action in MOVE_ACTIONS:
            moved_at = event.t
        return RestartClock(restart_s, moved_at)


def committed_since(last_commit_t: float | None, running_since: float, now: float, within_s: float) -> bool:
    """Whether the running gang committed a checkpoint in the last ``within_s``: only then does a shell decide a climb."""
    return last_commit_t is not None and running_since <= last_commit_t >= now - within_s


def commit_in_sight(last_commit_t: float | None, interval_s: float | None, running_since: float, now: float,
                    lead_s: float, after_s: float) -> bool:
    """Whether a climb decided at a commit can come within ``lead_s``: the running gang committed in
    the last ``after_s``, or its next commit (its latest plus ``interval_s``) is due by then and not a
    whole interval overdue. Nodes asked for (a probe, a look) while no climb can come sit idle and
    billed; a gang with no periodic commits gives a climb no moment."""
    if committed_since(last_commit_t, running_since, now, after_s):
        return True
    if last_commit_t is None or not interval_s or interval_s <= 0 or last_commit_t < running_since:
        return False
    due = last_commit_t + interval_s
    return due - lead_s <= now <= due + interval_s


@dataclass(frozen=True)
class RunEstimates:
    """The run's own measurements a climb is weighed with (a driver's ``CapacityWatch`` keeps them;
    the moving driver reads them from the ledger)."""

    remaining_work_s: float | None = None
    restart_s: float = 0.0
    checkpoint_interval_s: float = 0.0


def probe_target(
    policy: FallbackPolicy,
    state: PolicyState,
    now: float,
    lead_s: float,
    estimates: RunEstimates = RunEstimates(),
    *,
    across: bool = False,
    passed_over: frozenset[int] = frozenset(),
) -> int | None:
    """The tier to look at (and ask the autoscaler for) while the run is below it, or None.

    The policy itself answers: the first tier above the current one that it would climb back
    to if that tier's full gang were placeable when its climb dwell ends (or now, if it has
    ended), asked from ``lead_s`` before then so the nodes can be ready in time. Every climb
    rule that does not depend on the capacity seen applies as it will to the real observation:
    ``climb_back``, price against remaining work, re-preemption cost (a carried spent budget
    included), deadline guards. Only while a gang runs: a run waiting for capacity or moving
    has no climb to prepare. ``across``: a tier on another Ray cluster than the run's (which the
    driver that moves the run between clusters looks at), instead of one on the same cluster
    (which the run's own driver looks at); ``estimates.restart_s`` is then a move's restart.
    ``passed_over``: tiers not to look at now (their last request never got the whole gang), so
    that the next one the run could climb to is.
    """
    if state.is_terminal or state.running_since is None:
        return None
    since = state.tier_since if state.tier_since is not None else state.running_since
    for to in range(state.tier):
        tier = policy.tiers[to]
        dwell_ends = since + policy.climb_dwell_s(state, to)
        if (not tier.climb_back or to in passed_over or now < dwell_ends - lead_s
                or policy.ladder.same_cluster(to, state.tier) == across):
            continue
        observed = CapacityObserved(
            t=max(now, dwell_ends),
            tier=to,
            available_workers=tier.num_workers,
            remaining_work_s=estimates.remaining_work_s,
            restart_s=estimates.restart_s,
            checkpoint_interval_s=estimates.checkpoint_interval_s,
        )
        if isinstance(policy.decide(state, observed).decision, ClimbBack):
            return to
    return None
