"""Checkpoint requests: the controller asks a running gang for a checkpoint, the gang answers.

Why: a climb back from a lower tier otherwise waits for the gang's next periodic checkpoint,
and a gang without periodic checkpoints (a just-in-time one only, the cheapest setting on
spot) never has one while it runs. With requests, the controller watches the higher tier's
capacity while the gang runs, decides the climb when it pays, asks for one checkpoint, and
stops the gang once that checkpoint is committed: the climb loses no work and costs one write.

The channel is Ray's internal key-value store in the GCS, one key per run: the controller
writes the request, rank 0 of a ``PreemptionWatch(answer_requests=True)`` reads it at its
regular asks (one GCS read per ask) and every rank saves at the same step. The watch also
writes a listener key, so the controller knows whether anything will answer: without one
it climbs only just after a periodic checkpoint, as before. Every call is best effort: a
failed read is no request, a failed write no request made, never a broken caller.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger("spotfallback")

KV_NAMESPACE = "spotfallback"
LISTENER_LOOK_S = 10.0  # the controller looks up whether a gang answers at most this often


class KeyValue(Protocol):
    """What the channel needs of a key-value store (Ray's internal KV; a dict in unit tests)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class RayKeyValue:
    """Ray's internal KV in the GCS of the cluster this process is connected to."""

    def get(self, key: str) -> bytes | None:
        from ray.experimental import internal_kv

        return internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)

    def delete(self, key: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)


@dataclass(frozen=True)
class CheckpointRequest:
    """The controller's request, as ``PreemptionWatch.check()`` returns it (truthy, like a notice).

    ``deadline_ms`` (as Ray's ``PreemptionInfo``): how long the controller waits for the
    checkpoint; it stops the gang as soon as the checkpoint is committed, and at this deadline
    at the latest, so the gang holds after its save until then.
    """

    id: str
    reason: str
    asked_at: float
    deadline_ms: int


class CheckpointRequests:
    """One run's request channel (``run``: the run's name, which keys it)."""

    def __init__(self, run: str, store: KeyValue | None = None, clock: Callable[[], float] = time.time) -> None:
        self.run = run
        self.store: KeyValue = store or RayKeyValue()
        self.clock = clock
        self._listened: tuple[float, bool] | None = None  # (when looked, answer): looked up at most every 10 s

    @property
    def _request_key(self) -> str:
        return f"checkpoint-request/{self.run}"

    @property
    def _listener_key(self) -> str:
        return f"checkpoint-listener/{self.run}"

    # -- the gang's side -------------------------------------------------------------------

    def listen(self) -> None:
        """Say that this run's gang answers requests (rank 0 of the watch, at its start)."""
        self._put(self._listener_key, {"since": self.clock()})

    def pending(self) -> CheckpointRequest | None:
        """The request waiting for an answer, if any."""
        data = self._get(self._request_key)
        if not isinstance(data, dict):
            return None
        try:
            asked = float(data["asked_at"])
            return CheckpointRequest(id=str(data["id"]), reason=str(data.get("reason", "")), asked_at=asked,
                                     deadline_ms=int((asked + float(data["wait_s"])) * 1000))
        except (KeyError, TypeError, ValueError):
            return None

    # -- the controller's side --------------------------------------------------------------

    def listened(self) -> bool:
        """Whether the running gang answers requests (looked up at most every ``LISTENER_LOOK_S``)."""
        now = self.clock()
        if self._listened is None or now - self._listened[0] >= LISTENER_LOOK_S:
            self._listened = (now, self._get(self._listener_key) is not None)
        return self._listened[1]

    def ask(self, reason: str, wait_s: float) -> str:
        """Ask the gang for a checkpoint, to be committed within ``wait_s``; the request's id."""
        rid = uuid.uuid4().hex[:12]
        self._put(self._request_key, {"id": rid, "reason": reason, "asked_at": self.clock(), "wait_s": wait_s})
        return rid

    def new_gang(self) -> None:
        """A new gang starts: no request is for it, and it says itself whether it answers."""
        self.withdraw()
        self._delete(self._listener_key)
        self._listened = None

    def withdraw(self) -> None:
        """No request waits any more: answered, or the gang it was for has gone."""
        self._delete(self._request_key)

    # -- best effort ----------------------------------------------------------------------------

    def _get(self, key: str) -> object:
        try:
            raw = self.store.get(key)
            return None if raw is None else json.loads(raw)
        except Exception:
            logger.debug("could not read %s", key, exc_info=True)
            return None

    def _put(self, key: str, value: dict[str, object]) -> None:
        try:
            self.store.put(key, json.dumps(value).encode())
        except Exception:
            logger.debug("could not write %s", key, exc_info=True)

    def _delete(self, key: str) -> None:
        try:
            self.store.delete(key)
        except Exception:
            logger.debug("could not delete %s", key, exc_info=True)
