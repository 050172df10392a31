"""spotfallback: Ray Train on spot capacity, with a tiered fallback ladder that never gets stuck."""

from spotfallback.config import JobConfig, Ladder, Tier
from spotfallback.errors import ConfigError
from spotfallback.policy import FallbackPolicy

__all__ = ["ConfigError", "FallbackPolicy", "FallbackTrainer", "JobConfig", "Ladder", "Tier"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The trainer imports Ray; keep `import spotfallback` light for the planner and the CLI.
    if name == "FallbackTrainer":
        from spotfallback.runtime.trainer import FallbackTrainer

        return FallbackTrainer
    raise AttributeError(name)
