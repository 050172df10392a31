"""The retrying filesystem Ray is handed: outages shorter than the limit only pause, longer ones stop cleanly."""

from __future__ import annotations

import logging
import pickle
import threading
import time

import pyarrow.fs as pafs
import pytest
from ray.train import RunConfig
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from spotfallback.errors import LedgerError, StorageUnavailableError
from spotfallback.store.location import resolve_run
from spotfallback.store.retry import (
    DEFAULT_RETRY_S,
    READ_ONLY_RETRY_S,
    RETRY_ENV,
    call_with_retry,
    ray_run_config,
    read_only,
    retry_limit_s,
    retrying,
    storage_failure,
)
from tests.support.faultyfs import FaultControl, faulty_filesystem


@pytest.fixture()
def faulty(tmp_path):
    control = FaultControl(tmp_path / "control")
    yield control, faulty_filesystem(control.dir)
    control.stop()


def test_an_outage_shorter_than_the_limit_only_pauses_and_is_logged(faulty, tmp_path, caplog):
    control, fs = faulty
    wrapped = retrying(fs, limit_s=10)
    control.start(0.5)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="spotfallback"), wrapped.open_output_stream(str(tmp_path / "a.bin")) as out:
        out.write(b"x" * 100_000)
    assert 0.4 < time.monotonic() - t0 < 5
    assert (tmp_path / "a.bin").read_bytes() == b"x" * 100_000
    assert "storage error while trying to write" in caplog.text and "retrying in" in caplog.text
    control.start(0.5)
    assert wrapped.open_input_stream(str(tmp_path / "a.bin")).readall() == b"x" * 100_000
    control.start(0.5)
    assert [i.base_name for i in wrapped.get_file_info(pafs.FileSelector(str(tmp_path)))].count("a.bin") == 1


def test_an_outage_past_the_limit_stops_with_a_clear_error_and_writes_nothing_half(faulty, tmp_path):
    control, fs = faulty
    wrapped = retrying(fs, limit_s=1.0)
    with wrapped.open_output_stream(str(tmp_path / "before.bin")) as out:
        out.write(b"kept")
    control.start(30)
    t0 = time.monotonic()
    with (
        pytest.raises(StorageUnavailableError, match=r"storage unavailable for \d+s \(limit 1s.*write .*after.bin.*intact"),
        wrapped.open_output_stream(str(tmp_path / "after.bin")) as out,
    ):
        out.write(b"lost")
    assert time.monotonic() - t0 < 3
    control.stop()
    assert not (tmp_path / "after.bin").exists()
    assert (tmp_path / "before.bin").read_bytes() == b"kept"


def test_errors_no_wait_can_fix_are_not_retried(faulty, tmp_path):
    _, fs = faulty
    wrapped = retrying(fs, limit_s=30)
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError):
        wrapped.open_input_stream(str(tmp_path / "missing"))
    calls = []

    def denied():
        calls.append(1)
        raise OSError("AWS Error ACCESS_DENIED during PutObject operation")

    with pytest.raises(OSError, match="ACCESS_DENIED"):
        call_with_retry(denied, "write", 30)
    assert calls == [1] and time.monotonic() - t0 < 1


def test_a_checkpoint_copied_the_way_ray_copies_it_lands_whole_across_an_outage(faulty, tmp_path):
    """Ray uploads with ``pyarrow.fs.copy_files``; the outage begins in the middle of it."""
    control, fs = faulty
    src = tmp_path / "local"
    src.mkdir()
    files = {f"part{i}.bin": bytes([i]) * (50_000 + i) for i in range(6)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    control.arm("part3.bin", duration_s=0.8)
    dst = tmp_path / "stored"
    wrapped = retrying(fs, limit_s=20)
    wrapped.create_dir(str(dst))  # as Ray's persist_current_checkpoint does
    pafs.copy_files(str(src), str(dst), destination_filesystem=wrapped)
    assert control.outages == 1
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == files


def test_the_wrapper_travels_to_other_processes(faulty, tmp_path):
    _, fs = faulty
    wrapped = retrying(fs, limit_s=7)
    clone = pickle.loads(pickle.dumps(wrapped))
    assert clone.handler.limit_s == 7 and retrying(clone) is clone
    with clone.open_output_stream(str(tmp_path / "p")) as out:
        out.write(b"ok")
    assert (tmp_path / "p").read_bytes() == b"ok"


def test_ray_gets_the_wrapped_filesystem_and_the_stripped_root(faulty, tmp_path, monkeypatch):
    _, fs = faulty
    location = resolve_run(str(tmp_path), "job", fs)
    config = RunConfig(storage_path=str(tmp_path), name="job", storage_filesystem=fs)
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "5")
    ray_config = ray_run_config(config, location)
    assert ray_config.name == "job" and ray_config.storage_path == str(tmp_path)
    assert ray_config.storage_filesystem.type_name == "py::spotfallback-retry+py::faulty-local"
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "0")
    assert ray_run_config(config, location) is config


def test_a_local_path_stays_rays_own(tmp_path, monkeypatch):
    """Ray reads a local/NFS checkpoint in place; wrapped, it would download a copy per worker."""
    monkeypatch.setenv("SPOTFALLBACK_STORAGE_RETRY_S", "5")
    config = RunConfig(storage_path=str(tmp_path), name="job")
    assert ray_run_config(config, resolve_run(str(tmp_path), "job")) is config


def test_a_uri_with_an_explicit_filesystem_is_refused_not_mangled(tmp_path):
    from spotfallback.errors import ConfigError

    with pytest.raises(ConfigError, match=r"storage_path: 's3://bucket/runs' is a URI.*'bucket/runs'"):
        resolve_run("s3://bucket/runs", "job", pafs.LocalFileSystem())


def test_commands_that_only_read_wait_less_unless_the_environment_says_how_long(monkeypatch):
    monkeypatch.delenv(RETRY_ENV, raising=False)
    assert retry_limit_s() == DEFAULT_RETRY_S
    with read_only():
        assert retry_limit_s() == READ_ONLY_RETRY_S < DEFAULT_RETRY_S
    assert retry_limit_s() == DEFAULT_RETRY_S  # only inside
    monkeypatch.setenv(RETRY_ENV, "300")
    with read_only():
        assert retry_limit_s() == 300


def test_storage_failure_is_found_behind_workers_and_controller():
    cause = StorageUnavailableError("storage unavailable for 9s (limit 8s): AWS error NETWORK_CONNECTION")
    worker = WorkerGroupError("training failed", {1: UserExceptionWithTraceback(cause, "tb")})
    assert isinstance(storage_failure(worker), StorageUnavailableError)
    assert str(storage_failure(ControllerError(cause))) == str(cause)
    assert storage_failure(WorkerGroupError("x", {0: ValueError("bug")})) is None
    assert storage_failure(ControllerError(RuntimeError("x"))) is None


def test_ledger_calls_stop_with_storage_unavailable_past_the_limit():
    def refused():
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(StorageUnavailableError, match="storage unavailable.*intact") as info:
        call_with_retry(refused, "write ledger event", limit_s=0.5, permanent=LedgerError)
    assert isinstance(info.value, LedgerError)  # callers catching LedgerError still do
    with pytest.raises(LedgerError) as missing:
        call_with_retry(lambda: (_ for _ in ()).throw(FileNotFoundError("gone")), "read", limit_s=5, permanent=LedgerError)
    assert not isinstance(missing.value, StorageUnavailableError)


def test_a_command_that_only_reads_ends_by_its_limit_and_a_run_tries_up_to_it():
    # Each failing call takes 0.6 s (as an S3 client's own retries do). A run tries again at
    # 0.8 s, in case the outage ends: one shorter than the limit only pauses it. A command
    # that only reads does not start a try that would end at 1.4 s at the earliest, past 1 s.
    calls: list[float] = []

    def slow_refusal():
        calls.append(time.monotonic())
        time.sleep(0.6)
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(StorageUnavailableError, match=r"storage unavailable for \d+s \(limit 1s"):
        call_with_retry(slow_refusal, "read the ledger", limit_s=1.0)
    assert len(calls) == 2
    calls.clear()
    with read_only(), pytest.raises(StorageUnavailableError, match=r"storage unavailable for \d+s \(limit 1s"):
        call_with_retry(slow_refusal, "read the ledger", limit_s=1.0)
    assert len(calls) == 1


def test_the_ledger_gives_up_at_once_on_what_the_filesystem_gives_up_on(tmp_path, monkeypatch):
    """One rule: what no wait can fix is raised at once, by the ledger as a LedgerError naming the call."""
    import spotfallback.store.ledger as ledger_module
    from spotfallback.events import RunStarted

    calls = []

    def denied(fs, path, payload):
        calls.append(path)
        raise OSError("AWS Error ACCESS_DENIED during PutObject operation")

    monkeypatch.setattr(ledger_module, "write_atomically", denied)
    ledger = ledger_module.Ledger(resolve_run(str(tmp_path), "job"))
    t0 = time.monotonic()
    with pytest.raises(LedgerError, match=r"write ledger event .*ACCESS_DENIED") as info:
        ledger.append(RunStarted(1.0), 0)
    assert not isinstance(info.value, StorageUnavailableError)
    assert len(calls) == 1 and time.monotonic() - t0 < 1


def test_concurrent_writers_through_one_wrapper(faulty, tmp_path):
    """copy_files may use threads; each file is still written whole."""
    control, fs = faulty
    wrapped = retrying(fs, limit_s=20)
    control.start(0.5)

    def write(i: int) -> None:
        with wrapped.open_output_stream(str(tmp_path / f"t{i}")) as out:
            out.write(bytes([i]) * 10_000)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all((tmp_path / f"t{i}").read_bytes() == bytes([i]) * 10_000 for i in range(8))


def test_an_upload_that_fails_for_good_is_an_error_not_a_silent_gap(faulty, tmp_path):
    """pyarrow's copy_files drops errors from a Python stream's close(); ours fail in write()."""
    control, fs = faulty
    src = tmp_path / "local"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    wrapped = retrying(fs, limit_s=0.5)
    wrapped.create_dir(str(tmp_path / "stored"))
    control.start(30)
    with pytest.raises(StorageUnavailableError):
        pafs.copy_files(str(src), str(tmp_path / "stored"), destination_filesystem=wrapped)
    control.stop()
    assert not (tmp_path / "stored" / "a.bin").exists()


def test_files_longer_than_one_chunk_are_streamed_whole(tmp_path):
    wrapped = retrying(pafs.LocalFileSystem(), limit_s=5)
    with wrapped.open_output_stream(str(tmp_path / "big")) as out:
        for i in range(3):
            out.write(bytes([i]) * 1000)
    with wrapped.open_output_stream(str(tmp_path / "empty")):
        pass
    assert (tmp_path / "big").read_bytes() == b"\0" * 1000 + b"\1" * 1000 + b"\2" * 1000
    assert (tmp_path / "empty").read_bytes() == b""


def test_cli_reports_storage_gone_as_an_error_not_as_the_users_code(monkeypatch, tmp_path):
    """Exit 1 with the storage message; exit 3 ("the training function failed") would send users hunting a bug."""
    import ray
    import yaml
    from typer.testing import CliRunner

    from spotfallback.cli.app import _register_subcommands, app
    from spotfallback.runtime.trainer import FallbackTrainer

    def gone(self):
        raise StorageUnavailableError("storage unavailable for 8s (SPOTFALLBACK_STORAGE_RETRY_S) ... intact")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(FallbackTrainer, "fit", gone)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "job", "storage_path": str(tmp_path / "runs"), "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
        "ray_address": "127.0.0.1:1", "tiers": [{"name": "od", "market": "on-demand", "num_workers": 1}],
    }))
    _register_subcommands()
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 1, result.output
    assert "storage unavailable" in result.output and "training function failed" not in result.output


@pytest.fixture(scope="module")
def s3():
    from tests.support.s3server import S3Server

    with S3Server() as server:
        yield server


def test_a_real_s3_endpoint_going_away_mid_upload_only_pauses_a_checkpoint_copy(s3, tmp_path, caplog):
    """moto behind the outage proxy: the endpoint resets and refuses connections the instant
    ``part3.bin``'s upload is sent, for 4 s (past the S3 client's own ~2 s of retries)."""
    from tests.support.s3server import OutageProxy

    src = tmp_path / "local"
    src.mkdir()
    files = {f"part{i}.bin": bytes([i]) * (50_000 + i) for i in range(6)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    with OutageProxy(s3.endpoint) as proxy:
        wrapped = retrying(s3.filesystem(proxy.endpoint), limit_s=20)
        proxy.cut_on("part3.bin", duration_s=4)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="spotfallback"):
            pafs.copy_files(str(src), f"{s3.bucket}/ckpt", destination_filesystem=wrapped)
        took = time.monotonic() - t0
    assert proxy.outages == 1 and proxy.refused > 0 and 3.5 < took < 20, (proxy.log, took)
    assert "storage error while trying to write" in caplog.text and "retrying in" in caplog.text
    direct = s3.filesystem()
    assert {n: direct.open_input_stream(f"{s3.bucket}/ckpt/{n}").readall() for n in files} == files


def test_a_real_s3_endpoint_gone_for_good_stops_within_the_limit_and_keeps_what_was_written(s3, tmp_path):
    from tests.support.s3server import OutageProxy

    with OutageProxy(s3.endpoint) as proxy:
        wrapped = retrying(s3.filesystem(proxy.endpoint), limit_s=3)
        with wrapped.open_output_stream(f"{s3.bucket}/gone/before.bin") as out:
            out.write(b"kept")
        proxy.cut()
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailableError, match=r"limit 3s.*intact"):  # noqa: SIM117
            with wrapped.open_output_stream(f"{s3.bucket}/gone/after.bin") as out:
                out.write(b"lost")
        assert time.monotonic() - t0 < 15
    direct = s3.filesystem()
    assert direct.open_input_stream(f"{s3.bucket}/gone/before.bin").readall() == b"kept"
    assert direct.get_file_info(f"{s3.bucket}/gone/after.bin").type == pafs.FileType.NotFound


def test_the_outage_proxy_stalls_an_upload_until_its_client_goes_away(s3):
    """What the driver-kill test relies on to kill "during a checkpoint write"."""
    import socket

    from tests.support.s3server import OutageProxy

    with OutageProxy(s3.endpoint) as proxy:
        proxy.hold_on("/held.bin", max_s=30)
        client = socket.create_connection(("127.0.0.1", proxy.port))
        client.sendall(f"PUT /{s3.bucket}/held.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\ndata".encode())
        deadline = time.monotonic() + 10
        while not proxy.uploads_held() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.path for r in proxy.uploads_held()] == [f"/{s3.bucket}/held.bin"]
        client.close()  # the uploader dies
        while proxy.uploads_held() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.state for r in proxy.held] == ["aborted"]
    assert s3.filesystem().get_file_info(f"{s3.bucket}/held.bin").type == pafs.FileType.NotFound
