"""Just-in-time checkpoints: when Ray Train reports a preemption notice, save, report, move.

Use it in a Ray Train V2 training function::

    watch = PreemptionWatch(every_s=5)
    for step in range(start, total + 1):
        train_one_step()
        ...periodic checkpoints as usual...
        if watch.check():
            watch.save_and_move(lambda: report_checkpoint(step), step=step)

Why each rule (checked against Ray 2.60):

- ``ray.train.get_preemption_info()`` is a barrier across all ranks (4-40 ms a call on a
  small cluster), so ``check()`` must be called by *every* rank at the same step boundaries
  and only asks Ray every ``every_s`` seconds. Ranks' clocks differ, so the number of steps
  between asks is measured by rank 0 and agreed through ``broadcast_from_rank_zero``, at
  fixed call counts every rank reaches.
- The notice is not spent idle: with an estimate of the write (``save_s``, or writes timed
  with ``timing_save()``) the gang trains on and ``check()`` answers only when the save is
  due: once a replacement can take the next gang, or when what is left of the notice is down
  to the save's lead (``notice_window``: the rule the simulator uses too). Rank 0 decides at
  looks about every ``look_every_s`` and broadcasts the answer, so every rank saves at the
  same step. Without an estimate it answers at the notice, as a careful default.
- After the checkpoint the function must neither train on (those steps die with the node)
  nor return (Ray would treat the run as *finished*): ``save_and_move`` never returns. In a
  spotfallback run it asks the autoscaler for the replacement at the notice, and once the
  checkpoint is committed and the next gang fits on nodes that are not draining, rank 0 ends
  the attempt at once (``notices/move.py``); otherwise, and in plain Ray Train runs
  (``save_and_hold``), the workers hold until the controller tears them down at the deadline.
- What happened is written to the run's ledger (spotfallback runs only) as
  ``JitCheckpoint`` records: ``started`` and ``reported`` by rank 0 of the warned attempt,
  ``moved`` by rank 0 when it ends the attempt before the node goes, ``missed`` by rank 0 of
  the next attempt when no checkpoint of that step was committed (the notice was shorter
  than the write: the run resumed from the previous checkpoint).

``jit_failure_config`` sets the ``FailureConfig`` preemption switches on purpose (see there
why relaxed collectives stay off: they break the lockstep this helper relies on).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol

from spotfallback.errors import GangMovedError, JitHoldExpiredError
from spotfallback.events import CheckpointCommitted, JitCheckpoint, LedgerRecord
from spotfallback.notice_window import RAY_TRAIN_POLL_S, commit_margin_s, save_due
from spotfallback.notices.move import Move, Placement
from spotfallback.notices.requests import CheckpointRequest, CheckpointRequests
from spotfallback.notices.runlog import RunLog

logger = logging.getLogger("spotfallback")

# Ray Train's own fallback when a drain carries no deadline (DEFAULT_PREEMPTION_DEADLINE_S).
NO_DEADLINE_WAIT_S = 120.0
# Events that end a worker group's attempt: a JIT checkpoint not committed before one is lost.
_ATTEMPT_ENDS = ("preempted", "node_failed", "application_failed", "capacity_timed_out", "run_started", "fatal")


class TrainSession(Protocol):
    """What the watch needs from Ray Train (a fake in unit tests)."""

    def world_rank(self) -> int: ...

    def preemption_info(self) -> Any: ...

    def broadcast(self, value: Any) -> Any: ...

    def run_log(self) -> RunLog | None: ...


class RaySession:
    """The real one: Ray Train V2's worker-side API."""

    def world_rank(self) -> int:
        import ray.train

        return ray.train.get_context().get_world_rank()

    def preemption_info(self) -> Any:
        import ray.train

        return ray.train.get_preemption_info()

    def broadcast(self, value: Any) -> Any:
        from ray.train.collective import broadcast_from_rank_zero

        return broadcast_from_rank_zero(value)

    def run_log(self) -> RunLog | None:
        """The run's ledger if this is a spotfallback run (plain Ray Train runs have none)."""
        import ray.train

        from spotfallback.store.location import resolve_run

        try:
            storage = ray.train.get_context().get_storage()
            location = resolve_run(storage.storage_fs_path, storage.experiment_dir_name, storage.storage_filesystem)
            log = RunLog(location, writer=f"jit{uuid.uuid4().hex[:6]}")
            return log if log.is_spotfallback_run() else None
        except Exception as e:  # the record is a nicety; training must not depend on it
            logger.warning("just-in-time checkpoints will not be recorded in the ledger: %s", e)
            return None


def ray_train_poll_s() -> float:
    """How often Ray Train's controller polls its workers here (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``)."""
    try:
        return max(0.0, float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", RAY_TRAIN_POLL_S)))
    except ValueError:  # Ray itself would not start with it; plan with its default
        return RAY_TRAIN_POLL_S


def deadline_s_of(info: Any) -> float | None:
    """A PreemptionInfo's deadline in epoch seconds (None: the drain announced none)."""
    deadline_ms = getattr(info, "deadline_ms", None)
    return deadline_ms / 1000.0 if deadline_ms else None


class PreemptionWatch:
    """Asks Ray Train about preemption notices at step boundaries, cheaply and in lockstep.

    ``every_s``: ask about this often (the step count between asks is calibrated by rank 0
    and re-agreed every ``resync_every`` asks); ``every_steps``: ask every N calls instead,
    no calibration. ``max_hold_s``: how long after the deadline ``save_and_hold`` gives up
    waiting for the teardown and raises. ``record``: write ``JitCheckpoint`` ledger records.
    ``move``: in a spotfallback run, ask for the replacement at the notice and leave as soon as
    the next gang can be placed (``save_and_move``; it needs ``record``, since the commit is
    read from the ledger); ``placement`` replaces Ray's GCS in tests.

    ``save_s``: how long the just-in-time save takes (write and report); writes timed with
    ``timing_save()`` raise it. With an estimate and ``train_on`` the gang trains through the
    notice and ``check()`` answers only when the save is due (a replacement is up, or the
    deadline is a lead away: ``notice_window.save_due``); without one it answers at the notice.
    ``look_every_s``: how often rank 0 looks again while training on; ``save_margin_s``: the
    lead's fixed part (default: one poll of Ray Train's controller, which collects the report,
    at the interval this worker runs under, plus clock skew: ``notice_window.commit_margin_s``).

    ``answer_requests``: in a spotfallback run, also answer the controller's checkpoint
    requests (``notices/requests.py``) at the same asks, so a climb back to a higher tier need
    not wait for a periodic checkpoint: ``check()`` then returns a ``CheckpointRequest``, and
    ``save_and_move`` saves and holds until the controller stops the gang. Costs one more
    barrier per ask; pass the same value on every rank. ``requests`` replaces the channel in tests.
    """

    def __init__(
        self,
        every_s: float = 5.0,
        *,
        every_steps: int | None = None,
        max_hold_s: float = 60.0,
        record: bool = True,
        resync_every: int = 8,
        max_interval: int = 100_000,
        session: TrainSession | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        move: bool = True,
        placement: Placement | None = None,
        move_poll_s: float = 0.25,
        train_on: bool = True,
        save_s: float | None = None,
        look_every_s: float = 1.0,
        save_margin_s: float | None = None,
        answer_requests: bool = False,
        requests: CheckpointRequests | None = None,
    ) -> None:
        if every_steps is not None and every_steps < 1:
            raise ValueError("every_steps must be >= 1")
        if save_s is not None and save_s < 0:
            raise ValueError("save_s must be >= 0 (seconds the just-in-time save takes)")
        self.every_s = every_s
        self.every_steps = every_steps
        self.max_hold_s = max_hold_s
        self.resync_every = max(1, resync_every)
        self.max_interval = max_interval
        self.session: TrainSession = session or RaySession()
        self.clock = clock
        self.wall = wall  # epoch seconds, what Ray's deadline is in
        self.rank = self.session.world_rank()
        self.notice: Any = None
        self.interval = every_steps or 1  # calls between asks, the same on every rank
        self.calls = 0
        self.asks = 0
        self._next_ask = 1
        self._last_ask: tuple[float, int] | None = None  # (clock, calls) at the previous ask
        self._log: RunLog | None = None
        self._tier = 0
        self.move = move
        self._placement = placement
        self.move_poll_s = move_poll_s
        self._move: Move | None = None
        self.train_on = train_on
        self.save_s = save_s
        self.look_every_s = look_every_s
        self.save_margin_s = commit_margin_s(ray_train_poll_s()) if save_margin_s is None else save_margin_s
        self._timed_save_s: float | None = None  # the longest write timed by timing_save()
        self._per_call_s: float | None = None  # rank 0's pace: seconds per check() call
        self._due = False  # the save is due: every rank agreed
        self._noticed: tuple[float, int] | None = None  # (wall clock, calls) when the notice was seen
        self.answer_requests = answer_requests
        self._requests: CheckpointRequests | None = None
        if record and self.rank == 0:
            self._log = self.session.run_log()
            if self._log is not None:
                self._reconcile()
        if answer_requests and self.rank == 0 and (requests is not None or self._log is not None):
            self._requests = requests or CheckpointRequests(self._log.location.name)  # type: ignore[union-attr]
            self._requests.listen()

    # -- asking ---------------------------------------------------------------------------

    def check(self) -> Any:
        """Call at every step boundary on every rank: Ray's PreemptionInfo once the save is due (or,
        with ``answer_requests``, the controller's ``CheckpointRequest``), else None.

        Without a notice it asks Ray about every ``every_s``. After one, while the gang trains
        on, rank 0 looks about every ``look_every_s`` and every rank gets its answer.
        """
        if self._due:
            return self.notice  # every rank got the same answer, so none asks again
        self.calls += 1
        if self.calls < self._next_ask:
            return None
        if self.notice is not None:
            return self._look()
        info = self.session.preemption_info()  # barrier
        self.asks += 1
        now = self.clock()
        self._measure_pace(now)
        if self.every_steps is None and (self.asks == 2 or self.asks % self.resync_every == 0):
            self.interval = int(self.session.broadcast(self._proposed_interval()))  # barrier
        self._last_ask = (now, self.calls)
        self._next_ask = self.calls + self.interval
        if info is None:
            return self._requested() if self.answer_requests else None
        self.notice = info
        self._noticed = (self.wall(), self.calls)
        if self.rank == 0:
            left = deadline_s_of(info)
            logger.warning(
                "preemption notice for node(s) %s (ranks %s), %s",
                [n[:8] for n in getattr(info, "preempted_node_ids", [])],
                getattr(info, "preempted_ranks", []),
                "no deadline" if left is None else f"{left - self.wall():.1f}s left",
            )
            self._prepare_move(info)
        if not self.train_on:
            self._due = True
            return info
        return self._look()

    def _requested(self) -> CheckpointRequest | None:
        """Every rank, at an ask: the controller's checkpoint request, as rank 0 read it."""
        pending = self._requests.pending() if self._requests is not None else None
        request = self.session.broadcast(pending)  # barrier
        if not isinstance(request, CheckpointRequest):
            return None
        self.notice, self._due = request, True
        if self.rank == 0:
            logger.warning("the controller asks for a checkpoint: %s", request.reason)
        return request

    def _look(self) -> Any:
        """Every rank, at the same call: rank 0 says whether the save is due and when it looks next."""
        proposal: tuple[bool, int] = (True, 1)
        if self.rank == 0:
            now = self.clock()
            self._measure_pace(now)
            self._last_ask = (now, self.calls)
            proposal = self._decide()
        due, interval = self.session.broadcast(proposal)  # barrier
        self._next_ask = self.calls + max(1, int(interval))
        if due:
            self._due = True
            return self.notice
        return None

    def _decide(self) -> tuple[bool, int]:
        """Rank 0: (save now?, calls until the next look)."""
        per_call = self._per_call_s
        if per_call is None:  # no pace measured yet: no way to tell when the next look comes
            return True, 1
        interval = self._calls_in(self.look_every_s) or 1
        due = save_due(
            self.wall(),
            deadline_s_of(self.notice),
            self.save_estimate_s,
            next_look_s=interval * per_call,
            replacement_ready=self._replacement_ready(),
            margin_s=self.save_margin_s,
        )
        return due, interval

    def _replacement_ready(self) -> bool:
        """Rank 0 of a spotfallback run: can the next gang be placed off the draining node(s) now?"""
        if self._move is None:
            return False
        try:
            return self._move.fits()
        except Exception as e:  # a failed look only means training on until the lead
            logger.debug("could not look for the replacement: %s", e)
            return False

    def _measure_pace(self, now: float) -> None:
        """Rank 0's seconds per call since the last ask or look (its ``_last_ask``)."""
        if self._last_ask is not None and self.calls > self._last_ask[1]:
            then, calls_then = self._last_ask
            self._per_call_s = max(0.0, (now - then) / (self.calls - calls_then))

    def _calls_in(self, seconds: float) -> int | None:
        """Calls in ``seconds`` at the measured pace, within [1, max_interval]; None: no time per call known."""
        per_call = self._per_call_s
        if per_call is None or per_call <= 0:
            return None
        return max(1, min(self.max_interval, math.floor(seconds / per_call)))

    @property
    def save_estimate_s(self) -> float | None:
        """The write time planned with: ``save_s`` or the longest timed write, whichever is longer."""
        known = [s for s in (self.save_s, self._timed_save_s) if s is not None]
        return max(known) if known else None

    @contextmanager
    def timing_save(self) -> Iterator[None]:
        """Time a checkpoint write (wrap the periodic ones): the just-in-time save plans with the longest."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - t0
            self._timed_save_s = took if self._timed_save_s is None else max(self._timed_save_s, took)

    def _prepare_move(self, info: Any) -> None:
        """Rank 0 of a spotfallback run: work out the next gang and ask for it while the notice runs."""
        if not self.move or self._log is None:
            return
        try:
            self._move = Move.at_notice(self._log, info, deadline_s_of(info), self._placement or Placement())
        except Exception as e:  # moving early is an optimisation: holding is always safe
            logger.warning("will hold until the node goes: could not prepare the move (%s)", e)

    def _proposed_interval(self) -> int:
        """Rank 0's measure: calls per ``every_s`` at the pace since the last ask (others' values are ignored)."""
        if self._last_ask is None or self.every_s <= 0:
            return 1
        calls = self._calls_in(self.every_s)
        return self.max_interval if calls is None else calls

    # -- acting ---------------------------------------------------------------------------

    def save_and_move(self, report: Callable[[], Any], *, step: int | None = None) -> NoReturn:
        """Run ``report`` (every rank: it writes and reports the full checkpoint), then leave.

        Never returns: returning would finish the run. Rank 0 of a spotfallback run ends the
        attempt (``GangMovedError``) as soon as the checkpoint is committed and the next gang
        fits off the draining nodes; until then, and on the other ranks, the workers hold, and
        Ray tears them down at the deadline at the latest.
        """
        since = time.time()
        attempt = self._save(report, step)
        self._move_when_ready(since, step, attempt)
        self.hold()

    def save_and_hold(self, report: Callable[[], Any], *, step: int | None = None) -> NoReturn:
        """Run ``report`` (every rank), then hold until the node goes: for plain Ray Train runs.

        Never returns: returning would finish the run. Ray tears the workers down when the
        deadline passes and resumes from this checkpoint.
        """
        self._save(report, step)
        self.hold()

    def _save(self, report: Callable[[], Any], step: int | None) -> str:
        """Record ``started``, run ``report``, record ``reported``; returns the attempt id."""
        if self.notice is None:
            raise RuntimeError("save_and_move() and save_and_hold() need the notice check() returned")
        if isinstance(self.notice, CheckpointRequest):  # no notice: the controller's own move records itself
            t0 = time.time()
            report()
            if self.rank == 0:
                logger.warning("requested checkpoint of step %s reported in %.2fs", step, time.time() - t0)
            return self.notice.id
        deadline = deadline_s_of(self.notice)
        attempt = uuid.uuid4().hex[:12]
        info: dict[str, Any] = {
            "nodes": list(getattr(self.notice, "preempted_node_ids", [])),
            "ranks": list(getattr(self.notice, "preempted_ranks", [])),
        }
        left = None if deadline is None else deadline - self.wall()
        if self._noticed is not None:
            info["trained_on_s"] = round(max(0.0, self.wall() - self._noticed[0]), 3)
            info["trained_on_calls"] = self.calls - self._noticed[1]
        if self._log is not None:
            when = "no deadline" if left is None else f"{left:.1f}s before the deadline"
            if info.get("trained_on_calls"):
                when += f", after training on {info['trained_on_s']:.1f}s ({info['trained_on_calls']} steps) of the notice"
            started = JitCheckpoint(
                t=time.time(),
                outcome="started",
                step=step,
                deadline_s=deadline,
                attempt=attempt,
                detail=when,
            )
            self._log.append_soon(started, info, tier=self._tier)
        t0 = time.time()
        report()
        write_s = time.time() - t0
        if self.rank == 0:
            margin = None if deadline is None else deadline - self.wall()
            logger.warning(
                "just-in-time checkpoint of step %s reported in %.2fs%s",
                step,
                write_s,
                "" if margin is None else f", {margin:.1f}s before the deadline",
            )
            if self._log is not None:
                reported = JitCheckpoint(
                    t=time.time(),
                    outcome="reported",
                    step=step,
                    deadline_s=deadline,
                    attempt=attempt,
                    detail=f"written and reported in {write_s:.2f}s",
                )
                self._log.append_soon(reported, {**info, "write_s": round(write_s, 3), "margin_s": margin})
        return attempt

    def _move_when_ready(self, since: float, step: int | None, attempt: str) -> None:
        """Rank 0: raise ``GangMovedError`` once the move is ready, or return at the deadline to hold."""
        move = self._move
        if move is None or self.rank != 0 or self._log is None:
            return
        deadline = deadline_s_of(self.notice) or time.time() + NO_DEADLINE_WAIT_S
        while time.time() < deadline:
            try:
                ready = move.ready(since, step)
            except Exception as e:  # a failed look is no reason to stop: hold instead
                logger.warning("will hold until the node goes: %s", e)
                return
            if ready:
                left = deadline - time.time()
                moved = JitCheckpoint(
                    t=time.time(),
                    outcome="moved",
                    step=step,
                    deadline_s=deadline_s_of(self.notice),
                    attempt=attempt,
                    detail=f"left {left:.1f}s before the deadline for tier {move.tier.name!r}",
                )
                self._log.append_soon(moved, {"tier": move.gang.tier, "workers": move.gang.num_workers})
                raise GangMovedError(
                    f"the just-in-time checkpoint of step {step} is committed and {move.gang.num_workers} "
                    f"worker(s) of tier {move.tier.name!r} fit off the draining node(s): restarting now, "
                    f"{left:.1f}s before the deadline"
                )
            time.sleep(self.move_poll_s)
        logger.warning("nothing could be placed off the draining node(s) before the deadline: holding")

    def hold(self) -> NoReturn:
        """Wait for the node to go, or the controller to stop the gang (neither train on nor return);
        raise if neither happens."""
        deadline = deadline_s_of(self.notice) or time.time() + NO_DEADLINE_WAIT_S
        until = deadline + self.max_hold_s
        while time.time() < until:
            time.sleep(0.2)
        if isinstance(self.notice, CheckpointRequest):
            raise JitHoldExpiredError(
                f"the workers were still running {self.max_hold_s:g}s after the controller's wait for the requested "
                "checkpoint ended; the controller normally stops them as soon as it is committed"
            )
        raise JitHoldExpiredError(
            f"the workers were still running {self.max_hold_s:g}s after the preemption deadline; "
            "Ray Train normally restarts them at the deadline"
        )

    # -- the previous attempt's outcome ---------------------------------------------------

    def _reconcile(self) -> None:
        """Record ``missed`` for a previous attempt's JIT checkpoint that was never committed."""
        assert self._log is not None
        try:
            # A just-in-time checkpoint is the last one of its attempt (the gang stops after it),
            # so the digest answers as every record would.
            self._tier, records = self._log.digest()
            for missed in missed_jit_checkpoints(records):
                self._log.append(missed, {"resumed_from_step": _last_committed_step(records)}, tier=self._tier)
                logger.warning("just-in-time checkpoint of step %s did not make it: %s", missed.step, missed.detail)
        except Exception as e:  # never let the ledger stop training
            logger.warning("could not check earlier just-in-time checkpoints: %s", e)


def _last_committed_step(records: list[LedgerRecord]) -> int | None:
    steps = [r.event.step for r in records if isinstance(r.event, CheckpointCommitted)]
    return steps[-1] if steps else None


def missed_jit_checkpoints(records: list[LedgerRecord], now: float | None = None) -> list[JitCheckpoint]:
    """``missed`` records due: JIT checkpoints started, their attempt over, none committed.

    Committed means a ``checkpoint_committed`` (of the same step, when both name one) after
    the ``started`` record and before the event that ended that attempt.
    """
    done = {r.event.attempt for r in records if isinstance(r.event, JitCheckpoint) and r.event.outcome == "missed"}
    out = []
    for i, rec in enumerate(records):
        ev = rec.event
        if not isinstance(ev, JitCheckpoint) or ev.outcome != "started" or ev.attempt in done:
            continue
        committed, ended = False, False
        for later in records[i + 1 :]:
            lev = later.event
            if isinstance(lev, CheckpointCommitted) and (ev.step is None or lev.step in (None, ev.step)):
                committed = True
                break
            if lev.kind in _ATTEMPT_ENDS:
                ended = True
                break
        if committed or not ended:
            continue
        resumed = _last_committed_step(records[: i + 1])
        out.append(
            JitCheckpoint(
                t=time.time() if now is None else now,
                outcome="missed",
                step=ev.step,
                deadline_s=ev.deadline_s,
                attempt=ev.attempt,
                detail=(
                    f"no checkpoint of step {ev.step} was committed before the node went; the run resumed "
                    + ("from the start" if resumed is None else f"from the checkpoint of step {resumed}")
                ),
            )
        )
    return out


def jit_failure_config(*, preemption_grace_s: float = 0.0, **kwargs: Any) -> Any:
    """A ``ray.train.FailureConfig`` for just-in-time checkpoints, with the two switches set on purpose.

    ``relax_collectives_on_preemption`` stays False (pass True to override): when it is on and
    the preempted rank is not rank 0, Ray narrows its barrier to the surviving ranks while the
    preempted one is still alive, so the ranks fall out of the lockstep ``PreemptionWatch``
    keeps, and a checkpoint that needs every rank (the example gathers each rank's RNG state)
    does not complete before the deadline. Measured (``bench/bench_notices.py --scenario
    spotfallback+jit+relax:8``, rank 1's node, 8 s notice, 3 runs): the JIT checkpoint was lost
    every time and the run resumed from the periodic one (1-2 steps redone), against 0 steps
    redone in 3 of 3 runs with it off. It could only help a checkpoint that rank 0 writes alone,
    with no collective, after the preempted rank is already gone.
    ``preemption_grace_s`` keeps the surviving ranks running past the deadline so a write
    that outlasts the notice can still finish, when rank 0 is not on the preempted node;
    it delays every such restart by as much, so it stays 0 unless writes outlast notices.
    """
    from ray.train.v2.api.config import FailureConfig

    kwargs.setdefault("relax_collectives_on_preemption", False)
    return FailureConfig(preemption_grace_s=preemption_grace_s, **kwargs)
