"""Data-parallel PyTorch (DDP) on the 8x8 handwritten digits (`_digits`), resumable bit for bit.

Run it with Ray Train V2 (``TorchTrainer`` or ``spotfallback.FallbackTrainer``) as
``spotfallback.examples.ddp_digits:train_fn``. A run that is killed and resumed from any checkpoint ends
with exactly the same weights as one that never stopped, because the checkpoint holds the
*whole* training state, each piece for a reason:

- ``model.pt``: the weights (the obvious part).
- ``optimizer.pt``: Adam's moment estimates and step counts; without them the first steps
  after a resume take differently sized updates.
- ``lr_scheduler.pt``: where the learning-rate schedule stands; a fresh scheduler would
  restart the warm/decay curve.
- ``rank_states.pt``: for every rank (gathered with ``all_gather_object``, written by rank
  0): its ``torch.Generator`` state, which drives both the shuffling and the dropout masks,
  plus the current epoch's permutation and the position in it. Without these a resumed
  rank sees different batches and different dropout masks.
- ``progress.json``: the last completed step (training continues at the next one), the
  world size and the metrics at that step.
- ``_spotfallback_manifest.json``: size and SHA-256 of each file above
  (``spotfallback.store.checkpoints.write_manifest``), so a resume can tell a whole checkpoint
  from a truncated one and fall back to the newest whole checkpoint.

Devices: a tier with ``use_gpu`` gets NCCL (Ray Train picks it for workers with GPUs) and each
worker its CUDA device (``ray.train.torch.get_device``); CPU tiers get gloo. Checkpoints are
loaded onto the CPU first, so a run moves between GPU and CPU tiers; dropout masks are drawn on
the CPU from the rank's generator either way. Bit-for-bit resumes are promised on one kind of
device: CUDA kernels sum in another order than the CPU.

Determinism on CPU also needs one intra-op thread (``torch.set_num_threads(1)``: reduction
order stays fixed) and ``torch.use_deterministic_algorithms(True)``. All randomness goes
through per-rank generators, never the global RNG.

Config keys: ``total_steps`` (40), ``checkpoint_every`` (5), ``batch_size`` (32), ``lr``
(0.01), ``seed`` (0), ``hidden`` (64), ``step_delay_s`` (0: extra sleep per step, so a test
can inject a fault mid-run), ``report_every`` (1: metrics every N steps; Ray Train V2 holds
each report until its controller polls, every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` = 2 s by
default, so per-step reports want a shorter interval), ``preemption_check_every_s`` /
``preemption_check_every`` (0 = off: ask Ray about a preemption notice about every so many
seconds / every N steps and, on one, checkpoint just in time and restart off the draining
node, through ``spotfallback.notices.PreemptionWatch``), ``preemption_train_on`` (True: train
through the notice and save when a replacement is up or the deadline is the save's lead away,
planned with the longest periodic checkpoint write so far; False: save at the notice),
``preemption_move`` (True: False holds until the node goes instead), ``preemption_answer_requests``
(False: True also answers the controller's checkpoint requests at the same checks, so a climb
back to a higher tier need not wait for a periodic checkpoint), ``preemption_hold_s``
(60: how long past the deadline a hold lasts), ``jit_checkpoint_delay_s`` (0: extra seconds a
just-in-time checkpoint write takes, to test notices shorter than a write), ``step_log`` (None: a file
where rank 0 appends ``{"step", "t", "pid", "node"}`` per completed step, to measure lost work),
``step_gate`` (None: a file that must exist before each step starts; a test removes it to hold
the workers at a precise moment, e.g. placed but not yet stepping, and puts it back to let them go),
``raise_at_step`` / ``raise_marker`` (an application error at that step, on every attempt,
or only on the first when a marker path is given), ``remaining_work`` (False: True adds
``remaining_work_s`` to every report, the steps left at this attempt's pace so far, checkpoint
writes included; the deadline guard, the cost cap and a climb's test judge the run by it, and
without it take the whole job as left), ``global_batch_size`` (None: see below).

When the world size changes (a tier with another worker count, or an elastic tier
``num_workers=[min, max]`` that shrinks on a lost node and grows back when capacity returns),
a fixed per-rank ``batch_size`` changes the global batch (per-rank batch x world size), hence
the gradient noise and the step the learning rate was tuned for. Give ``global_batch_size``
instead: each rank then takes ``global_batch_size / world_size`` samples a step, so the global
batch, and the learning rate that suits it, stay the same at every size. It must divide by
every world size the run can have (for ``[2, 4]``: 12, 24, 48, ...); at a world size it does
not divide, every rank raises a ValueError naming both before training (an application
error: retried up to the tier's ``max_failures``, then raised). The other common fix, keeping
the per-rank batch and scaling the learning rate with the world size, changes the optimisation
at every resize; this example does not do it. With ``global_batch_size`` the metrics also
carry ``world_size`` and the per-rank ``batch_size``. Unset, ``batch_size`` is per rank, as
before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from spotfallback.examples._digits import digits_split
from spotfallback.integrations.restore_dir import checkpoint_files
from spotfallback.integrations.scratch import scratch_dir

DEFAULTS: dict[str, Any] = {
    "total_steps": 40,
    "checkpoint_every": 5,
    "batch_size": 32,
    "lr": 0.01,
    "seed": 0,
    "hidden": 64,
    "step_delay_s": 0.0,
    "report_every": 1,
    "preemption_check_every": 0,
    "preemption_check_every_s": 0.0,
    "preemption_hold_s": 60.0,
    "preemption_move": True,
    "preemption_train_on": True,
    "preemption_answer_requests": False,
    "jit_checkpoint_delay_s": 0.0,
    "step_log": None,
    "step_gate": None,
    "raise_at_step": None,
    "raise_marker": None,
    "remaining_work": False,
    "global_batch_size": None,
}
DROPOUT = 0.1
CHECKPOINT_FILES = (
    "model.pt",
    "optimizer.pt",
    "lr_scheduler.pt",
    "rank_states.pt",
    "progress.json",
    "_spotfallback_manifest.json",
)


class MLP(nn.Module):
    """64 -> hidden -> hidden -> 10 with dropout drawn from a caller-given generator."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = _dropout(x, generator, self.training)
        x = F.relu(self.fc2(x))
        x = _dropout(x, generator, self.training)
        return self.out(x)


def _dropout(x: torch.Tensor, generator: torch.Generator | None, training: bool) -> torch.Tensor:
    # nn.Dropout draws from the global RNG; this draws from the rank's own generator so
    # its state, saved in the checkpoint, fully determines the masks.
    if not training or generator is None:
        return x
    keep = (torch.rand(x.shape, generator=generator) >= DROPOUT).to(x.device)
    return x * keep / (1.0 - DROPOUT)


def load_digits_split(
    test_fraction: float = 0.25, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X_train, y_train, X_test, y_test): the 1797 8x8 digits, scaled to [0, 1], split by seed."""
    x_train, y_train, x_test, y_test = digits_split(test_fraction, seed)
    return torch.from_numpy(x_train), torch.from_numpy(y_train), torch.from_numpy(x_test), torch.from_numpy(y_test)


def make_model(hidden: int = 64, seed: int = 0) -> MLP:
    """The model, initialised from ``seed`` without touching the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLP(hidden)


def state_hash(model_or_state: nn.Module | dict[str, torch.Tensor]) -> str:
    """SHA-256 of the state_dict's names and raw tensor bytes (DDP wrapper unwrapped)."""
    if isinstance(model_or_state, nn.Module):
        model_or_state = getattr(model_or_state, "module", model_or_state).state_dict()
    h = hashlib.sha256()
    for name in sorted(model_or_state):
        h.update(name.encode())
        h.update(model_or_state[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(x.to(next(model.parameters()).device)).argmax(dim=1).cpu()
    model.train()
    return float((pred == y).float().mean())


def _gather(obj: Any) -> list[Any]:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def _mean(value: float) -> float:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # NCCL reduces only tensors on the rank's GPU.
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / dist.get_world_size()
    return value


def rank_batch_size(cfg: dict[str, Any], world: int) -> int:
    """Samples per rank per step: ``global_batch_size / world`` when given, else ``batch_size``."""
    total = cfg.get("global_batch_size")
    if total is None:
        return int(cfg["batch_size"])
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"global_batch_size must be a positive integer, not {total!r}")
    if total % world:
        raise ValueError(
            f"global_batch_size={total} does not divide by the world size {world}; "
            "use a multiple of every worker count the run can have (for [2, 4]: 12, 24, 48, ...)"
        )
    return total // world


class _Rank:
    """One rank's data stream: its shard, its generator and where it stands in the epoch."""

    def __init__(self, n_train: int, rank: int, world: int, seed: int, batch_size: int) -> None:
        self.shard = torch.arange(rank, n_train, world)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed * 7919 + rank)
        self.epoch = 0
        self.position = 0  # batches already taken from ``perm``
        self.perm = torch.randperm(len(self.shard), generator=self.generator)

    def next_batch(self) -> torch.Tensor:
        if (self.position + 1) * self.batch_size > len(self.perm):
            self.epoch += 1
            self.position = 0
            self.perm = torch.randperm(len(self.shard), generator=self.generator)
        lo = self.position * self.batch_size
        self.position += 1
        return self.shard[self.perm[lo : lo + self.batch_size]]

    def state(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "epoch": self.epoch,
            "position": self.position,
            "perm": self.perm.clone(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.perm = state["perm"].clone()


def _save(
    directory: Path,
    model: MLP,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank_states: list[dict[str, Any]],
    step: int,
    metrics: dict[str, Any],
) -> None:
    torch.save(model.state_dict(), directory / "model.pt")
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict(), directory / "lr_scheduler.pt")
    torch.save(rank_states, directory / "rank_states.pt")
    progress = {"step": step, "world_size": len(rank_states), "metrics": metrics}
    (directory / "progress.json").write_text(json.dumps(progress, indent=1))


def _device() -> torch.device:
    """The worker's device: its CUDA device on a ``use_gpu`` tier, else the CPU."""
    import ray.train.torch

    device = ray.train.torch.get_device()
    if device.type == "cuda":
        # Deterministic cuBLAS needs a fixed workspace, set before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(device)
    return device


def _wait_for_gate(gate: str | None) -> None:
    """Hold the step until the ``step_gate`` file exists (every rank waits, so the step stays collective)."""
    while gate is not None and not os.path.exists(gate):
        time.sleep(0.02)


def train_fn(config: dict[str, Any]) -> None:
    """Ray Train V2 per-worker loop; see the module docstring for what it checkpoints and why."""
    import ray.train

    cfg = {**DEFAULTS, **(config or {})}
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    batch_size = rank_batch_size(cfg, world)  # before any work: a bad size fails at once

    device = _device()
    x_train, y_train, x_test, y_test = load_digits_split(seed=cfg["seed"])
    model = make_model(cfg["hidden"], cfg["seed"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    stream = _Rank(len(y_train), rank, world, cfg["seed"], batch_size)

    start = 1
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint_files(checkpoint, label=f"ddp-digits-restore-{rank}-") as ckpt:  # not as_directory: see there
            model.load_state_dict(torch.load(ckpt / "model.pt", map_location="cpu", weights_only=True))
            optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True))
            scheduler.load_state_dict(torch.load(ckpt / "lr_scheduler.pt", map_location="cpu", weights_only=True))
            rank_states = torch.load(ckpt / "rank_states.pt", map_location="cpu", weights_only=True)
            start = json.loads((ckpt / "progress.json").read_text())["step"] + 1
        if len(rank_states) == world:
            stream.load(rank_states[rank])
        else:
            # Another tier with another worker count: shards differ, so per-rank streams
            # cannot continue; reseed them from the step so the run stays reproducible.
            stream = _Rank(len(y_train), rank, world, cfg["seed"] + start, batch_size)

    ddp: nn.Module = model
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    model.train()

    watch = _preemption_watch(cfg)
    attempt_started = time.monotonic()  # after the restore: the pace is the steps' own, writes included
    node_id = ray.get_runtime_context().get_node_id() if cfg["step_log"] else ""
    for step in range(start, cfg["total_steps"] + 1):
        _wait_for_gate(cfg["step_gate"])
        _maybe_raise(cfg, step, rank)
        idx = stream.next_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x_train[idx].to(device), generator=stream.generator), y_train[idx].to(device))
        loss.backward()
        optimizer.step()
        scheduler.step()
        if cfg["step_delay_s"]:
            time.sleep(cfg["step_delay_s"])
        if cfg["step_log"] and rank == 0:
            with open(cfg["step_log"], "a") as f:
                entry = {"step": step, "t": time.time(), "pid": os.getpid(), "node": node_id}
                f.write(json.dumps(entry) + "\n")

        metrics: dict[str, Any] = {
            "step": step,
            "epoch": stream.epoch,
            "loss": _mean(float(loss.detach())),
            "lr": scheduler.get_last_lr()[0],
        }
        if cfg["global_batch_size"] is not None:
            metrics.update(world_size=world, batch_size=batch_size)
        if cfg["remaining_work"]:
            metrics["remaining_work_s"] = remaining_work_s(
                cfg["total_steps"] - step, step - start + 1, time.monotonic() - attempt_started
            )
        last = step == cfg["total_steps"]
        if last:
            metrics["accuracy"] = accuracy(model, x_test, y_test)
            metrics["weights_sha256"] = state_hash(model)
        # Every rank reaches check() at the same steps (it is a collective); on a notice the
        # gang trains on until the save is due, then checkpoints the full state and restarts
        # off the draining node; on the controller's request it checkpoints and the controller
        # moves it.
        if watch is not None and not last and watch.check():
            watch.save_and_move(
                functools.partial(
                    _report_checkpoint,
                    model, optimizer, scheduler, stream, step, metrics, rank, cfg["jit_checkpoint_delay_s"],
                ),
                step=step,
            )
        if last or step % cfg["checkpoint_every"] == 0:
            with watch.timing_save() if watch is not None else contextlib.nullcontext():
                _report_checkpoint(model, optimizer, scheduler, stream, step, metrics, rank)
        elif step % cfg["report_every"] == 0:
            ray.train.report(metrics)


def remaining_work_s(steps_left: int, steps_done: int, elapsed_s: float) -> float:
    """Wall seconds the steps left take at the pace of the ``steps_done`` this attempt took ``elapsed_s`` for."""
    return steps_left * elapsed_s / steps_done


def _preemption_watch(cfg: dict[str, Any]) -> Any:
    """spotfallback's just-in-time checkpoint helper, or None when preemption checks are off."""
    every_steps, every_s = int(cfg["preemption_check_every"]), float(cfg["preemption_check_every_s"])
    if every_steps <= 0 and every_s <= 0:
        return None
    from spotfallback.notices.jit import PreemptionWatch

    return PreemptionWatch(
        every_s=every_s,
        every_steps=every_steps or None,
        max_hold_s=float(cfg["preemption_hold_s"]),
        move=bool(cfg["preemption_move"]),
        train_on=bool(cfg["preemption_train_on"]),
        answer_requests=bool(cfg["preemption_answer_requests"]),
    )


def _maybe_raise(cfg: dict[str, Any], step: int, rank: int) -> None:
    """The injected application error of ``raise_at_step`` (a bug, not an infrastructure fault)."""
    if cfg["raise_at_step"] is None or step != int(cfg["raise_at_step"]):
        return
    if cfg["raise_marker"]:
        marker = Path(f"{cfg['raise_marker']}.rank{rank}")
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    raise ValueError(f"injected application error at step {step} on rank {rank}")


def _report_checkpoint(
    model: MLP,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    stream: _Rank,
    step: int,
    metrics: dict[str, Any],
    rank: int,
    extra_delay_s: float = 0.0,
) -> None:
    import ray.train

    from spotfallback.store.checkpoints import write_manifest

    rank_states = _gather(stream.state())  # a collective: every rank calls it
    if rank != 0:
        ray.train.report(metrics)
        return
    with scratch_dir("ddp-digits-") as d:  # a worker killed while it writes leaves none behind
        _save(Path(d), model, optimizer, scheduler, rank_states, step, metrics)
        if extra_delay_s:
            time.sleep(extra_delay_s)  # a large state takes this much longer to write
        write_manifest(d)  # sizes + SHA-256: lets a resume tell a whole checkpoint from a damaged one
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
