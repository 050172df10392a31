"""Where a run lives: resolve ``storage_path`` + ``name`` to a pyarrow filesystem and directory.

Ray Train keeps its checkpoints at ``{storage_path}/{name}``; spotfallback keeps its ledger
and lease beside them in ``{storage_path}/{name}/_spotfallback`` so one URI finds everything.

Also the two filesystem moves every store module makes: listing a directory that may not
exist yet, and writing an object whole (object stores have no append and no locks, so a
reader must never see half an object).
"""

from __future__ import annotations

import datetime
import os
import posixpath
import re
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from spotfallback.config import GCS_SCHEMES, gcs_uri_error, run_name_error, storage_uri_error
from spotfallback.errors import ConfigError
from spotfallback.store.retry import call_with_retry

STATE_DIR = "_spotfallback"
# Objects being written (``write_atomically``) start with this; readers skip them.
TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class RunLocation:
    """A run's directory on some filesystem (local, NFS, S3, GCS...)."""

    fs: pafs.FileSystem
    run_dir: str  # path inside ``fs``, no scheme
    storage_path: str
    name: str

    @property
    def state_dir(self) -> str:
        return posixpath.join(self.run_dir, STATE_DIR)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.state_dir, *parts)

    def uri(self) -> str:
        """``STORAGE_PATH/NAME``: the name goes before a storage URI's query (``?endpoint_override=...``)."""
        base, sep, query = self.storage_path.partition("?")
        return posixpath.join(base.rstrip("/"), self.name) + sep + query


def list_dir(fs: pafs.FileSystem, path: str, *, recursive: bool = False) -> list[pafs.FileInfo]:
    """List a directory that may not exist yet (an empty list then).

    pyarrow's local listing tries the directory first and only then checks that it is missing,
    so a directory created in between (``status`` or a test reading a run that is just starting)
    raises ``FileNotFoundError`` despite ``allow_not_found``. Listing again sees it.
    """
    selector = pafs.FileSelector(path, recursive=recursive, allow_not_found=True)
    for attempt in range(3):
        try:
            return fs.get_file_info(selector)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def write_atomically(fs: pafs.FileSystem, path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` whole: under a temporary name first, then moved into place.

    A crash mid-write leaves only a ``TMP_PREFIX`` object that readers skip, never a torn one.
    """
    directory, _, base = path.rpartition("/")
    tmp = f"{directory}/{TMP_PREFIX}{uuid.uuid4().hex}-{base}"
    with fs.open_output_stream(tmp) as out:
        out.write(payload)
    try:
        fs.move(tmp, path)
    except NotImplementedError:
        # Azure Blob without a hierarchical namespace cannot rename. Writing in place would not
        # do either: opening a blob for writing empties it at once, for every reader to see. A
        # server-side copy replaces the object whole.
        fs.copy_file(tmp, path)
        fs.delete_file(tmp)


def _is_uri(path: str) -> bool:
    return "://" in path


def resolve_run(storage_path: str, name: str, filesystem: pafs.FileSystem | None = None) -> RunLocation:
    """Resolve a run's location the way Ray does (URI, or a local path, or an explicit fs)."""
    problem = run_name_error(name)
    if problem:
        raise ConfigError(f"name: {problem}")
    if not storage_path or any(ord(c) < 32 for c in storage_path):
        raise ConfigError("storage_path: must be a non-empty path or URI without control characters")
    if filesystem is not None:
        if _is_uri(storage_path):  # Ray would take 's3://b/p' as a key path 's3:/b/p' in that filesystem
            raise ConfigError(
                f"storage_path: {storage_path!r} is a URI, but storage_filesystem is given; Ray then expects the "
                f"path inside that filesystem: {storage_path.split('://', 1)[1]!r}"
            )
        root = storage_path
    elif _is_uri(storage_path):
        if problem := storage_uri_error(storage_path):
            raise ConfigError(f"storage_path: {problem}")
        try:
            # Opening may ask the store (S3 looks up the bucket's region): a network error is waited out
            # as every storage call is, then StorageUnavailableError (retryable); no bucket or no access is bad input.
            filesystem, root = call_with_retry(lambda: filesystem_from_uri(storage_path), f"open {storage_path!r}")
        except (ValueError, OSError) as e:  # pyarrow.ArrowInvalid is a ValueError
            raise ConfigError(f"storage_path: cannot open {storage_path!r}: {e}") from None
    else:
        filesystem = pafs.LocalFileSystem()
        root = os.path.abspath(os.path.expanduser(storage_path))
        storage_path = root
    return RunLocation(fs=filesystem, run_dir=posixpath.join(root, name), storage_path=storage_path, name=name)


def filesystem_from_uri(uri: str, env: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """A storage URI -> (pyarrow filesystem, path inside it), reading credentials from ``env``.

    Azure Blob and GCS filesystems are built here rather than by ``FileSystem.from_uri``, which
    reads no account key, connection string or emulator endpoint from the environment and
    leaves GCS on its client's 15-minute retry loop. Ray Train is handed this same object
    (``retry.ray_run_config``), so a URI means the same in the job file, in ``status`` and
    ``report``, and in every Ray process.
    """
    env = os.environ if env is None else env
    scheme = uri.split("://", 1)[0].lower()
    if scheme in AZURE_SCHEMES:
        return azure_filesystem(uri, env)
    if scheme in GCS_SCHEMES:
        return gcs_filesystem(uri, env)
    return pafs.FileSystem.from_uri(uri)


# -- Azure Blob Storage --------------------------------------------------------------------

AZURE_SCHEMES = ("abfs", "abfss", "az")
AZURE_FORMS = "abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX, or az://CONTAINER/PREFIX with AZURE_STORAGE_ACCOUNT_NAME set"
AZURE_CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
# adlfs' names first, then the Azure CLI's: either is what a user already has in the shell.
AZURE_ACCOUNT_ENVS = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT")
AZURE_KEY_ENVS = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY")
AZURE_SAS_ENV = "AZURE_STORAGE_SAS_TOKEN"
AZURE_DEFAULT_SUFFIX = "core.windows.net"
_AZURE_HOST = re.compile(r"(?P<account>[^.]+)\.(?:dfs|blob)\.(?P<suffix>[a-z0-9.-]+)")
_AZURE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZURE_CONTAINER = re.compile(r"(?=.{3,63}$)[a-z0-9]+(?:-[a-z0-9]+)*")


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The value of the first of ``names`` set in ``env`` ("" if none is)."""
    return next((env[name].strip() for name in names if env.get(name, "").strip()), "")


def parse_connection_string(raw: str) -> dict[str, str]:
    """``Key=Value;Key=Value`` (Azure's storage connection string) -> {Key: Value}.

    Values keep their own ``=`` (account keys end in ``==``). Errors name the variable, never
    a value: these strings carry secrets.
    """
    parts: dict[str, str] = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"{AZURE_CONNECTION_STRING_ENV}: expected Key=Value;... pairs, found an item without '='"
            )
        parts[key.strip()] = value.strip()
    return parts


def _azure_endpoint(url: str, account: str, what: str) -> tuple[str, str]:
    """``BlobEndpoint`` -> (scheme, pyarrow authority): ``.blob.SUFFIX`` for the account's own
    public host, ``HOST:PORT`` (requests go to ``HOST:PORT/ACCOUNT/...``) for Azurite or a proxy."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.netloc.lower()
    if parsed.scheme not in ("http", "https") or not host:
        raise ValueError(f"{what}: expected http(s)://HOST[:PORT][/ACCOUNT], got {url!r}")
    own = _AZURE_HOST.fullmatch(host)
    if own and own["account"] == account:
        return parsed.scheme, "." + host.split(".", 1)[1]
    if parsed.path.strip("/") not in ("", account):
        raise ValueError(
            f"{what}: the path of {url!r} must be empty or /{account} (the account, as Azurite's endpoint has it)"
        )
    return parsed.scheme, host


def azure_filesystem(uri: str, env: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """``abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX`` (``.blob.`` too, any cloud's
    suffix), or ``abfs[s]://`` / ``az://CONTAINER/PREFIX`` with the account from the environment
    -> (Azure filesystem, "CONTAINER/PREFIX").

    Credentials, first found: AZURE_STORAGE_CONNECTION_STRING (its AccountKey or
    SharedAccessSignature; its BlobEndpoint also points at Azurite or a private endpoint),
    AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN; else pyarrow's default chain (a
    service principal in AZURE_CLIENT_ID/..., workload identity, managed identity, ``az login``).
    """
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.lower()
    if parsed.query or parsed.fragment:
        raise ValueError(
            f"{scheme}:// URIs take no ?options: the endpoint and credentials come from the environment "
            f"({AZURE_CONNECTION_STRING_ENV}, AZURE_STORAGE_ACCOUNT_KEY; see docs/storage.md)"
        )
    container, at, host = parsed.netloc.rpartition("@") if "@" in parsed.netloc else (parsed.netloc, "", "")
    # The URI names the account (its host) or the environment does; the environment says how to reach it.
    prefix = parsed.path.strip("/")
    conn = parse_connection_string(env.get(AZURE_CONNECTION_STRING_ENV, ""))
    suffix = conn.get("EndpointSuffix", AZURE_DEFAULT_SUFFIX).lower()
    if at:
        own = _AZURE_HOST.fullmatch(host.lower())
        if not own:
            raise ValueError(
                f"expected {scheme}://CONTAINER@ACCOUNT.dfs.{AZURE_DEFAULT_SUFFIX}/PREFIX, got host {host!r}"
            )
        account, suffix = own["account"], own["suffix"]
    else:
        account = _first(env, AZURE_ACCOUNT_ENVS) or conn.get("AccountName", "")
        if not account:
            raise ValueError(
                f"{scheme}://{container}/... names no storage account: write "
                f"{scheme}://{container}@ACCOUNT.dfs.{AZURE_DEFAULT_SUFFIX}/{prefix} or set AZURE_STORAGE_ACCOUNT_NAME"
            )
    if not _AZURE_CONTAINER.fullmatch(container):
        raise ValueError(
            f"{container!r} is not a container name (3-63 lowercase letters, digits and single hyphens); expected {AZURE_FORMS}"
        )
    if not _AZURE_ACCOUNT.fullmatch(account):
        raise ValueError(
            f"{account!r} is not a storage account name (3-24 lowercase letters and digits); expected {AZURE_FORMS}"
        )
    if conn.get("AccountName") and conn["AccountName"] != account:
        raise ValueError(
            f"{AZURE_CONNECTION_STRING_ENV} is for account {conn['AccountName']!r}, but the URI names account {account!r}"
        )
    options: dict[str, str] = {"account_name": account}
    blob_scheme = conn.get("DefaultEndpointsProtocol", "https").lower()
    if blob_scheme not in ("http", "https"):
        raise ValueError(f"{AZURE_CONNECTION_STRING_ENV}: DefaultEndpointsProtocol must be http or https")
    blob, dfs = f".blob.{suffix}", f".dfs.{suffix}"
    if conn.get("BlobEndpoint"):
        what = f"{AZURE_CONNECTION_STRING_ENV}: BlobEndpoint"
        blob_scheme, blob = _azure_endpoint(conn["BlobEndpoint"], account, what)
        # Azurite (or a proxy) answers the DFS API on the same host:port.
        dfs = ".dfs." + blob.split(".blob.", 1)[1] if blob.startswith(".blob.") else blob
    if (blob, dfs, blob_scheme) != (f".blob.{AZURE_DEFAULT_SUFFIX}", f".dfs.{AZURE_DEFAULT_SUFFIX}", "https"):
        options.update(
            blob_storage_authority=blob, blob_storage_scheme=blob_scheme, dfs_storage_authority=dfs, dfs_storage_scheme=blob_scheme
        )
    key = conn.get("AccountKey") or _first(env, AZURE_KEY_ENVS)
    sas = conn.get("SharedAccessSignature") or _first(env, (AZURE_SAS_ENV,))
    if key:
        options["account_key"] = key
    elif sas:
        options["sas_token"] = sas.lstrip("?")
    return pafs.AzureFileSystem(**options), posixpath.join(container, prefix) if prefix else container


# -- Google Cloud Storage ------------------------------------------------------------------

# Google's client libraries' switch to an emulator: its endpoint, and no credentials.
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
# The GCS client's own retries per call (its default is 15 minutes): short, so a longer outage
# reaches spotfallback's bounded, logged back-off (``retry.py``), as S3's client does.
GCS_CLIENT_RETRY_S = 2.0


def _http_scheme(value: str, what: str) -> str:
    if value not in ("http", "https"):
        raise ValueError(f"{what} must be http or https, got {value!r}")
    return value


def gcs_filesystem(uri: str, env: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """``gs://BUCKET/PREFIX[?endpoint_override=HOST:PORT&scheme=http...]`` -> (GCS filesystem, "BUCKET/PREFIX").

    Credentials: Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, workload
    identity, the VM's service account, ``gcloud auth application-default login``). With
    STORAGE_EMULATOR_HOST set, requests go to that emulator without credentials, as Google's
    own client libraries do; URI options still override it.
    """
    parsed = urllib.parse.urlsplit(uri)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if problem := gcs_uri_error(uri):
        raise ValueError(problem)
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    options: dict[str, object] = {"retry_time_limit": datetime.timedelta(seconds=GCS_CLIENT_RETRY_S)}
    emulator = env.get(GCS_EMULATOR_ENV, "").strip().rstrip("/")
    if emulator:
        e_scheme, sep, e_host = emulator.rpartition("://")
        if not e_host:
            raise ValueError(f"{GCS_EMULATOR_ENV}={emulator!r} names no host; expected http://HOST:PORT")
        options.update(anonymous=True, scheme=_http_scheme(e_scheme if sep else "http", f"{GCS_EMULATOR_ENV}: scheme"))
        options["endpoint_override"] = e_host
    for key, values in query.items():
        value = values[-1]
        if key == "scheme":
            options["scheme"] = _http_scheme(value, "scheme")
        elif key == "retry_limit_seconds":
            try:
                options["retry_time_limit"] = datetime.timedelta(seconds=float(value))
            except ValueError:
                raise ValueError(f"retry_limit_seconds: expected a number of seconds, got {value!r}") from None
        else:
            options[key] = value
    return pafs.GcsFileSystem(**options), posixpath.join(bucket, prefix) if prefix else bucket


def _bare_name_hint(name: str) -> str:
    """Where a run given by its name alone may be: a local folder of that name here or under ./runs."""
    found = [f"./{p}" for p in (Path("runs") / name, Path(name)) if p.is_dir()]
    if found:
        return f" (did you mean {found[0]}?)"
    return f" (STORAGE_PATH is the job file's storage_path: ./runs/{name} for the job file `spotfallback init` writes)"


def split_run_uri(uri: str) -> tuple[str, str]:
    """``STORAGE_PATH/NAME`` -> (storage_path, name), for commands that take one argument."""
    path, sep, query = uri.partition("?")  # a URI's options stay with the storage path
    path = path.rstrip("/")
    storage_path, _, name = path.rpartition("/")
    if not storage_path or not name:
        bare = name and not storage_path and "/" not in path and run_name_error(name) is None
        raise ConfigError(f"run: expected STORAGE_PATH/NAME, got {uri!r}{_bare_name_hint(name) if bare else ''}")
    if storage_path.endswith(":/"):
        raise ConfigError(f"run: {uri!r} names a bucket, not a run; expected STORAGE_PATH/NAME")
    if name == STATE_DIR:
        raise ConfigError(f"run: {uri!r} is a run's own {STATE_DIR} folder; give the run: {storage_path + sep + query!r}")
    return storage_path + sep + query, name
