"""localspec: lossless speculative decoding for local LLMs on llama.cpp."""

from localspec.api import Engine, GenerationResult
from localspec.engine.loop import RoundEvent, SpecConfig
from localspec.engine.settings import GenerationSettings
from localspec.engine.stats import Stats
from localspec.errors import LocalspecError

__all__ = [
    "Engine",
    "GenerationResult",
    "GenerationSettings",
    "LocalspecError",
    "RoundEvent",
    "SpecConfig",
    "Stats",
    "StepEvent",
]
StepEvent = RoundEvent  # the name of earlier releases
__version__ = "0.1.0"
