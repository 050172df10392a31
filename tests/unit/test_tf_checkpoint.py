"""``TFTrainState`` round trip without Ray: every piece of state comes back, and resuming equals not stopping."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow", reason="TensorFlow is the optional extra: pip install -e '.[tensorflow]'")
keras = pytest.importorskip("keras")

from spotfallback.integrations.tensorflow import TFTrainState  # noqa: E402


def _setup(seed: int = 0):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed))])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5, staircase=True)
    optimizer = keras.optimizers.Adam(schedule)
    optimizer.build(model.trainable_variables)
    generator = tf.random.Generator.from_seed(seed + 1)
    epoch = tf.Variable(0, dtype=tf.int64)
    state = TFTrainState(
        model=model, optimizer=optimizer, lr_schedule=schedule, per_rank={"generator": generator, "epoch": epoch}, rank=0, world_size=1
    )
    return model, optimizer, generator, epoch, state


def _train(model, optimizer, generator, epoch, steps):
    for _ in range(steps):
        x = generator.normal((8, 4))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - 1.0))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        epoch.assign_add(1)


def _weights(model):
    return [w.numpy().tobytes() for w in model.weights]


def test_resume_equals_uninterrupted(tmp_path):
    tf.config.experimental.enable_op_determinism()
    ref = _setup()
    _train(*ref[:4], steps=6)

    first = _setup()
    _train(*first[:4], steps=3)
    first[4].save(tmp_path, 3, {"loss": 1.0})

    second = _setup()
    restored = second[4].restore(tmp_path)
    assert (restored.step, restored.start, restored.per_rank, restored.metrics) == (3, 4, True, {"loss": 1.0})
    assert int(second[1].iterations.numpy()) == 3 and int(second[3].numpy()) == 3
    _train(*second[:4], steps=3)
    assert _weights(second[0]) == _weights(ref[0])
    assert second[2].state.numpy().tolist() == ref[2].state.numpy().tolist()


def test_other_world_size_restores_shared_state_only_and_unbuilt_optimizer_is_refused(tmp_path):
    model, optimizer, generator, epoch, state = _setup()
    _train(model, optimizer, generator, epoch, steps=2)
    state.save(tmp_path, 2)

    m2, o2, g2, e2, _ = _setup()
    wider = TFTrainState(model=m2, optimizer=o2, per_rank={"generator": g2, "epoch": e2}, rank=0, world_size=2)
    restored = wider.restore(tmp_path)
    assert restored.step == 2 and not restored.per_rank
    assert _weights(m2) == _weights(model) and int(e2.numpy()) == 0

    fresh = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    unbuilt = TFTrainState(model=fresh, optimizer=keras.optimizers.Adam(), rank=0, world_size=1)
    with pytest.raises(ValueError, match="build the optimizer first"):
        unbuilt.restore(tmp_path)
