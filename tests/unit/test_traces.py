"""Trace parsing: the shared traces load, malformed files fail with file and line/field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from spotfallback.errors import TraceError
from spotfallback.sim.traces import NodeEvent, load_node_trace, load_spot_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SPOT_TRACES = SHARED / "data" / "spot-traces"
NODE_TRACE = SHARED / "data" / "node-traces" / "aws-p3-trace.csv"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not checked out beside the repo")


@needs_shared
def test_every_shared_spot_trace_loads():
    files = sorted(SPOT_TRACES.rglob("*.json"))
    assert len(files) == 7
    for f in files:
        raw = json.loads(f.read_text())
        tr = load_spot_trace(f)
        assert tr.name == f.stem
        assert tr.gap_seconds == raw["metadata"]["gap_seconds"]
        assert tr.available.tolist() == raw["data"]
        assert tr.available.dtype == np.int64


@needs_shared
def test_shared_spot_trace_contents():
    tr = load_spot_trace(SPOT_TRACES / "availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json")
    assert (tr.gap_seconds, len(tr.available), tr.capacity) == (600.0, 3895, 1)
    assert int(tr.available.sum()) == 3087
    four = load_spot_trace(SPOT_TRACES / "preemption/4-node/aws-08-03-2023/us-east-1f_v100_1.json")
    assert (four.gap_seconds, len(four.available), four.capacity) == (300.0, 3664, 4)
    assert four.duration_s == 300.0 * 3664
    # The file with an extra 'prices' list loads too.
    priced = load_spot_trace(SPOT_TRACES / "preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json")
    assert len(priced.available) == 19961


@needs_shared
def test_shared_node_trace():
    tr = load_node_trace(NODE_TRACE)
    assert tr.name == "aws-p3-trace"
    assert len(tr.events) == 344
    assert sum(e.action == "add" for e in tr.events) == 177
    assert tr.events[0] == NodeEvent(0.0, "add", "node1")
    assert tr.events[-1] == NodeEvent(40920.0, "remove", "node172")
    assert tr.duration_s == 40920.0
    assert all(a.t_s <= b.t_s for a, b in zip(tr.events, tr.events[1:], strict=False))


def test_fixtures_match_shared_copies():
    tr = load_spot_trace(FIXTURES / "us-west-2a_v100_1.json")
    assert len(tr.available) == 3895
    assert len(load_node_trace(FIXTURES / "aws-p3-trace.csv").events) == 344
    if SHARED.is_dir():
        assert (FIXTURES / "aws-p3-trace.csv").read_bytes() == NODE_TRACE.read_bytes()


def test_available_is_read_only():
    tr = load_spot_trace(FIXTURES / "us-east-1f_v100_4node.json")
    with pytest.raises(ValueError):
        tr.available[0] = 7


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"metadata": {"gap_seconds": 60},\n "data": [1, 0,]}', "line 2, column"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"data": [1]}', "'metadata'"),
        ('{"metadata": {}, "data": [1]}', "'metadata.gap_seconds'"),
        ('{"metadata": {"gap_seconds": -5}, "data": [1]}', "'metadata.gap_seconds' must be a positive number"),
        ('{"metadata": {"gap_seconds": 1e308}, "data": [1, 0]}', "'metadata.gap_seconds' must be a positive number of "
                                                                 "seconds, at most 604800 (a week), got 1e+308"),
        ('{"metadata": {"gap_seconds": "60"}, "data": [1]}', "'metadata.gap_seconds'"),
        ('{"metadata": {"gap_seconds": 60}}', "'data' is missing"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "'data' is empty"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, 0, "x"]}', "'data[2]' must be a non-negative integer"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, -1]}', "'data[1]'"),
        ('{"metadata": {"gap_seconds": 60}, "data": [true]}', "'data[0]'"),
        ("", "the file is empty; expected a JSON object"),
        (" \n", "the file is empty"),
    ],
)
def test_malformed_spot_trace_names_file_and_field(tmp_path, text, needle):
    p = _write(tmp_path, "bad.json", text)
    with pytest.raises(TraceError) as err:
        load_spot_trace(p)
    msg = str(err.value)
    assert str(p) in msg and needle in msg
    assert "\n" not in msg


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_spot_trace(tmp_path / "absent.json")
    with pytest.raises(TraceError, match="is a directory"):
        load_node_trace(tmp_path)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_node_trace(tmp_path / "bin.csv")


@pytest.mark.parametrize(("head", "fix"), [(b"\x1f\x8b\x08\x00\xff", "gzip-compressed (gunzip)"),
                                         (b"PK\x03\x04\x14\x00\xc3", "a zip archive (unzip)")])
def test_a_packed_trace_is_named_for_what_it_is(tmp_path, head, fix):
    """Traces are downloaded gzipped or zipped: the fix is to unpack, not to re-encode."""
    (tmp_path / "t.json").write_bytes(head + b"\x00\x00")
    with pytest.raises(TraceError, match=rf"not UTF-8 text \(byte \d+\); it is {re.escape(fix)}: unpack it first"):
        load_spot_trace(tmp_path / "t.json")


@pytest.mark.parametrize("text", ["time_ms,action,node\n0,add,a\n", "0,add,a\n60000,remove,a\n"])
def test_a_node_trace_read_as_a_spot_trace_says_so(tmp_path, text):
    p = _write(tmp_path, "nodes.txt", text)
    with pytest.raises(TraceError, match="it looks like a node add/remove CSV trace: name it .csv or give it with "
                                         "--node-trace"):
        load_spot_trace(p)


def test_integral_floats_are_accepted(tmp_path):
    p = _write(tmp_path, "f.json", '{"metadata": {"gap_seconds": 30.5}, "data": [1.0, 0, 2]}')
    assert load_spot_trace(p).available.tolist() == [1, 0, 2]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0,add,node1\n60000,add\n", "line 2: expected 3 fields"),
        ("0,add,node1\nsoon,add,node2\n", "line 2: time_ms 'soon' is not a number"),
        ("timestamp,event,node_id\n0,add,node1\n", "line 1: time_ms 'timestamp' is not a number; a header line must read 'time_ms,action,node'"),
        ("0,add,node1\n-5,add,node2\n", "line 2: time_ms must be a non-negative number"),
        ("60000,add,node1\n0,add,node2\n", "line 2: time_ms 0 goes back in time"),
        ("0,add,node1\n0,evict,node1\n", "line 2: action must be 'add' or 'remove'"),
        ("0,add,node1\n5,remove,node2\n", "line 2: node 'node2' removed but not present"),
        ("0,add,node1\n\n5,add,node1\n", "line 3: node 'node1' added while already present; remove it first"),
        ("0,add,\n", "line 1: node name is empty"),
        ("\n\n", "no events"),
        ("0,add,node1\n0,remove,node1\n", "the trace spans no time"),
        ("0,add,node1\n", "the trace spans no time"),
        ("0,add,a\x0c1,add\n", "line 1: expected 3 fields"),  # a form feed ends no line in an editor
        ("0,add,a\r\n1,add\r\n", "line 2: expected 3 fields"),
        ("60000,add,node1\n0,add,node2\n", "; sort the lines by time"),
        # Out of order with a remove first: the order is the cause, and it is what is said.
        ("90000,remove,node1\n0,add,node1\n", "line 1: node 'node1' removed but not present; line 2 goes back in time: "
                                                "sort the lines by time"),
        ("5,remove,node1\n", "removed but not present; add it on an earlier line (nodes up when the trace begins "
                               "are added at its first time)"),
        # A first line at 0 before a log's clock times (the trace would span 54 years of ticks).
        ("0,add,a\n1700000000000,add,b\n1700000600000,remove,a\n", "line 2: time_ms 1700000000000 is a clock's time "
                                                                  "(milliseconds since 1970), but the first line's, 0, "
                                                                  "counts from the trace's start"),
        ("0,add,a\n90000000000,remove,a\n", "line 2: time_ms 90000000000 is 1,042 days after the first line; a node "
                                            "trace spans at most 730 days"),
        ("1700000000000,add,a\n1800000000000,remove,a\n", "is 1,157 days after the first line"),
    ],
)
def test_malformed_node_trace_names_file_and_line(tmp_path, text, needle):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as err:
        load_node_trace(p)
    assert str(p) in str(err.value) and needle in str(err.value)


def test_node_trace_header_and_comments(tmp_path):
    p = _write(tmp_path, "h.csv", "time_ms,action,node\n# warm-up\n0,add,a\n1500,remove,a\n")
    tr = load_node_trace(p)
    assert tr.events == (NodeEvent(0.0, "add", "a"), NodeEvent(1.5, "remove", "a"))


def test_a_spreadsheets_quoted_node_trace_loads_as_the_plain_one(tmp_path):
    """Spreadsheet exports quote every field: the header is still a header and the times still numbers."""
    quoted = _write(tmp_path, "q.csv", '"time_ms","action","node"\r\n"0","add","a"\r\n"1500","remove","a"\r\n')
    plain = _write(tmp_path, "p.csv", "time_ms,action,node\n0,add,a\n1500,remove,a\n")
    assert load_node_trace(quoted).events == load_node_trace(plain).events == (
        NodeEvent(0.0, "add", "a"), NodeEvent(1.5, "remove", "a"))
    named = _write(tmp_path, "n.csv", '0,add,"p3.8xlarge, us-east-1a"\n60000,remove,"p3.8xlarge, us-east-1a"\n')
    assert load_node_trace(named).events[1] == NodeEvent(60.0, "remove", "p3.8xlarge, us-east-1a")
    # A field past the csv module's limit (128 KiB) is read as before, not the module's error.
    node = "n" * 200_000
    huge = _write(tmp_path, "huge.csv", f"0,add,{node}\n60000,remove,{node}\n")
    assert load_node_trace(huge).events == (NodeEvent(0.0, "add", node), NodeEvent(60.0, "remove", node))


def test_a_node_trace_in_unix_epoch_milliseconds_counts_from_its_first_line(tmp_path):
    """A cluster's own log writes clock times: read as offsets they would open with 55 years without nodes."""
    p = _write(tmp_path, "epoch.csv", "1733472000000,add,a\n1733472000000,add,b\n1733475600000,remove,a\n")
    assert load_node_trace(p).events == (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"),
                                         NodeEvent(3600.0, "remove", "a"))
    # An offset of a day, or a year, is the trace's own: it is kept.
    p = _write(tmp_path, "late.csv", "86400000,add,a\n90000000,remove,a\n")
    assert load_node_trace(p).events[0].t_s == 86400.0


def test_a_byte_order_mark_is_read_past(tmp_path):
    """Windows editors and spreadsheet exports start UTF-8 files with a BOM: both kinds load as without it."""
    spot = tmp_path / "bom.json"
    spot.write_bytes(b"\xef\xbb\xbf" + b'{"metadata": {"gap_seconds": 600}, "data": [1, 0, 1]}')
    assert load_spot_trace(spot).available.tolist() == [1, 0, 1]
    node = tmp_path / "bom.csv"
    node.write_bytes(b"\xef\xbb\xbf" + b"time_ms,action,node\r\n0,add,a\r\n1500,remove,a\r\n")
    assert load_node_trace(node).events == (NodeEvent(0.0, "add", "a"), NodeEvent(1.5, "remove", "a"))


def test_a_json_trace_read_as_a_node_trace_is_quoted_short(tmp_path):
    """A one-line SkyPilot trace given as a node trace: the error quotes the start of the line, not megabytes
    of it, and says what the file looks like."""
    p = _write(tmp_path, "zone.csv", json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0] * 50_000}))
    with pytest.raises(TraceError) as err:
        load_node_trace(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: line 1: expected 3 fields") and "characters)" in msg
    assert "looks like a SkyPilot JSON trace: name it .json and give it with --trace" in msg and len(msg) < 400


def test_a_json_file_given_as_a_node_trace_is_sent_to_trace_not_renamed(tmp_path):
    p = _write(tmp_path, "zone.json", json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 1, 1]}))
    with pytest.raises(TraceError, match=r"looks like a SkyPilot JSON trace: give it with --trace$"):
        load_node_trace(p)


def test_a_long_bad_value_is_quoted_short(tmp_path):
    p = _write(tmp_path, "nested.json", json.dumps({"metadata": {"gap_seconds": 600}, "data": [[1] * 10_000]}))
    with pytest.raises(TraceError, match=r"'data\[0\]' must be a non-negative integer, got \[1, 1.*characters\)$") as err:
        load_spot_trace(p)
    assert len(str(err.value)) < 300


@pytest.mark.parametrize(("gap", "available", "message"), [
    (0.0, [1, 0, 1], "gap_seconds must be a positive number"),
    (-60.0, [1, 0, 1], "gap_seconds must be a positive number"),
    (float("nan"), [1], "gap_seconds must be a positive number"),
    (1e308, [1], "gap_seconds must be a positive number of seconds, at most 604800"),
    (0.5, [1, 0, 1], "gap_seconds is 0.5 s, shorter than the shortest tick accepted, 1 s"),
    (60.0, [], "available must be a non-empty list"),
    (60.0, [1, -1], "non-negative whole numbers"),
    (60.0, [1.5], "non-negative whole numbers"),
    (60.0, [[1, 0]], "available must be a non-empty list"),
])
def test_a_spot_trace_built_in_python_gets_the_loaders_rules(gap, available, message):
    """A zero gap never advances the simulated clock (a hang); a negative one finished work early."""
    from spotfallback.sim.traces import SpotTrace

    with pytest.raises(TraceError, match=rf"^SpotTrace 't': .*{message}"):
        SpotTrace("t", gap, np.array(available))


def test_a_spot_trace_built_from_a_list_holds_a_read_only_copy():
    from spotfallback.sim.traces import SpotTrace

    mine = np.array([1, 0, 1])
    trace = SpotTrace("t", 60.0, mine)
    mine[0] = 0
    assert trace.available.tolist() == [1, 0, 1] and not trace.available.flags.writeable
    assert SpotTrace("t", 60.0, [2, 1]).capacity == 2  # type: ignore[arg-type]


@pytest.mark.parametrize(("events", "message"), [
    ((NodeEvent(0, "add", "a"), NodeEvent(10, "remove", "b")), r"events\[1\]: node 'b' removed but not present"),
    ((NodeEvent(0, "add", "a"), NodeEvent(10, "add", "a")), r"events\[1\]: node 'a' added while already present"),
    ((NodeEvent(float("nan"), "add", "a"), NodeEvent(3600, "remove", "a")), r"events\[0\]: t_s must be"),
    ((NodeEvent(20, "add", "a"), NodeEvent(10, "remove", "a")), r"events\[1\]: t_s must be .* not before"),
    ((NodeEvent(0, "join", "a"), NodeEvent(10, "remove", "a")), r"events\[0\]: expected action 'add' or 'remove'"),
    ((NodeEvent(0, "add", "a"),), "span no time"),
    ((NodeEvent(1.7e9, "add", "a"), NodeEvent(1.7e9 + 60, "remove", "a")), "events\\[0\\] is at 1.7e\\+09 s, a clock's time"),
])
def test_a_node_trace_built_in_python_gets_the_loaders_rules(events, message):
    from spotfallback.sim.traces import NodeTrace

    with pytest.raises(TraceError, match=rf"^NodeTrace 'n': .*{message}"):
        NodeTrace("n", events)


@pytest.mark.parametrize("gap", [1e-9, 0.1, 0.999])
def test_a_tick_shorter_than_a_second_is_refused_naming_the_file_and_the_field(tmp_path, gap):
    """Such a tick made the simulator lay out billions of ticks: a memory error, or minutes of planning."""
    p = _write(tmp_path, "fine.json", json.dumps({"metadata": {"gap_seconds": gap}, "data": [1, 0] * 500}))
    with pytest.raises(TraceError) as err:
        load_spot_trace(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: field 'metadata.gap_seconds' is {gap:g} s, shorter than the shortest tick accepted, 1 s")
    assert "resample the trace to ticks of 1 s or more" in msg


def test_a_one_second_trace_loads_and_plans(tmp_path):
    from spotfallback.sim.planner import PlanRequest, plan

    data = [1] * 3000 + [0, 1] * 300 + [1] * 30000
    p = _write(tmp_path, "one_s.json", json.dumps({"metadata": {"gap_seconds": 1}, "data": data}))
    trace = load_spot_trace(p)
    assert trace.gap_seconds == 1.0
    req = PlanRequest(work_h=2, num_workers=1, checkpoint_cost_h=60 / 3600, restart_overhead_h=60 / 3600,
                      spot_price=0.3, on_demand_price=1.0, deadline_h=3, runs=20)
    assert plan(req, trace).recommended.mean_spend > 0
