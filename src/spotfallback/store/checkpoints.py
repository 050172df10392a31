"""Checkpoint verification and the driver's repair step before a run resumes.

Why: Ray Train resumes from the newest checkpoint its snapshot
(``{run_dir}/checkpoint_manager_snapshot.json``) names. If that checkpoint was damaged after
it was committed (a truncated object, a lost file, a deleted prefix), Ray either fails to
start (``CheckpointManagerInitializationError``: a listed directory is gone) or hands the
training function files it cannot load, and every retry fails the same way. The fix belongs
before ``fit()``: find the newest checkpoint that is whole, move the damaged ones aside to
``{run_dir}/_damaged/`` (never delete them), and rewrite the snapshot so Ray resumes from the
whole one. What was done goes into the ledger (``run_started.info.checkpoint_repair``) and
the log.

"Whole" is decided by a manifest written into the checkpoint directory next to its files
(``write_manifest``): every file's size and SHA-256. Checkpoints without a manifest can only
be checked for existence; once a run writes manifests, a checkpoint without one is damaged.

Command line: ``python -m spotfallback.store.checkpoints verify PATH_OR_URI...``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import pyarrow.fs as pafs

from spotfallback.errors import LedgerError
from spotfallback.events import CheckpointCommitted, Event
from spotfallback.store.ledger_snapshot import KEEP_COMMITTED, LedgerSnapshot
from spotfallback.store.location import list_dir, write_atomically
from spotfallback.store.retry import call_with_retry

if TYPE_CHECKING:
    from spotfallback.events import LedgerRecord
    from spotfallback.store.ledger import Ledger
    from spotfallback.store.location import RunLocation

logger = logging.getLogger("spotfallback")

MANIFEST_NAME = "_spotfallback_manifest.json"
MANIFEST_VERSION = 1
SNAPSHOT_NAME = "checkpoint_manager_snapshot.json"  # Ray 2.60 CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
DAMAGED_DIR = "_damaged"
CHECKPOINT_PREFIX = "checkpoint_"
_CHUNK = 8 * 1024 * 1024


# -- manifests ------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``_spotfallback_manifest.json`` (size and SHA-256 of every file) into a local directory.

    Call it last, after every checkpoint file is written and before ``ray.train.report``:
    the manifest then describes exactly what was meant to be uploaded.
    """
    root = Path(directory)
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == MANIFEST_NAME:
            continue
        rel = path.relative_to(root).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256_file(path)}
    manifest = {"v": MANIFEST_VERSION, "files": files}
    tmp = root / f".{MANIFEST_NAME}.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(manifest, sort_keys=True, indent=1))
    os.replace(tmp, root / MANIFEST_NAME)
    return manifest


@dataclass(frozen=True)
class CheckpointCheck:
    """What ``verify`` found: ``ok`` only when a manifest exists and every file matches it."""

    path: str
    ok: bool
    has_manifest: bool
    exists: bool
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "problems": list(self.problems)}


def _resolve(path: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    return call_with_retry(lambda: fs.open_input_stream(path).readall(), f"read {path}", permanent=LedgerError)


def _sha256_fs(fs: pafs.FileSystem, path: str) -> str:
    def digest() -> str:
        h = hashlib.sha256()
        with fs.open_input_stream(path) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    return call_with_retry(digest, f"read {path}", permanent=LedgerError)


def verify(path: str, filesystem: pafs.FileSystem | None = None, *, checksums: bool = True) -> CheckpointCheck:
    """Check a checkpoint directory against its manifest (local path, URI, or path in ``filesystem``).

    ``checksums=False`` compares sizes only (no download of the contents).
    """
    fs, root = _resolve(path, filesystem)
    root = root.rstrip("/")
    infos = call_with_retry(lambda: list_dir(fs, root, recursive=True), f"list {root}", permanent=LedgerError)
    if not infos:
        return CheckpointCheck(path, ok=False, has_manifest=False, exists=False, problems=("directory is missing or empty",))
    sizes = {posixpath.relpath(i.path, root): i.size for i in infos if i.type == pafs.FileType.File}
    if MANIFEST_NAME not in sizes:
        return CheckpointCheck(path, ok=False, has_manifest=False, exists=True, problems=(f"no {MANIFEST_NAME}",))
    try:
        manifest = json.loads(_read(fs, f"{root}/{MANIFEST_NAME}"))
        entries = manifest["files"]
        if manifest.get("v") != MANIFEST_VERSION or not isinstance(entries, dict):
            raise ValueError(f"unsupported manifest version {manifest.get('v')!r}")
        expected = {str(k): (int(v["size"]), str(v["sha256"])) for k, v in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return CheckpointCheck(path, ok=False, has_manifest=True, exists=True, problems=(f"unreadable manifest: {e}",))
    problems: list[str] = []
    for rel, (size, sha) in sorted(expected.items()):
        if rel not in sizes:
            problems.append(f"{rel}: missing")
        elif sizes[rel] != size:
            problems.append(f"{rel}: {sizes[rel]} bytes, manifest says {size}")
        elif checksums and _sha256_fs(fs, f"{root}/{rel}") != sha:
            problems.append(f"{rel}: SHA-256 differs from the manifest")
    return CheckpointCheck(path, ok=not problems, has_manifest=True, exists=True, problems=tuple(problems))


# -- repair before resume ---------------------------------------------------------------------


@dataclass
class Resume:
    """What the driver's pre-``fit()`` step did; ``info()`` goes into the ``run_started`` record."""

    damaged: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: str | None = None
    snapshot_backup: str | None = None
    rebuilt_snapshot: bool = False
    skipped: list[dict[str, Any]] = field(default_factory=list)  # not provably whole; left in place
    recorded: list[Event] = field(default_factory=list)  # commits Ray made but the ledger missed

    def info(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.damaged or self.rebuilt_snapshot:
            out["checkpoint_repair"] = {
                "damaged": self.damaged,
                "resumed_from": self.resumed_from,
                "snapshot_backup": self.snapshot_backup,
                "rebuilt_snapshot": self.rebuilt_snapshot,
                "not_listed": self.skipped,
            }
        if self.recorded:
            out["recorded_missing_commits"] = len(self.recorded)
        return out or None


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"


def _move_aside(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move a directory; object stores cannot rename prefixes, so copy then delete there."""

    def move() -> None:
        if fs.get_file_info(src).type == pafs.FileType.NotFound:
            return  # an earlier attempt finished the move
        fs.create_dir(posixpath.dirname(dst), recursive=True)
        try:
            fs.move(src, dst)
            return
        except (OSError, NotImplementedError):
            pass  # S3/GCS/Azure Blob: no directory rename
        pafs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(src)

    call_with_retry(move, f"move {src} to {dst}", permanent=LedgerError)


def _checkpoint_dirs(fs: pafs.FileSystem, run_dir: str) -> list[str]:
    infos = call_with_retry(lambda: list_dir(fs, run_dir), f"list {run_dir}", permanent=LedgerError)
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith(CHECKPOINT_PREFIX))


def _result(name: str, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"version": 0, "checkpoint_dir_name": name, "metrics": metrics or {}}


def _is_known_snapshot(snap: Any) -> TypeGuard[dict[str, Any]]:
    if not isinstance(snap, dict):
        return False
    results = snap.get("checkpoint_results")
    indices = snap.get("checkpoint_report_indices")
    return (
        isinstance(results, list)
        and isinstance(indices, list)
        and len(results) == len(indices)
        and all(isinstance(r, dict) and isinstance(r.get("checkpoint_dir_name"), str) for r in results)
    )


class _Repairer:
    def __init__(self, location: RunLocation):
        self.fs = location.fs
        self.run_dir = location.run_dir
        self.snapshot_path = posixpath.join(self.run_dir, SNAPSHOT_NAME)
        self.resume = Resume()
        self.stamp = _stamp()

    def damaged_path(self, name: str) -> str:
        return posixpath.join(self.run_dir, DAMAGED_DIR, f"{name}.{self.stamp}")

    def judge(self, names: Sequence[str], existing: set[str]) -> tuple[list[str], dict[str, CheckpointCheck]]:
        """Newest first until a whole one: returns (damaged names, checks)."""
        uses_manifests = any(
            call_with_retry(
                partial(self.fs.get_file_info, posixpath.join(self.run_dir, n, MANIFEST_NAME)),
                "look for a checkpoint manifest",
                permanent=LedgerError,
            ).type
            == pafs.FileType.File
            for n in names
            if n in existing
        )
        damaged: list[str] = []
        checks: dict[str, CheckpointCheck] = {}
        found_whole = False
        for name in reversed(names):
            path = posixpath.join(self.run_dir, name)
            if name not in existing:
                checks[name] = CheckpointCheck(path, False, False, False, ("directory is missing",))
                damaged.append(name)
                continue
            if found_whole:
                continue  # older ones only need to exist for Ray to start
            check = verify(path, self.fs)
            checks[name] = check
            if check.ok or (not check.has_manifest and not uses_manifests and check.exists):
                found_whole = True
                self.resume.resumed_from = name
            else:
                damaged.append(name)
        return damaged, checks

    def set_aside(self, damaged: Iterable[str], checks: dict[str, CheckpointCheck], existing: set[str]) -> None:
        for name in damaged:
            check = checks[name]
            moved_to = None
            if name in existing:
                moved_to = self.damaged_path(name)
                _move_aside(self.fs, posixpath.join(self.run_dir, name), moved_to)
            self.resume.damaged.append({"checkpoint": name, "problems": list(check.problems), "moved_to": moved_to})
            logger.warning(
                "checkpoint %s is damaged (%s); %s",
                name,
                "; ".join(check.problems),
                f"moved to {moved_to}" if moved_to else "it is gone",
            )

    def backup_snapshot(self, raw: bytes) -> None:
        path = posixpath.join(self.run_dir, DAMAGED_DIR, f"{SNAPSHOT_NAME}.{self.stamp}")
        call_with_retry(
            lambda: self.fs.create_dir(posixpath.dirname(path), recursive=True), "create _damaged", permanent=LedgerError
        )
        call_with_retry(lambda: write_atomically(self.fs, path, raw), "back up the checkpoint snapshot", permanent=LedgerError)
        self.resume.snapshot_backup = path

    def write_snapshot(self, snap: dict[str, Any]) -> None:
        payload = json.dumps(snap).encode()
        call_with_retry(
            lambda: write_atomically(self.fs, self.snapshot_path, payload), "rewrite the checkpoint snapshot",
            permanent=LedgerError,
        )

    def repair(self) -> Resume:
        fs = self.fs
        raw = call_with_retry(
            lambda: fs.open_input_stream(self.snapshot_path).readall()
            if fs.get_file_info(self.snapshot_path).type == pafs.FileType.File
            else None,
            "read the checkpoint snapshot",
            permanent=LedgerError,
        )
        dirs = _checkpoint_dirs(fs, self.run_dir)
        if raw is None:
            if dirs:  # checkpoints but no snapshot: Ray would silently start from scratch
                self.rebuild(dirs, None)
            return self.resume
        try:
            snap = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            logger.warning("the checkpoint snapshot %s is torn; rebuilding it from the checkpoints", self.snapshot_path)
            self.rebuild(dirs, raw)
            return self.resume
        if not _is_known_snapshot(snap):
            logger.warning("leaving %s alone: not a Ray 2.60 checkpoint snapshot", self.snapshot_path)
            return self.resume
        self.repair_snapshot(snap, raw, set(dirs))
        return self.resume

    def repair_snapshot(self, snap: dict[str, Any], raw: bytes, existing: set[str]) -> None:
        results: list[dict[str, Any]] = snap["checkpoint_results"]
        indices: list[int] = snap["checkpoint_report_indices"]
        order = sorted(range(len(results)), key=lambda i: indices[i])
        names = [results[i]["checkpoint_dir_name"] for i in order]
        damaged, checks = self.judge(names, existing)
        if not damaged:
            return
        self.backup_snapshot(raw)
        self.set_aside(damaged, checks, existing)
        gone = set(damaged)
        keep = [i for i in range(len(results)) if results[i]["checkpoint_dir_name"] not in gone]
        snap["checkpoint_results"] = [results[i] for i in keep]
        snap["checkpoint_report_indices"] = [indices[i] for i in keep]
        latest = max(keep, key=lambda i: indices[i], default=None)
        snap["latest_checkpoint_result"] = results[latest] if latest is not None else None
        pending = snap.get("pending_training_results") or []
        specs = snap.get("pending_validation_specs") or []
        kept_pending = [(p, s) for p, s in zip(pending, specs, strict=False) if p.get("checkpoint_dir_name") not in gone]
        snap["pending_training_results"] = [p for p, _ in kept_pending]
        snap["pending_validation_specs"] = [s for _, s in kept_pending]
        for key in (
            "validated_checkpoint_dir_names",
            "timed_out_validation_checkpoint_dir_names",
            "failed_validation_checkpoint_dir_names",
        ):
            snap[key] = [n for n in snap.get(key) or [] if n not in gone]
        self.write_snapshot(snap)
        self.log_outcome()

    def rebuild(self, dirs: list[str], raw: bytes | None) -> None:
        """No usable snapshot: list again only the checkpoints whose manifest proves them whole.

        Nothing is moved aside here: without Ray's list, a directory that does not match a
        manifest may be an upload cut short before Ray committed it (a driver killed during
        the first checkpoint leaves exactly that, and no snapshot), not a damaged checkpoint.
        """
        import ray

        checks = {n: verify(posixpath.join(self.run_dir, n), self.fs) for n in dirs}
        keep = [n for n in dirs if checks[n].ok]
        self.resume.skipped = [{"checkpoint": n, "problems": list(checks[n].problems)} for n in dirs if n not in keep]
        if raw is None and not keep:
            return  # no snapshot and nothing whole: Ray starts from the beginning, as it would anyway
        if raw is not None:
            self.backup_snapshot(raw)
        self.resume.resumed_from = keep[-1] if keep else None
        snap = {
            "ray_version": ray.__version__,
            "checkpoint_results": [_result(n) for n in keep],
            "checkpoint_report_indices": list(range(len(keep))),
            "latest_checkpoint_result": _result(keep[-1]) if keep else None,
            "pending_training_results": [],
            "pending_validation_specs": [],
            "current_report_index": len(keep),
            "validated_checkpoint_dir_names": [],
            "timed_out_validation_checkpoint_dir_names": [],
            "failed_validation_checkpoint_dir_names": [],
        }
        self.write_snapshot(snap)
        self.resume.rebuilt_snapshot = True
        for skipped in self.resume.skipped:
            logger.warning("not listing %s in the rebuilt snapshot: %s", skipped["checkpoint"], "; ".join(skipped["problems"]))
        self.log_outcome()

    def log_outcome(self) -> None:
        if self.resume.resumed_from:
            logger.warning("resuming from the newest whole checkpoint, %s", self.resume.resumed_from)
        else:
            logger.warning("no whole checkpoint is left; the run starts from the beginning")


def repair_run(location: RunLocation) -> Resume:
    """Make Ray resume from the newest whole checkpoint; damaged ones go to ``_damaged/``."""
    return _Repairer(location).repair()


def _committed_names(records: Iterable[LedgerRecord]) -> set[str]:
    return {
        posixpath.basename(str(r.event.path).rstrip("/"))
        for r in records
        if isinstance(r.event, CheckpointCommitted)
    }


def prepare_resume(location: RunLocation, ledger: Ledger, records: Sequence[LedgerRecord], tier: int, *,
                   snapshot: LedgerSnapshot | None = None) -> Resume:
    """The driver's step before ``fit()``, under the lease: repair, then record missed commits.

    Ray writes its snapshot just before spotfallback's ledger callback runs; a driver killed
    between the two leaves a commit only Ray knows. It is recorded now, so the ledger counts
    every checkpoint the run can resume from. ``records``: the ledger's records after
    ``snapshot`` (the ledger's stored one, if read with it); a checkpoint neither they nor the
    snapshot's latest commits name is looked for in the whole ledger before it is recorded.
    """
    resume = repair_run(location)
    snapshot_path = posixpath.join(location.run_dir, SNAPSHOT_NAME)
    fs = location.fs
    raw = call_with_retry(
        lambda: fs.open_input_stream(snapshot_path).readall()
        if fs.get_file_info(snapshot_path).type == pafs.FileType.File
        else None,
        "read the checkpoint snapshot",
        permanent=LedgerError,
    )
    try:
        snap = json.loads(raw) if raw is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        snap = None
    if not _is_known_snapshot(snap):
        return resume
    known = _committed_names(records) | set(snapshot.committed if snapshot else ())
    read_all = snapshot is not None and len(snapshot.committed) >= KEEP_COMMITTED  # it may have kept fewer than there are
    moved = {d["checkpoint"] for d in resume.damaged}
    pairs = sorted(zip(snap["checkpoint_report_indices"], snap["checkpoint_results"], strict=True), key=lambda p: p[0])
    for _, result in pairs:
        name = result["checkpoint_dir_name"]
        if name not in known and name not in moved and read_all:  # older than the snapshot keeps: look in every record
            known |= _committed_names(ledger.read())
            read_all = False
        if name in known or name in moved:
            continue
        metrics = result.get("metrics") or {}
        step = metrics.get("step") if isinstance(metrics.get("step"), int) else None
        event = CheckpointCommitted(t=time.time(), path=posixpath.join(location.run_dir, name), step=step)
        ledger.append(event, tier, {"action": "continue"}, {"recorded_by": "driver", "why": "in Ray's snapshot, not in the ledger"})
        resume.recorded.append(event)
        logger.info("recorded checkpoint %s, which Ray committed but the ledger had missed", name)
    return resume


# -- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spotfallback.store.checkpoints verify PATH...``: one line per checkpoint.

    Exit codes: 0 every checkpoint is whole, 1 one is damaged, 2 bad input (a path that is
    not a checkpoint directory, or a URI that cannot be opened), never a traceback.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m spotfallback.store.checkpoints")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="check checkpoint directories against their manifests")
    check.add_argument("paths", nargs="+", help="checkpoint directory: local path or URI (s3://, gs://)")
    check.add_argument("--sizes-only", action="store_true", help="compare sizes, skip SHA-256")
    args = parser.parse_args(argv)
    code = 0
    for path in args.paths:
        shown = path if path.isprintable() else repr(path)
        if not path.strip() or any(ord(c) < 32 or ord(c) == 127 for c in path):
            print(f"ERROR {path!r}: not a path: empty or holding control characters")
            code = 2
            continue
        if "://" in path and not path.split("://", 1)[1].split("?", 1)[0].strip("/"):
            print(f"ERROR {shown}: names no bucket or directory; give the checkpoint directory, e.g. s3://bucket/runs/NAME/checkpoint_...")
            code = 2
            continue
        try:
            result = verify(path, checksums=not args.sizes_only)
        except Exception as e:  # noqa: BLE001 - a bad URI, unreachable storage: one line, never a traceback
            print(f"ERROR {shown}: {type(e).__name__}: {' '.join(str(e).split())}")
            code = 2
            continue
        if not result.exists:
            print(f"ERROR {shown}: no checkpoint there (the directory is missing or empty)")
            code = 2
            continue
        print(f"{'OK' if result.ok else 'DAMAGED'} {path}" + "".join(f"\n  {p}" for p in result.problems))
        if not result.ok:
            code = max(code, 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
