"""localspec: lossless speculative decoding for local LLMs on llama.cpp.

The names below are imported when first used, and this module imports nothing itself (not
even ``typing``): the ``localspec`` command starts by importing this package, and a Ctrl-C
before its handler is in place (``localspec.launch``) is Python's own traceback."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from localspec.api import Engine, GenerationResult
    from localspec.engine.fim import ExtraFile, FimPrompt
    from localspec.engine.loop import RoundEvent, SpecConfig
    from localspec.engine.settings import GenerationSettings
    from localspec.engine.stats import Stats
    from localspec.errors import LocalspecError

    StepEvent = RoundEvent

_HOMES = {
    "Engine": "localspec.api",
    "GenerationResult": "localspec.api",
    "FimPrompt": "localspec.engine.fim",
    "ExtraFile": "localspec.engine.fim",
    "RoundEvent": "localspec.engine.loop",
    "SpecConfig": "localspec.engine.loop",
    "GenerationSettings": "localspec.engine.settings",
    "Stats": "localspec.engine.stats",
    "LocalspecError": "localspec.errors",
}
_RENAMED = {"StepEvent": "RoundEvent"}  # the names of earlier releases

__all__ = [
    "Engine",
    "ExtraFile",
    "FimPrompt",
    "GenerationResult",
    "GenerationSettings",
    "LocalspecError",
    "RoundEvent",
    "SpecConfig",
    "Stats",
    "StepEvent",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    real = _RENAMED.get(name, name)
    if real not in _HOMES:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[real]), real)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    public = {name for name in globals() if name.startswith("__") or name in __all__}
    return sorted(public | {*__all__, "__version__"})
