"""The examples' data: scikit-learn's 8x8 handwritten digits, bundled, and the split both examples train on.

Read with numpy alone (``spotfallback/data/digits``): every start of a gang starts fresh
Train workers, and importing scikit-learn to load the same arrays cost each about a CPU-second.
"""

from __future__ import annotations

from importlib import resources

import numpy as np


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images, labels): uint8 (1797, 64) pixel counts 0..16 and uint8 (1797,) digits, as scikit-learn has them."""
    path = resources.files("spotfallback").joinpath("data", "digits", "digits.npz")
    with path.open("rb") as f, np.load(f, allow_pickle=False) as arrays:
        return arrays["images"], arrays["labels"]


def digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test): images scaled to [0, 1] as float32, labels as int64, split by ``seed``."""
    images, labels = load_digits()
    x = (images / 16.0).astype(np.float32)
    y = labels.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
