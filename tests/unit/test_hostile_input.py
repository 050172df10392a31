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
import threading
import typing
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spotfallback.config import MAX_DURATION_S, JobConfig, Tier, make_ladder, run_name_error
from spotfallback.errors import ConfigError, LedgerError, TraceError
from spotfallback.events import EVENT_TYPES
from spotfallback.sim.traces import load_node_trace, load_spot_trace
from spotfallback.store.ledger import Ledger
from spotfallback.store.location import resolve_run
from tests.support.yaml_texts import alias_bomb, nested_too_deep

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CLI_SETTINGS = settings(SETTINGS, max_examples=50)  # each example runs the whole typer command

VALID_JOB: dict = {
    "name": "job-1",
    "storage_path": "/tmp/sf-hostile-runs",
    "entrypoint": "spotfallback.examples.ddp_digits:train_fn",
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
        assert tier.capacity_timeout_s is None or tier.capacity_timeout_s <= MAX_DURATION_S
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
    given = f"{field}: {value}" if field == "max_preemptions" else f"max_preemptions: 1\n  {field}: {value}"
    path.write_text(_dump(VALID_JOB).replace("max_preemptions: 1", given, 1))
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.{field}"):
        JobConfig.from_yaml(path)


@pytest.mark.parametrize(
    ("given", "field", "unit"),
    [("capacity_timeout_s: {s}", "tiers[0].capacity_timeout_s", "315360000 seconds"),
     ("min_dwell_s: {s}", "tiers[0].min_dwell_s", "315360000 seconds"),
     ("max_preemption_rate: {{count: 2, window_s: {s}}}", "tiers[0].max_preemption_rate.window_s", "315360000 seconds"),
     ("deadline_guard: {{deadline_h: {h}, work_h: 2}}", "tiers[0].deadline_guard.deadline_h", "87600 hours"),
     ("cost_cap: {{work_h: {h}}}", "tiers[0].cost_cap.work_h", "87600 hours")],
)
def test_a_duration_past_ten_years_is_refused_by_name_and_ten_years_is_not(given, field, unit, tmp_path):
    """Every timer must hold a job file's durations (threading refuses a wait past TIMEOUT_MAX)."""
    assert threading.TIMEOUT_MAX > MAX_DURATION_S
    path = tmp_path / "job.yaml"
    for s, h, refused in ((MAX_DURATION_S, MAX_DURATION_S / 3600, False), ("1.0e+300", "1.0e+300", True)):
        path.write_text(_dump(VALID_JOB).replace("max_preemptions: 1", "max_preemptions: 1\n  " + given.format(s=s, h=h), 1))
        if not refused:
            JobConfig.from_yaml(path)
            continue
        with pytest.raises(ConfigError) as e:
            JobConfig.from_yaml(path)
        assert f"{field}: 1e+300 is more than 10 years; give at most {unit}" in str(e.value)


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


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [("name: a\ntiers: []\nstorage_path: b\ntiers: [x]\n", 4, "'tiers'"),
     ("tiers:\n  - {name: s, market: spot, num_workers: 1, max_preemptions: 1, max_preemptions: 9}\n", 2, "'max_preemptions'")],
)
def test_a_key_given_twice_is_refused_naming_its_line(tmp_path, text, line, key):
    """YAML lets the last of two equal keys win without a word: a job file with two tiers: lists
    would run the ladder its author did not read."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"job.yaml: not valid YAML at line {line}, column \d+: {key} is given twice in one mapping; keep one"):
        JobConfig.from_yaml(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [("tiers: &t [*t]\n", "an alias refers to a node that holds it"),
     (alias_bomb(9, tail="tiers: []\n"), "its aliases expand this document to more than 100,000 values")],
)
def test_a_job_file_whose_aliases_loop_or_explode_is_refused_before_it_is_built(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"job.yaml: not valid YAML at line 1, column \d+: {message}"):
        JobConfig.from_yaml(path)


def test_a_job_file_nested_past_the_yaml_readers_depth_is_refused_in_one_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(nested_too_deep())
    with pytest.raises(ConfigError, match=r"job.yaml: not readable YAML: its values nest deeper than the YAML reader can follow$"):
        JobConfig.from_yaml(path)


def test_a_job_file_may_share_a_tiers_settings_through_a_merge_key(tmp_path):
    """``<<: *spot`` is how YAML repeats a mapping; the mapping's own keys override what it merges."""
    path = tmp_path / "job.yaml"
    path.write_text("name: merged\nentrypoint: spotfallback.examples.ddp_digits:train_fn\nstorage_path: /tmp/merged\ntiers:\n"
                    "  - &spot {name: spot-a, market: spot, num_workers: 2, max_preemptions: 3}\n"
                    "  - {<<: *spot, name: spot-b, max_preemptions: 1}\n"
                    "  - {name: on-demand, market: on-demand, num_workers: 2}\n")
    ladder = JobConfig.from_yaml(path).ladder
    assert [(t.name, t.num_workers, t.max_preemptions) for t in ladder.tiers[:2]] == [("spot-a", 2, 3), ("spot-b", 2, 1)]


# -- command line -------------------------------------------------------------------------------


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from spotfallback.cli.app import _register_subcommands, app

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
    ["no_such_module_anywhere:train_fn", "spotfallback.examples.ddp_digits:no_such_function", "/nonexistent/file.py:fn"],
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


# What a node trace too short to hold a run says; no line is at fault yet.
WHOLE_FILE = ("no events", "spans no time")


@SETTINGS
@given(lines=st.lists(st.text(max_size=30) | st.builds(lambda t, a, n: f"{t},{a},{n}", hostile_scalars, st.sampled_from(["add", "remove", "ADD", ""]), st.text(max_size=6)), max_size=8))
def test_a_hostile_node_trace_is_a_trace_error_naming_the_line(lines, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    path = tmp / "t.csv"
    path.write_text("\n".join(lines), encoding="utf-8")
    try:
        trace = load_node_trace(path)
    except TraceError as e:
        assert str(path) in str(e)
        named = re.search(r": line (\d+): ", str(e))
        if named is None:  # only a whole-file problem may name no line
            assert any(w in str(e) for w in WHOLE_FILE), str(e)
            return
        # The line named is the first the file cannot have, counted as an editor counts lines:
        # the lines before it load (or hold no event yet), and with it the same error comes.
        n = int(named.group(1))
        seen = path.read_text(encoding="utf-8").split("\n")
        assert 1 <= n <= len(seen), (n, len(seen))
        before, upto = tmp / "before.csv", tmp / "upto.csv"
        before.write_text("\n".join(seen[: n - 1]), encoding="utf-8")
        upto.write_text("\n".join(seen[:n]), encoding="utf-8")
        try:
            load_node_trace(before)
        except TraceError as earlier:
            assert any(w in str(earlier) for w in WHOLE_FILE), f"{e} / but the lines before it fail: {earlier}"
        with pytest.raises(TraceError) as again:
            load_node_trace(upto)
        # A file out of order names the later line that goes back in time as the fix, which the
        # lines up to the first error cannot know: the error itself is the same.
        unsorted = re.compile(r"; line \d+ goes back in time: sort the lines by time$")
        if unsorted.search(str(e)):
            assert str(again.value).replace(str(upto), str(path)).startswith(unsorted.sub("", str(e)) + "; "), (e, again.value)
        else:
            assert str(again.value).replace(str(upto), str(path)) == str(e)
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


@pytest.mark.parametrize("storage_path", ["s3://", "s3:///", "gs://?project=x"])
def test_a_storage_uri_without_a_bucket_is_refused_not_listed(storage_path):
    with pytest.raises(ConfigError, match=r"^storage_path: .* names no bucket"):
        resolve_run(storage_path, "run")


@SETTINGS
@given(path=st.text(min_size=1, max_size=30).filter(lambda p: any(ord(c) < 32 for c in p)))
def test_a_storage_path_with_control_characters_is_refused(path):
    with pytest.raises(ConfigError, match="^storage_path:"):
        resolve_run(path, "run")


# -- nothing is a pickle of user code ------------------------------------------------------------


def test_no_module_of_the_project_pickles_anything():
    """The ledger, lease, run metadata and manifests are JSON; no code path may even import pickle."""
    src = Path(__file__).resolve().parents[2] / "src" / "spotfallback"
    offenders = [
        f"{p.relative_to(src)}:{n}"
        for p in src.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.match(r"\s*(import|from)\s+(pickle|cPickle|cloudpickle|dill|joblib|shelve|marshal)\b", line)
    ]
    assert offenders == []


# -- the Python API ------------------------------------------------------------------------------

TIER_FIELDS = sorted(Tier.model_fields)
VALID_TIER = {"name": "spot", "market": "spot", "num_workers": 2}


@st.composite
def tier_arguments(draw: st.DrawFn) -> tuple[dict, str]:
    """Keyword arguments for ``Tier(...)`` with one hostile change, and the field it touched."""
    kwargs = dict(VALID_TIER)
    where = draw(st.sampled_from(["field", "extra", "drop"]))
    if where == "drop":
        key = draw(st.sampled_from(sorted(VALID_TIER)))
        del kwargs[key]
    else:
        key = draw(st.sampled_from(TIER_FIELDS) if where == "field" else KEYS.filter(lambda k: k not in TIER_FIELDS))
        kwargs[key] = draw(hostile_values)
    return kwargs, key


def _assert_sane_tier(tier: Tier) -> None:
    assert type(tier.num_workers) is int and tier.num_workers >= 1
    assert tier.min_workers is None or 1 <= tier.min_workers <= tier.num_workers
    assert math.isfinite(tier.price_per_worker_hour) and tier.price_per_worker_hour >= 0
    assert tier.capacity_timeout_s is None or (math.isfinite(tier.capacity_timeout_s) and tier.capacity_timeout_s > 0)
    assert tier.max_preemptions >= -1 and tier.max_failures >= -1
    assert all(type(k) is str and type(v) is str for k, v in tier.label_selector.items())
    assert run_name_error(tier.name) is None


@SETTINGS
@given(case=tier_arguments())
def test_a_hostile_tier_argument_is_refused_by_name_or_gives_a_sane_tier(case):
    kwargs, key = case
    try:
        tier = Tier(**kwargs)
    except ValidationError as e:  # pydantic's error: a ValueError, one line per field
        assert key in str(e), str(e)
        return
    _assert_sane_tier(tier)


@SETTINGS
@given(tiers=hostile_values | st.lists(tier_arguments().map(lambda case: case[0]), min_size=1, max_size=3))
def test_make_ladder_of_anything_is_a_config_error_naming_tiers_or_a_sane_ladder(tiers):
    try:
        ladder = make_ladder(tiers)
    except ConfigError as e:
        assert str(e).startswith("tiers"), str(e)
        return
    for tier in ladder.tiers:
        _assert_sane_tier(tier)
    assert len({t.name for t in ladder.tiers}) == len(ladder.tiers)


def _train_fn(config: dict) -> None:  # pragma: no cover - never run
    pass


trainer_arguments = st.fixed_dictionaries(
    {},
    optional={
        "tiers": hostile_values,
        "backend": hostile_scalars,
        "lease_ttl_s": hostile_scalars,
        "train_loop_config": hostile_values,
        "train_loop_per_worker": hostile_scalars,
        "name": st.text(max_size=20) | st.sampled_from(["..", "../x", "/abs", "a/b", "ok\x07"]),
        "storage_path": st.text(max_size=20).filter(lambda p: "://" not in p) | st.sampled_from(["/tmp/\x00", "\n"]),
    },
)


@SETTINGS
@given(arguments=trainer_arguments)
def test_fallback_trainer_arguments_are_refused_by_name_or_give_a_run_inside_its_storage(arguments, tmp_path_factory):
    """Building a trainer starts nothing; whatever it is given, it names the bad argument or is sound."""
    import ray.train

    from spotfallback import FallbackTrainer

    root = str(tmp_path_factory.mktemp("trainer"))
    storage = arguments.pop("storage_path", root)
    try:
        run_config = ray.train.RunConfig(storage_path=storage or root, name=arguments.pop("name", "run-1"))
    except Exception:  # Ray's own check of its RunConfig: not ours to test
        assume(False)
    kwargs = {"tiers": [Tier.on_demand(1)], **arguments}
    fn = kwargs.pop("train_loop_per_worker", _train_fn)
    try:
        trainer = FallbackTrainer(fn, run_config=run_config, **kwargs)
    except ConfigError as e:
        assert re.match(r"(tiers|name|storage_path|backend|lease_ttl_s|train_loop_config|train_loop_per_worker)\b", str(e)), str(e)
        return
    assert callable(trainer.train_loop_per_worker)
    assert trainer.train_loop_config is None or isinstance(trainer.train_loop_config, dict)
    assert trainer.lease_ttl_s is None or (math.isfinite(trainer.lease_ttl_s) and trainer.lease_ttl_s > 0)
    assert trainer.backend in ("torch", "tensorflow", "none")
    location = trainer.location
    assert posixpath.dirname(location.run_dir) == posixpath.normpath(location.storage_path)
    assert all(ord(c) >= 32 for c in location.run_dir)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_lease_ttl_in_the_environment_is_named(value, monkeypatch, tmp_path):
    from spotfallback.store.lease import DriverLease

    monkeypatch.setenv("SPOTFALLBACK_LEASE_TTL_S", value)
    with pytest.raises(ConfigError, match=r"^SPOTFALLBACK_LEASE_TTL_S: "):
        DriverLease(resolve_run(str(tmp_path), "run"))


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_a_bad_progress_interval_in_the_environment_is_named_where_a_run_starts(value, monkeypatch, tmp_path):
    import ray.train

    from spotfallback import FallbackTrainer

    monkeypatch.setenv("SPOTFALLBACK_PROGRESS_INTERVAL_S", value)
    run_config = ray.train.RunConfig(storage_path=str(tmp_path), name="run-1")
    with pytest.raises(ConfigError, match=r"^SPOTFALLBACK_PROGRESS_INTERVAL_S: "):
        FallbackTrainer(_train_fn, tiers=[Tier.on_demand(1)], run_config=run_config)


@pytest.mark.parametrize("command", ["status", "report"])
def test_readers_take_a_hostile_lease_heartbeat_and_environment_without_a_traceback(command, monkeypatch, tmp_path, caplog):
    """A lease whose times are text, a heartbeat with NaN and the drivers' own settings gone bad
    are the run's or the driver's problems: someone reading the run still gets its figures."""
    import logging

    from tests.support.ledgers import run_events, write_ledger

    # An earlier command's handler may write to a stream closed since: the warning goes to caplog.
    monkeypatch.setattr(logging.getLogger("spotfallback"), "handlers", [])
    monkeypatch.setattr(logging.getLogger("spotfallback"), "propagate", True)

    location, _ = write_ledger(tmp_path / "runs", run_events()[:12], name="odd")
    Path(location.path("lease.json")).write_text(json.dumps(
        {"token": "t", "host": "elsewhere", "pid": 1, "renewed_at": "yesterday", "expires_at": "tomorrow"}))
    Path(location.path("progress.json")).write_text('{"v": 1, "t": 1700004000.0, "tier": 0, "metrics": {"step": NaN, "loss": 0.5}}')
    monkeypatch.setenv("SPOTFALLBACK_LEASE_TTL_S", "abc")
    monkeypatch.setenv("SPOTFALLBACK_PROGRESS_INTERVAL_S", "abc")
    monkeypatch.chdir(tmp_path)
    result = _invoke([command, location.uri(), "--json"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    data = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert data["status"] == "stalled"  # the unreadable lease is no live driver
    assert "ignoring unreadable driver lease" in caplog.text


@pytest.mark.parametrize("times", [(10**400, 1.0), (1.0, float("inf")), (True, 1.0), ("1", 1.0)])
def test_a_lease_whose_times_are_no_finite_number_is_unreadable_not_a_crash(times):
    """A lease written by hand or by another tool: an int past the float range must not raise."""
    from spotfallback.store.lease import parse_lease

    raw = json.dumps({"token": "t", "host": "h", "pid": 1, "renewed_at": times[0], "expires_at": times[1]})
    assert parse_lease(raw.encode(), "lease.json") is None


# -- more commands: status, report, plan, manifest, notice-agent, checkpoints verify --------------

# Strings a person (or a script gone wrong) could pass where a path or a run is expected. No
# scheme that reaches a network (s3://bucket/x would wait for real AWS), bare schemes kept.
hostile_paths = st.one_of(
    st.text(max_size=40).filter(lambda p: "://" not in p),
    st.sampled_from(["s3://", "gs://", "s3:///x", "file://", "../../etc", "/", ".", "~", "-", "--", "a\x00b", "\x1b[31m"]),
)
NUMBERS = ["nan", "inf", "-inf", "-1", "0", "-0", "1e309", "", "abc", "1e-320", "0x10", " 5", "1_000", "2", "0.5"]


def _lines(output: str) -> list[str]:
    """Lines as a log or a terminal has them: split at newlines only (a '\r' or U+0085 inside a
    hostile argument echoed back does not start a new message)."""
    return [line for line in output.split("\n") if line.strip()]


def _assert_clear_refusal(result) -> None:
    """Exit 2, no traceback, and one line saying what is wrong (a usage error typer finds too)."""
    _assert_clean_refusal(result)
    assert len(_lines(result.output)) == 1, result.output


@CLI_SETTINGS
@given(command=st.sampled_from(["status", "report"]), run=hostile_paths)
def test_status_and_report_of_a_hostile_run_argument_exit_2_with_one_line(command, run, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))  # a relative path cannot find anyone's run
    result = _invoke([command, run])
    _assert_clear_refusal(result)


PLAN_BASE = {"--hours": "1", "--rate": "0.1", "--runs": "5", "--workers": "2"}
PLAN_OPTIONS = ["--hours", "--workers", "--rate", "--failure-rate", "--outage-prob", "--outage-h", "--checkpoint-cost-s",
                "--restart-overhead-s", "--provisioning-delay-s", "--notice-s", "--spot-price", "--on-demand-price",
                "--deadline-h", "--deadline-prob", "--runs", "--seed-m", "--discount"]


@settings(CLI_SETTINGS, max_examples=40)
@given(option=st.sampled_from(PLAN_OPTIONS), value=st.sampled_from(NUMBERS) | st.text(max_size=8))
def test_plan_with_a_hostile_number_exits_2_naming_the_option_or_plans(option, value):
    # --discount is --seed-table's alone, and the seed's table takes no job
    base = {"--seed-table": None} if option == "--discount" else PLAN_BASE
    result = _invoke(["plan", *[x for k, v in {**base, option: value}.items() for x in (k, v) if x is not None]])
    if result.exit_code == 0:
        try:
            number = float(value)
        except ValueError:
            number = 1.0
        assert math.isfinite(number), f"{option} {value!r} accepted"
        return
    _assert_clear_refusal(result)
    assert option in result.output, result.output


@CLI_SETTINGS
@given(trace=hostile_paths, kind=st.sampled_from(["--trace", "--node-trace"]))
def test_plan_with_a_hostile_trace_path_exits_2_naming_it(trace, kind, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    result = _invoke(["plan", "--hours", "1", "--runs", "5", kind, trace])
    _assert_clear_refusal(result)
    assert kind in result.output, result.output


@CLI_SETTINGS
@given(
    case=mutated_jobs(),
    command=st.sampled_from([["kuberay", "--cloud", "gke"], ["kuberay", "--cloud", "eks-karpenter", "--kind", "raycluster"],
                             ["cluster-launcher", "--cloud", "aws", "--region", "us-east-1"]]),
)
def test_manifest_of_a_hostile_job_file_exits_2_naming_the_field_or_writes_a_valid_file(case, command, tmp_path_factory):
    job, field = case
    if field != "storage_path":  # pods on several nodes share no local path: start from a bucket
        job["storage_path"] = "s3://bucket/runs"
    tmp = tmp_path_factory.mktemp("manifest")
    path = tmp / "job.yaml"
    try:
        path.write_text(_dump(job))
    except (UnicodeEncodeError, yaml.YAMLError):
        assume(False)
    out = tmp / "out.yaml"
    result = _invoke(["manifest", *command, "--job", str(path), "--out", str(out)])
    if result.exit_code == 0:  # a job the loader accepted: the file written must validate
        assert _invoke(["manifest", "validate", str(out)]).exit_code == 0
        return
    _assert_clean_refusal(result)
    assert field.split("[")[0] in result.output, result.output


@CLI_SETTINGS
@given(text=st.text(max_size=200) | hostile_values.map(_dump))
def test_manifest_validate_of_any_text_says_what_is_wrong_without_a_traceback(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("validate") / "cluster.yaml"
    path.write_text(text, encoding="utf-8")
    result = _invoke(["manifest", "validate", str(path)])
    assert result.exit_code in (1, 2), result.output  # 1: not a valid file (with its errors), 2: unreadable
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and str(path) in result.output.replace("\n", "")


# The agent's options, each with the flags that make it matter, and the smallest valid value.
# --node-id is given so that the agent never looks for a Ray node (with --once and a metadata
# service that refuses, a valid command polls once and exits 1 saying it got no answer; k8s asks
# no service and exits 0); --ray-wait and --address are left out: a valid wait is a wait, and an
# address is looked up by Ray itself.
AGENT_BASE = ["notice-agent", "--once", "--ray-wait", "0", "--address", "127.0.0.1:1", "--node-id", "ab" * 28,
              "--metadata-url", "http://127.0.0.1:1"]
AGENT_NUMBERS = {  # option: (context flags, smallest valid value, whether the smallest is allowed)
    "--interval": (["--cloud", "aws"], 0.05, True),
    "--timeout": (["--cloud", "aws"], 0.05, True),
    "--k8s-grace": (["--cloud", "k8s"], 0.0, True),
    "--gcp-notice": (["--cloud", "gcp"], 0.0, False),
    "--rebalance-deadline": (["--cloud", "aws", "--act-on-rebalance"], 0.0, False),
}


def _agent_value_is_valid(option: str, value: str) -> bool:
    _, low, inclusive = AGENT_NUMBERS[option]
    try:
        number = float(value)
    except ValueError:
        return False
    return math.isfinite(number) and (number >= low if inclusive else number > low)


def _assert_agent_refuses_or_accepts_only_valid(args: list[str], valid: bool) -> None:
    result = _invoke(args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if valid:  # 0: the poll was answered; 1: the refusing metadata service, said in one line
        assert result.exit_code in (0, 1), result.output
        if result.exit_code == 1:
            said = [line for line in _lines(result.output) if "did not get an answer" in line]
            assert len(said) == 1 and said[0].startswith("error: "), result.output
        return
    assert result.exit_code == 2, f"accepted: {args[-2:]}\n{result.output}"
    assert len(_lines(result.output)) <= 2, result.output


@pytest.mark.parametrize(("option", "value"), [(o, v) for o in AGENT_NUMBERS for v in NUMBERS])
def test_notice_agent_with_a_hostile_number_exits_2_or_takes_only_a_valid_one(option, value):
    context, _, _ = AGENT_NUMBERS[option]
    _assert_agent_refuses_or_accepts_only_valid([*AGENT_BASE, *context, option, value], _agent_value_is_valid(option, value))


@CLI_SETTINGS
@given(cloud=st.text(max_size=10) | st.sampled_from(["AWS", "aws ", "gce", ""]), run=hostile_paths)
def test_notice_agent_with_a_hostile_cloud_or_run_exits_2_without_a_traceback(cloud, run, tmp_path_factory, monkeypatch):
    from spotfallback.store.location import resolve_run, split_run_uri

    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        resolve_run(*split_run_uri(run))
        run_ok = True
    except ConfigError:
        run_ok = False
    valid = cloud.strip().lower() in ("aws", "gcp", "azure", "k8s") and run_ok  # the agent takes " AWS" for aws
    _assert_agent_refuses_or_accepts_only_valid([*AGENT_BASE, "--cloud", cloud, "--run", run], valid)


@CLI_SETTINGS
@given(url=st.text(max_size=20).filter(lambda u: not u.startswith(("http://", "https://"))))
def test_notice_agent_with_a_metadata_url_that_is_no_url_exits_2(url):
    _assert_agent_refuses_or_accepts_only_valid([*AGENT_BASE, "--cloud", "aws", "--metadata-url", url], False)


@CLI_SETTINGS
@given(paths=st.lists(hostile_paths, min_size=1, max_size=3))
def test_checkpoints_verify_of_hostile_paths_exits_2_with_one_line_each(paths, tmp_path_factory, monkeypatch, capsys):
    from spotfallback.store.checkpoints import main

    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    assume(all(not p.startswith("-") for p in paths))  # an option, not a path: argparse's usage error
    capsys.readouterr()
    assert main(["verify", *paths]) == 2
    out = capsys.readouterr().out
    assert out.count("ERROR") == len(paths) and "Traceback" not in out
    assert len(_lines(out)) == len(paths), out
