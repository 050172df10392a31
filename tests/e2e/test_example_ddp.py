"""The DDP digits example resumes bit for bit, and its checkpoints hold the whole training state."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
ROOT = Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch")

import ray  # noqa: E402
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from spotfallback.examples.ddp_digits import (  # noqa: E402
    CHECKPOINT_FILES,
    load_digits_split,
    make_model,
    rank_batch_size,
    state_hash,
    train_fn,
)
from tests.support.helpers_e2e import SLOW_UNDER_LOAD  # noqa: E402

pytestmark = pytest.mark.ray

CONFIG = {"total_steps": 40, "checkpoint_every": 5, "seed": 3}


# ----------------------------------------------------------------- pure helpers


def test_data_split_is_fixed_and_disjoint() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    assert x_tr.shape == (len(y_tr), 64) and len(y_tr) + len(y_te) == 1797
    assert float(x_tr.max()) <= 1.0 and float(x_tr.min()) >= 0.0
    again = load_digits_split(seed=0)
    assert torch.equal(again[0], x_tr) and torch.equal(again[3], y_te)
    assert not torch.equal(load_digits_split(seed=1)[1], y_tr)


def test_model_init_is_seeded_and_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    assert state_hash(make_model(32, seed=1)) == state_hash(make_model(32, seed=1))
    assert state_hash(make_model(32, seed=1)) != state_hash(make_model(32, seed=2))
    assert torch.equal(torch.get_rng_state(), before)


def test_global_batch_size_is_split_over_the_world_and_must_divide() -> None:
    per_rank = {"batch_size": 32, "global_batch_size": None}
    assert [rank_batch_size(per_rank, w) for w in (2, 3)] == [32, 32]  # unset: per rank, as before
    fixed = {"batch_size": 32, "global_batch_size": 48}
    assert [rank_batch_size(fixed, w) for w in (2, 3, 4)] == [24, 16, 12]
    with pytest.raises(ValueError, match=r"global_batch_size=48 does not divide by the world size 5; use a multiple"):
        rank_batch_size(fixed, 5)
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        rank_batch_size({**fixed, "global_batch_size": 0}, 1)


# ----------------------------------------------------------------- on Ray Train


@pytest.fixture(scope="module")
def ray_local():
    ray.init(
        address="local",
        num_cpus=3,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={
            "env_vars": {
                # Workers import `spotfallback.examples.ddp_digits` wherever pytest was started from.
                "PYTHONPATH": str(ROOT),
                "RAY_TRAIN_V2_ENABLED": "1",
                # Each report waits for the controller's poll (2 s by default).
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
            }
        },
    )
    try:
        yield
    finally:
        ray.shutdown()


def _fit(storage: Path, config: dict, max_failures: int = 0):
    name = f"ddp-digits-{uuid.uuid4().hex[:8]}"
    trainer = TorchTrainer(
        train_fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            storage_path=str(storage),
            name=name,
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit(), storage / name


def _checkpoint_steps(run_dir: Path) -> list[int]:
    steps = [
        json.loads((d / "progress.json").read_text())["step"]
        for d in run_dir.glob("checkpoint_*")
        if (d / "progress.json").exists()
    ]
    return sorted(steps)


@pytest.fixture(scope="module")
def scratch():
    # Not pytest's tmp_path: its base directory is shared by every pytest run on the machine,
    # and concurrent sessions prune each other's old ones.
    path = Path(tempfile.mkdtemp(prefix="sf-test-ddp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def uninterrupted(ray_local, scratch):
    return _fit(scratch / "uninterrupted", CONFIG)


@SLOW_UNDER_LOAD  # its limit also covers the uninterrupted reference run its fixture makes first
def test_resume_after_failure_is_bit_identical(uninterrupted, scratch) -> None:
    clean, clean_dir = uninterrupted
    assert clean.error is None and clean.metrics["step"] == 40
    assert clean.metrics["accuracy"] > 0.8

    marker = scratch / "failed-once"
    config = {**CONFIG, "raise_at_step": 17, "raise_marker": str(marker)}
    resumed, resumed_dir = _fit(scratch / "resumed", config, max_failures=1)

    assert resumed.error is None and resumed.metrics["step"] == 40
    assert Path(f"{marker}.rank0").exists()  # the first attempt really failed at step 17
    # Resumed from the step-15 checkpoint, not from scratch: every step checkpointed once.
    assert _checkpoint_steps(resumed_dir) == list(range(5, 41, 5))
    assert resumed.metrics["weights_sha256"] == clean.metrics["weights_sha256"]
    assert resumed.metrics["accuracy"] == clean.metrics["accuracy"]


def test_checkpoint_holds_the_whole_training_state(uninterrupted) -> None:
    result, run_dir = uninterrupted
    assert _checkpoint_steps(run_dir) == list(range(5, 41, 5))
    assert isinstance(result.checkpoint, Checkpoint)
    with result.checkpoint.as_directory() as d:
        ckpt = Path(d)
        assert sorted(p.name for p in ckpt.iterdir()) == sorted(CHECKPOINT_FILES)
        model_state = torch.load(ckpt / "model.pt", weights_only=True)
        optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
        scheduler = torch.load(ckpt / "lr_scheduler.pt", weights_only=True)
        ranks = torch.load(ckpt / "rank_states.pt", weights_only=True)
        progress = json.loads((ckpt / "progress.json").read_text())

    assert state_hash(model_state) == result.metrics["weights_sha256"]
    assert set(model_state) == set(make_model(64).state_dict())
    # Adam's moments for every parameter, and its step count.
    assert len(optimizer["state"]) == len(model_state)
    assert all({"exp_avg", "exp_avg_sq", "step"} <= set(s) for s in optimizer["state"].values())
    assert scheduler["last_epoch"] == 40
    assert progress["step"] == 40 and progress["world_size"] == 2
    # Every rank's generator (shuffling and dropout) and its place in the epoch.
    assert len(ranks) == 2
    for r in ranks:
        assert {"generator", "epoch", "position", "perm"} <= set(r)
        assert r["generator"].dtype == torch.uint8 and r["position"] >= 1
    assert not torch.equal(ranks[0]["generator"], ranks[1]["generator"])
