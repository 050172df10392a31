#!/usr/bin/env bash
# What a user gets from `pip install spotfallback[torch]`: build the sdist and the wheel, install
# the wheel into a clean venv, and run `spotfallback plan` + `backtest` on a made-up trace,
# `spotfallback demo` and `spotfallback init && spotfallback run job.yaml` in an empty directory
# outside any checkout. The test suite runs the package from the source tree (an editable
# install); only this catches a wheel that lacks a file, or code that reaches for the checkout
# (its examples/, its data/).
#
# Usage: scripts/wheel_smoke.sh   (PYTHON: the interpreter for the venv, default python3.11;
# BUILD_PYTHON: one that has `build`, default .venv/bin/python). Takes about 4 minutes on 2 cores.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
BUILD_PYTHON="${BUILD_PYTHON:-$ROOT/.venv/bin/python}"
# The CPU build, installed before the wheel: a bare `torch` requirement pulls a multi-GB CUDA build.
TORCH="torch==2.13.0"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/spotfallback-wheel-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# Nothing of the caller's may point the smoke at the checkout or at another Ray cluster.
unset PYTHONPATH RAY_ADDRESS SPOTFALLBACK_RAY_ADDRESS VIRTUAL_ENV

step_start=$SECONDS
step() {
    echo "wheel-smoke: $1 ($((SECONDS - step_start)) s)"
    step_start=$SECONDS
}
fail() {
    echo "wheel-smoke: FAILED: $*" >&2
    exit 1
}

"$BUILD_PYTHON" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "python -m build"; }
WHEEL="$(ls "$WORK"/dist/spotfallback-*.whl)"
ls "$WORK"/dist/spotfallback-*.tar.gz >/dev/null || fail "no sdist in $WORK/dist"
step "built $(cd "$WORK/dist" && ls | tr '\n' ' ')"

"$PYTHON" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/python" -m pip install --disable-pip-version-check)
{ "${PIP[@]}" "$TORCH" && "${PIP[@]}" "$WHEEL[torch]"; } >"$WORK/pip.log" 2>&1 || { tail -40 "$WORK/pip.log"; fail "pip install"; }
step "installed the wheel with the [torch] extra into a clean venv"

mkdir "$WORK/empty"
cd "$WORK/empty"
export PATH="$WORK/venv/bin:$PATH"
where="$(python -c 'import spotfallback; print(spotfallback.__file__)')"
[[ "$where" == "$WORK/venv/"* ]] || fail "spotfallback imported from $where, not from the venv"
release="$(python -c 'import importlib.metadata as m; print(m.version("spotfallback"))')"
[[ "$(spotfallback --version)" == "spotfallback $release" ]] || fail "spotfallback --version: '$(spotfallback --version)', not the installed $release"
python -c 'import importlib.metadata as m, sys; sys.exit(not {"LICENSE", "NOTICE"} <= {p.name for p in m.files("spotfallback")})' \
    || fail "the wheel carries no LICENSE and NOTICE"

rc=0
# plan and backtest on a recorded trace (here a made-up week: spot for 5 h, then gone for 1 h):
# the job file plan writes carries the job, so backtest needs only the trace.
python -c 'import json; json.dump({"metadata": {"gap_seconds": 600}, "data": ([1] * 30 + [0] * 6) * 28}, open("trace.json", "w"))'
spotfallback plan --hours 10 --deadline-h 15 --workers 1 --trace trace.json --write-yaml planned.yaml \
    --entrypoint spotfallback.examples.ddp_digits:train_fn >"$WORK/plan.log" 2>&1 || rc=$?
((rc == 0)) || { tail -40 "$WORK/plan.log"; fail "spotfallback plan exited $rc"; }
spotfallback backtest planned.yaml --trace trace.json --json >"$WORK/backtest.json" 2>&1 || rc=$?
((rc == 0)) || { tail -40 "$WORK/backtest.json"; fail "spotfallback backtest exited $rc"; }
python -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["windows"] == 7 and r["replayed"]["work_h"] == 10 and r["on_time_share"] == 1, r' \
    "$WORK/backtest.json" || fail "spotfallback backtest planned.yaml: not the planned job's 7 windows, all on time"
step "spotfallback plan --write-yaml && spotfallback backtest: $(python -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["windows"], "windows, spend / optimum", round(r["vs_optimum"]["mean"], 3))' "$WORK/backtest.json")"

timeout 600 spotfallback demo >"$WORK/demo.log" 2>&1 || rc=$?
((rc == 0)) || { tail -40 "$WORK/demo.log"; fail "spotfallback demo exited $rc"; }
[[ -s spotfallback-demo-timeline.png ]] || fail "spotfallback demo wrote no timeline picture"
step "spotfallback demo: $(grep -m1 -o 'final step.*' "$WORK/demo.log" || true)"

spotfallback init >"$WORK/init.log" 2>&1 || rc=$?
((rc == 0)) || { cat "$WORK/init.log"; fail "spotfallback init exited $rc"; }
timeout 600 spotfallback run job.yaml >"$WORK/run.out" 2>"$WORK/run.err" || rc=$?
((rc == 0)) || { tail -40 "$WORK/run.err"; fail "spotfallback run job.yaml exited $rc"; }
tail -1 "$WORK/run.out" | python -c 'import json, sys; r = json.loads(sys.stdin.read()); assert r["status"] == "finished", r' \
    || fail "spotfallback run job.yaml: no finished result line: $(tail -1 "$WORK/run.out")"
step "spotfallback init && spotfallback run job.yaml: $(tail -1 "$WORK/run.out" | cut -c1-160)"
echo "wheel-smoke: passed"
