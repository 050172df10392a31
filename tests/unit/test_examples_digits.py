"""The examples' bundled digits: scikit-learn's own, read without importing scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from spotfallback.examples._digits import digits_split, load_digits


def test_the_bundled_digits_equal_scikit_learns() -> None:
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    theirs = sklearn_datasets.load_digits()
    images, labels = load_digits()
    assert images.dtype == labels.dtype == np.uint8
    np.testing.assert_array_equal(images, theirs.data)
    np.testing.assert_array_equal(labels, theirs.target)


def test_the_split_is_the_seeded_permutation_scaled_to_one() -> None:
    """Fixed by the seed alone: a run resumed on another release must train on the same batches."""
    x_train, y_train, x_test, y_test = digits_split(test_fraction=0.25, seed=0)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    images, labels = load_digits()
    order = np.random.RandomState(0).permutation(1797)
    test, train = order[:449], order[449:]
    np.testing.assert_array_equal(x_train, (images[train] / 16.0).astype(np.float32))
    np.testing.assert_array_equal(x_test, (images[test] / 16.0).astype(np.float32))
    np.testing.assert_array_equal(y_train, labels[train])
    np.testing.assert_array_equal(y_test, labels[test])
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert not np.array_equal(digits_split(seed=1)[1], y_train)


@pytest.mark.parametrize("example", ["ddp_digits", "keras_digits"])
def test_an_example_loads_its_data_where_scikit_learn_is_not_installed(example: str) -> None:
    """As on the stock Ray image with only the example's extra: ``import sklearn`` fails there."""
    pytest.importorskip("torch" if example == "ddp_digits" else "tensorflow")
    code = ("import sys; sys.modules['sklearn'] = None; "
            f"from spotfallback.examples.{example} import load_digits_split; "
            "print(sum(len(a) for a in load_digits_split()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "3594"  # 1348 + 1348 + 449 + 449
