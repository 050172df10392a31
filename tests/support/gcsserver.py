"""A GCS JSON API on loopback: ``gcp-storage-emulator`` (PyPI) in a subprocess, one fidelity fix on top.

``GcsServer`` starts ``python -m tests.support.gcsserver PORT BUCKET`` on 127.0.0.1 at a free
port, waits until it answers, and stops the process by its pid. Objects are kept in memory (the
emulator's on-disk store cannot hold both ``a/b/`` and ``a/b/c``: a directory marker and a file
under it). Runs reach it through a ``gs://`` URI plus ``STORAGE_EMULATOR_HOST`` (``env()``), the
variable Google's own client libraries read for an emulator; ``s3server.OutageProxy`` in front
of it makes an outage. pyarrow writes a file as a resumable upload session (a POST that opens
it, then PUTs of the bytes, several for a large file), which the emulator implements.

The fix: a listing with ``delimiter=/&includeTrailingDelimiter=true`` must also return, among
the objects, those whose names end in the delimiter (the directory markers pyarrow writes);
real GCS does, the emulator returns them only as prefixes. pyarrow lists a directory that way,
so without the fix a run directory's checkpoint directories would not be listed at all.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path
from typing import Any

from tests.support.s3server import emulator_missing, free_port, stop_process, wait_until_answers

REPO = Path(__file__).resolve().parents[2]


class GcsServer:
    """gcp-storage-emulator on 127.0.0.1 with one bucket; use as a context manager."""

    def __init__(self, bucket: str = "runs") -> None:
        if importlib.util.find_spec("gcp_storage_emulator") is None:
            emulator_missing("gcp-storage-emulator is not installed; it is in the dev extra (pip install -e '.[dev]')")
        self.bucket = bucket
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What a process needs to reach this server through a ``gs://`` URI."""
        return {"STORAGE_EMULATOR_HOST": f"http://{endpoint or self.endpoint}"}

    def uri(self, path: str) -> str:
        return f"gs://{self.bucket}/{path}"

    def filesystem(self, endpoint: str | None = None) -> Any:
        """The filesystem a run builds from ``uri()`` and ``env(endpoint)``: the product's own code."""
        from spotfallback.store.location import gcs_filesystem

        return gcs_filesystem(self.uri(""), self.env(endpoint))[0]

    def start(self) -> GcsServer:
        command = [sys.executable, "-m", "tests.support.gcsserver", str(self.port), self.bucket]
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_until_answers(self.proc, f"http://{self.endpoint}/", "gcp-storage-emulator")
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)

    def __enter__(self) -> GcsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(port: int, bucket: str) -> None:
    """The emulator in this process, in memory, with ``bucket`` and the listing fix (see above)."""
    import logging

    from gcp_storage_emulator.handlers import objects

    list_objects = objects.ls

    def ls(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        list_objects(request, response, storage, *args, **kwargs)
        wanted = request.query.get("includeTrailingDelimiter", ["false"])[0].lower() == "true"
        if not wanted or response.status != HTTPStatus.OK or not request.query.get("delimiter"):
            return
        listing = json.loads(response._content)
        stored = storage.objects.get(request.params["bucket_name"], {})
        markers = [stored[p] for p in listing.get("prefixes", []) if p in stored]
        response.json({**listing, "items": sorted([*listing["items"], *markers], key=lambda o: o["name"])})

    objects.ls = ls  # before the server module builds its routing table from it
    from gcp_storage_emulator.server import create_server

    logging.basicConfig(level=logging.CRITICAL)
    create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2])
