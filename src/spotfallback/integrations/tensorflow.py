"""The whole TensorFlow training state in one Ray Train checkpoint, via ``tf.train.Checkpoint``.

A resumed run only continues *exactly* where it stopped if everything that shapes the next
step comes back, so a checkpoint written by ``TFTrainState`` holds:

- ``state/``: one ``tf.train.Checkpoint`` of what is the same on every rank: the model, the
  optimizer (its slots *and* its ``iterations`` counter, which also drives a Keras
  learning-rate schedule), a stateful schedule when it is a ``tf.Module``, any ``extra``
  trackables, and ``step``, the last completed step. Written by rank 0.
- ``rank_<r>/``: one ``tf.train.Checkpoint`` per rank of what differs between ranks: its
  ``tf.random.Generator`` (shuffling, dropout masks), its epoch/position in the data, a
  ``tf.data`` iterator, whatever the caller passes as ``per_rank``. Every rank writes its own
  into the same reported directory: Ray Train uploads all ranks' files of one ``report()``
  into one checkpoint directory.
- ``progress.json``: step, world size, metrics and the schedule's config (a stateless Keras
  schedule is a pure function of ``iterations``; its config is kept so a resume with a
  different schedule is flagged instead of silently training on another curve).

Every rank must call ``save``/``report`` at the same steps: with ``MultiWorkerMirroredStrategy``
reading a sync-on-read variable is a collective, so non-chief ranks write the shared state
too, into a scratch directory that is dropped (TensorFlow's own multi-worker recipe).

The just-in-time checkpoint on a preemption notice is the same call, made from
``spotfallback.notices.jit.PreemptionWatch``::

    if watch.check():
        watch.save_and_move(lambda: state.report(step, metrics), step=step)

Build the model and the optimizer (``optimizer.build(model.trainable_variables)``) inside
the strategy's scope before ``restore``: restoring into unbuilt Keras objects would defer
values to variables that do not exist yet, and a typo would go unnoticed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf

from spotfallback.integrations.restore_dir import checkpoint_files
from spotfallback.integrations.scratch import scratch_dir

logger = logging.getLogger("spotfallback")

SHARED_DIR = "state"
PROGRESS_FILE = "progress.json"
_PREFIX = "ckpt"


def rank_dir(rank: int) -> str:
    return f"rank_{rank}"


@dataclass(frozen=True)
class Restored:
    """What ``restore`` found: ``step`` is the last completed step (0: nothing restored)."""

    step: int = 0
    per_rank: bool = False  # this rank's own state came back (False: none, or another world size)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> int:
        """The step to train next."""
        return self.step + 1


class TFTrainState:
    """Saves and restores model, optimizer, schedule, step and per-rank state together.

    ``rank``/``world_size`` default to Ray Train's context. ``per_rank``: trackables whose
    values differ between ranks (``tf.random.Generator``, ``tf.Variable`` counters,
    ``tf.data`` iterators); they are restored only when the world size is unchanged, since a
    different worker count shards the data differently; ``Restored.per_rank`` tells the
    caller to reseed then.
    """

    def __init__(
        self,
        *,
        model: Any,
        optimizer: Any,
        lr_schedule: Any = None,
        per_rank: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if rank is None or world_size is None:
            import ray.train

            ctx = ray.train.get_context()
            rank = ctx.get_world_rank() if rank is None else rank
            world_size = ctx.get_world_size() if world_size is None else world_size
        self.rank = rank
        self.world_size = world_size
        self.model = model
        self.optimizer = optimizer
        self.lr_schedule = lr_schedule
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="spotfallback_step")
        shared: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": self.step, **(extra or {})}
        if isinstance(lr_schedule, tf.Module):
            shared["lr_schedule"] = lr_schedule
        self._shared = tf.train.Checkpoint(**shared)
        self._per_rank = tf.train.Checkpoint(**dict(per_rank or {}))

    # -- writing ------------------------------------------------------------------------

    def save(self, directory: str | Path, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Write this rank's part of the checkpoint of ``step`` (a completed step) into ``directory``."""
        d = Path(directory)
        self.step.assign(step)
        if self.rank == 0:
            self._shared.write(str(d / SHARED_DIR / _PREFIX))
            progress = {
                "step": step,
                "world_size": self.world_size,
                "metrics": dict(metrics or {}),
                "lr_schedule": self._schedule_config(),
            }
            (d / PROGRESS_FILE).write_text(json.dumps(progress, indent=1, default=str))
        else:
            with scratch_dir("tf-unused-") as scratch:
                self._shared.write(str(scratch / _PREFIX))
        self._per_rank.write(str(d / rank_dir(self.rank) / _PREFIX))

    def report(self, step: int, metrics: Mapping[str, Any], **report_kwargs: Any) -> None:
        """Save into a fresh directory and ``ray.train.report`` it (every rank calls this)."""
        import ray.train

        with scratch_dir("tf-checkpoint-") as d:
            self.save(d, step, metrics)
            ray.train.report(dict(metrics), checkpoint=ray.train.Checkpoint.from_directory(d), **report_kwargs)

    # -- reading ------------------------------------------------------------------------

    def restore_from_ray(self) -> Restored:
        """Restore from ``ray.train.get_checkpoint()``; ``Restored()`` (step 0) when there is none."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return Restored()
        with checkpoint_files(checkpoint, label=f"tf-restore-{self.rank}-") as d:  # not as_directory: see there
            return self.restore(d)

    def restore(self, directory: str | Path) -> Restored:
        d = Path(directory)
        if getattr(self.optimizer, "built", True) is False:
            raise ValueError(
                "TFTrainState.restore: build the optimizer first (optimizer.build(model.trainable_variables) "
                "inside strategy.scope()), or its slots and iteration counter would not be restored"
            )
        progress = json.loads((d / PROGRESS_FILE).read_text())
        self._shared.read(str(d / SHARED_DIR / _PREFIX)).assert_existing_objects_matched()
        saved_schedule, schedule = progress.get("lr_schedule"), self._schedule_config()
        if saved_schedule != schedule:
            logger.warning(
                "the learning-rate schedule differs from the checkpoint's (%s, now %s): the run continues "
                "with the new schedule at iteration %s",
                saved_schedule,
                schedule,
                int(self.optimizer.iterations.numpy()),
            )
        per_rank = int(progress["world_size"]) == self.world_size
        if per_rank:
            own = d / rank_dir(self.rank)
            if not own.is_dir():
                raise FileNotFoundError(f"checkpoint {d} has no {own.name}/ although it was written by as many ranks")
            self._per_rank.read(str(own / _PREFIX)).assert_existing_objects_matched()
        step = int(self.step.numpy())
        if step != int(progress["step"]):
            raise ValueError(f"checkpoint {d}: progress.json says step {progress['step']}, the TF state says {step}")
        return Restored(step=step, per_rank=per_rank, metrics=dict(progress.get("metrics", {})))

    def _schedule_config(self) -> Any:
        if self.lr_schedule is None:
            return None
        get_config = getattr(self.lr_schedule, "get_config", None)
        if get_config is None:
            return repr(self.lr_schedule)
        return json.loads(json.dumps({"class": type(self.lr_schedule).__name__, **get_config()}, default=str))


__all__ = ["PROGRESS_FILE", "SHARED_DIR", "Restored", "TFTrainState", "rank_dir"]
