"""Hostile YAML the readers of job files and manifests must refuse in one line."""

from __future__ import annotations


def alias_bomb(levels: int, tail: str = "") -> str:
    """Each level a list of ten aliases of the one before: 10**levels values from a few lines."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n" + tail


def nested_too_deep(depth: int = 3000) -> str:
    """A value nested deeper than the YAML reader's recursion can follow."""
    return "a: " + "[" * depth + "]" * depth + "\n"
