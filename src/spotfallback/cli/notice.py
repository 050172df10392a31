"""`spotfallback notice-agent`: one per node, turns the cloud's preemption notice into a Ray drain."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
import urllib.parse
from typing import Annotated, Any

import typer

from spotfallback.cli.common import fail, setup_logging
from spotfallback.errors import ConfigError, SpotfallbackError
from spotfallback.notices.agent import NoticeAgent
from spotfallback.notices.metadata import CLOUDS, DEFAULT_BASE_URL, Notice, make_poller


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


def register(app: typer.Typer) -> None:
    @app.command("notice-agent")
    def notice_agent(
        cloud: Annotated[str, typer.Option(help=f"auto, or one of: {', '.join(CLOUDS)}.", envvar="SPOTFALLBACK_CLOUD")] = "auto",
        metadata_url: Annotated[str, typer.Option(help="Instance metadata service base URL.", envvar="SPOTFALLBACK_METADATA_URL")] = DEFAULT_BASE_URL,
        interval: Annotated[float, typer.Option(help="Seconds between polls.", min=0.05)] = 2.0,
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
        run: Annotated[str | None, typer.Option(help="Record notices in this run's ledger: STORAGE_PATH/NAME.", envvar="SPOTFALLBACK_RUN")] = None,
        ray_wait: Annotated[
            float,
            typer.Option(help="Seconds to wait for the Ray node to come up (a sidecar may start first).", min=0, envvar="SPOTFALLBACK_RAY_WAIT_S"),
        ] = 120.0,
        act_on_rebalance: Annotated[bool, typer.Option("--act-on-rebalance", help="AWS: drain on a rebalance recommendation too, not only record it.")] = False,
        rebalance_deadline: Annotated[float, typer.Option(help="AWS: drain deadline (s) when acting on a rebalance recommendation.")] = 120.0,
        gcp_notice: Annotated[float, typer.Option(help="GCP: seconds from the notice to the shutdown.")] = 30.0,
        gcp_wait_for_change: Annotated[bool, typer.Option("--gcp-wait-for-change", help="GCP: hanging GET instead of polling.")] = False,
        azure_vm_name: Annotated[str | None, typer.Option(help="Azure: this VM's name (default: from the metadata service).")] = None,
        k8s_grace: Annotated[
            float, typer.Option(help="Kubernetes: the pod's terminationGracePeriodSeconds.", min=0, envvar="SPOTFALLBACK_K8S_GRACE_S")
        ] = 30.0,
        once: Annotated[bool, typer.Option("--once", help="Poll once and exit.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Log and record notices, never drain.")] = False,
    ) -> None:
        """Watch the cloud's preemption notices; on one, drain this Ray node (reason PREEMPTION, the
        cloud's deadline) once, so Ray Train checkpoints just in time and counts a preemption.

        Prints one JSON line per notice handled. Exit code 2 on bad input.

        Every setting a sidecar needs has an environment variable (shown below); the Ray node is found through the ray_current_cluster file, so share the Ray container's /tmp/ray with the agent (docs/notices.md).
        """
        from spotfallback.notices.metadata import detect_cloud

        setup_logging(verbose=False)
        logging.getLogger("spotfallback").setLevel(logging.INFO)
        for option, value, low, inclusive in (
            ("--interval", interval, 0.05, True),
            ("--timeout", timeout, 0.05, True),
            ("--ray-wait (SPOTFALLBACK_RAY_WAIT_S)", ray_wait, 0.0, True),
            ("--k8s-grace (SPOTFALLBACK_K8S_GRACE_S)", k8s_grace, 0.0, True),
            ("--gcp-notice", gcp_notice, 0.0, False),
            ("--rebalance-deadline", rebalance_deadline, 0.0, False),
        ):
            _check_number(option, value, low=low, inclusive=inclusive)
        metadata_url = _check_url(metadata_url)
        cloud = cloud.strip().lower()
        if cloud not in ("auto", *CLOUDS):
            raise fail(f"--cloud (SPOTFALLBACK_CLOUD): {cloud!r} is not one of auto, {', '.join(CLOUDS)}")
        if cloud == "auto":
            detected = detect_cloud(metadata_url, timeout_s=min(timeout, 1.0))
            if detected is None:
                raise fail("could not detect the cloud (no metadata service answered); pass --cloud")
            cloud = detected
            typer.echo(f"notice-agent: detected cloud {cloud}", err=True)
        per_cloud: dict[str, dict[str, Any]] = {
            "aws": {"act_on_rebalance": act_on_rebalance, "rebalance_deadline_s": rebalance_deadline},
            "gcp": {"notice_s": gcp_notice, "wait_for_change": gcp_wait_for_change},
            "azure": {"vm_name": azure_vm_name},
            "k8s": {"grace_s": k8s_grace},
        }
        options = per_cloud[cloud]
        poller = make_poller(cloud, metadata_url, timeout_s=timeout, **options)

        target = node_id or "-"
        drain: Any
        if dry_run:

            def drain(notice: Notice) -> None:
                typer.echo(f"notice-agent: dry run, not draining for {notice.key}", err=True)

        else:
            drain = _find_ray_node(address, node_id, ray_wait)
            target = drain.node_id

        recorder = None
        if run is not None:
            from spotfallback.notices.agent import LedgerRecorder
            from spotfallback.notices.runlog import RunLog
            from spotfallback.store.location import resolve_run, split_run_uri

            try:
                recorder = LedgerRecorder(RunLog(resolve_run(*split_run_uri(run))), target)
            except ConfigError as e:
                raise fail(f"--run (SPOTFALLBACK_RUN): {e}", e.exit_code) from None

        def record(notice: Notice, drained: bool, detail: str) -> None:
            if dry_run:
                drained, detail = False, f"{detail} (dry run: not drained)"
            _print_notice(notice, drained)
            if recorder is not None:
                recorder.node_id = getattr(drain, "node_id", None) or target
                recorder(notice, drained, detail)

        agent = NoticeAgent(poller, drain, record=record, interval_s=interval)
        stop = threading.Event()
        if cloud == "k8s":
            poller.install(after=agent.wake)  # type: ignore[attr-defined]  # SIGTERM is the notice
        else:
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        typer.echo(f"notice-agent: watching {cloud} notices for Ray node {target[:12]}", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            agent.run(stop, max_polls=1 if once else None)


def _find_ray_node(address: str | None, node_id: str | None, wait_s: float) -> Any:
    """The drain for this machine's Ray node, waiting up to ``wait_s`` for Ray to come up.

    A sidecar or a boot-time unit may start before ``ray start`` has written its address or
    registered its node (``NoLocalRayNodeError``, retryable): that is waited out. A malformed
    address or several nodes on this machine's address (``AmbiguousRayNodeError``: pass
    --node-id) cannot get better by waiting: exit 2 at once.
    """
    from ray.exceptions import RpcError

    from spotfallback.notices.agent import RayDrain, gcs_address_for

    deadline = time.monotonic() + wait_s
    said = ""
    while True:
        try:
            gcs = gcs_address_for(address)
            drain = RayDrain(gcs, node_id)
            drain.node_id = drain.target()
            return drain
        except SpotfallbackError as e:
            if not e.retryable:
                raise fail(f"cannot find the Ray node to drain: {e}", e.exit_code) from None
            error: Exception = e
        except ValueError as e:  # a malformed address
            raise fail(f"cannot find the Ray node to drain: {e}") from None
        except (ConnectionError, RuntimeError, RpcError) as e:
            error = e
        if time.monotonic() >= deadline:
            raise fail(f"cannot find the Ray node to drain after {wait_s:g}s: {error}") from None
        if str(error) != said:
            typer.echo(f"notice-agent: waiting for the Ray node: {error}", err=True)
            said = str(error)
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
