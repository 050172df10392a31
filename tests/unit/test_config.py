"""Tier, ladder and job configuration: defaults, and clear errors that name the field."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spotfallback.config import (
    JobConfig,
    Tier,
    label_key_error,
    label_selector_value_error,
    ladder_from_yaml,
    make_ladder,
)
from spotfallback.errors import ConfigError


def test_spot_and_on_demand_defaults():
    spot = Tier.spot(num_workers=4, max_preemptions=5, capacity_timeout_s=600, price_per_worker_hour=0.9)
    assert spot.label_selector == {"ray.io/market-type": "spot"}
    assert spot.max_preemptions == 5 and spot.price_per_hour() == pytest.approx(3.6)
    od = Tier.on_demand(num_workers=2, max_failures=3, price_per_worker_hour=3.06)
    assert od.name == "on-demand" and od.label_selector == {"ray.io/market-type": "on-demand"}
    assert od.worker_resources() == {"CPU": 1.0}
    gpu = Tier(name="res", market="reserved", num_workers=1, use_gpu=True)
    assert gpu.worker_resources() == {"GPU": 1.0}  # as Ray Train asks: a GPU, no CPU
    assert gpu.model_copy(update={"resources_per_worker": {"CPU": 8}}).worker_resources() == {"CPU": 8.0, "GPU": 1.0}


@pytest.mark.parametrize(("market", "meant"), [("Spot", "spot"), ("SPOT", "spot"), ("preemptible", "spot"),
                                               ("On-Demand", "on-demand"), ("on_demand", "on-demand"), ("ondemand", "on-demand")])
def test_another_spelling_of_a_known_market_is_refused_naming_it(market: str, meant: str) -> None:
    """It would be a market of its own: no spot budgets or notices, no node selection in the deployment files."""
    with pytest.raises(ValueError, match=rf"market '{market}': did you mean '{meant}'\?"):
        Tier(name="t", market=market, num_workers=1)
    assert Tier(name="t", market="gpu-reserved", num_workers=1).market == "gpu-reserved"  # any other label value stays a market


@pytest.mark.parametrize("key", ["cpu", "gpu", "Memory"])
def test_a_miscased_ray_resource_is_refused_naming_rays_spelling(key: str) -> None:
    with pytest.raises(ValueError, match=rf"resource '{key}': Ray's name is '{key.upper() if key != 'Memory' else 'memory'}'"):
        Tier(name="t", market="spot", num_workers=1, resources_per_worker={key: 1})


def test_custom_selector_keeps_region_and_node_group():
    t = Tier.spot(2, name="spot-west", label_selector={
        "ray.io/market-type": "spot", "ray.io/availability-region": "us-west-2", "ray.io/node-group": "!gpu-big"})
    assert t.label_selector["ray.io/availability-region"] == "us-west-2"


def test_selector_keys_are_added_to_the_market_label():
    zone_only = Tier.spot(2, label_selector={"ray.io/availability-zone": "us-west-2a"})
    assert zone_only.label_selector == {"ray.io/market-type": "spot", "ray.io/availability-zone": "us-west-2a"}
    from_yaml = ladder_from_yaml("tiers: [{name: od, market: on-demand, num_workers: 1, label_selector: {ray.io/node-group: big}}]")
    assert from_yaml.tiers[0].label_selector == {"ray.io/market-type": "on-demand", "ray.io/node-group": "big"}
    # A selector that names the market label says what it means.
    widened = Tier.spot(2, label_selector={"ray.io/market-type": "in(spot,reserved)"})
    assert widened.label_selector == {"ray.io/market-type": "in(spot,reserved)"}


@pytest.mark.parametrize(
    ("tiers", "field"),
    [
        ([], "tiers"),
        ([{"name": "a", "market": "spot", "num_workers": 0}], "tiers[0].num_workers"),
        ([{"name": "a", "market": "spot", "num_workers": 1, "capacity_timeout_s": -5}], "tiers[0].capacity_timeout_s"),
        ([{"name": "a", "market": "spot", "num_workers": 1, "max_preemptions": -2}], "tiers[0].max_preemptions"),
        ([{"name": "a", "market": "", "num_workers": 1}], "tiers[0].market"),
        ([{"name": "a", "num_workers": 1}], "tiers[0].market"),
        ([{"name": "a", "market": "spot", "num_workers": 1, "label_selector": {"bad key!": "x"}}], "tiers[0].label_selector"),
        ([{"name": "a", "market": "spot", "num_workers": 1, "label_selector": {"k": "in(a,,b)"}}], "tiers[0].label_selector"),
        ([{"name": "a", "market": "spot", "num_workers": 1, "workers": 3}], "tiers[0].workers"),
        ([{"name": "a", "market": "spot", "num_workers": 1}, {"name": "a", "market": "on-demand", "num_workers": 1}], "tiers"),
        ([{"name": "Bad Name", "market": "spot", "num_workers": 1}], "tiers[0].name"),
    ],
)
def test_invalid_ladders_name_the_field(tiers, field):
    with pytest.raises(ConfigError) as info:
        make_ladder(tiers)
    assert str(info.value).startswith(field), str(info.value)


def test_yaml_unknown_field_is_named(tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text("tiers:\n  - name: spot\n    market: spot\n    num_workers: 2\n    max_preemption: 3\n")
    with pytest.raises(ConfigError) as info:
        ladder_from_yaml(path)
    assert "tiers[0].max_preemption: unknown field; did you mean 'max_preemptions'?" in str(info.value)
    path.write_text("tiers: [\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        ladder_from_yaml(path)
    path.write_text("tiers:\n  - {name: spot, market: spot, num_workers: 2}\n  - {name: on-demand, market: on-demand, num_workers: 1}\n")
    assert [t.name for t in ladder_from_yaml(path).tiers] == ["spot", "on-demand"]


def test_job_file_errors_name_the_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: ../escape\nstorage_path: /tmp/x\nentrypoint: spotfallback.examples.ddp_digits:train_fn\n"
        "tiers:\n  - {name: spot, market: spot, num_workers: 2}\n"
    )
    with pytest.raises(ConfigError, match=r"name: .*must not leave storage_path|name: .*'\.\.'"):
        JobConfig.from_yaml(path)
    path.write_text("name: ok\nstorage_path: /tmp/x\nentrypoint: nocolon\ntiers: []\n")
    with pytest.raises(ConfigError) as info:
        JobConfig.from_yaml(path)
    assert "entrypoint" in str(info.value) and "tiers" in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        JobConfig.from_yaml(tmp_path / "missing.yaml")


def test_a_job_file_that_is_not_utf8_is_named_with_the_byte(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"# caf\xe9\n" + JOB_HEAD.encode())
    with pytest.raises(ConfigError, match=r"job.yaml: the job file is not UTF-8 text \(byte 5\); save it as UTF-8"):
        JobConfig.from_yaml(path)


@pytest.mark.parametrize("storage_path", ["", "  "])
def test_an_empty_storage_path_is_refused_rather_than_sent_to_ray_results(tmp_path, storage_path):
    """Ray Train reads an empty storage path as ~/ray_results: the run would not be where the job file says."""
    path = tmp_path / "job.yaml"
    path.write_text(JOB_HEAD.replace("storage_path: /tmp/x", f"storage_path: {storage_path!r}")
                    + "tiers:\n  - {name: spot, market: spot, num_workers: 2}\n")
    with pytest.raises(ConfigError, match="storage_path: empty; give the durable storage root"):
        JobConfig.from_yaml(path)


# Our label syntax check must agree with Ray's own validator (ray/_private/label_utils.py).
label_text = st.text(alphabet=st.sampled_from(list("abcXYZ019-_./!(), in")), min_size=0, max_size=20)


@settings(max_examples=400, deadline=None)
@given(label_text, label_text)
def test_label_selector_check_agrees_with_ray(key, value):
    from ray._private.label_utils import validate_label_selector

    ours = label_key_error(key) or label_selector_value_error(value)
    theirs = validate_label_selector({key: value})
    assert (ours is None) == (theirs is None), (key, value, ours, theirs)


JOB_HEAD = "name: ok\nstorage_path: /tmp/x\nentrypoint: spotfallback.examples.ddp_digits:train_fn\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # A tier's typo is matched against tier fields, not the job's.
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2, max_preemption: 1}\n",
         "tiers[0].max_preemption: unknown field; did you mean 'max_preemptions'?"),
        # A tier field one level too high says where it belongs (it used to suggest itself).
        ("num_workers: 2\ntiers:\n  - {name: spot, market: spot, num_workers: 2}\n",
         "num_workers: unknown field here; 'num_workers' belongs under each entry of 'tiers'"),
        # A job-level typo is matched against job fields.
        ("train_loop_cfg: {}\ntiers:\n  - {name: spot, market: spot, num_workers: 2}\n",
         "train_loop_cfg: unknown field; did you mean 'train_loop_config'?"),
        # The plan's fields (spotfallback plan --write-yaml) are known too.
        ("plan: {spend: 3.0, wall_hours: 2}\ntiers:\n  - {name: spot, market: spot, num_workers: 2}\n",
         "plan.wall_hours: unknown field; did you mean 'wall_h'?"),
        # A tier's deadline guard is matched against the guard's own fields.
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2, deadline_guard: {deadline_h: 9, work_hh: 5}}\n",
         "tiers[0].deadline_guard.work_hh: unknown field; did you mean 'work_h'?"),
        # A guard whose tier could not finish by the deadline even uninterrupted would leave it at once.
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2, deadline_guard: {deadline_h: 9, work_h: 10}}\n",
         "tiers[0].deadline_guard: work_h (10 h) is more than deadline_h (9 h): this tier could not finish the job by "
         "the deadline even uninterrupted, so the guard would leave it at once; give work_h as this tier's "
         "uninterrupted wall hours and deadline_h as the hours the run has, or drop the guard"),
        # The ladder's own rule is reported under 'tiers', not 'tiers.tiers'.
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2}\n  - {name: spot, market: on-demand, num_workers: 2}\n",
         "tiers: tier names must be unique; repeated: spot"),
        # A number that is not one (YAML's .nan) is not called "not greater than 0".
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2, max_preemption_rate: {count: 2, window_s: .nan}}\n",
         "tiers[0].max_preemption_rate.window_s: Input should be a finite number"),
        ("tiers:\n  - {name: spot, market: spot, num_workers: 2, cluster: {address: 'http://h:8265', unreachable_timeout_s: .nan}}\n",
         "tiers[0].cluster.unreachable_timeout_s: Input should be a finite number"),
    ],
)
def test_job_file_mistakes_name_the_field_and_typos_get_suggestions_from_the_fields_valid_there(tmp_path, body, expected):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_HEAD + body)
    with pytest.raises(ConfigError) as info:
        JobConfig.from_yaml(path)
    assert str(info.value) == f"{path}: {expected}"  # one problem: one line, naming the file and the field


def test_a_bad_tier_lists_only_its_own_problems(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_HEAD + "workers: 2\ntiers:\n  - {name: spot, market: spot, num_workerz: 2}\n")
    with pytest.raises(ConfigError) as info:
        JobConfig.from_yaml(path)
    lines = str(info.value).splitlines()
    # No "tiers: Tuple should have at least 1 item" echo of the tier's own error, and no
    # "tiers[0].num_workers: required field is missing" beside the suggestion that says it.
    assert lines == [
        f"{path}:",
        "tiers[0].num_workerz: unknown field; did you mean 'num_workers'?",
        "workers: unknown field; remove it or check its spelling",
    ]


@pytest.mark.parametrize("field", ["num_workers", "max_preemptions", "max_failures", "min_workers"])
def test_a_yaml_yes_or_no_is_not_read_as_a_count(tmp_path, field):
    """YAML reads `yes` as true, and pydantic would take true as 1: a budget of one preemption nobody wrote."""
    tier = {"name": "spot", "market": "spot", "num_workers": 2, field: True}
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.{field}: expected a whole number, got true"):
        make_ladder([tier])


@pytest.mark.parametrize(("where", "data"), [
    ("tiers[0].price_per_worker_hour", {"price_per_worker_hour": True}),
    ("tiers[0].capacity_timeout_s", {"capacity_timeout_s": True}),
    ("tiers[0].deadline_guard.deadline_h", {"deadline_guard": {"deadline_h": True, "work_h": 10}}),
    ("tiers[0].cluster.unreachable_timeout_s", {"cluster": {"address": "http://h:8265", "unreachable_timeout_s": True}}),
])
def test_a_yaml_yes_or_no_is_not_read_as_a_number(where, data):
    """`price_per_worker_hour: yes` would be a price of 1 nobody wrote."""
    tier = {"name": "spot", "market": "spot", "num_workers": 2, **data}
    pattern = re.escape(where) + r": expected a number, got true \(YAML reads yes/no/on/off as true/false\)"
    with pytest.raises(ConfigError, match=pattern):
        make_ladder([tier, {"name": "od", "market": "on-demand", "num_workers": 2,
                            **({"cluster": data["cluster"]} if "cluster" in data else {})}])


def test_a_planned_jobs_yes_is_not_an_hour_of_work():
    from spotfallback.config import PlannedJob

    with pytest.raises(ValidationError, match="work_h\n.*expected a number, got true"):
        PlannedJob(work_h=True, checkpoint_cost_h=0.1, restart_overhead_h=0.1)


@pytest.mark.parametrize("storage_path", ["ftp://host/runs", "http://host/runs", "memory://runs"])
def test_a_storage_uri_ray_train_cannot_write_is_refused_where_the_job_is_read(storage_path):
    """Not only at `run`: a deployment file made for it would fail on the cluster, after the wait for nodes."""
    with pytest.raises(ValidationError, match=rf"storage_path\n.*'{storage_path.split(':')[0]}://' is not storage"):
        JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),))


@pytest.mark.parametrize("storage_path", ["s3://", "gs:///", "s3://?region=us-east-1", "s3:///runs", "gs:///runs/a"])
def test_a_storage_uri_without_a_bucket_is_refused_where_the_job_is_read(storage_path):
    """Not only by status: a manifest made from it would fail on the cluster."""
    with pytest.raises(ValidationError, match=r"names no bucket; give (s3|gs)://BUCKET/PREFIX"):
        JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),))



@pytest.mark.parametrize(("storage_path", "problem"), [
    ("gs://Bad_Bucket/runs", r"'Bad_Bucket' is not a bucket name \(3-63 lowercase"),
    ("gs://ab/runs", r"'ab' is not a bucket name"),
    ("gcs://bkt/runs?endpoint=localhost:4443", r"unknown URI option 'endpoint'; gs:// URIs take endpoint_override, "),
])
def test_a_gcs_uri_no_run_can_open_is_refused_where_the_job_is_read(storage_path, problem):
    """As `status` and the driver refuse it: a deployment file made from it would fail on the cluster."""
    with pytest.raises(ValidationError, match=problem):
        JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),))
    assert JobConfig(name="ok", storage_path="gs://my_bkt.v2/runs?endpoint_override=localhost:4443&scheme=http",
                     entrypoint="m:f", tiers=(Tier.spot(1),))


@pytest.mark.parametrize(("storage_path", "fixed"), [("s3:/bucket/runs", "s3://bucket/runs"), ("gs:/bkt/runs", "gs://bkt/runs"),
                                                     ("S3:/bucket/runs", "s3://bucket/runs"),
                                                     ("file:/mnt/runs", "file:///mnt/runs")])
def test_a_uri_missing_a_slash_is_refused_rather_than_taken_for_a_local_directory(storage_path, fixed):
    """'s3:/bucket/runs' has no '://', so it read as a relative path: a directory named 's3:' on the driver."""
    with pytest.raises(ValidationError, match=rf"is missing a '/': write '{fixed}'"):
        JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),))
    assert JobConfig(name="ok", storage_path="runs:/a", entrypoint="m:f", tiers=(Tier.spot(1),))  # not a scheme of storage

def test_hdfs_without_a_host_is_the_default_file_system():
    """``hdfs:///path`` is HDFS's default namenode, not a missing bucket."""
    assert JobConfig(name="ok", storage_path="hdfs:///runs", entrypoint="m:f", tiers=(Tier.spot(1),)).storage_path == "hdfs:///runs"


def test_a_storage_scheme_in_capitals_is_refused_with_its_lower_case():
    """pyarrow, and so Ray, knows 's3://' but not 'S3://'."""
    with pytest.raises(ValidationError, match=r"write the scheme in lower case: 'gs://', not 'GS://'"):
        JobConfig(name="ok", storage_path="GS://b/runs", entrypoint="m:f", tiers=(Tier.spot(1),))


@pytest.mark.parametrize("storage_path", ["s3://b/runs", "gs://bkt/runs", "abfss://c@acct.dfs.core.windows.net/runs",
                                          "file:///tmp/runs", "./runs", "/mnt/nfs/runs"])
def test_the_storage_ray_train_writes_is_taken(storage_path):
    assert JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),)).storage_path


@pytest.mark.parametrize(("storage_path", "problem"), [
    ("s3://b/runs\n", "holds a control character"),
    ("/mnt/runs\t", "holds a control character"),
    ("s3://my bucket/runs", "bucket 'my bucket' of 's3://my bucket/runs' has a space"),
])
def test_a_storage_path_that_cannot_reach_a_shell_or_a_bucket_is_refused(storage_path, problem):
    """The path goes into the deployment files' shell commands; no bucket name has a space."""
    with pytest.raises(ValidationError, match=problem):
        JobConfig(name="ok", storage_path=storage_path, entrypoint="m:f", tiers=(Tier.spot(1),))
    assert JobConfig(name="ok", storage_path="/mnt/my runs", entrypoint="m:f", tiers=(Tier.spot(1),))  # a local path may


@pytest.mark.parametrize(("config", "where"), [({"lr": float("nan")}, "lr is nan"),
                                                ({"opt": {"betas": [0.9, float("inf")]}}, r"opt.betas\[1\] is inf")])
def test_a_train_loop_config_number_json_cannot_carry_is_refused(config, where):
    """The job reaches the cluster as JSON, where NaN would arrive as null."""
    with pytest.raises(ValidationError, match=rf"train_loop_config\n.*{where}, which JSON cannot carry"):
        JobConfig(name="ok", storage_path="s3://b/r", entrypoint="m:f", train_loop_config=config, tiers=(Tier.spot(1),))


def test_more_workers_than_kubernetes_counts_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.num_workers: Input should be less than or equal to 2147483647"):
        make_ladder([{"name": "spot", "market": "spot", "num_workers": 2**31}])


@pytest.mark.parametrize(("selector", "problem"), [({"bad key!": "x"}, "label key name 'bad key!'"),
                                                   ({"pool": "a b"}, "label value 'a b'")])
def test_a_node_selector_kubernetes_would_reject_is_refused(selector, problem):
    tier = {"name": "spot", "market": "spot", "num_workers": 1, "placement": {"node_selector": selector}}
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.placement\.node_selector: Kubernetes would reject .*{problem}"):
        make_ladder([tier])


@pytest.mark.parametrize(("line", "expected"), [
    ("name: 2024-01-01", "name: expected text, got 2024-01-01 (YAML reads it as a date): put it in quotes"),
    ("name: 12", "name: expected text, got 12 (YAML reads it as a number): put it in quotes"),
])
def test_an_unquoted_yaml_scalar_meant_as_text_is_told_to_be_quoted(tmp_path, line, expected):
    assert _job_file_error(tmp_path, f"{line}\ntiers: [{{name: od, market: on-demand, num_workers: 1}}]").endswith(expected)


def _job_file_error(tmp_path, lines: str) -> str:
    """The ConfigError of a job file of ``lines`` after a storage path and an entrypoint."""
    path = tmp_path / "job.yaml"
    path.write_text(f"storage_path: /tmp/r\nentrypoint: m:f\n{lines}\n")
    with pytest.raises(ConfigError) as info:
        JobConfig.from_yaml(path)
    return str(info.value)


def test_a_market_yaml_reads_as_a_boolean_is_one_problem_told_to_be_quoted():
    with pytest.raises(ConfigError) as info:
        make_ladder([{"name": "spot", "market": True, "num_workers": 1}])
    assert str(info.value) == ("tiers[0].market: expected text, got true (YAML reads yes/no/on/off/true/false as a boolean): "
                               "put it in quotes")


@pytest.mark.parametrize("entrypoint", ["my mod:fn", "a:b:c", "pkg.:fn", "m:f x"])
def test_an_entrypoint_python_cannot_import_is_refused(entrypoint):
    with pytest.raises(ValidationError, match="must look like 'package.module:function' or 'file.py:function'"):
        JobConfig(name="ok", storage_path="/tmp/r", entrypoint=entrypoint, tiers=(Tier.spot(1),))
    for ok in ("pkg.mod:fn", "train.py:fn", "dir with space/train.py:fn"):
        assert JobConfig(name="ok", storage_path="/tmp/r", entrypoint=ok, tiers=(Tier.spot(1),)).entrypoint == ok


@pytest.mark.parametrize(("resources", "problem"), [
    ({"": 1}, "a resource with an empty name"),
    ({"CPU": 0.00001}, "resource 'CPU': 1e-05 is not an amount Ray can hold"),
    ({"memory": 1e300}, "resource 'memory': 1e\\+300 is not an amount Ray can hold"),
])
def test_a_resource_ray_cannot_hold_is_refused_by_name(resources, problem):
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.resources_per_worker: {problem}"):
        make_ladder([{"name": "spot", "market": "spot", "num_workers": 1, "resources_per_worker": resources}])
    assert make_ladder([{"name": "spot", "market": "spot", "num_workers": 1, "resources_per_worker": {"CPU": 0.5, "X": 0}}])


def test_the_resource_step_is_rays():
    import ray._raylet

    from spotfallback.config import RESOURCE_STEP

    assert RESOURCE_STEP * ray._raylet.RESOURCE_UNIT_SCALING == 1


@pytest.mark.parametrize(("tiers", "expected"), [
    ("[]", "tiers: empty; give at least 1 item"),
    ("spot", "tiers: expected a list (in YAML, '- item' lines or [a, b]), got text 'spot'"),
    ("", "tiers: expected a list (in YAML, '- item' lines or [a, b]), got nothing (an empty value)"),
    ("[{name: od, market: on-demand, num_workers: 1, label_selector: [a]}]",
     "tiers[0].label_selector: expected a mapping (in YAML, 'key: value' lines or {key: value}), got a list"),
])
def test_a_field_of_the_wrong_shape_says_the_shape_in_yaml_terms(tmp_path, tiers, expected):
    assert _job_file_error(tmp_path, f"name: x\ntiers: {tiers}").endswith(expected)


@pytest.mark.parametrize(("value", "expected"), [(None, 7.0), ("2.5", 2.5), ("0", 0.0), ("soon", 7.0), ("-1", 7.0),
                                                 ("inf", 7.0), ("nan", 7.0)])
def test_a_duration_knob_in_the_environment_falls_back_to_its_default_unless_usable(value, expected, monkeypatch):
    from spotfallback.config import env_seconds

    if value is None:
        monkeypatch.delenv("SPOTFALLBACK_TEST_KNOB_S", raising=False)
    else:
        monkeypatch.setenv("SPOTFALLBACK_TEST_KNOB_S", value)
    assert env_seconds("SPOTFALLBACK_TEST_KNOB_S", 7.0) == expected


def test_one_tier_given_for_a_ladder_is_named_as_such():
    with pytest.raises(ConfigError, match=r"^tiers: expected a list of tiers, got one Tier \('spot'\); give it as a list"):
        make_ladder(Tier.spot(2))


@pytest.mark.parametrize(("argument", "message"), [
    ("missing.yaml", r"^missing\.yaml: no such ladder file"),
    ("ladders/none", r"^ladders/none: no such ladder file"),
    ("", r"^<string>: empty; expected a mapping with a 'tiers' key"),
    ("# nothing yet\n", r"^<string>: empty; expected a mapping with a 'tiers' key"),
])
def test_a_ladder_argument_that_is_no_file_and_no_ladder_is_named(argument, message):
    with pytest.raises(ConfigError, match=message):
        ladder_from_yaml(argument)


def test_a_ladder_path_that_is_a_folder_or_missing_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"a folder, not a ladder file"):
        ladder_from_yaml(tmp_path)
    with pytest.raises(ConfigError, match=r"gone\.yaml: no such ladder file"):
        ladder_from_yaml(tmp_path / "gone.yaml")


def test_an_empty_job_file_says_it_is_empty(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("# to be written\n")
    with pytest.raises(ConfigError, match=r"job\.yaml: empty; expected a mapping with a 'tiers' key"):
        JobConfig.from_yaml(path)


@pytest.mark.parametrize("address", ["", " ", "auto "])
def test_a_blank_ray_address_is_refused_rather_than_starting_a_cluster_of_its_own(tmp_path, address):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_HEAD + f"ray_address: {address!r}\ntiers:\n  - {{name: od, market: on-demand, num_workers: 1}}\n")
    with pytest.raises(ConfigError, match=r"ray_address: '.*': give 'local' \(an embedded local cluster\)"):
        JobConfig.from_yaml(path)


def test_gpus_without_use_gpu_are_refused_as_ray_train_would_at_the_start():
    from ray.train import ScalingConfig

    resources = {"CPU": 8, "GPU": 8}
    with pytest.raises(ValueError, match="`use_gpu` is False but `GPU` was found"):  # Ray Train's, once the cluster is up
        ScalingConfig(num_workers=1, use_gpu=False, resources_per_worker=resources)
    with pytest.raises(ConfigError, match=r"^tiers\[0\]: resources_per_worker asks for 8 GPU but use_gpu is false; set use_gpu: true"):
        make_ladder([{"name": "gpu", "market": "spot", "num_workers": 1, "resources_per_worker": resources}])


@pytest.mark.parametrize(("market", "meant"), [("spto", "spot"), ("spots", "spot"), ("on-demnd", "on-demand")])
def test_a_misspelt_market_is_refused_with_the_one_meant(market, meant):
    """It would run as a market of its own: no spot budgets, no notices, never interrupted in a backtest."""
    with pytest.raises(ValidationError, match=rf"market '{market}': did you mean '{meant}'\?"):
        Tier(name="a", market=market, num_workers=1)
    assert Tier(name="a", market="reserved", num_workers=1).market == "reserved"


@pytest.mark.parametrize(("value", "ok"), [
    ("on-demand", False), ("", False), ("!spot", False), ("in(on-demand,reserved)", False), ("!in(spot,reserved)", False),
    ("spot", True), ("in(spot,on-demand)", True), ("!on-demand", True), ("!in(on-demand)", True),
])
def test_a_label_selector_on_the_market_label_must_select_the_tiers_market(value, ok):
    """Else the tier runs on other nodes under its market: spot budgets and notices on on-demand nodes."""
    make = lambda: Tier(name="a", market="spot", num_workers=1, label_selector={"ray.io/market-type": value})  # noqa: E731
    if ok:
        assert make().label_selector["ray.io/market-type"] == value
    else:
        with pytest.raises(ValidationError, match=r"label_selector.ray.io/market-type: .* does not select the tier's market 'spot'"):
            make()


def test_a_train_loop_config_nested_past_the_writers_limits_is_refused_by_name():
    """The job reaches the cluster as YAML and JSON, whose writers recurse: 900 levels failed there, after the plan."""
    from spotfallback.config import MAX_CONFIG_DEPTH

    deep: list = []
    for _ in range(MAX_CONFIG_DEPTH + 1):
        deep = [deep or 1]
    with pytest.raises(ValidationError, match=rf"train_loop_config\n.*'layers' nests deeper than {MAX_CONFIG_DEPTH} levels"):
        JobConfig(name="ok", storage_path="/tmp/r", entrypoint="m:f", tiers=(Tier.spot(1),), train_loop_config={"layers": deep})
    shallow = {"a": {"b": [1, {"c": 2}]}}
    assert JobConfig(name="ok", storage_path="/tmp/r", entrypoint="m:f", tiers=(Tier.spot(1),), train_loop_config=shallow).train_loop_config == shallow
