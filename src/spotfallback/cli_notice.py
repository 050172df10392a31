"""`spotfallback notice-agent`: one per node, turns the cloud's preemption notice into a Ray drain."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
from typing import Annotated, Any

import typer

from .notices.agent import CLOUDS, DEFAULT_BASE_URL, Notice, NoticeAgent, make_poller

EXIT_BAD_INPUT = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _print_notice(notice: Notice, drained: bool) -> None:
    line = {"source": notice.source, "action": notice.action, "deadline_s": notice.deadline_s, "drained": drained}
    typer.echo(json.dumps({**line, "key": notice.key, "detail": notice.detail}))


def register(app: typer.Typer) -> None:
    @app.command("notice-agent")
    def notice_agent(
        cloud: Annotated[str, typer.Option(help=f"auto, or one of: {', '.join(CLOUDS)}.")] = "auto",
        metadata_url: Annotated[str, typer.Option(help="Instance metadata service base URL.")] = DEFAULT_BASE_URL,
        interval: Annotated[float, typer.Option(help="Seconds between polls.", min=0.05)] = 2.0,
        timeout: Annotated[float, typer.Option(help="Seconds one metadata request may take.", min=0.05)] = 2.0,
        address: Annotated[str | None, typer.Option(help="Ray GCS address (default: RAY_ADDRESS or this node's cluster).")] = None,
        node_id: Annotated[str | None, typer.Option(help="Ray node id to drain (default: the one Ray node on this machine).")] = None,
        run: Annotated[str | None, typer.Option(help="Record notices in this run's ledger: STORAGE_PATH/NAME.")] = None,
        act_on_rebalance: Annotated[bool, typer.Option("--act-on-rebalance", help="AWS: drain on a rebalance recommendation too, not only record it.")] = False,
        rebalance_deadline: Annotated[float, typer.Option(help="AWS: drain deadline (s) when acting on a rebalance recommendation.")] = 120.0,
        gcp_notice: Annotated[float, typer.Option(help="GCP: seconds from the notice to the shutdown.")] = 30.0,
        gcp_wait_for_change: Annotated[bool, typer.Option("--gcp-wait-for-change", help="GCP: hanging GET instead of polling.")] = False,
        azure_vm_name: Annotated[str | None, typer.Option(help="Azure: this VM's name (default: from the metadata service).")] = None,
        k8s_grace: Annotated[float, typer.Option(help="Kubernetes: the pod's terminationGracePeriodSeconds.")] = 30.0,
        once: Annotated[bool, typer.Option("--once", help="Poll once and exit.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Log and record notices, never drain.")] = False,
    ) -> None:
        """Watch the cloud's preemption notices; on one, drain this Ray node (reason PREEMPTION, the
        cloud's deadline) once, so Ray Train checkpoints just in time and counts a preemption.

        Prints one JSON line per notice handled. Exit code 2 on bad input.
        """
        from .cli_run import setup_logging
        from .notices.agent import detect_cloud

        setup_logging(verbose=False)
        logging.getLogger("spotfallback").setLevel(logging.INFO)
        if cloud == "auto":
            detected = detect_cloud(metadata_url, timeout_s=min(timeout, 1.0))
            if detected is None:
                raise _fail("could not detect the cloud (no metadata service answered); pass --cloud")
            cloud = detected
            typer.echo(f"notice-agent: detected cloud {cloud}", err=True)
        if cloud not in CLOUDS:
            raise _fail(f"--cloud: {cloud!r} is not one of auto, {', '.join(CLOUDS)}")
        options: dict[str, Any] = {
            "aws": {"act_on_rebalance": act_on_rebalance, "rebalance_deadline_s": rebalance_deadline},
            "gcp": {"notice_s": gcp_notice, "wait_for_change": gcp_wait_for_change},
            "azure": {"vm_name": azure_vm_name},
            "k8s": {"grace_s": k8s_grace},
        }[cloud]
        poller = make_poller(cloud, metadata_url, timeout_s=timeout, **options)

        target = node_id or "-"
        drain: Any
        if dry_run:

            def drain(notice: Notice) -> None:
                typer.echo(f"notice-agent: dry run, not draining for {notice.key}", err=True)

        else:
            from .notices.agent import RayDrain, gcs_address_for, local_node_id

            try:
                gcs = gcs_address_for(address)
                target = node_id or local_node_id(gcs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise _fail(f"cannot find the Ray node to drain: {e}") from None
            drain = RayDrain(gcs, target)

        recorder = None
        if run is not None:
            from .config import ConfigError
            from .notices.agent import LedgerRecorder
            from .notices.runlog import RunLog
            from .storage import resolve_run, split_run_uri

            try:
                recorder = LedgerRecorder(RunLog(resolve_run(*split_run_uri(run))), target)
            except ConfigError as e:
                raise _fail(f"--run: {e}") from None

        def record(notice: Notice, drained: bool, detail: str) -> None:
            if dry_run:
                drained, detail = False, f"{detail} (dry run: not drained)"
            _print_notice(notice, drained)
            if recorder is not None:
                recorder(notice, drained, detail)

        agent = NoticeAgent(poller, drain, record=record, interval_s=interval)
        stop = threading.Event()
        if cloud == "k8s":
            poller.install()  # type: ignore[attr-defined]  # SIGTERM is the notice
        else:
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        typer.echo(f"notice-agent: watching {cloud} notices for Ray node {target[:12]}", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            agent.run(stop, max_polls=1 if once else None)
