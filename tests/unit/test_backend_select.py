"""The training backend comes from the argument or the entrypoint's declaration, never from guessing."""

from __future__ import annotations

import sys
import types

import pytest

from spotfallback.config import JobConfig
from spotfallback.errors import ConfigError
from spotfallback.runtime.entrypoint import declared_backend
from spotfallback.runtime.trainer import resolve_backend


def _function_in_module(name: str, **attrs: object):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    exec("def train_fn(config):\n    pass\n", module.__dict__)
    sys.modules[name] = module
    return module.train_fn


@pytest.fixture()
def tf_fn():
    fn = _function_in_module("sf_test_declares_tf", SPOTFALLBACK_BACKEND="tensorflow")
    yield fn
    del sys.modules["sf_test_declares_tf"]


@pytest.fixture()
def plain_fn():
    # Imports TensorFlow-looking names but declares nothing: still torch.
    fn = _function_in_module("sf_test_plain", tensorflow=object(), keras=object())
    yield fn
    del sys.modules["sf_test_plain"]


def test_declaration_is_read_and_absence_means_torch(tf_fn, plain_fn):
    assert declared_backend(tf_fn) == "tensorflow"
    assert resolve_backend(None, tf_fn) == "tensorflow"
    assert declared_backend(plain_fn) is None
    assert resolve_backend(None, plain_fn) == "torch"
    assert resolve_backend("tensorflow", plain_fn) == "tensorflow"


def test_argument_contradicting_declaration_is_an_error(tf_fn):
    with pytest.raises(ConfigError, match="declares 'tensorflow'"):
        resolve_backend("torch", tf_fn)


def test_unknown_backends_are_rejected(plain_fn):
    with pytest.raises(ConfigError, match="not supported"):
        resolve_backend("jax", plain_fn)
    bad = _function_in_module("sf_test_bad_decl", SPOTFALLBACK_BACKEND=3)
    try:
        with pytest.raises(ConfigError, match="must be a string"):
            declared_backend(bad)
    finally:
        del sys.modules["sf_test_bad_decl"]


def test_job_file_backend_explicit_or_left_to_the_entrypoint():
    base = {"name": "r", "storage_path": "/tmp/x", "entrypoint": "m:f", "tiers": [{"name": "od", "market": "on-demand", "num_workers": 1}]}
    assert JobConfig(**base, backend="tensorflow").backend == "tensorflow"
    assert "backend" not in JobConfig(**base).model_fields_set  # from_job then asks the entrypoint
    with pytest.raises(ValueError, match="not supported"):
        JobConfig(**base, backend="jax")
