"""Informational records (notices, just-in-time checkpoints) appended to a run's ledger.

Why a wrapper: these records come from outside the Train controller (the notice agent on a
node, the training function on a worker), so they must find the run's current tier
themselves (replaying the ledger, as the driver does) and must never hold up what they
describe: a storage hiccup may cost the record, never the drain or the checkpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from spotfallback.config import Ladder
from spotfallback.events import InfoEvent, LedgerRecord
from spotfallback.policy import FallbackPolicy
from spotfallback.store.ledger import Ledger
from spotfallback.store.ledger_snapshot import digest_records
from spotfallback.store.location import RunLocation

logger = logging.getLogger("spotfallback")


class RunLog:
    """Appends ``InfoEvent``s to one run's ledger, tagged with the tier the run is on."""

    def __init__(self, location: RunLocation, writer: str | None = None) -> None:
        self.location = location
        # Compacting is the run's writers' job: a record from a node must stay quick.
        self.ledger = Ledger(location, writer=writer, compact_every=0)
        self._dirs_ready = False

    def is_spotfallback_run(self) -> bool:
        """Whether the run has a ledger (plain Ray Train runs have none: nothing is written)."""
        return self.ledger.read_meta() is not None

    def read(self) -> list[LedgerRecord]:
        return self.ledger.read()

    def current_tier(self) -> int:
        """The tier the run is on now (0 before the run starts), replayed from the ledger's stored
        snapshot and the events after it: a notice on a run of weeks costs what one on a new run does."""
        ladder = self.ledger.read_ladder()
        return 0 if ladder is None else self._digest(ladder)[0]

    def digest(self) -> tuple[int, list[LedgerRecord]]:
        """(the run's tier now, its records but committed checkpoints followed by another), from
        the ledger's stored snapshot and the events after it: what a new attempt checks of the
        previous one's just-in-time checkpoint (``store.ledger_snapshot.digest``), read at the
        cost of a new run's ledger however long the run is."""
        ladder = self.ledger.read_ladder()
        return (0, self.ledger.read()) if ladder is None else self._digest(ladder)

    def _digest(self, ladder: Ladder) -> tuple[int, list[LedgerRecord]]:
        view = self.ledger.read_view(ladder)
        tier = FallbackPolicy(ladder).replay((r.event for r in view.tail), view.start_state).tier
        return tier, digest_records(view.snapshot, view.tail)

    def append(self, event: InfoEvent, info: dict[str, Any] | None = None, *, tier: int | None = None) -> LedgerRecord:
        """Append now (replaying for the tier unless given); storage errors propagate."""
        if not self._dirs_ready:
            self.ledger.ensure_dirs()  # the agent may record before the run's first driver starts
            self._dirs_ready = True
        if tier is None:
            tier = self.current_tier()
        return self.ledger.append(event, tier, {"action": "continue"}, info)

    def append_soon(
        self, event: InfoEvent, info: dict[str, Any] | None = None, *, tier: int | None = None, wait_s: float = 2.0
    ) -> bool:
        """Append on a helper thread, waiting at most ``wait_s``; True if it was written in time.

        Storage retries can last minutes; what the record describes must not wait that long.
        """
        done = threading.Event()

        def write() -> None:
            try:
                self.append(event, info, tier=tier)
                done.set()
            except Exception as e:  # a lost record is logged, never raised into the caller
                logger.warning("could not record %s in %s: %s", event.kind, self.location.uri(), e)

        threading.Thread(target=write, name=f"spotfallback-{event.kind}", daemon=True).start()
        return done.wait(wait_s)
