"""Re-render docs/reliability.md from docs/reliability.json, or check that it is up to date.

`make reliability` writes both files: it runs the fault suite with
``SPOTFALLBACK_PUBLISH_RELIABILITY=1`` (``tests/conftest.py`` -> ``tests/support/reliability.py:publish``); the long soak
(``python -m tests.support.soak``) adds its row the same way. This script is for the rest: rendering
again after a change to the table's layout, and ``--check`` (exit 1 when the page does not
match the rows, e.g. after a hand edit)::

    .venv/bin/python -m scripts.reliability_table [--check]
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.support.reliability import DOCS_DIR, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if reliability.md differs from reliability.json")
    args = parser.parse_args(argv)
    store, doc = DOCS_DIR / "reliability.json", DOCS_DIR / "reliability.md"
    if not store.exists():
        print(f"no {store}; run the reliability tests first", file=sys.stderr)
        return 1
    text = render(json.loads(store.read_text())["rows"])
    if args.check:
        same = doc.exists() and doc.read_text() == text
        print(f"{doc} {'matches' if same else 'does not match'} {store}")
        return 0 if same else 1
    doc.write_text(text)
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
