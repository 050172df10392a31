"""`spotfallback notice-agent`: one per node, turns the cloud's preemption notice into a Ray drain."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer

from spotfallback.cli.common import fail, one_line, setup_logging
from spotfallback.cloud_notices import (
    GCP_GPU_MAINTENANCE_NOTICE_S,
    GCP_MAINTENANCE_NOTICE_S,
    GCP_PREEMPTION_NOTICE_S,
)
from spotfallback.errors import (
    ConfigError,
    DrainRejectedError,
    MetadataError,
    MetadataThrottledError,
    RayNodeNotFoundError,
    SpotfallbackError,
)
from spotfallback.notices.agent import MAX_BACKOFF_S, NoticeAgent
from spotfallback.notices.health import HEALTH_EVERY_S, AgentHealth, HealthReporter, agent_name
from spotfallback.notices.metadata import (
    AZURE_FIRST_CALL_S,
    CLOUDS,
    DEFAULT_BASE_URL,
    Notice,
    PollResult,
    make_poller,
)

# Outside a pod, a node that never comes up is a mistake worth exiting on (its supervisor restarts us).
DEFAULT_RAY_WAIT_S = 120.0


def _check_number(option: str, value: float, *, low: float, inclusive: bool = True) -> None:
    """Seconds must be finite and in range: typer's ``min`` lets nan and inf through."""
    ok = math.isfinite(value) and (value >= low if inclusive else value > low)
    if not ok:
        bound = f"at least {low:g}" if inclusive else f"more than {low:g}"
        raise fail(f"{option}: {value!r} is not a number of seconds {bound}")


def _check_url(url: str) -> str:
    """The metadata service's base URL: http(s) with a host, or every poll would fail."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(
            f"--metadata-url (SPOTFALLBACK_METADATA_URL): {url!r} is not an http(s) URL with a host, "
            f"e.g. {DEFAULT_BASE_URL}"
        )
    return url.strip()


def _print_notice(notice: Notice, drained: bool) -> None:
    line = {"source": notice.source, "action": notice.action, "deadline_s": notice.deadline_s, "drained": drained}
    typer.echo(json.dumps({**line, "key": notice.key, "detail": notice.detail}))


def in_a_pod(flag: bool | None, env: Mapping[str, str] | None = None) -> bool:
    """``--in-pod`` if given, else whether Kubernetes put its service address in the environment
    (the kubelet sets ``KUBERNETES_SERVICE_HOST`` in every container)."""
    env = os.environ if env is None else env
    return flag if flag is not None else bool(env.get("KUBERNETES_SERVICE_HOST"))


def register(app: typer.Typer) -> None:
    @app.command("notice-agent")
    def notice_agent(
        cloud: Annotated[str, typer.Option(help=f"auto, or one of: {', '.join(CLOUDS)}.", envvar="SPOTFALLBACK_CLOUD")] = "auto",
        metadata_url: Annotated[str, typer.Option(help="Instance metadata service base URL.", envvar="SPOTFALLBACK_METADATA_URL")] = DEFAULT_BASE_URL,
        interval: Annotated[float, typer.Option(help=f"Seconds between polls (while the metadata service answers HTTP 429: doubled, up to {MAX_BACKOFF_S:g}).", min=0.05)] = 2.0,
        timeout: Annotated[float, typer.Option(help="Seconds one metadata request may take.", min=0.05)] = 2.0,
        address: Annotated[
            str | None,
            typer.Option(
                help="Ray GCS address host:port (default: this node's cluster, from the ray_current_cluster file "
                "`ray start` writes in $RAY_TMPDIR/ray, /tmp/ray by default).",
                envvar="RAY_ADDRESS",
            ),
        ] = None,
        node_id: Annotated[
            str | None,
            typer.Option(help="Ray node id to drain (default: the one Ray node with this machine's address).", envvar="SPOTFALLBACK_NODE_ID"),
        ] = None,
        run: Annotated[
            str | None,
            typer.Option(
                help="Record notices in this run's ledger, and keep this agent's health record beside it "
                "(`spotfallback status` shows it): STORAGE_PATH/NAME.",
                envvar="SPOTFALLBACK_RUN",
            ),
        ] = None,
        in_pod: Annotated[
            bool | None,
            typer.Option(
                "--in-pod/--not-in-pod",
                help="Whether the agent runs in a Kubernetes pod, whose containers are not restarted: there it "
                "waits for the Ray node until the pod stops. Default: detected (KUBERNETES_SERVICE_HOST).",
                envvar="SPOTFALLBACK_IN_POD",
                show_default=False,
            ),
        ] = None,
        ray_wait: Annotated[
            float | None,
            typer.Option(
                help="Seconds to wait for the Ray node to come up (a sidecar may start first), then exit 2. "
                "Default: in a pod, until the pod stops (its containers are not restarted, so giving up would "
                f"leave the node unwatched); elsewhere {DEFAULT_RAY_WAIT_S:g}.",
                min=0,
                envvar="SPOTFALLBACK_RAY_WAIT_S",
                show_default=False,
            ),
        ] = None,
        health_every: Annotated[
            float,
            typer.Option(help="Seconds between the health record's rewrites (with --run).", envvar="SPOTFALLBACK_HEALTH_EVERY_S"),
        ] = HEALTH_EVERY_S,
        act_on_rebalance: Annotated[bool, typer.Option("--act-on-rebalance", help="AWS: drain on a rebalance recommendation too, not only record it.")] = False,
        rebalance_deadline: Annotated[float, typer.Option(help="AWS: drain deadline (s) when acting on a rebalance recommendation.")] = 120.0,
        gcp_notice: Annotated[
            float,
            typer.Option(help="GCP: seconds from the preemption notice to the shutdown (a Spot VM's extended notice "
                         "where its node pool sets one).", envvar="SPOTFALLBACK_GCP_NOTICE_S"),
        ] = GCP_PREEMPTION_NOTICE_S,
        gcp_maintenance_notice: Annotated[
            float,
            typer.Option(help=f"GCP: seconds from a host-maintenance notice (TERMINATE_ON_HOST_MAINTENANCE) to the stop: "
                         f"{GCP_GPU_MAINTENANCE_NOTICE_S:g} on a VM with GPUs, {GCP_MAINTENANCE_NOTICE_S:g} on others.",
                         envvar="SPOTFALLBACK_GCP_MAINTENANCE_NOTICE_S"),
        ] = GCP_MAINTENANCE_NOTICE_S,
        gcp_wait_for_change: Annotated[bool, typer.Option("--gcp-wait-for-change", help="GCP: hanging GET instead of polling.")] = False,
        azure_vm_name: Annotated[str | None, typer.Option(help="Azure: this VM's name (default: from the metadata service).")] = None,
        azure_first_timeout: Annotated[
            float, typer.Option(help="Azure: seconds the first Scheduled Events request may take (it switches the service on).")
        ] = AZURE_FIRST_CALL_S,
        k8s_grace: Annotated[
            float, typer.Option(help="Kubernetes: the pod's terminationGracePeriodSeconds.", min=0, envvar="SPOTFALLBACK_K8S_GRACE_S")
        ] = 30.0,
        once: Annotated[
            bool,
            typer.Option(
                "--once",
                help="Poll once and exit (no health record): 0 when the metadata service answered (a notice or "
                "none), 1 when it did not, or when a notice's drain failed.",
            ),
        ] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Log and record notices, never drain.")] = False,
    ) -> None:
        """Watch the cloud's preemption notices; on one, drain this Ray node (reason PREEMPTION, the
        cloud's deadline) once, so Ray Train checkpoints just in time and counts a preemption.

        Prints one JSON line per notice handled. Exit code 2 on bad input, or when the Ray node is not
        found in --ray-wait (never in a pod: there it waits until SIGTERM); with --once, 1 when the one
        poll got no answer, or saw a notice and could not drain the node. SIGTERM stops the agent,
        except with --cloud k8s, where it is the notice.

        Every setting a sidecar needs has an environment variable (shown below); the Ray node is found through the ray_current_cluster file, so share the Ray container's /tmp/ray with the agent (docs/notices.md).
        """
        from spotfallback.notices.metadata import detect_cloud

        setup_logging(verbose=False)
        logging.getLogger("spotfallback").setLevel(logging.INFO)
        pod = in_a_pod(in_pod)
        if ray_wait is None:
            ray_wait = math.inf if pod else DEFAULT_RAY_WAIT_S
        else:
            _check_number("--ray-wait (SPOTFALLBACK_RAY_WAIT_S)", ray_wait, low=0.0)
        for option, value, low, inclusive in (
            ("--interval", interval, 0.05, True),
            ("--timeout", timeout, 0.05, True),
            ("--health-every (SPOTFALLBACK_HEALTH_EVERY_S)", health_every, 0.1, True),
            ("--k8s-grace (SPOTFALLBACK_K8S_GRACE_S)", k8s_grace, 0.0, True),
            ("--gcp-notice (SPOTFALLBACK_GCP_NOTICE_S)", gcp_notice, 0.0, False),
            ("--gcp-maintenance-notice (SPOTFALLBACK_GCP_MAINTENANCE_NOTICE_S)", gcp_maintenance_notice, 0.0, False),
            ("--rebalance-deadline", rebalance_deadline, 0.0, False),
            ("--azure-first-timeout", azure_first_timeout, 0.05, True),
        ):
            _check_number(option, value, low=low, inclusive=inclusive)
        metadata_url = _check_url(metadata_url)
        cloud = cloud.strip().lower()
        if cloud not in ("auto", *CLOUDS):
            raise fail(f"--cloud (SPOTFALLBACK_CLOUD): {cloud!r} is not one of auto, {', '.join(CLOUDS)}")
        run_log = None
        if run is not None:
            from spotfallback.notices.runlog import RunLog
            from spotfallback.store.location import resolve_run, split_run_uri

            try:
                run_log = RunLog(resolve_run(*split_run_uri(run)))
            except ConfigError as e:
                raise fail(f"--run (SPOTFALLBACK_RUN): {e}", e.exit_code) from None
        if cloud == "auto":
            detected = detect_cloud(metadata_url, timeout_s=min(timeout, 1.0))
            if detected is None:
                raise fail("could not detect the cloud (no metadata service answered); pass --cloud")
            cloud = detected
            typer.echo(f"notice-agent: detected cloud {cloud}", err=True)
        per_cloud: dict[str, dict[str, Any]] = {
            "aws": {"act_on_rebalance": act_on_rebalance, "rebalance_deadline_s": rebalance_deadline},
            "gcp": {"notice_s": gcp_notice, "maintenance_notice_s": gcp_maintenance_notice,
                    "wait_for_change": gcp_wait_for_change},
            "azure": {"vm_name": azure_vm_name, "first_timeout_s": azure_first_timeout},
            "k8s": {"grace_s": k8s_grace},
        }
        poller = make_poller(cloud, metadata_url, timeout_s=timeout, **per_cloud[cloud])

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the pod (or unit) is stopping
        reporter = None
        if run_log is not None and not once:
            health = AgentHealth.starting(agent_name(node_id=node_id), cloud, time.time(), every_s=health_every, node_id=node_id)
            reporter = HealthReporter(run_log.location, health)
        ended = "crashed"
        try:
            ended = _watch(
                poller, cloud, stop, reporter, run_log,
                address=address, node_id=node_id, ray_wait=ray_wait, pod=pod, interval=interval, once=once, dry_run=dry_run,
            )
        except RayNodeNotFoundError as e:
            ended = f"gave up: {e.message}"
            raise fail(e.message, e.exit_code) from None
        except DrainRejectedError as e:  # --once only: a notice came and its drain failed
            ended = "stopped (--once): drain failed"
            raise fail(
                f"the one poll (--once) saw a notice but could not drain the Ray node: {one_line(str(e))}; check "
                "that Ray runs on this machine and its GCS answers (--address, RAY_ADDRESS)",
                e.exit_code,
            ) from None
        except MetadataError as e:  # --once only: its one poll got no answer, so "all clear" would be a guess
            ended = "stopped (--once): no answer"
            check = (
                "the service is there but refuses requests as too many: something else on this machine asks it "
                "often; run --once again in a few seconds" if isinstance(e, MetadataThrottledError) else
                f"check that it answers on this machine (--metadata-url, SPOTFALLBACK_METADATA_URL) and that this "
                f"machine is on {cloud} (--cloud, SPOTFALLBACK_CLOUD)"
            )
            raise fail(
                f"the one poll (--once) did not get an answer it could use from the {cloud} metadata service at "
                f"{metadata_url}: {one_line(str(e))}; {check}",
                e.exit_code,
            ) from None
        except KeyboardInterrupt:
            ended = "stopped (interrupted)"
        except BaseException as e:
            ended = f"crashed: {type(e).__name__}: {e}"
            raise
        finally:
            if reporter is not None:
                reporter.close(reporter.health.stopped(time.time(), ended))


def _watch(
    poller: Any,
    cloud: str,
    stop: threading.Event,
    reporter: HealthReporter | None,
    run_log: Any,
    *,
    address: str | None,
    node_id: str | None,
    ray_wait: float,
    pod: bool,
    interval: float,
    once: bool,
    dry_run: bool,
) -> str:
    """Find the node (unless dry run), then poll until ``stop``; the health record follows each
    step. Returns why it ended, the health record's last word."""

    def health(change: Callable[[AgentHealth, float], AgentHealth]) -> None:
        if reporter is not None:
            reporter.update(change(reporter.health, time.time()))

    target = node_id or "-"
    drain: Any
    if dry_run:

        def drain(notice: Notice) -> None:
            typer.echo(f"notice-agent: dry run, not draining for {notice.key}", err=True)

    else:
        drain = _find_ray_node(address, node_id, ray_wait, stop, pod=pod, on_wait=lambda why: health(lambda h, now: h.waiting_for_ray(now, why)))
        if drain is None:
            typer.echo("notice-agent: stopped while waiting for the Ray node", err=True)
            return "SIGTERM while waiting for the Ray node"
        target = drain.node_id
    health(lambda h, now: h.watching(now, None if dry_run else target))
    if getattr(poller, "enabling", False):  # Azure: the first poll may take two minutes; say why
        health(lambda h, now: h.after_poll(now, [], [AZURE_FIRST_ASK], [], []))

    recorder = None
    if run_log is not None:
        from spotfallback.notices.agent import LedgerRecorder

        recorder = LedgerRecorder(run_log, target)

    def record(notice: Notice, drained: bool, detail: str) -> None:
        if dry_run:
            drained, detail = False, f"{detail} (dry run: not drained)"
        _print_notice(notice, drained)
        if recorder is not None:
            recorder.node_id = getattr(drain, "node_id", None) or target
            recorder(notice, drained, detail)

    last: list[tuple[PollResult, list[Notice]]] = []  # the last poll's result and drains (--once judges it)

    def observe(result: PollResult, handled: list[Notice], drained: list[Notice]) -> None:
        node = getattr(drain, "node_id", None)
        health(lambda h, now: dataclasses.replace(h.after_poll(now, result.problems, result.pending, handled, drained), node_id=node))
        last[:] = [(result, drained)]

    agent = NoticeAgent(poller, drain, record=record, observe=observe, interval_s=interval)
    if cloud == "k8s":
        poller.install(after=agent.wake)  # SIGTERM is the notice
    typer.echo(f"notice-agent: watching {cloud} notices for Ray node {target[:12]}", err=True)
    agent.run(stop, max_polls=1 if once else None)
    if once and agent.drain_failures:
        raise DrainRejectedError("; ".join(agent.drain_failures))
    if once and last:
        why = no_answer(*last[0], answered=getattr(poller, "answered", True))
        if why and last[0][0].throttled_s is not None:
            raise MetadataThrottledError("; ".join(why), last[0][0].throttled_s)
        if why:
            raise MetadataError("; ".join(why))
    return "stopped (--once)" if once else "stopped (SIGTERM)"


def no_answer(result: PollResult, drained: list[Notice], *, answered: bool = True) -> list[str]:
    """Why one poll is no answer (``--once`` exits 1 naming it), or [] when it is one: a notice or none.

    The health record's rule (``AgentHealth.after_poll``): a poll with problems is
    ``metadata-failing`` unless a notice drained the node. While Azure's service has never
    answered (``answered`` False), its "no answer yet" is a wait to an agent that polls again,
    and no answer to one that does not.
    """
    if drained:
        return []
    return list(dict.fromkeys([*result.problems, *([] if answered else result.pending)]))


AZURE_FIRST_ASK = "enabling Scheduled Events: first request, which can take two minutes"

# Between looks for the Ray node: short at first (a sidecar usually starts seconds before Ray),
# then longer, so an agent waiting all day does not query the GCS every two seconds.
RAY_LOOK_FIRST_S = 1.0
RAY_LOOK_MAX_S = 15.0
# While waiting, say so again this often (the first reason and each new one are said at once).
RAY_WAIT_REMIND_S = 300.0


def _find_ray_node(
    address: str | None,
    node_id: str | None,
    wait_s: float,
    stop: threading.Event,
    *,
    pod: bool = False,
    on_wait: Callable[[str], None] | None = None,
) -> Any:
    """The drain for this machine's Ray node, waiting up to ``wait_s`` (may be infinite) for Ray
    to come up; None if ``stop`` is set (SIGTERM) first.

    A sidecar or a boot-time unit may start before ``ray start`` has written its address or
    registered its node (``NoLocalRayNodeError``, retryable): that is waited out with a
    back-off, logging each new reason and a reminder every few minutes, and reported through
    ``on_wait``. A malformed address or several nodes on this machine's address
    (``AmbiguousRayNodeError``: pass --node-id) cannot get better by waiting: ``RayNodeNotFoundError``
    at once (exit 2).
    """
    from ray.exceptions import RpcError

    from spotfallback.notices.agent import RayDrain, gcs_address_for

    started = time.monotonic()
    deadline = started + wait_s
    said, reminded = "", started
    pause = RAY_LOOK_FIRST_S
    while True:
        try:
            gcs = gcs_address_for(address)
            drain = RayDrain(gcs, node_id)
            drain.node_id = drain.target()
            if said:
                typer.echo(f"notice-agent: found the Ray node after {time.monotonic() - started:.0f}s", err=True)
            return drain
        except SpotfallbackError as e:
            if not e.retryable:
                raise RayNodeNotFoundError(f"cannot find the Ray node to drain: {e}") from None
            error: Exception = e
        except ValueError as e:  # a malformed address
            raise RayNodeNotFoundError(f"cannot find the Ray node to drain: {e}") from None
        except (ConnectionError, RuntimeError, RpcError) as e:
            error = e
        now = time.monotonic()
        if now >= deadline:
            raise RayNodeNotFoundError(f"cannot find the Ray node to drain after {wait_s:g}s: {error}") from None
        if str(error) != said or now - reminded >= RAY_WAIT_REMIND_S:
            until = "until the pod stops" if math.isinf(wait_s) and pod else ("until stopped" if math.isinf(wait_s) else f"up to {wait_s:g}s")
            typer.echo(f"notice-agent: waiting for the Ray node ({now - started:.0f}s so far, {until}): {error}", err=True)
            said, reminded = str(error), now
        if on_wait is not None:
            on_wait(str(error))
        if stop.wait(min(pause, max(0.0, deadline - now))):
            return None
        pause = min(pause * 2, RAY_LOOK_MAX_S)
