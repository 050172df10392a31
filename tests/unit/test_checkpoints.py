"""Checkpoint manifests, verification and the driver's repair step, against Ray 2.60's own loader.

No cluster: the run directory is built by hand, the snapshot with Ray's own state model, and
after the repair Ray's ``CheckpointManager`` must load it and point at the checkpoint we expect.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.train import CheckpointConfig
from ray.train.v2._internal.exceptions import CheckpointManagerInitializationError
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
    CheckpointManager,
    _CheckpointManagerState,
    _TrainingResultState,
)
from ray.train.v2._internal.execution.storage import StorageContext

from spotfallback.events import CheckpointCommitted, RunStarted
from spotfallback.store.checkpoints import (
    DAMAGED_DIR,
    MANIFEST_NAME,
    SNAPSHOT_NAME,
    main,
    prepare_resume,
    repair_run,
    verify,
    write_manifest,
)
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run

NAMES = [f"checkpoint_2026-01-01_00-00-{s:02d}.000000" for s in (5, 10, 15)]


def make_checkpoint(directory: Path, step: int, manifest: bool = True) -> None:
    directory.mkdir(parents=True)
    (directory / "model.pt").write_bytes(os.urandom(4096))
    (directory / "optimizer.pt").write_bytes(os.urandom(8192))
    (directory / "progress.json").write_text(json.dumps({"step": step}))
    if manifest:
        write_manifest(directory)


def ray_snapshot(names: list[str]) -> str:
    """A snapshot exactly as Ray 2.60 writes it (its own pydantic model)."""
    results = [_TrainingResultState(checkpoint_dir_name=n, metrics={"step": 5 * (i + 1)}) for i, n in enumerate(names)]
    return _CheckpointManagerState(
        checkpoint_results=results,
        checkpoint_report_indices=[2 * i for i in range(len(names))],
        latest_checkpoint_result=results[-1],
        pending_training_results=[],
        pending_validation_specs=[],
        current_report_index=2 * len(names),
        validated_checkpoint_dir_names=[],
        timed_out_validation_checkpoint_dir_names=[],
        failed_validation_checkpoint_dir_names=[],
    ).json()


def ray_resumes_from(root: Path, name: str) -> str | None:
    """The checkpoint Ray's own CheckpointManager would hand the workers."""
    storage = StorageContext(storage_path=str(root), experiment_dir_name=name)
    manager = CheckpointManager(CheckpointConfig(), storage)
    latest = manager.latest_checkpoint_result
    return os.path.basename(latest.checkpoint.path) if latest else None


@pytest.fixture()
def run(tmp_path):
    """A run directory with three whole checkpoints (steps 5, 10, 15) and Ray's snapshot."""
    run_dir = tmp_path / "runs" / "job"
    for i, name in enumerate(NAMES):
        make_checkpoint(run_dir / name, 5 * (i + 1))
    (run_dir / SNAPSHOT_NAME).write_text(ray_snapshot(NAMES))
    return run_dir


def test_manifest_catches_truncation_missing_files_and_flipped_bytes(tmp_path):
    ckpt = tmp_path / "c"
    make_checkpoint(ckpt, 5)
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == ["model.pt", "optimizer.pt", "progress.json"]
    assert verify(str(ckpt)).ok

    data = (ckpt / "model.pt").read_bytes()
    (ckpt / "model.pt").write_bytes(data[:100])
    assert verify(str(ckpt)).problems == ("model.pt: 100 bytes, manifest says 4096",)

    (ckpt / "model.pt").write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert verify(str(ckpt), checksums=False).ok  # same size: only the checksum can tell
    assert verify(str(ckpt)).problems == ("model.pt: SHA-256 differs from the manifest",)

    (ckpt / "model.pt").write_bytes(data)
    (ckpt / "optimizer.pt").unlink()
    assert verify(str(ckpt)).problems == ("optimizer.pt: missing",)

    (ckpt / MANIFEST_NAME).unlink()
    check = verify(str(ckpt))
    assert not check.ok and not check.has_manifest
    assert not verify(str(tmp_path / "nowhere")).exists


def test_cli_verify_exit_codes(tmp_path, capsys):
    make_checkpoint(tmp_path / "good", 5)
    make_checkpoint(tmp_path / "bad", 10)
    (tmp_path / "bad" / "model.pt").write_bytes(b"x")
    assert main(["verify", str(tmp_path / "good")]) == 0
    assert main(["verify", str(tmp_path / "good"), str(tmp_path / "bad")]) == 1
    out = capsys.readouterr().out
    assert f"OK {tmp_path / 'good'}" in out and f"DAMAGED {tmp_path / 'bad'}" in out and "model.pt: 1 bytes" in out
    # Bad input outranks damage: a path that holds no checkpoint, or a URI without a bucket.
    assert main(["verify", str(tmp_path / "bad"), str(tmp_path / "nowhere")]) == 2
    assert main(["verify", "s3://"]) == 2
    out = capsys.readouterr().out
    assert f"ERROR {tmp_path / 'nowhere'}: no checkpoint there" in out and "ERROR s3://: names no bucket" in out


def damage(run_dir: Path, how: str) -> None:
    newest = run_dir / NAMES[-1]
    if how == "truncated":
        (newest / "optimizer.pt").write_bytes((newest / "optimizer.pt").read_bytes()[:10])
    elif how == "file_missing":
        (newest / "model.pt").unlink()
    elif how == "manifest_missing":
        (newest / MANIFEST_NAME).unlink()
    elif how == "dir_gone":
        shutil.rmtree(newest)
    else:  # pragma: no cover - test bug
        raise ValueError(how)


@pytest.mark.parametrize("how", ["truncated", "file_missing", "manifest_missing", "dir_gone"])
def test_damaged_newest_checkpoint_is_set_aside_and_ray_resumes_from_the_previous(run, how):
    damage(run, how)
    original = (run / SNAPSHOT_NAME).read_text()
    if how == "dir_gone":
        with pytest.raises(CheckpointManagerInitializationError):  # what Ray does on its own
            ray_resumes_from(run.parent, run.name)

    resume = repair_run(resolve_run(str(run.parent), run.name))

    assert resume.resumed_from == NAMES[1]
    assert [d["checkpoint"] for d in resume.damaged] == [NAMES[-1]]
    assert resume.damaged[0]["problems"]
    assert ray_resumes_from(run.parent, run.name) == NAMES[1]
    assert sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir()) == NAMES[:2]
    # Nothing is deleted: the damaged checkpoint and the old snapshot are kept, and named.
    assert Path(resume.snapshot_backup).read_text() == original
    moved = resume.damaged[0]["moved_to"]
    if how == "dir_gone":
        assert moved is None
    else:
        assert Path(moved).parent == run / DAMAGED_DIR and (Path(moved) / "progress.json").exists()
    assert resume.info()["checkpoint_repair"]["resumed_from"] == NAMES[1]


def test_whole_checkpoints_are_left_exactly_as_they_are(run):
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    resume = repair_run(resolve_run(str(run.parent), run.name))
    assert resume.info() is None and resume.resumed_from == NAMES[-1]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_every_damaged_checkpoint_newer_than_the_whole_one_goes(run):
    damage(run, "truncated")
    (run / NAMES[1] / "model.pt").write_bytes(b"")
    resume = repair_run(resolve_run(str(run.parent), run.name))
    assert resume.resumed_from == NAMES[0]
    assert [d["checkpoint"] for d in resume.damaged] == [NAMES[2], NAMES[1]]
    assert ray_resumes_from(run.parent, run.name) == NAMES[0]


def test_nothing_whole_left_means_starting_over_not_loading_garbage(run):
    for name in NAMES:
        (run / name / "model.pt").write_bytes(b"")
    resume = repair_run(resolve_run(str(run.parent), run.name))
    assert resume.resumed_from is None and len(resume.damaged) == 3
    assert ray_resumes_from(run.parent, run.name) is None


@pytest.mark.parametrize("snapshot", ["torn", "missing"])
def test_torn_or_missing_snapshot_is_rebuilt_from_the_whole_checkpoints(run, snapshot):
    if snapshot == "torn":
        (run / SNAPSHOT_NAME).write_text(ray_snapshot(NAMES)[:57])
    else:
        (run / SNAPSHOT_NAME).unlink()
    damage(run, "truncated")
    resume = repair_run(resolve_run(str(run.parent), run.name))
    assert resume.rebuilt_snapshot and resume.resumed_from == NAMES[1]
    assert (resume.snapshot_backup is not None) == (snapshot == "torn")
    assert ray_resumes_from(run.parent, run.name) == NAMES[1]


@pytest.mark.parametrize("manifest_arrived", [False, True])
def test_a_first_upload_cut_short_is_not_mistaken_for_a_checkpoint(tmp_path, manifest_arrived):
    """Found by the driver-kill loop: killed during the first checkpoint upload, so no snapshot yet
    and a directory holding some of the files. Listing it handed the workers a checkpoint without
    optimizer.pt; it must be left alone and Ray must start over.
    """
    run_dir = tmp_path / "job"
    make_checkpoint(run_dir / NAMES[0], 5, manifest=manifest_arrived)
    (run_dir / NAMES[0] / "optimizer.pt").unlink()
    resume = repair_run(resolve_run(str(tmp_path), "job"))
    assert not (run_dir / SNAPSHOT_NAME).exists() and resume.resumed_from is None
    assert [p.name for p in run_dir.iterdir()] == NAMES[:1] and (run_dir / NAMES[0] / "model.pt").exists()
    assert ray_resumes_from(tmp_path, "job") is None


def test_checkpoints_without_manifests_are_judged_by_existence_only(tmp_path):
    run_dir = tmp_path / "job"
    for i, name in enumerate(NAMES):
        make_checkpoint(run_dir / name, 5 * (i + 1), manifest=False)
    (run_dir / SNAPSHOT_NAME).write_text(ray_snapshot(NAMES))
    shutil.rmtree(run_dir / NAMES[0])  # Ray refuses a snapshot naming a missing directory
    resume = repair_run(resolve_run(str(tmp_path), "job"))
    assert resume.resumed_from == NAMES[2] and [d["checkpoint"] for d in resume.damaged] == [NAMES[0]]
    assert ray_resumes_from(tmp_path, "job") == NAMES[2]


def test_commits_ray_made_but_the_ledger_missed_are_recorded_once(run):
    location = resolve_run(str(run.parent), run.name)
    ledger = Ledger(location, writer="test")
    ledger.ensure_dirs()
    ledger.append(RunStarted(t=1.0), 0)
    ledger.append(CheckpointCommitted(t=2.0, path=str(run / NAMES[0]), step=5), 0)

    resume = prepare_resume(location, ledger, ledger.read(), tier=0)
    assert [(e.path.rsplit("/", 1)[1], e.step) for e in resume.recorded] == [(NAMES[1], 10), (NAMES[2], 15)]
    assert resume.info() == {"recorded_missing_commits": 2}
    again = prepare_resume(location, ledger, ledger.read(), tier=0)
    assert again.recorded == [] and again.info() is None
    commits = [r for r in ledger.read() if r.event.kind == "checkpoint_committed"]
    assert len(commits) == 3 and all(r.info.get("recorded_by") in (None, "driver") for r in commits)


def test_repair_works_on_an_object_store(s3, run):
    """S3 has no directory rename: the damaged prefix is copied aside, then deleted."""
    fs = s3.filesystem()
    prefix = f"{s3.bucket}/repair-{os.getpid()}"
    pafs.copy_files(str(run), f"{prefix}/job", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    fs.open_output_stream(f"{prefix}/job/{NAMES[-1]}/model.pt").close()  # truncated to 0 bytes
    resume = repair_run(resolve_run(prefix, "job", fs))
    assert resume.resumed_from == NAMES[1]
    moved = resume.damaged[0]["moved_to"]
    assert fs.get_file_info(f"{moved}/optimizer.pt").type == pafs.FileType.File
    assert fs.get_file_info(f"{prefix}/job/{NAMES[-1]}").type == pafs.FileType.NotFound
    snap = json.loads(fs.open_input_stream(f"{prefix}/job/{SNAPSHOT_NAME}").readall())
    assert snap["latest_checkpoint_result"]["checkpoint_dir_name"] == NAMES[1]


@pytest.fixture(scope="module")
def s3():
    from tests.support.s3server import S3Server

    with S3Server() as server:
        yield server
