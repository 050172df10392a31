"""Resolve a job's entrypoint string to the training function."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotfallback.errors import ConfigError


def load_entrypoint(entrypoint: str) -> Callable[..., Any]:
    """``package.module:function`` or ``path/to/file.py:function`` -> the function.

    A file path is imported as a module named after the file, with its directory put on
    ``sys.path`` so the Ray workers can import it the same way.
    """
    target, _, func_name = entrypoint.rpartition(":")
    if not target or not func_name:
        raise ConfigError(f"entrypoint: {entrypoint!r} must look like 'package.module:function' or 'file.py:function'")
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"entrypoint: file {target!r} does not exist")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_name = path.stem
    else:
        module_name = target
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"entrypoint: cannot import module {module_name!r}: {e}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError(f"entrypoint: module {module_name!r} has no function {func_name!r}")
    return func


BACKEND_ATTRIBUTE = "SPOTFALLBACK_BACKEND"


def declared_backend(func: Callable[..., Any]) -> str | None:
    """The backend ``func``'s module declares (``SPOTFALLBACK_BACKEND = "tensorflow"``), or None."""
    module_name = getattr(func, "__module__", None) or ""
    value = getattr(sys.modules.get(module_name), BACKEND_ATTRIBUTE, None)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{BACKEND_ATTRIBUTE} in {module_name!r} must be a string, not {value!r}")
    return value
