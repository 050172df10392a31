"""The Ray versions the Ray shell is known to work with, checked before any of it loads.

Why a check of our own: the hooks subclass and call Ray Train V2 internals
(``ray.train.v2._internal``: the failure and scaling policies, the controller entry point,
the exception types) and the drains use ``ray._raylet.GcsClient`` and the autoscaler
protobufs. None of that is public API; any Ray minor release may change it, and on a Ray
we never tested a changed signature would surface mid-run as an odd error inside the
controller, not at start. So the package depends on the tested minor releases only
(``pyproject.toml``), and importing ``spotfallback.runtime`` on any other Ray (installed
with ``--no-deps``, or upgraded afterwards) stops at once with the supported range.
``tests/unit/test_ray_contract.py`` pins the internals themselves.

The pure core, the planner, ``deploy`` and ``import spotfallback`` never load this module:
they work without Ray, or with any Ray.

``SPOTFALLBACK_ALLOW_UNTESTED_RAY=1`` turns the error into a warning, to try a new Ray
(run ``tests/unit/test_ray_contract.py`` on it first).
"""

from __future__ import annotations

import os
import re
import warnings

from spotfallback.errors import UnsupportedRayError

# The release range the Ray shell is tested on: >= MIN, < BELOW (major, minor). Keep it equal
# to the ray[train] requirement in pyproject.toml (a unit test compares them).
RAY_MIN = (2, 60)
RAY_BELOW = (2, 61)
SUPPORTED_RAY = f">={RAY_MIN[0]}.{RAY_MIN[1]},<{RAY_BELOW[0]}.{RAY_BELOW[1]}"
ALLOW_ENV = "SPOTFALLBACK_ALLOW_UNTESTED_RAY"


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def is_supported(version: str) -> bool:
    """Whether ``version`` (Ray's ``__version__``) is in the supported range; dev builds are not."""
    release = _release(version)
    return release is not None and RAY_MIN <= release < RAY_BELOW and "dev" not in version


def check_ray_version(version: str | None = None) -> None:
    """Raise ``UnsupportedRayError`` unless ``version`` (default: the installed Ray's) is supported."""
    if version is None:
        import ray

        version = ray.__version__
    if is_supported(version):
        return
    message = (
        f"spotfallback supports ray[train]{SUPPORTED_RAY} (it uses Ray Train internals that change "
        f"between releases); this environment has ray {version}. Install a supported one: "
        f"pip install 'ray[train]{SUPPORTED_RAY}'"
    )
    if os.environ.get(ALLOW_ENV) == "1":
        warnings.warn(f"{message} ({ALLOW_ENV}=1: going on anyway)", RuntimeWarning, stacklevel=2)
        return
    raise UnsupportedRayError(f"{message}, or set {ALLOW_ENV}=1 to try this one anyway")


check_ray_version()
