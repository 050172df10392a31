"""The error hierarchy: every class's exit code and retryable flag, and the rules that keep it one.

The exit codes are a contract with schedulers (README "Command line", docs/integrations.md);
changing one here must be a decision, not a side effect of a refactor.
"""

from __future__ import annotations

import ast
import inspect
import pickle
from pathlib import Path

import pytest

import spotfallback
from spotfallback import errors
from spotfallback.errors import (
    EXIT_BAD_INPUT,
    EXIT_DRIVER_LIVE,
    EXIT_ERROR,
    EXIT_FATAL,
    EXIT_LADDER_EXHAUSTED,
    EXIT_MOVED,
    EXIT_REFUSED,
    EXIT_USER_CODE,
    SpotfallbackError,
)

PACKAGE = Path(spotfallback.__file__).parent

# class name -> (exit code, retryable)
EXPECTED = {
    "SpotfallbackError": (EXIT_ERROR, False),
    "ConfigError": (EXIT_BAD_INPUT, False),
    "UsageError": (EXIT_BAD_INPUT, False),
    "TraceError": (EXIT_BAD_INPUT, False),
    "PoolError": (EXIT_BAD_INPUT, False),
    "WindowError": (EXIT_BAD_INPUT, False),
    "OptimumTooLargeError": (EXIT_ERROR, False),
    "UnsupportedRayError": (EXIT_ERROR, False),
    "DriverAlreadyRunningError": (EXIT_DRIVER_LIVE, True),
    "DriverLeaseLostError": (EXIT_DRIVER_LIVE, True),
    "RunAlreadyFinishedError": (EXIT_REFUSED, False),
    "RunFailedError": (EXIT_REFUSED, False),
    "LadderExhaustedError": (EXIT_LADDER_EXHAUSTED, True),
    "RunFatalError": (EXIT_FATAL, False),
    "JitHoldExpiredError": (EXIT_USER_CODE, True),
    "GangMovedError": (EXIT_USER_CODE, True),
    "RunOnOtherClusterError": (EXIT_MOVED, True),
    "ClusterUnreachableError": (EXIT_ERROR, True),
    "LedgerError": (EXIT_ERROR, False),
    "StorageUnavailableError": (EXIT_ERROR, True),
    "ObjectConflictError": (EXIT_ERROR, False),
    "ManifestInvalid": (EXIT_ERROR, False),
    "MetadataError": (EXIT_ERROR, True),
    "MetadataThrottledError": (EXIT_ERROR, True),
    "DrainRejectedError": (EXIT_ERROR, False),
    "NoLocalRayNodeError": (EXIT_BAD_INPUT, True),
    "AmbiguousRayNodeError": (EXIT_BAD_INPUT, False),
    "RayNodeNotFoundError": (EXIT_BAD_INPUT, False),
}


def _instance(name: str, message: str) -> SpotfallbackError:
    """One error of class ``name``, made as the code that raises it makes it."""
    cls = getattr(errors, name)
    special = {"ManifestInvalid": lambda: cls(["spec.a: bad", "spec.b: bad"]), "PoolError": lambda: cls("spot-b", message),
               "MetadataThrottledError": lambda: cls(message, 5.0)}
    return special.get(name, lambda: cls(message))()


def _classes() -> dict[str, type[SpotfallbackError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, SpotfallbackError)
    }


def test_the_exit_codes_are_the_documented_ones():
    assert (errors.EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_USER_CODE, EXIT_LADDER_EXHAUSTED,
            EXIT_DRIVER_LIVE, EXIT_REFUSED, EXIT_FATAL, EXIT_MOVED) == (0, 1, 2, 3, 4, 5, 6, 7, 8)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_class_carries_its_exit_code_and_whether_retrying_helps(name):
    cls = getattr(errors, name)
    assert (cls.exit_code, cls.retryable) == EXPECTED[name]
    error = _instance(name, "what happened; what to do")
    assert (error.exit_code, error.retryable) == EXPECTED[name]  # read from an instance, as the CLI does


def test_every_class_is_pinned_here():
    assert set(_classes()) == set(EXPECTED)


@pytest.mark.parametrize(
    ("name", "builtin"),
    [("ConfigError", ValueError), ("TraceError", ValueError), ("PoolError", ValueError), ("UnsupportedRayError", ImportError)],
)
def test_the_builtin_callers_catch_stays_a_base(name, builtin):
    """``except ValueError`` around bad input and ``except ImportError`` around an import still catch these."""
    assert issubclass(getattr(errors, name), builtin)


def test_subclasses_keep_what_callers_catch():
    assert issubclass(errors.StorageUnavailableError, errors.LedgerError)  # `except LedgerError` still sees it


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_errors_survive_pickling(name):
    """Errors raised in Ray workers and actors cross processes pickled."""
    cls = getattr(errors, name)
    error = _instance(name, "message")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls and str(again) == str(error)


def test_errors_module_imports_nothing_from_the_package():
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    imported = [
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    ] + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("spotfallback")], imported


def test_no_error_class_is_defined_outside_errors_py():
    """One hierarchy: a new error goes into errors.py, with its exit code and retryable flag."""
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Invalid")) for b in bases):
                    strays.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert strays == []
