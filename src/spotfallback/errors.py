"""Errors a user of spotfallback can act on; each message says what happened and what to do."""

from __future__ import annotations


class SpotfallbackError(RuntimeError):
    """Base class of spotfallback's own run errors."""


class LadderExhaustedError(SpotfallbackError):
    """Every tier of the ladder was left; checkpoints are kept, so the run can be resumed."""


class RunAlreadyFinishedError(SpotfallbackError):
    """The run name holds a finished run; starting it again would silently do nothing."""


class RunFailedError(SpotfallbackError):
    """The run name holds a run that gave up; resuming it must be asked for explicitly."""


class RunFatalError(SpotfallbackError):
    """An error that retrying cannot fix (configuration, access)."""
