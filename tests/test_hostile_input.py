"""Hostile input, property-tested: job files, CLI arguments, ledger objects, traces, run names.

The rule every test states: a bad input gives the project's own error (ConfigError,
LedgerError, TraceError, or exit code 2 with one message) that names the field or line, never
a traceback; an input that is accepted is accepted *correctly* (every event field has its
declared type, a run directory is a direct child of the storage root).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from spotfallback.config import ConfigError, JobConfig, run_name_error
from spotfallback.events import EVENT_TYPES
from spotfallback.ledger import Ledger, LedgerError
from spotfallback.storage import resolve_run
from spotfallback.traces import TraceError, load_node_trace, load_spot_trace

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CLI_SETTINGS = settings(SETTINGS, max_examples=50)  # each example runs the whole typer command

VALID_JOB: dict = {
    "name": "job-1",
    "storage_path": "/tmp/sf-hostile-runs",
    "entrypoint": "examples.ddp_digits:train_fn",
    "train_loop_config": {"total_steps": 5},
    "ray_address": "127.0.0.1:1",
    "tiers": [
        {"name": "spot", "market": "spot", "num_workers": 2, "max_preemptions": 1},
        {"name": "on-demand", "market": "on-demand", "num_workers": 2},
    ],
}

# Unknown keys a person could type (YAML folds line-break characters such as U+0085 in keys,
# so those would not survive the round trip the test relies on).
KEYS = st.text(st.characters(categories=("L", "N", "P", "S")), min_size=1, max_size=12)
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["../x", "/etc/passwd", "a\x00b", "a\nb", "", " ", "-1", "nan", "1e309", "tiers"]),
)
hostile_values = st.recursive(
    hostile_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6
)


def _dump(data: object) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


# -- job configuration ------------------------------------------------------------------------


@st.composite
def mutated_jobs(draw: st.DrawFn) -> tuple[dict, str]:
    """A valid job with one hostile change; returns (job, the field path the error must name)."""
    job = json.loads(json.dumps(VALID_JOB))
    where = draw(st.sampled_from(["top", "tier", "drop", "extra", "tier-extra"]))
    if where == "top":
        key = draw(st.sampled_from(sorted(VALID_JOB)))
        job[key] = draw(hostile_values)
        return job, key
    if where == "drop":
        key = draw(st.sampled_from(["name", "storage_path", "entrypoint", "tiers"]))
        del job[key]
        return job, key
    if where == "extra":
        key = draw(KEYS.filter(lambda k: k not in VALID_JOB))
        job[key] = draw(hostile_values)
        return job, key
    i = draw(st.integers(0, 1))
    tier_keys = ["name", "market", "num_workers", "max_preemptions", "max_failures", "capacity_timeout_s",
                 "price_per_worker_hour", "label_selector", "resources_per_worker", "use_gpu"]
    key = draw(st.sampled_from(tier_keys)) if where == "tier" else draw(
        KEYS.filter(lambda k: k not in tier_keys)
    )
    job["tiers"][i][key] = draw(hostile_values)
    return job, f"tiers[{i}]"


def _assert_sane(job: JobConfig) -> None:
    """What an accepted job must satisfy: nothing NaN or infinite, a name that stays put."""
    assert run_name_error(job.name) is None
    for tier in job.tiers:
        for value in (tier.price_per_worker_hour, tier.capacity_timeout_s):
            assert value is None or math.isfinite(value), f"tier {tier.name}: non-finite number accepted"
        assert tier.num_workers >= 1


@SETTINGS
@given(case=mutated_jobs())
def test_a_bad_job_file_is_a_config_error_naming_the_field(case, tmp_path):
    job, field = case
    path = tmp_path / "job.yaml"
    try:
        path.write_text(_dump(job))
    except (UnicodeEncodeError, yaml.YAMLError):
        assume(False)
    try:
        loaded = JobConfig.from_yaml(path)
    except ConfigError as e:
        message = str(e)
        assert str(path) in message
        assert field in message or f"{field}" in message.replace("\n", " "), message
        assert "Traceback" not in message
        return
    _assert_sane(loaded)


@pytest.mark.parametrize("field", ["price_per_worker_hour", "capacity_timeout_s", "max_preemptions"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_in_a_tier_are_refused_by_name(field, value, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(_dump(VALID_JOB).replace("max_preemptions: 1", f"max_preemptions: 1\n  {field}: {value}", 1))
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.{field}"):
        JobConfig.from_yaml(path)


@SETTINGS
@given(text=st.text(max_size=300))
def test_any_text_as_a_job_file_is_a_config_error_or_a_valid_job(text, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        loaded = JobConfig.from_yaml(path)
    except ConfigError as e:
        assert str(path) in str(e)
        return
    _assert_sane(loaded)


def test_yaml_errors_name_the_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nstorage_path: b\n  bad: indent\n")
    with pytest.raises(ConfigError, match=r"job.yaml: not valid YAML at line 3, column \d+"):
        JobConfig.from_yaml(path)


# -- command line -------------------------------------------------------------------------------


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from spotfallback.cli import _register_subcommands, app

    if not getattr(_invoke, "registered", False):
        _register_subcommands()
        _invoke.registered = True  # type: ignore[attr-defined]
    return CliRunner().invoke(app, args, catch_exceptions=True)


def _assert_clean_refusal(result) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


bad_names = st.text(max_size=40).filter(lambda n: run_name_error(n) is not None)


@CLI_SETTINGS
@given(name=bad_names)
def test_cli_refuses_run_names_that_could_leave_the_storage_root(name, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(_dump(VALID_JOB))
    result = _invoke(["run", str(job), "--name", name])
    _assert_clean_refusal(result)
    assert "name" in result.output


@CLI_SETTINGS
@given(text=st.text(max_size=80))
def test_cli_job_json_that_is_not_a_job_exits_2(text):
    result = _invoke(["run", "--job-json", text])
    _assert_clean_refusal(result)


@CLI_SETTINGS
@given(args=st.lists(st.sampled_from(["--name", "--storage-path", "--ray-address", "--job-json", "--bogus", "-x", "run", "", "\x00", "--retry-failed"]), max_size=5))
def test_cli_argument_soup_is_a_usage_error_not_a_traceback(args, tmp_path):
    result = _invoke(["run", *args])
    _assert_clean_refusal(result)


@pytest.mark.parametrize(
    "entrypoint",
    ["no_such_module_anywhere:train_fn", "examples.ddp_digits:no_such_function", "/nonexistent/file.py:fn"],
)
def test_cli_entrypoint_that_cannot_load_is_a_clean_error(entrypoint, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(_dump({**VALID_JOB, "entrypoint": entrypoint, "storage_path": str(tmp_path / "runs")}))
    result = _invoke(["run", str(job)])
    _assert_clean_refusal(result)
    assert "entrypoint" in result.output


# -- ledger objects --------------------------------------------------------------------------


def _declared(cls: type, name: str) -> object:
    return typing.get_type_hints(cls)[name]


def _has_type(value: object, annotation: object) -> bool:
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation in (str, bool):
        return type(value) is annotation
    args = typing.get_args(annotation)
    if args:
        return any(_has_type(value, a) for a in args)
    if annotation is type(None):
        return value is None
    return True


@st.composite
def ledger_objects(draw: st.DrawFn) -> object:
    """A stored record with hostile parts: a valid record of any kind, then one part replaced."""
    kind = draw(st.sampled_from(sorted(EVENT_TYPES)))
    cls = EVENT_TYPES[kind]
    event: dict = {"kind": kind, "t": 1.5}
    for f in fields(cls):
        if f.name != "t":
            event[f.name] = f.default if f.default is not None else None
    record = {"v": 1, "id": "abc", "writer": "w", "tier": 0, "event": event, "decision": None, "info": {}}
    target = draw(st.sampled_from(["event-field", "record-field", "whole", "event-extra"]))
    if target == "event-field":
        event[draw(st.sampled_from(sorted(event)))] = draw(hostile_values)
    elif target == "record-field":
        record[draw(st.sampled_from(sorted(record)))] = draw(hostile_values)
    elif target == "event-extra":
        event[draw(st.text(min_size=1, max_size=8))] = draw(hostile_values)
    else:
        return draw(hostile_values)
    return record


@SETTINGS
@given(obj=ledger_objects())
def test_a_hostile_ledger_object_is_named_or_read_with_every_field_typed(obj, tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger")
    location = resolve_run(str(root), "run")
    ledger = Ledger(location)
    ledger.ensure_dirs()
    name = "00000000001500000000-w-event.json"
    try:
        payload = json.dumps(obj)
    except (ValueError, TypeError):
        assume(False)
    Path(ledger.directory, name).write_text(payload)
    try:
        records = ledger.read()
    except LedgerError as e:
        assert name in str(e)
        return
    (rec,) = records
    assert isinstance(obj, dict)
    assert type(obj["id"]) is str and type(obj["writer"]) is str
    assert type(rec.tier) is int and rec.tier >= 0
    for f in fields(rec.event):
        assert _has_type(getattr(rec.event, f.name), _declared(type(rec.event), f.name)), (f.name, getattr(rec.event, f.name))


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_ledger_bytes_that_are_not_json_are_named(raw, tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger")
    ledger = Ledger(resolve_run(str(root), "run"))
    ledger.ensure_dirs()
    Path(ledger.directory, "00000000000000000001-w-x.json").write_bytes(raw)
    try:
        ledger.read()
    except LedgerError as e:
        assert "00000000000000000001-w-x.json" in str(e)


# -- trace files -------------------------------------------------------------------------------


@SETTINGS
@given(doc=hostile_values | st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"gap_seconds": hostile_scalars}), "data": st.lists(hostile_scalars, max_size=5)}))
def test_a_hostile_spot_trace_is_a_trace_error_naming_the_field(doc, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.json"
    try:
        path.write_text(json.dumps(doc))
    except (ValueError, TypeError):
        assume(False)
    try:
        trace = load_spot_trace(path)
    except TraceError as e:
        assert str(path) in str(e) and re.search(r"field|JSON|line", str(e))
        return
    assert trace.gap_seconds > 0 and math.isfinite(trace.gap_seconds)
    assert (trace.available >= 0).all() and len(trace.available) >= 1


@SETTINGS
@given(lines=st.lists(st.text(max_size=30) | st.builds(lambda t, a, n: f"{t},{a},{n}", hostile_scalars, st.sampled_from(["add", "remove", "ADD", ""]), st.text(max_size=6)), max_size=8))
def test_a_hostile_node_trace_is_a_trace_error_naming_the_line(lines, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    path.write_text("\n".join(lines), encoding="utf-8")
    try:
        trace = load_node_trace(path)
    except TraceError as e:
        assert str(path) in str(e)
        return
    times = [e.t_s for e in trace.events]
    assert times == sorted(times) and all(math.isfinite(t) and t >= 0 for t in times)


# -- run names and paths -------------------------------------------------------------------------


@SETTINGS
@given(name=st.text(max_size=60) | st.sampled_from(["..", "../x", "a/../../b", "/abs", "a\x1fb", "x/", "ok.", ".hidden"]))
def test_a_run_name_never_leaves_the_storage_root(name, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("root"))
    try:
        location = resolve_run(root, name)
    except ConfigError as e:
        assert str(e).startswith("name:")
        return
    assert posixpath.dirname(location.run_dir) == root
    assert posixpath.normpath(location.run_dir) == location.run_dir
    assert all(ord(c) >= 32 for c in location.run_dir) and "/" not in name


@SETTINGS
@given(path=st.text(min_size=1, max_size=30).filter(lambda p: any(ord(c) < 32 for c in p)))
def test_a_storage_path_with_control_characters_is_refused(path):
    with pytest.raises(ConfigError, match="^storage_path:"):
        resolve_run(path, "run")


# -- nothing is a pickle of user code ------------------------------------------------------------


def test_no_module_of_the_project_pickles_anything():
    """The ledger, lease, run metadata and manifests are JSON; no code path may even import pickle."""
    src = Path(__file__).resolve().parents[1] / "src" / "spotfallback"
    offenders = [
        f"{p.relative_to(src)}:{n}"
        for p in src.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.match(r"\s*(import|from)\s+(pickle|cPickle|cloudpickle|dill|joblib|shelve|marshal)\b", line)
    ]
    assert offenders == []
