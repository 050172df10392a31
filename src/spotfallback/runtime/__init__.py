"""Ray shell: the trainer that drives Ray Train tier by tier, and the hooks that run inside its controller."""

from spotfallback.runtime import ray_support  # noqa: F401  (first: stops on an untested Ray before any Ray internals load)
