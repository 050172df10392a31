"""Data-parallel Keras (MultiWorkerMirroredStrategy, CPU) on the 8x8 handwritten digits, resumable bit for bit.

The TensorFlow twin of ``examples/ddp_digits.py``: same data, same shape of model, same
config keys. Run it with ``spotfallback.FallbackTrainer`` as ``spotfallback.examples.keras_digits:train_fn``;
``SPOTFALLBACK_BACKEND`` below tells spotfallback to use Ray's ``TensorflowTrainer``.

The checkpoint (``spotfallback.integrations.tensorflow.TFTrainState``) holds the whole training state,
each piece for a reason:

- the model's weights (the obvious part);
- the optimizer: Adam's moment slots and its ``iterations`` counter; without them the first
  steps after a resume take differently sized updates;
- the learning-rate schedule: ``ExponentialDecay(staircase)`` is a function of
  ``iterations``, so restoring the counter restores where the curve stands (its config is
  kept beside it, to flag a resume with another schedule);
- ``step``: the last completed step; training continues at the next one;
- per rank: its ``tf.random.Generator`` (it draws the shuffling *and* the dropout masks), the
  current epoch's permutation and the position in it. Without these a resumed rank sees
  other batches and other masks.

Determinism on CPU: oneDNN off (``TF_ENABLE_ONEDNN_OPTS=0``, set before TensorFlow loads: its
fused kernels may reorder float sums), one intra- and inter-op thread,
``tf.config.experimental.enable_op_determinism()``, seeded initialisers, and no randomness
outside the per-rank generators. Keras 3 is imported as ``keras``: Ray's TensorFlow backend
sets ``TF_USE_LEGACY_KERAS=1``, which would point ``tf.keras`` at the separate ``tf_keras``.

Config keys: ``total_steps`` (40), ``checkpoint_every`` (5), ``batch_size`` (32), ``lr``
(0.01), ``seed`` (0), ``hidden`` (64), ``step_delay_s`` (0: extra sleep per step, so a test
can inject a fault mid-run), ``report_every`` (1), ``preemption_check_every`` (0 = off:
every N steps ask Ray for a preemption notice through ``PreemptionWatch``; on one, save a
just-in-time checkpoint and hold until the node goes), ``trace_file`` (None: rank 0 appends
one JSON line per attempt, ``{"start": step, "restored": bool}``, so a test can see where
each attempt resumed).
"""

from __future__ import annotations

import os
from functools import partial

# Before TensorFlow loads (this module is imported by the workers before train_fn runs).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from spotfallback.examples._digits import digits_split  # noqa: E402

SPOTFALLBACK_BACKEND = "tensorflow"

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
    "preemption_hold_s": 60.0,
    "trace_file": None,
}
DROPOUT = 0.1


class MLP(keras.Model):
    """64 -> hidden -> hidden -> 10; dropout masks are passed in (drawn from the rank's generator)."""

    def __init__(self, hidden: int = 64, seed: int = 0) -> None:
        super().__init__()

        def dense(units: int, i: int, activation: str | None = None) -> keras.layers.Dense:
            return keras.layers.Dense(
                units, activation=activation, kernel_initializer=keras.initializers.GlorotUniform(seed=seed * 10 + i)
            )

        self.fc1 = dense(hidden, 1, "relu")
        self.fc2 = dense(hidden, 2, "relu")
        self.out = dense(10, 3)

    def call(self, x: Any, masks: tuple[Any, Any] | None = None) -> Any:
        x = self.fc1(x)
        if masks is not None:
            x = x * masks[0]
        x = self.fc2(x)
        if masks is not None:
            x = x * masks[1]
        return self.out(x)


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(X_train, y_train, X_test, y_test): the same split as ``ddp_digits.load_digits_split``, labels as int32."""
    x_train, y_train, x_test, y_test = digits_split(test_fraction, seed)
    return x_train, y_train.astype(np.int32), x_test, y_test.astype(np.int32)


def weights_sha256(model: keras.Model) -> str:
    """SHA-256 of every weight's path and raw bytes."""
    h = hashlib.sha256()
    for v in sorted(model.weights, key=lambda v: v.path):
        h.update(v.path.encode())
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


class _Stream:
    """One rank's data stream, as TF state a checkpoint can hold: generator, epoch, position, permutation."""

    def __init__(self, n_train: int, rank: int, world: int, seed: int, batch_size: int) -> None:
        self.shard = np.arange(rank, n_train, world)
        self.batch_size = batch_size
        self.generator = tf.random.Generator.from_seed(seed * 7919 + rank)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False)  # batches taken from perm
        self.perm = tf.Variable(self._shuffle(), trainable=False)

    def _shuffle(self) -> tf.Tensor:
        return tf.argsort(self.generator.uniform([len(self.shard)]), stable=True)

    def next_batch(self) -> np.ndarray:
        position = int(self.position.numpy())
        if (position + 1) * self.batch_size > len(self.shard):
            self.epoch.assign_add(1)
            self.perm.assign(self._shuffle())
            position = 0
        self.position.assign(position + 1)
        lo = position * self.batch_size
        return self.shard[self.perm.numpy()[lo : lo + self.batch_size]]

    def trackables(self) -> dict[str, Any]:
        return {"generator": self.generator, "epoch": self.epoch, "position": self.position, "perm": self.perm}


def train_fn(config: dict[str, Any]) -> None:
    """Ray Train V2 per-worker loop (TensorflowTrainer); see the module docstring."""
    import ray.train

    from spotfallback.integrations.tensorflow import TFTrainState

    cfg = {**DEFAULTS, **(config or {})}
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG, set by Ray's backend
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    batch, hidden = int(cfg["batch_size"]), int(cfg["hidden"])

    x_np, y_np, x_test, y_test = load_digits_split(seed=cfg["seed"])
    x_train, y_train = tf.constant(x_np), tf.constant(y_np)
    with strategy.scope():
        model = MLP(hidden, cfg["seed"])
        model(tf.zeros((1, 64)))
        # StepLR(step_size=10, gamma=0.7) of the PyTorch example, as a Keras schedule.
        schedule = keras.optimizers.schedules.ExponentialDecay(cfg["lr"], 10, 0.7, staircase=True)
        optimizer = keras.optimizers.Adam(schedule)
        optimizer.build(model.trainable_variables)
    stream = _Stream(len(y_np), rank, world, cfg["seed"], batch)
    state = TFTrainState(
        model=model, optimizer=optimizer, lr_schedule=schedule, per_rank=stream.trackables(), rank=rank, world_size=world
    )
    restored = state.restore_from_ray()
    start = restored.start
    if restored.step and not restored.per_rank:
        # Another tier with another worker count: shards differ, so per-rank streams cannot
        # continue; reseed them from the step so the run stays reproducible.
        stream = _Stream(len(y_np), rank, world, cfg["seed"] + start, batch)
        state = TFTrainState(
            model=model, optimizer=optimizer, lr_schedule=schedule, per_rank=stream.trackables(), rank=rank, world_size=world
        )
    _trace(cfg, rank, {"start": start, "restored": restored.step > 0})

    def replica_step(x: tf.Tensor, y: tf.Tensor, m1: tf.Tensor, m2: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(x, masks=(m1, m2))
            per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch * world)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # all-reduced across workers
        return loss

    @tf.function
    def train_step(idx: tf.Tensor) -> tf.Tensor:
        generator = stream.generator  # the final stream's: defined after the restore above
        keep = 1.0 - DROPOUT
        m1 = tf.cast(generator.uniform((batch, hidden)) < keep, tf.float32) / keep
        m2 = tf.cast(generator.uniform((batch, hidden)) < keep, tf.float32) / keep
        x, y = tf.gather(x_train, idx), tf.gather(y_train, idx)
        per_replica = strategy.run(replica_step, args=(x, y, m1, m2))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    watch = None
    if int(cfg["preemption_check_every"]) > 0:
        from spotfallback.notices.jit import PreemptionWatch

        watch = PreemptionWatch(every_steps=int(cfg["preemption_check_every"]), max_hold_s=cfg["preemption_hold_s"])

    for step in range(start, cfg["total_steps"] + 1):
        loss = train_step(tf.constant(stream.next_batch(), dtype=tf.int32))
        if cfg["step_delay_s"]:
            time.sleep(cfg["step_delay_s"])
        metrics: dict[str, Any] = {
            "step": step,
            "epoch": int(stream.epoch.numpy()),
            "loss": float(loss.numpy()),
            "lr": float(schedule(optimizer.iterations)),
        }
        last = step == cfg["total_steps"]
        if last:
            pred = np.argmax(model(tf.constant(x_test)).numpy(), axis=1)
            metrics["accuracy"] = float(np.mean(pred == y_test))
            metrics["weights_sha256"] = weights_sha256(model)
        if watch is not None and not last and watch.check():
            watch.save_and_move(partial(state.report, step, metrics), step=step)  # never returns
        if last or step % cfg["checkpoint_every"] == 0:
            state.report(step, metrics)
        elif step % cfg["report_every"] == 0:
            ray.train.report(metrics)


def _trace(cfg: dict[str, Any], rank: int, record: dict[str, Any]) -> None:
    if rank != 0 or not cfg["trace_file"]:
        return
    path = Path(cfg["trace_file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({**record, "t": time.time()}) + "\n")
