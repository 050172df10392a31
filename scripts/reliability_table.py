"""Render docs/reliability.md from the results the reliability tests record.

Each fault test writes one JSON row to ``build/reliability/`` (see ``tests/reliability.py``);
this script turns the rows into the table. Regenerate with::

    .venv/bin/python -m pytest tests/test_reliability_storage.py tests/test_reliability_drivers.py \\
        tests/test_reliability_soak.py
    .venv/bin/python scripts/reliability_table.py          # add --check to fail on a stale table

The long soak (``python -m tests.soak --minutes 30``) adds its own row when it is run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(os.environ.get("SPOTFALLBACK_RELIABILITY_DIR", REPO / "build" / "reliability"))
DOC = REPO / "docs" / "reliability.md"

HEADER = """# Reliability: what breaks, how often the suite breaks it, and what is lost

Produced by the fault suite itself: every row is written by a test that injected the fault
into a real run of the example job (`examples/ddp_digits.py`, 2 DDP workers on a local Ray
cluster whose nodes are labelled spot / on-demand) and then checked the same invariants:

- **runs completed**: the run finished, with final weights bit-identical to a run that was
  never interrupted;
- **steps redone**: training steps computed more than once (rank 0 logs every completed
  step), i.e. the work the faults cost;
- **events lost**: places where the replayed ledger is not a sequence a live run can produce
  (workers acquired twice with no failure between, a record from a driver session that had
  ended, a missing or repeated `finished`); **duplicated**: ledger objects sharing an id;
- **checkpoints lost**: committed checkpoints that are neither whole (manifest sizes and
  SHA-256) where they were nor set aside under `_damaged/` on record.

Regenerate: run `tests/test_reliability_storage.py`, `tests/test_reliability_drivers.py` and
`tests/test_reliability_soak.py` (they write `build/reliability/*.json`), then
`python scripts/reliability_table.py`. The long soak, `python -m tests.soak --minutes 30`,
adds its own row. Times are wall seconds on a shared 2-core machine; the load average at the
moment each row was recorded is given because other jobs ran beside the suite.

"""


def render(rows: list[dict]) -> str:
    lines = [
        "| Fault | Injected | Runs completed | Steps redone | Events lost | Duplicated | Checkpoints lost | Time (s) | Load | Notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['injected']} | {r['runs_completed']}/{r['runs']} | {r['steps_redone']} | "
            f"{r['events_lost']} | {r.get('duplicated_events', 0)} | {r['checkpoints_lost']} | {r['seconds']:.0f} | "
            f"{r.get('load_avg', '')} | {r.get('notes', '')} |"
        )
    total = {k: sum(r[k] for r in rows) for k in ("injected", "events_lost", "checkpoints_lost", "runs_completed", "runs")}
    lines.append(
        f"| **all** | **{total['injected']}** | **{total['runs_completed']}/{total['runs']}** | | "
        f"**{total['events_lost']}** | | **{total['checkpoints_lost']}** | | | |"
    )
    newest = max((r["recorded_at"] for r in rows), default=time.time())
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(newest))
    return HEADER + "\n".join(lines) + f"\n\nLast result recorded {stamp}.\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/reliability.md differs from the results")
    args = parser.parse_args(argv)
    rows = sorted((json.loads(p.read_text()) for p in RESULTS.glob("*.json")), key=lambda r: r["kind"])
    if not rows:
        print(f"no results in {RESULTS}; run the reliability tests first", file=sys.stderr)
        return 1
    text = render(rows)
    if args.check:
        return 0 if DOC.exists() and DOC.read_text() == text else 1
    DOC.write_text(text)
    print(f"wrote {DOC} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
