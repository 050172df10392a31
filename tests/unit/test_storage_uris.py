"""``abfs://`` / ``az://`` and ``gs://`` storage paths: what filesystem they open, and the errors.

The first part needs no server: a filesystem's options are read back from its pickle (what Ray
ships to every worker). The last tests read a run on Azurite and on the GCS emulator through
``status`` and ``report`` with nothing but the URI and the environment a user would set.
"""

from __future__ import annotations

import datetime
import json
import pickle

import pyarrow.fs as pafs
import pytest
import typer
from ray.train import RunConfig
from typer.testing import CliRunner

from spotfallback.errors import ConfigError
from spotfallback.store.location import GCS_CLIENT_RETRY_S, resolve_run
from spotfallback.store.retry import RETRY_ENV, ray_run_config
from tests.support.ledgers import LADDER

ENVS = (
    "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "STORAGE_EMULATOR_HOST",
)  # fmt: skip
KEY = "c2VjcmV0LWtleS1vZi10aGUtdGVzdA=="
AZURITE = f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)


def options(fs: pafs.FileSystem) -> dict:
    """The options a filesystem travels with (to Ray's controller and workers)."""
    again = pickle.loads(pickle.dumps(fs))
    return dict(again.__reduce__()[1][0])


def storage_error(storage_path: str, *needles: str) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_run(storage_path, "job-1")
    message = str(caught.value)
    assert message.startswith("storage_path: "), message
    for needle in needles:
        assert needle in message, message
    return message


# -- Azure Blob ----------------------------------------------------------------------------


def test_abfs_uri_names_container_account_and_prefix_and_uses_the_public_endpoint():
    location = resolve_run("abfss://runs@acct1.dfs.core.windows.net/team/a", "job-1")
    assert isinstance(location.fs, pafs.AzureFileSystem)
    assert location.run_dir == "runs/team/a/job-1" and location.uri() == "abfss://runs@acct1.dfs.core.windows.net/team/a/job-1"
    opts = options(location.fs)
    assert opts["account_name"] == "acct1" and opts["account_key"] == "" and opts["sas_token"] == ""  # the default chain
    assert (opts["blob_storage_authority"], opts["blob_storage_scheme"]) == (".blob.core.windows.net", "https")


def test_abfs_uri_of_another_azure_cloud_keeps_its_endpoint_suffix():
    opts = options(resolve_run("abfs://runs@acct1.blob.core.chinacloudapi.cn/p", "job-1").fs)
    assert opts["blob_storage_authority"] == ".blob.core.chinacloudapi.cn" and opts["dfs_storage_authority"] == ".dfs.core.chinacloudapi.cn"


@pytest.mark.parametrize("account_env", ["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"])
def test_az_uri_takes_account_and_key_from_the_environment(monkeypatch, account_env):
    monkeypatch.setenv(account_env, "acct1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    location = resolve_run("az://runs/team", "job-1")
    assert location.run_dir == "runs/team/job-1"
    assert options(location.fs)["account_name"] == "acct1" and options(location.fs)["account_key"] == KEY


def test_a_sas_token_is_used_when_there_is_no_key(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=2024-01-01&sig=abc")
    opts = options(resolve_run("abfs://runs@acct1.dfs.core.windows.net/p", "job-1").fs)
    assert opts["sas_token"] == "sv=2024-01-01&sig=abc" and opts["account_key"] == ""


def test_azurite_connection_string_points_the_account_at_the_emulator(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE)
    for uri in ("abfs://runs@devstoreaccount1.dfs.core.windows.net/p", "az://runs/p"):
        opts = options(resolve_run(uri, "job-1").fs)
        assert opts["account_name"] == "devstoreaccount1" and opts["account_key"] == KEY
        assert (opts["blob_storage_authority"], opts["blob_storage_scheme"]) == ("127.0.0.1:10000", "http")
        assert (opts["dfs_storage_authority"], opts["dfs_storage_scheme"]) == ("127.0.0.1:10000", "http")


def test_connection_string_of_a_real_account_keeps_the_account_host(monkeypatch):
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", f"DefaultEndpointsProtocol=https;AccountName=acct1;AccountKey={KEY};EndpointSuffix=core.windows.net"
    )
    opts = options(resolve_run("az://runs/p", "job-1").fs)
    assert opts["blob_storage_authority"] == ".blob.core.windows.net" and opts["account_key"] == KEY
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=acct1;AccountKey={KEY};BlobEndpoint=https://acct1.blob.core.windows.net/")
    assert options(resolve_run("az://runs/p", "job-1").fs)["blob_storage_authority"] == ".blob.core.windows.net"


@pytest.mark.parametrize(
    ("storage_path", "needles"),
    [
        ("az://runs/p", ["names no storage account", "AZURE_STORAGE_ACCOUNT_NAME", "az://runs@ACCOUNT.dfs.core.windows.net/p"]),
        ("abfs://runs@acct1.example.com/p", ["expected abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX"]),
        ("abfs://Runs@acct1.dfs.core.windows.net/p", ["'Runs' is not a container name"]),
        ("abfs://@acct1.dfs.core.windows.net/p", ["is not a container name"]),
        ("abfs://runs@Bad_Acct.dfs.core.windows.net/p", ["is not a storage account name"]),
        ("abfs://runs@acct1.dfs.core.windows.net/p?endpoint_override=127.0.0.1:1", ["take no ?options", "AZURE_STORAGE_CONNECTION_STRING"]),
    ],
)
def test_malformed_azure_uri_is_one_error_naming_storage_path_and_the_fix(storage_path, needles):
    storage_error(storage_path, *needles)


def test_a_connection_string_for_another_account_or_malformed_is_refused_without_showing_the_key(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE)
    message = storage_error("abfs://runs@other1.dfs.core.windows.net/p", "is for account 'devstoreaccount1'", "names account 'other1'")
    assert KEY not in message
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=acct1;{KEY[:-2]};")
    assert KEY[:-2] not in storage_error("az://runs/p", "AZURE_STORAGE_CONNECTION_STRING: expected Key=Value")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=acct1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/elsewhere")
    assert KEY not in storage_error("az://runs/p", "BlobEndpoint", "must be empty or /acct1")


# -- Google Cloud Storage ------------------------------------------------------------------


def test_gs_uri_uses_application_default_credentials_and_a_short_client_retry():
    location = resolve_run("gs://my-bucket/team/a", "job-1")
    assert isinstance(location.fs, pafs.GcsFileSystem) and location.run_dir == "my-bucket/team/a/job-1"
    opts = options(location.fs)
    assert opts["anonymous"] is False and opts["scheme"] == "https" and opts["endpoint_override"] == ""
    # Not the client's own 15 minutes: spotfallback's bounded, logged back-off governs an outage.
    assert opts["retry_time_limit"] == datetime.timedelta(seconds=GCS_CLIENT_RETRY_S)


def test_storage_emulator_host_points_gs_at_the_emulator_without_credentials(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")
    opts = options(resolve_run("gs://my-bucket/p", "job-1").fs)
    assert (opts["anonymous"], opts["scheme"], opts["endpoint_override"]) == (True, "http", "127.0.0.1:9023")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:9023")  # no scheme: http, as Google's clients take it
    assert options(resolve_run("gs://my-bucket/p", "job-1").fs)["endpoint_override"] == "localhost:9023"


def test_gs_uri_options_are_pyarrows_own_and_override_the_environment(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")
    location = resolve_run("gs://my-bucket/p?endpoint_override=10.0.0.5:443&scheme=https&retry_limit_seconds=7&project_id=proj", "job-1")
    opts = options(location.fs)
    assert (opts["endpoint_override"], opts["scheme"], opts["project_id"]) == ("10.0.0.5:443", "https", "proj")
    assert opts["retry_time_limit"] == datetime.timedelta(seconds=7) and location.run_dir == "my-bucket/p/job-1"


@pytest.mark.parametrize(
    ("storage_path", "needles"),
    [
        ("gs://My_Bucket/p", ["'My_Bucket' is not a bucket name", "gs://BUCKET/PREFIX"]),
        ("gs://ab/p", ["'ab' is not a bucket name"]),
        ("gs://my-bucket/p?anonymous=true", ["unknown URI option 'anonymous'", "endpoint_override, scheme"]),
        ("gs://my-bucket/p?scheme=ftp", ["scheme must be http or https, got 'ftp'"]),
        ("gs://my-bucket/p?retry_limit_seconds=soon", ["retry_limit_seconds: expected a number of seconds"]),
        ("gs:///p", ["names no bucket", "gs://BUCKET/PREFIX"]),
        ("gs://", ["names no bucket", "gs://BUCKET/PREFIX"]),
    ],
)
def test_malformed_gs_uri_is_one_error_naming_storage_path_and_the_fix(storage_path, needles):
    storage_error(storage_path, *needles)


def test_a_bad_storage_emulator_host_is_named(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "ftp://127.0.0.1:9023")
    storage_error("gs://my-bucket/p", "STORAGE_EMULATOR_HOST: scheme must be http or https")


# -- what Ray Train is handed --------------------------------------------------------------


@pytest.mark.parametrize("retry_s", ["8", "0"])
def test_ray_gets_the_filesystem_built_from_the_environment_even_with_retries_off(monkeypatch, retry_s):
    """Ray reading ``gs://`` or ``abfs://`` itself would drop the emulator endpoint, the account
    key and the short client retry: it must be handed the filesystem spotfallback built."""
    monkeypatch.setenv(RETRY_ENV, retry_s)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE)
    for uri in ("gs://my-bucket/runs", "abfs://runs@devstoreaccount1.dfs.core.windows.net/runs"):
        location = resolve_run(uri, "job-1")
        handed = ray_run_config(RunConfig(storage_path=uri, name="job-1"), location)
        assert handed.name == "job-1" and handed.storage_path == location.run_dir.rsplit("/", 1)[0]
        fs = handed.storage_filesystem
        inner = fs.handler.inner if isinstance(fs, pafs.PyFileSystem) else fs
        assert isinstance(fs, pafs.PyFileSystem) == (retry_s != "0")
        assert options(inner) == options(location.fs)


# -- status and report on the emulators ----------------------------------------------------


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from spotfallback.cli import report as cli_report
    from spotfallback.cli import status as cli_status

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    for command in (cli_status, cli_report):
        command.register(app)
    return app


@pytest.fixture(params=["azure", "gcs"])
def emulator(request):
    if request.param == "azure":
        from tests.support.azurite import AzuriteServer

        with AzuriteServer() as server:
            yield server
    else:
        from tests.support.gcsserver import GcsServer

        with GcsServer() as server:
            yield server


def test_status_and_report_read_a_run_on_azure_blob_and_gcs_by_uri(app, emulator, monkeypatch, tmp_path):
    from tests.support.ledgers import run_events, write_ledger

    for key, value in emulator.env().items():
        monkeypatch.setenv(key, value)
    write_ledger(emulator.uri("runs"), run_events(), name="digits-1")
    run = emulator.uri("runs/digits-1")
    result = CliRunner().invoke(app, ["status", run, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spend"] == pytest.approx(8.01, abs=0.005)
    result = CliRunner().invoke(app, ["report", run, "--out", str(tmp_path / "r.png")], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "│ spot      │ spot      │ $1.84/h │ 1.5833 h │ $2.91 │" in result.output, result.output
    missing = CliRunner().invoke(app, ["status", emulator.uri("runs/missing")], env={"COLUMNS": "200"})
    assert missing.exit_code == 2 and "run: no spotfallback run at" in missing.output, missing.output


def test_a_wrong_azure_key_stops_a_ledger_write_at_once_naming_the_error(monkeypatch):
    """Not retried for SPOTFALLBACK_STORAGE_RETRY_S: no wait fixes a key the account refuses."""
    import time

    from spotfallback.errors import LedgerError
    from spotfallback.store.ledger import Ledger
    from tests.support.azurite import KEY as AZURITE_KEY
    from tests.support.azurite import AzuriteServer

    monkeypatch.setenv(RETRY_ENV, "60")
    with AzuriteServer() as server:
        wrong = server.env()["AZURE_STORAGE_CONNECTION_STRING"].replace(AZURITE_KEY, KEY)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
        ledger = Ledger(resolve_run(server.uri("runs"), "job-1"), writer="test")
        t0 = time.monotonic()
        with pytest.raises(LedgerError, match="AuthorizationFailure"):
            ledger.ensure_dirs()
            ledger.write_meta(LADDER, {"name": "job-1"})
        assert time.monotonic() - t0 < 10


def test_a_multi_megabyte_checkpoint_file_uploads_whole_in_pieces_on_both_emulators(emulator, monkeypatch):
    """On GCS a resumable upload session sent in many requests; also through the retrying
    wrapper Ray is handed, which writes a file of this size as one whole object."""
    import os

    from spotfallback.store.retry import retrying

    for key, value in emulator.env().items():
        monkeypatch.setenv(key, value)
    location = resolve_run(emulator.uri("runs"), "job-1")
    payload = os.urandom(20 * 1024 * 1024 + 3)
    for fs, name in ((location.fs, "direct.pt"), (retrying(location.fs, limit_s=5), "wrapped.pt")):
        path = f"{location.run_dir}/checkpoint_1/{name}"
        fs.create_dir(f"{location.run_dir}/checkpoint_1")
        with fs.open_output_stream(path) as out:
            for i in range(0, len(payload), 1024 * 1024):
                out.write(payload[i : i + 1024 * 1024])
        with fs.open_input_stream(path) as f:
            assert f.read() == payload
    listed = [(i.base_name, i.type) for i in location.fs.get_file_info(pafs.FileSelector(location.run_dir))]
    assert listed == [("checkpoint_1", pafs.FileType.Directory)]  # a directory Ray created is listed


def test_a_run_uri_keeps_the_storage_uris_options_after_the_name():
    """``status``/``report`` take the URI a run prints: the options follow the name, and are split back off it."""
    from spotfallback.store.location import RunLocation, split_run_uri

    storage = "s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    location = RunLocation(pafs.LocalFileSystem(), "/unused", storage, "digits")
    assert location.uri() == "s3://bucket/runs/digits?endpoint_override=127.0.0.1:9000&scheme=http"
    assert split_run_uri(location.uri()) == (storage, "digits")
    assert split_run_uri("/data/runs/digits/") == ("/data/runs", "digits")
