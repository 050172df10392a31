"""Capacity faults for a local cluster: preemptions, node failures, capacity droughts, traces.

Why each kind exists: Ray Train treats them differently, so the runner must see each one for
real. A *preemption* is a drain with reason PREEMPTION and a deadline followed by the kill,
exactly what a cloud notice turned into a Ray drain looks like (Ray charges it to
``max_preemption_failures`` and workers can see it through ``get_preemption_info()``). A *kill*
without a drain is a plain node failure. *Taking capacity* removes a market's nodes and
refuses replacements, which is how a capacity timeout happens. *Trace replay* drives the
number of live nodes from recorded spot availability, scaled in time.

The kinds share one timed-action thread and one log, so they stay in one module.

On a ``LocalAutoscalingCluster`` the node faults (notices, preemptions, kills) work the same.
Capacity there is the cloud's cap, which Ray's autoscaler launches against: taking capacity sets
the cap to 0 and preempts the market's nodes, giving it back restores the cap, and a trace sets
the cap tick by tick (preempting the nodes above it). Nodes then come only when a run asks for
them, a provisioning delay later, as on a cloud; none are added here.

Every action is appended to ``Injector.log`` so tests and the demo can print a timeline.
All public methods are thread-safe; timed actions run on one background thread, which
``close()`` stops.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spotfallback.local.cluster import LocalNode, LocalSpotCluster, NodeGroup

if TYPE_CHECKING:
    from spotfallback.local.autoscaling import LocalAutoscalingCluster
    from spotfallback.notices.runlog import RunLog
    from spotfallback.sim.traces import NodeTrace, SpotTrace
    from spotfallback.store.location import RunLocation

Action = Literal[
    "drain",  # preemption notice sent (node keeps running until the deadline)
    "preempt",  # node killed after its drain
    "kill",  # node killed without notice
    "add",  # node added (replacement, give-back, replenish, trace)
    "add-refused",  # a replacement was wanted but the market's capacity is taken
    "cap",  # an autoscaled cluster's capacity cap changed (take, give-back, replenish, trace)
    "take-capacity",
    "give-back",
    "trace",  # a trace tick/event was applied
    "error",  # a background action failed; detail says why
]


@dataclass(frozen=True)
class Injection:
    """One injected action; ``t`` is seconds since the injector was created."""

    t: float
    wall_time: float
    action: Action
    node_id: str | None = None
    market: str | None = None
    detail: str = ""

    def line(self) -> str:
        node = self.node_id[:8] if self.node_id else "-"
        return (
            f"{self.t:8.2f}s  {self.action:<13} {self.market or '-':<10} {node:<8}  {self.detail}"
        )


class _Scheduler:
    """One daemon thread running timed actions in due order; pending ones are dropped on stop."""

    def __init__(self, on_error: Callable[[BaseException, str], None]) -> None:
        self._heap: list[tuple[float, int, str, Callable[[], Any]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopped = False
        self._on_error = on_error
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, fn: Callable[[], Any], what: str) -> None:
        with self._cv:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), what, fn))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="spotfallback-injector", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped:
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        break
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout)
                if self._stopped:
                    return
                _, _, what, fn = heapq.heappop(self._heap)
            try:
                fn()
            except BaseException as e:  # a background failure must be seen, not lost
                self._on_error(e, what)

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._cv:
            self._stopped = True
            self._heap.clear()
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)


class Replay:
    """A trace replay running on its own thread."""

    def __init__(self, name: str, body: Callable[[threading.Event], None]) -> None:
        self.name = name
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(body,), name=name, daemon=True)

    def _run(self, body: Callable[[threading.Event], None]) -> None:
        try:
            body(self._stop)
        except BaseException as e:
            self.error = e
        finally:
            self._done.set()

    def start(self) -> Replay:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the end of the replay; re-raise its error, if any. True if it ended."""
        ended = self._done.wait(timeout_s)
        if self.error is not None:
            raise self.error
        return ended

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)


class Injector:
    """Injects capacity faults into a running local cluster (pre-started or autoscaled), recording each.

    ``replace_after_s``: after a preemption or kill, add a node of the same group after this
    many seconds (a cloud autoscaler replacing the VM), unless that market's capacity is
    taken; ``None`` means no automatic replacement. ``run`` (a ``RunLocation`` or
    ``STORAGE_PATH/NAME``; also settable later with ``record_notices``): each drain's notice
    is written to that run's ledger, as ``spotfallback notice-agent --run`` writes a cloud's.
    """

    def __init__(
        self,
        cluster: LocalSpotCluster | LocalAutoscalingCluster,
        *,
        replace_after_s: float | None = None,
        run: RunLocation | str | None = None,
    ) -> None:
        if replace_after_s is not None and not isinstance(cluster, LocalSpotCluster):
            raise ValueError("replace_after_s: on an autoscaled cluster Ray's autoscaler replaces a lost node "
                             "while the capacity cap allows; leave replace_after_s unset")
        self.cluster = cluster
        self.replace_after_s = replace_after_s
        self._run_log: RunLog | None = None
        self.record_notices(run)
        self.log: list[Injection] = []
        self.errors: list[BaseException] = []
        self._t0 = time.monotonic()
        self._lock = threading.RLock()
        # market -> group -> what give_back restores: the nodes taken away (pre-started cluster)
        # or the cap before the take (autoscaled cluster)
        self._taken: dict[str, dict[str, int]] = {}
        self._doomed: set[str] = set()  # drained, kill pending
        self._replays: list[Replay] = []
        self._scheduler = _Scheduler(self._background_error)
        self._closed = False

    # ----------------------------------------------------------------- plumbing

    def __enter__(self) -> Injector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop background work: pending timed actions are dropped, replays stopped."""
        self._closed = True
        for replay in list(self._replays):
            replay.stop()
        self._scheduler.stop()

    def _record(
        self,
        action: Action,
        node_id: str | None = None,
        market: str | None = None,
        detail: str = "",
    ) -> Injection:
        entry = Injection(
            t=round(time.monotonic() - self._t0, 3),
            wall_time=time.time(),
            action=action,
            node_id=node_id,
            market=market,
            detail=detail,
        )
        with self._lock:
            self.log.append(entry)
        return entry

    def _background_error(self, err: BaseException, what: str) -> None:
        with self._lock:
            self.errors.append(err)
        self._record("error", detail=f"{what}: {type(err).__name__}: {err}")

    def timeline(self) -> str:
        """The log as aligned text lines, for tests and the demo."""
        with self._lock:
            return "\n".join(e.line() for e in self.log)

    def actions(self, action: Action | None = None) -> list[Injection]:
        with self._lock:
            return [e for e in self.log if action is None or e.action == action]

    def is_taken(self, market: str) -> bool:
        with self._lock:
            return market in self._taken

    def _resolve(self, node: LocalNode | str) -> LocalNode:
        return self.cluster.node(node)

    def record_notices(self, run: RunLocation | str | None) -> None:
        """Write each later drain's notice to ``run``'s ledger (``None``: stop writing them).

        The demo and the tests create the injector before the trainer, so they name the run
        here once the trainer exists (``injector.record_notices(trainer.location)``).
        """
        if run is None:
            self._run_log = None
            return
        from spotfallback.notices.runlog import RunLog
        from spotfallback.store.location import resolve_run, split_run_uri

        location = resolve_run(*split_run_uri(run)) if isinstance(run, str) else run
        self._run_log = RunLog(location, writer=f"injector{id(self) % 10000:04d}")

    # ----------------------------------------------------------------- node faults

    def drain(self, node: LocalNode | str, notice_s: float, reason: str = "") -> LocalNode:
        """Send a preemption notice: drain with reason PREEMPTION and deadline now + notice_s.

        The notice goes the notice agent's way: the same ``RayDrain`` (hence the same Ray
        call) and, when a run is known (``record_notices``), the same ``LedgerRecorder``,
        so the ledger shows an injected notice exactly as it shows a cloud's.
        """
        from spotfallback.notices.agent import LedgerRecorder, RayDrain
        from spotfallback.notices.metadata import Notice

        local = self._resolve(node)
        deadline = time.time() + max(notice_s, 0.0)
        notice = Notice(
            "injector",
            f"injector:{local.node_id}:{deadline:.3f}",
            "preempt",
            deadline,
            detail=reason or f"spot preemption injected by spotfallback ({notice_s:g}s notice)",
        )
        RayDrain(self.cluster.gcs_client(), local.node_id)(notice)
        with self._lock:
            self._doomed.add(local.node_id)
        self._record("drain", local.node_id, local.market, f"deadline in {notice_s:g}s")
        run_log = self._run_log
        if run_log is not None:
            LedgerRecorder(run_log, local.node_id)(notice, True, notice.detail)
        return local

    def preempt(
        self,
        node: LocalNode | str,
        notice_s: float = 2.0,
        *,
        block: bool = True,
        reason: str = "",
    ) -> LocalNode:
        """Realistic preemption: drain (notice), then kill when the notice runs out.

        ``notice_s=0`` still drains, so Ray sees a preemption, and kills at once. With
        ``block=False`` the kill happens on the injector's thread and this returns at once.
        """
        local = self.drain(node, notice_s, reason)
        if block or notice_s <= 0:
            time.sleep(max(notice_s, 0.0))
            self._kill(local, "preempt")
        else:
            self._scheduler.call_later(
                notice_s, lambda: self._kill(local, "preempt"), f"preempt {local.node_id[:8]}"
            )
        return local

    def kill(self, node: LocalNode | str, *, delay_s: float = 0.0) -> LocalNode:
        """A node failure without notice (Ray charges it to max_failures, not preemptions).

        A ``LocalNode`` that is already gone is recorded as such: on Ray's autoscaler a drained
        node whose gang has moved away is terminated once idle, before its deadline.
        """
        local = node if isinstance(node, LocalNode) else self._resolve(node)
        if delay_s > 0:
            self._scheduler.call_later(
                delay_s, lambda: self._kill(local, "kill"), f"kill {local.node_id[:8]}"
            )
        else:
            self._kill(local, "kill")
        return local

    def _kill(self, local: LocalNode, action: Action, *, replace: bool = True) -> None:
        with self._lock:
            drained = local.node_id in self._doomed
        try:
            self.cluster.remove_node(local, graceful=False)
        except KeyError:
            # Already gone: a trace or another injection removed it, or (on Ray's autoscaler)
            # the drained node was terminated once idle. Said when a drain or a kill was meant for it.
            if drained or action == "kill":
                self._record(action, local.node_id, local.market, "already gone" + (" after its drain" if drained else ""))
            return
        finally:
            with self._lock:
                self._doomed.discard(local.node_id)
        self._record(action, local.node_id, local.market)
        if replace and self.replace_after_s is not None and not self._closed:
            group = self._started("replace_after_s").groups[local.group]
            self._scheduler.call_later(
                self.replace_after_s,
                lambda: self._add(group, "replacement"),
                f"replace {group.name}",
            )

    def pick(self, market: str = "spot", *, prefer_workers: bool = True) -> LocalNode | None:
        """A running, not yet drained node of ``market``; one hosting train workers if any."""
        with self._lock:
            candidates = [n for n in self.cluster.nodes(market) if n.node_id not in self._doomed]
        if not candidates:
            return None
        if prefer_workers:
            hosted = self.cluster.train_workers_per_node()
            busiest = max(candidates, key=lambda n: hosted.get(n.node_id, 0))
            if hosted.get(busiest.node_id, 0) > 0:
                return busiest
        return candidates[0]

    def preempt_one(
        self, market: str = "spot", notice_s: float = 2.0, *, block: bool = True
    ) -> LocalNode | None:
        """Preempt the node of ``market`` that hosts train workers (else any); None if none run."""
        node = self.pick(market)
        return None if node is None else self.preempt(node, notice_s, block=block)

    def kill_one(self, market: str = "spot") -> LocalNode | None:
        """Kill, without notice, the node of ``market`` that hosts train workers (else any)."""
        node = self.pick(market)
        return None if node is None else self.kill(node)

    # ----------------------------------------------------------------- capacity

    def _autoscaled(self) -> LocalAutoscalingCluster | None:
        """The cluster if Ray's autoscaler launches its nodes (capacity is then a cap), else None."""
        return None if isinstance(self.cluster, LocalSpotCluster) else self.cluster

    def _started(self, what: str) -> LocalSpotCluster:
        """The cluster, for what only a pre-started one can do: add nodes at will."""
        if not isinstance(self.cluster, LocalSpotCluster):
            raise TypeError(f"{what}: on an autoscaled cluster Ray's autoscaler adds nodes; change the cap instead")
        return self.cluster

    def _node_groups(self) -> dict[str, NodeGroup]:
        auto = self._autoscaled()
        if auto is None:
            return self._started("node groups").groups
        return {name: g.group for name, g in auto.groups.items()}

    def _group(self, name: str) -> NodeGroup:
        groups = self._node_groups()
        if name not in groups:
            raise KeyError(f"no node group named {name!r}; groups: {sorted(groups)}")
        return groups[name]

    def _size(self, group: NodeGroup) -> int:
        """The group's configured size: its node count, or its configured cap when autoscaled."""
        auto = self._autoscaled()
        return group.count if auto is None else auto.groups[group.name].configured_cap

    def _groups_of(self, market: str) -> list[NodeGroup]:
        groups = [g for g in self._node_groups().values() if g.market == market]
        if not groups:
            raise KeyError(f"no node group of market {market!r}; groups: {sorted(self._node_groups())}")
        return groups

    def _set_cap(self, group: NodeGroup, cap: int, why: str) -> None:
        """Set an autoscaled group's cap (recorded only when it changes)."""
        auto = self._autoscaled()
        assert auto is not None
        if auto.capacity(group.name) != cap:
            auto.set_capacity(group.name, cap)
            self._record("cap", None, group.market, f"{group.name} cap {cap}: {why}")

    def _add(self, group: NodeGroup, why: str) -> LocalNode | None:
        if self.is_taken(group.market):
            self._record("add-refused", None, group.market, f"{why}: capacity is taken")
            return None
        node = self._started("adding nodes").add_node(group)
        self._record("add", node.node_id, node.market, why)
        return node

    def _remove_many(
        self, nodes: list[LocalNode], notice_s: float | None, *, replace: bool
    ) -> None:
        """Drain all (if notice_s is not None), wait the notice once, kill all."""
        if notice_s is not None:
            for n in nodes:
                self.drain(n, notice_s)
            time.sleep(max(notice_s, 0.0))
        for n in nodes:
            self._kill(n, "kill" if notice_s is None else "preempt", replace=replace)

    def take_capacity(
        self,
        market: str,
        duration_s: float | None = None,
        *,
        notice_s: float | None = 0.0,
        restore: bool = True,
    ) -> list[LocalNode]:
        """Remove every node of ``market`` and refuse replacements until ``give_back``.

        Nodes are preempted (drain, ``notice_s``, kill); ``notice_s=None`` kills them
        without notice. With ``duration_s`` the capacity comes back by itself after that
        long (``restore``: with as many nodes as were taken). On an autoscaled cluster the
        market's caps drop to 0 first, so the autoscaler launches no replacement. Returns
        the removed nodes.
        """
        groups = self._groups_of(market)  # unknown market: fail before touching anything
        with self._lock:
            taken = self._taken.setdefault(market, {})
        self._record(
            "take-capacity",
            None,
            market,
            f"for {duration_s:g}s" if duration_s else "until given back",
        )
        auto = self._autoscaled()
        if auto is not None:
            for g in groups:
                with self._lock:
                    taken.setdefault(g.name, auto.capacity(g.name))  # a second take keeps the first's cap
                self._set_cap(g, 0, "capacity taken")
        removed = self.cluster.nodes(market)
        if auto is None:
            for n in removed:
                with self._lock:
                    taken[n.group] = taken.get(n.group, 0) + 1
        self._remove_many(removed, notice_s, replace=False)
        if duration_s is not None:
            self._scheduler.call_later(
                duration_s, lambda: self.give_back(market, restore=restore), f"give back {market}"
            )
        return removed

    def give_back(self, market: str, *, restore: bool = True) -> list[LocalNode]:
        """Make ``market`` available again; with ``restore``, re-add the nodes taken away.

        On an autoscaled cluster the caps come back as they were before the take, whatever
        ``restore`` says: the autoscaler launches nodes once a run asks, so none are returned.
        """
        with self._lock:
            taken = self._taken.pop(market, None)
        if taken is None:
            return []
        if self._autoscaled() is not None:
            self._record("give-back", None, market, "caps restored")
            for group_name, cap in taken.items():
                self._set_cap(self._group(group_name), cap, "capacity given back")
            return []
        self._record(
            "give-back", None, market, f"restoring {sum(taken.values())} node(s)" if restore else ""
        )
        added: list[LocalNode] = []
        if restore:
            for group_name, n in taken.items():
                for _ in range(n):
                    node = self._add(self._group(group_name), "capacity given back")
                    if node is not None:
                        added.append(node)
        return added

    def replenish(self, market: str, count: int | None = None) -> list[LocalNode]:
        """Add nodes of ``market``: ``count`` more, or up to each group's configured size.

        On an autoscaled cluster this raises the caps instead (by ``count``, or back to each
        group's configured cap) and returns no nodes: the autoscaler launches them on request.
        """
        auto = self._autoscaled()
        added: list[LocalNode] = []
        for group in self._groups_of(market):
            if auto is not None:
                if self.is_taken(market):
                    self._record("add-refused", None, market, "replenish: capacity is taken")
                    return added
                self._set_cap(group, self._size(group) if count is None else auto.capacity(group.name) + count, "replenish")
            else:
                want = count if count is not None else group.count - len(self.cluster.nodes(group=group.name))
                for _ in range(max(want, 0)):
                    node = self._add(group, "replenish")
                    if node is None:
                        return added
                    added.append(node)
            if count is not None:
                break
        return added

    def scale_to(self, market: str, count: int, *, notice_s: float | None = 0.0, group: str | None = None) -> int:
        """Bring ``market``'s first group (or ``group``) to ``count`` nodes; returns how many run.

        Nodes above ``count`` are preempted, newest first (``notice_s=None``: killed without
        notice). Below it, nodes are added on a pre-started cluster; on an autoscaled one
        ``count`` becomes the cap and the autoscaler launches up to it when asked (or to keep
        its ``min_workers``). Refused growth while the market's capacity is taken is recorded.
        """
        if count < 0:
            raise ValueError(f"scale_to({market!r}, {count}): count is a node count, >= 0")
        target = self._group(group) if group else self._groups_of(market)[0]
        return self._scale_to(target, count, notice_s, f"scaled to {count}")

    def _running(self, group: NodeGroup) -> list[LocalNode]:
        """The group's nodes that are up and not draining, oldest first."""
        with self._lock:
            doomed = set(self._doomed)
        return [n for n in self.cluster.nodes(group=group.name) if n.node_id not in doomed]

    def _scale_cap(self, group: NodeGroup, cap: int, growing: bool, why: str) -> None:
        """Set an autoscaled group's cap, unless its market is taken (then growth is refused)."""
        if not self.is_taken(group.market):
            self._set_cap(group, cap, why)
        elif growing:
            self._record("add-refused", None, group.market, f"{why}: capacity is taken")

    def _map_arrivals(self, group: NodeGroup, mapping: dict[str, LocalNode], waiting: list[str]) -> None:
        """Give the nodes the autoscaler launched since the last look to the waiting trace names."""
        known = {n.node_id for n in mapping.values()}
        for node in self._running(group):
            if not waiting:
                return
            if node.node_id not in known:
                mapping[waiting.pop(0)] = node

    def _scale_to(self, group: NodeGroup, target: int, notice_s: float | None, why: str) -> int:
        """Bring ``group`` to ``target`` nodes (newest removed first); returns the running count.

        On an autoscaled cluster ``target`` becomes the cap (nodes above it are preempted, and
        the autoscaler launches up to it only when a run asks).
        """
        running = self._running(group)
        autoscaled = self._autoscaled() is not None
        if autoscaled:
            self._scale_cap(group, target, target > 0, why)  # first: a node preempted below must not be replaced
        if len(running) > target:
            self._remove_many(running[target:][::-1], notice_s, replace=False)
        elif not autoscaled:
            for _ in range(target - len(running)):
                if self._add(group, why) is None:
                    break
        return len(self.cluster.nodes(group=group.name))

    # ----------------------------------------------------------------- traces

    def _wait_until(self, stop: threading.Event, due: float) -> bool:
        """Sleep until monotonic time ``due``; False if asked to stop first."""
        return not stop.wait(max(due - time.monotonic(), 0.0))

    def _start_replay(
        self, name: str, body: Callable[[threading.Event], None], block: bool
    ) -> Replay:
        if self._closed:
            raise RuntimeError("the injector is closed")
        replay = Replay(name, body).start()
        with self._lock:
            self._replays.append(replay)
        if block:
            replay.wait()
        return replay

    def replay_spot_trace(
        self,
        trace: SpotTrace | str | Path,
        market: str = "spot",
        time_scale: float = 3600.0,
        *,
        start_tick: int = 0,
        ticks: int | None = None,
        nodes_per_unit: int = 1,
        max_nodes: int | None = None,
        notice_s: float | None = 0.0,
        group: str | None = None,
        block: bool = False,
        on_tick: Callable[[int, int, int], None] | None = None,
    ) -> Replay:
        """Drive the number of running nodes of ``market`` from a SkyPilot availability trace.

        Tick ``i`` (``gap_seconds`` apart in the trace) sets the group to
        ``min(available[i] * nodes_per_unit, max_nodes)`` nodes (on an autoscaled cluster:
        sets its cap to that); ``time_scale`` is trace seconds per wall second (3600: an hour
        of trace per second). ``max_nodes`` defaults to the group's configured size so a big
        trace cannot swamp the machine. Lost nodes
        are preempted with ``notice_s`` (``None``: killed without notice). ``on_tick(tick,
        target, running)`` is called after each tick is applied.
        """
        from spotfallback.sim.traces import load_spot_trace

        spot = load_spot_trace(trace) if isinstance(trace, str | Path) else trace
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0 (trace seconds per wall second)")
        target_group = self._group(group) if group else self._groups_of(market)[0]
        cap = self._size(target_group) if max_nodes is None else max_nodes
        end = len(spot.available) if ticks is None else min(len(spot.available), start_tick + ticks)
        dt = float(spot.gap_seconds) / time_scale

        def body(stop: threading.Event) -> None:
            t0 = time.monotonic()
            for k, i in enumerate(range(start_tick, end)):
                if not self._wait_until(stop, t0 + k * dt):
                    return
                target = min(int(spot.available[i]) * nodes_per_unit, cap)
                running = self._scale_to(target_group, target, notice_s, f"trace tick {i}")
                self._record(
                    "trace",
                    None,
                    target_group.market,
                    f"{spot.name} tick {i}: available={int(spot.available[i])} target={target} running={running}",
                )
                if on_tick is not None:
                    on_tick(i, target, running)

        return self._start_replay(f"spot-trace-{spot.name}", body, block)

    def replay_node_trace(
        self,
        trace: NodeTrace | str | Path,
        market: str = "spot",
        time_scale: float = 3600.0,
        *,
        start_s: float = 0.0,
        end_s: float | None = None,
        max_nodes: int | None = None,
        notice_s: float | None = 0.0,
        group: str | None = None,
        block: bool = False,
        on_event: Callable[[float, int], None] | None = None,
    ) -> Replay:
        """Replay a node add/remove trace onto ``market``, node identity preserved.

        The trace's nodes alive at ``start_s`` are mapped onto the group's running nodes
        (adding or preempting to match), then each later event adds a node or preempts the
        node mapped to that trace name. At most ``max_nodes`` (default: the group's size)
        trace nodes are mirrored; events on the others are ignored. ``on_event(t_s,
        running)`` is called after each batch of simultaneous events.

        On an autoscaled cluster an added trace node raises the cap by one and takes the
        next node the autoscaler launches (once a run asks for it); a removed one lowers the
        cap and preempts its node, if it came.
        """
        from spotfallback.sim.traces import load_node_trace

        nodes_trace = load_node_trace(trace) if isinstance(trace, str | Path) else trace
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0 (trace seconds per wall second)")
        target_group = self._group(group) if group else self._groups_of(market)[0]
        cap = self._size(target_group) if max_nodes is None else max_nodes
        autoscaled = self._autoscaled() is not None
        events = sorted(nodes_trace.events, key=lambda e: e.t_s)
        alive_at_start: list[str] = []  # events up to start_s fold into the starting state
        for e in events:
            if e.t_s > start_s:
                break
            if e.action == "add" and e.node not in alive_at_start:
                alive_at_start.append(e.node)
            elif e.action == "remove" and e.node in alive_at_start:
                alive_at_start.remove(e.node)
        later = [e for e in events if e.t_s > start_s and (end_s is None or e.t_s <= end_s)]
        batches: dict[float, list[Any]] = {}
        for e in later:
            batches.setdefault(e.t_s, []).append(e)

        def body(stop: threading.Event) -> None:
            mirrored = alive_at_start[:cap]
            self._scale_to(
                target_group, len(mirrored), notice_s, f"{nodes_trace.name} at {start_s:g}s"
            )
            mapping = dict(zip(mirrored, self._running(target_group), strict=False))
            # Trace nodes the cap has room for whose node has not come up yet (autoscaled only).
            waiting = [name for name in mirrored if name not in mapping] if autoscaled else []
            self._record(
                "trace",
                None,
                target_group.market,
                f"{nodes_trace.name} start: mirroring {sorted(mapping)}"
                + (f", waiting for {sorted(waiting)}" if waiting else ""),
            )
            t0 = time.monotonic()
            for t_s, batch in batches.items():
                if not self._wait_until(stop, t0 + (t_s - start_s) / time_scale):
                    return
                if autoscaled:
                    self._map_arrivals(target_group, mapping, waiting)
                removed = [e.node for e in batch if e.action == "remove"]
                gone = [mapping.pop(name) for name in removed if name in mapping]
                waiting[:] = [name for name in waiting if name not in removed]
                added = [e.node for e in batch if e.action == "add" and e.node not in mapping and e.node not in waiting]
                if autoscaled:
                    waiting += added[: max(0, cap - len(mapping) - len(waiting))]
                    self._scale_cap(target_group, len(mapping) + len(waiting), bool(added), f"{nodes_trace.name} t={t_s:g}s")
                self._remove_many(gone, notice_s, replace=False)
                for name in added if not autoscaled else ():
                    if name not in mapping and len(mapping) < cap:
                        node = self._add(target_group, f"{nodes_trace.name} {name}")
                        if node is not None:
                            mapping[name] = node
                running = len(self.cluster.nodes(group=target_group.name))
                self._record(
                    "trace",
                    None,
                    target_group.market,
                    f"{nodes_trace.name} t={t_s:g}s: {', '.join(f'{e.action} {e.node}' for e in batch)}; running={running}",
                )
                if on_event is not None:
                    on_event(t_s, running)

        return self._start_replay(f"node-trace-{nodes_trace.name}", body, block)
