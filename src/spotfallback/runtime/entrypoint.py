"""Resolve a job's entrypoint string to the training function."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from spotfallback.errors import ConfigError


def _module_file(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _installed(module: ModuleType) -> bool:
    """Whether a module is Python's own or an installed package's (built in, or under the prefixes)."""
    file = _module_file(module)
    return file is None or any(file.is_relative_to(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix})


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
        earlier = sys.modules.get(module_name)
        if earlier is not None and _module_file(earlier) not in (path, None) and not _installed(earlier):
            del sys.modules[module_name]  # another file of that name this process loaded before: this one now
    else:
        module_name = target
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"entrypoint: cannot import module {module_name!r}: {e}") from None
    except Exception as e:  # the module's own code failed as it loaded: the user's to fix, not the cluster's
        raise ConfigError(f"entrypoint: importing module {module_name!r} failed: {type(e).__name__}: {e}") from None
    if target.endswith(".py") and _module_file(module) != path:
        # Imported by name (as the Ray workers import it too), the file lost to a module of that name.
        raise ConfigError(f"entrypoint: {target!r} is named like the module {module_name!r} "
                          f"({getattr(module, '__file__', None) or 'built in'}), which is imported instead; rename the file")
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
