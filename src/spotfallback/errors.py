"""Every error spotfallback raises on purpose, in one hierarchy, each saying what a caller can do.

Why one module: a scheduler running ``spotfallback run`` and a program calling the library ask
the same two questions of an error, and the answers belong to the error, not to whoever
catches it. ``exit_code`` is the code the command line ends with when this error ends a
command (the table below; the CLI reads it from the error, it keeps no list of types).
``retryable`` says whether trying the same thing again later can help: storage that stayed
unreachable, a live driver, capacity that ran out can; a bad job file, denied access, a run
that already finished cannot (SkyPilot keeps the same two apart).

Some keep a builtin base that callers catch them by: ``ConfigError``, ``TraceError`` and
``PoolError`` and ``WindowError`` are ``ValueError`` (bad input values, as pydantic's own ``ValidationError`` for a job built in
Python is, so one ``except ValueError`` catches a bad job however it was made), and
``UnsupportedRayError`` is an ``ImportError`` (it stops ``import spotfallback.runtime``). The
rest derive from ``SpotfallbackError`` alone: nothing catches them as ``RuntimeError`` any more
(``notice-agent`` asks ``retryable`` which Ray-node errors to wait out). This module imports
nothing from the package, so every layer can raise these without a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

# Exit codes a scheduler can act on (README "Command line", docs/integrations.md).
EXIT_OK = 0
EXIT_ERROR = 1  # anything else: storage unreachable past its limit, a damaged ledger, an unexpected error
EXIT_BAD_INPUT = 2  # the job file, an option or the environment it names (fix it and run again)
EXIT_USER_CODE = 3  # the training function raised on healthy nodes, after its retries (your bug)
EXIT_LADDER_EXHAUSTED = 4  # every tier was left; checkpoints kept, --retry-failed resumes
EXIT_DRIVER_LIVE = 5  # another driver is running this run; try again later
EXIT_REFUSED = 6  # the run already finished, or gave up earlier (--retry-failed resumes it)
EXIT_FATAL = 7  # an error retrying cannot fix (configuration, access); checkpoints kept
EXIT_MOVED = 8  # the run's current tier is on another Ray cluster: the moving driver takes it there


class SpotfallbackError(Exception):
    """Base class of spotfallback's own errors; the message says what happened and what to do."""

    exit_code: ClassVar[int] = EXIT_ERROR
    retryable: ClassVar[bool] = False


# -- input: cannot ever work until the input changes -------------------------------------------


class ConfigError(SpotfallbackError, ValueError):
    """A configuration that can never work; the message names each bad field and the fix."""

    exit_code = EXIT_BAD_INPUT


class UsageError(SpotfallbackError):
    """A command-line option that cannot work; printed as one line naming the option."""

    exit_code = EXIT_BAD_INPUT


class TraceError(SpotfallbackError, ValueError):
    """A trace file that cannot be used; the message says which file, line or field, and why."""

    exit_code = EXIT_BAD_INPUT


class PoolError(SpotfallbackError, ValueError):
    """A backtest's trace for one spot tier (``pools``) that the tier cannot replay; ``tier``
    names the tier, ``problem`` says why, so the CLI can blame ``--pool`` and not ``--trace``."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, tier: str, problem: str):
        super().__init__(f"pools: {problem}")
        self.tier, self.problem = tier, problem

    def __reduce__(self) -> tuple[type[PoolError], tuple[str, str]]:
        return type(self), (self.tier, self.problem)


class WindowError(SpotfallbackError, ValueError):
    """A backtest's window length that cannot cut a trace (not a positive number, or into more
    windows than any backtest needs), so the CLI can blame ``--window-h`` and not ``--trace``."""

    exit_code = EXIT_BAD_INPUT


class OptimumTooLargeError(SpotfallbackError):
    """The hindsight optimum's search for this job on these traces would pass the limit it was
    given: it grows with the gang's interruptions before the deadline, so the message names the
    size and what keeps it in reach (a shorter job or deadline, a smaller gang, fewer starts)."""


class UnsupportedRayError(SpotfallbackError, ImportError):
    """The installed Ray is outside the range spotfallback's Ray shell is tested on."""


# -- a run refused before it starts -------------------------------------------------------------


class DriverAlreadyRunningError(SpotfallbackError):
    """Another driver holds a live lease on this run; once it ends or its lease expires, this one may."""

    exit_code = EXIT_DRIVER_LIVE
    retryable = True


class DriverLeaseLostError(DriverAlreadyRunningError):
    """This driver was cut off from the run's storage past its lease, and another driver took the
    run over: this one stopped training, so that one run is never trained, and written, twice."""


class RunAlreadyFinishedError(SpotfallbackError):
    """The run name holds a finished run; starting it again would silently do nothing."""

    exit_code = EXIT_REFUSED


class RunFailedError(SpotfallbackError):
    """The run name holds a run that gave up; resuming it must be asked for explicitly."""

    exit_code = EXIT_REFUSED


# -- a run that stopped -------------------------------------------------------------------------


class LadderExhaustedError(SpotfallbackError):
    """Every tier of the ladder was left; checkpoints are kept, so the run can be resumed."""

    exit_code = EXIT_LADDER_EXHAUSTED
    retryable = True  # capacity comes back: --retry-failed resumes with fresh budgets


class RunFatalError(SpotfallbackError):
    """An error that retrying cannot fix (configuration, access)."""

    exit_code = EXIT_FATAL


class RunOnOtherClusterError(SpotfallbackError):
    """The run's current tier lives on another Ray cluster than the one this driver runs on.

    Raised by a driver started on one cluster of a ladder across clusters when the policy
    moves the run off it (or finds it already off): the driver that moves runs between
    clusters (``spotfallback run`` without ``--on-cluster``) reads the ledger and submits the
    run to the right cluster. Nothing is lost: the move is in the ledger, progress in checkpoints.
    """

    exit_code = EXIT_MOVED
    retryable = True


class GangMovedError(SpotfallbackError):
    """Rank 0 ends the attempt on purpose: its just-in-time checkpoint is committed and the
    next gang can be placed off the draining node(s), so waiting for the node to go is idle.

    spotfallback's failure policy counts it as the preemption it is (the tier's preemption
    budget, not ``max_failures``) and Ray Train restarts the gang at once; plain Ray Train
    runs never see it (``PreemptionWatch`` only moves in spotfallback runs).
    """

    exit_code = EXIT_USER_CODE
    retryable = True


class JitHoldExpiredError(SpotfallbackError):
    """The node outlived its preemption deadline by far: Ray never tore the workers down.

    Raised inside the training function to end the attempt, so Ray Train restarts it; if it
    ever ends a run, it is the training function's failure, as any exception it raises is.
    """

    exit_code = EXIT_USER_CODE
    retryable = True


class ClusterUnreachableError(SpotfallbackError):
    """A Ray cluster's Jobs API did not answer (connection refused or timed out, or an HTTP 5xx).

    The driver that moves a run between clusters waits it out up to the cluster's
    ``unreachable_timeout_s``, then leaves the cluster's tiers.
    """

    retryable = True


# -- storage ------------------------------------------------------------------------------------


class LedgerError(SpotfallbackError):
    """The ledger cannot be read or written; the message names the object."""


class StorageUnavailableError(LedgerError):
    """Storage stayed unreachable past ``SPOTFALLBACK_STORAGE_RETRY_S``; what was written is intact."""

    retryable = True


class ObjectConflictError(LedgerError):
    """A conditional write's condition did not hold: the object exists (create-if-absent) or
    changed (replace-if-unchanged) because another writer got there first; nothing was overwritten."""


# -- deployment files ---------------------------------------------------------------------------


class ManifestInvalid(SpotfallbackError):
    """A generated file failed validation: a bug in the generator, never the user's input."""

    def __init__(self, findings: Sequence[object]) -> None:
        self.findings = findings  # spotfallback.deploy.validate.Finding, each naming a field path
        super().__init__("; ".join(map(str, findings)))

    def __reduce__(self) -> tuple[type[ManifestInvalid], tuple[Sequence[object]]]:
        return type(self), (self.findings,)  # pickled with its findings, not its message


# -- preemption notices -------------------------------------------------------------------------


class MetadataError(SpotfallbackError):
    """The metadata service could not be asked, or answered something unexpected (the next poll may not)."""

    retryable = True


class MetadataThrottledError(MetadataError):
    """The metadata service answered HTTP 429: it limits requests per VM (Azure: five a second;
    AWS throttles per instance), so the notice agent polls less often for a while.
    ``retry_after_s``: the answer's Retry-After in seconds (0: none, or not a number)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[type[MetadataThrottledError], tuple[str, float]]:
        return type(self), (str(self), self.retry_after_s)


class DrainRejectedError(SpotfallbackError):
    """Ray refused the drain (unknown node, node already dead...); the message says why."""


class NoLocalRayNodeError(SpotfallbackError):
    """No live Ray node has this machine's address (yet: Ray may still be starting)."""

    exit_code = EXIT_BAD_INPUT  # once `notice-agent --ray-wait` is over
    retryable = True


class AmbiguousRayNodeError(SpotfallbackError):
    """Several live Ray nodes share this machine's address: the node id must be given."""

    exit_code = EXIT_BAD_INPUT


class RayNodeNotFoundError(SpotfallbackError):
    """The notice agent cannot find its Ray node, and waiting cannot help (or its wait is over)."""

    exit_code = EXIT_BAD_INPUT

    @property
    def message(self) -> str:
        return str(self)
