"""`python -m bench [--quick] [--only NAME ...]`: every benchmark figure, one results page.

Runs the measurements on one local cluster (head without CPUs, three one-CPU spot nodes, two
one-CPU on-demand nodes), alternating the compared variants. By default Ray's autoscaler runs
the nodes (``--cluster autoscaled``: each node type kept at its count, as a node pool is, so a
preempted node is replaced by the autoscaler and capacity changes are caps); ``--cluster
prestarted`` starts them ahead of time instead, as the figures before the autoscaled cluster
were measured. It writes
``docs/benchmarks.md`` (the table and every raw run) and ``docs/benchmarks.json`` (the raw
rows the page is computed from), plus ``docs/recovery.md``/``.json`` from the recovery runs.
A run with ``--only`` or ``--quick`` leaves the docs alone unless ``--out`` names a folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from bench.harness import REPO, Measurement, Results, figure_rows, machine, render

# Registry order is run order: the CPU-bound ones first (simulator, planner, ledger reads), before the Ray jobs load the machine.
MODULES = {
    "simulator": "bench.bench_throughput",
    "backtest": "bench.bench_backtest",
    "ledger": "bench.bench_ledger",
    "overhead": "bench.bench_overhead",
    "recovery": "bench.bench_recovery",
    "timeout": "bench.bench_timeout",
    "notices": "bench.bench_eviction",
    "move": "bench.bench_move",
    "move-autoscaled": "bench.bench_move_autoscaled",
    "checkpoint": "bench.bench_checkpoint",
    "predict": "bench.bench_predict",
    "clusters": "bench.bench_clusters",  # two clusters of its own, in a child process
}
DOCS = REPO / "docs"
HEALTH_CHECK_S = "0.25"
RAY_ENV = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "RAY_TRAIN_V2_ENABLED")
CLUSTERS = ("autoscaled", "prestarted")


def registry() -> dict[str, Measurement]:
    return {name: import_module(mod).MEASUREMENT for name, mod in MODULES.items()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter jobs (a few minutes)")
    p.add_argument("--only", nargs="+", choices=sorted(MODULES), metavar="NAME",
                   help=f"run only these ({', '.join(MODULES)}); what they need is run too")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for benchmarks.md/.json (default: docs/ for a full run; a temporary folder otherwise)")
    p.add_argument("--render", action="store_true", help="re-render benchmarks.md from benchmarks.json in --out and exit")
    p.add_argument("--no-profile", action="store_true", help="do not profile measurements that miss a target")
    p.add_argument("--cluster", choices=CLUSTERS, default=CLUSTERS[0],
                   help="autoscaled: nodes run by Ray's autoscaler, kept at their counts (default); "
                        "prestarted: nodes started ahead of time, replaced only by the harness")
    return p


def selected(only: Sequence[str] | None, reg: dict[str, Measurement]) -> list[str]:
    """The asked-for measurements plus what they require, in registry (run) order."""
    want = set(only or reg)
    todo = list(want)
    while todo:
        for req in reg[todo.pop()].requires:
            if req not in want:
                want.add(req)
                todo.append(req)
    return [n for n in reg if n in want]


def out_dir(args: argparse.Namespace) -> tuple[Path, bool]:
    """(where to write, whether that is docs/) from the arguments."""
    if args.out is not None:
        return args.out, args.out.resolve() == DOCS.resolve()
    if args.only or args.quick:
        return Path(tempfile.mkdtemp(prefix="sf-bench-results-")), False
    return DOCS, True


GROUPS = {"spot": 3, "on-demand": 2}  # node group (= market) -> nodes


@contextlib.contextmanager
def local_cluster(needed: bool, kind: str = CLUSTERS[0]) -> Iterator[tuple[Any, Any]]:
    if not needed:
        yield None, None
        return
    from tests.support.helpers_e2e import autoscaled_cluster

    from spotfallback.local import Injector, LocalSpotCluster, NodeGroup

    groups = [NodeGroup(name, count=n) for name, n in GROUPS.items()]
    if kind == "autoscaled":
        with autoscaled_cluster(groups, e2e_env=False) as cluster, Injector(cluster) as injector:  # main() set the env
            yield cluster, injector
    else:
        with LocalSpotCluster(groups, connect=True) as cluster, Injector(cluster) as injector:
            yield cluster, injector


def restore(injector: Any, timeout_s: float = 120.0) -> None:
    """Put back what a measurement took away, so the next one starts on the full cluster.

    On the autoscaled cluster the caps come back and the autoscaler relaunches the nodes;
    this waits until they are up.
    """
    if injector is None:
        return
    from spotfallback.local import LocalSpotCluster

    for market in GROUPS:
        injector.give_back(market, restore=False)
        injector.replenish(market)  # on the pre-started cluster the nodes are back when this returns
    if not isinstance(injector.cluster, LocalSpotCluster):
        deadline = time.monotonic() + timeout_s
        for market, n in GROUPS.items():
            injector.cluster.wait_for_nodes(market, n, max(0.0, deadline - time.monotonic()))


def write(results: Results, reg: dict[str, Measurement], folder: Path, docs: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmarks.json").write_text(json.dumps(results.to_json(), indent=1, default=str) + "\n")
    page = folder / "benchmarks.md"
    page.write_text(render(reg, results))
    if docs and results.rows.get("recovery"):
        from bench import bench_recovery

        bench_recovery.write_recovery_page(results, folder)
    return page


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    reg = registry()
    folder, docs = out_dir(args)
    if args.render:
        data = json.loads((folder / "benchmarks.json").read_text())
        print(write(Results.from_json(data), reg, folder, docs))
        return 0
    names = selected(args.only, reg)
    extra = sorted(set(names) - set(args.only or names))
    command = "python -m bench" + (" " + shlex.join(sys.argv[1:] if argv is None else list(argv)) if (argv or sys.argv[1:]) else "")
    from tests.support.helpers_e2e import apply_env

    apply_env()
    # Ray Train V2 holds each report until the controller's next poll: the local cluster's own
    # 0.25 s (the tests' 0.5 s would make every per-step report of the example cost 0.5 s).
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = HEALTH_CHECK_S
    results = Results(command=command, machine=machine(), quick=args.quick)
    results.machine["ray_env"] = {k: os.environ[k] for k in RAY_ENV if k in os.environ}
    results.machine["cluster"] = args.cluster
    storage = Path(tempfile.mkdtemp(prefix="sf-bench-"))
    from bench.runs import Context

    ctx = Context(quick=args.quick, storage=storage, log=lambda s: print(f"[bench {time.strftime('%H:%M:%S')}] {s}", file=sys.stderr, flush=True))
    if extra:
        ctx.log(f"also running {', '.join(extra)}: what was asked for calibrates from it")
    t_start = time.monotonic()
    try:
        needs_cluster = any(reg[n].cluster for n in names)
        with local_cluster(needs_cluster, args.cluster) as (cluster, injector):
            ctx.cluster, ctx.injector = cluster, injector
            for name in names:
                m = reg[name]
                ctx.log(f"{name}: {m.title}")
                t0 = time.monotonic()
                try:
                    rows = m.run(ctx)
                except Exception as e:  # one failed measurement must not lose the others
                    results.errors[name] = f"{type(e).__name__}: {e}"
                    ctx.log(f"{name} failed:\n{traceback.format_exc()}")
                    rows = []
                finally:
                    restore(injector)
                results.seconds[name] = round(time.monotonic() - t0, 1)
                if rows:
                    results.rows[name] = ctx.rows[name] = rows
                    missed = [f for f in m.figures(rows) if f.met is False]
                    if missed and not args.no_profile and hasattr(sys.modules[m.run.__module__], "profile"):
                        ctx.log(f"{name}: target missed, profiling one repetition")
                        try:
                            results.profiles[name] = sys.modules[m.run.__module__].profile(ctx)
                        except Exception as e:
                            results.profiles[name] = f"profiling failed: {type(e).__name__}: {e}"
                        finally:
                            restore(injector)
                results.total_s = time.monotonic() - t_start
                results.machine["load_after"] = round(os.getloadavg()[0], 2)
                write(results, reg, folder, docs)  # after each measurement: a crash later loses nothing
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    results.total_s = time.monotonic() - t_start
    page = write(results, reg, folder, docs)
    for _, f in figure_rows(reg, results):
        med, spread = f.stat.fmt(f.digits)
        print(f"{f.item}. {f.name}: {med} {f.unit} [{spread}] (target {f.target.text}; n={f.stat.n})")
    print(f"wrote {page} and {page.with_suffix('.json')} in {results.total_s / 60:.1f} min")
    return 1 if results.errors else 0
