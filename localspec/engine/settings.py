"""One generation's settings, as one value: what ``Engine.stream`` takes, and what the CLI,
the chat and the server each build from their own input (``GenerationSettings.pick``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from localspec.engine.logit_bias import LogitBias
from localspec.engine.loop import SpecConfig
from localspec.engine.penalties import Penalties


@dataclass(frozen=True)
class GenerationSettings:
    max_tokens: int | None = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # -1: a random seed (llama.cpp's convention)
    # repetition penalties over the context's last ``repeat_last_n`` tokens (llama.cpp's
    # names; ``engine/penalties.py``)
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    logit_bias: Sequence[tuple[int, float]] = ()  # (token, added to its logit; -inf: never)
    ignore_eos: bool = False  # generate past the model's end tokens (to max_tokens)
    stop: Sequence[str] = ()
    mode: str | None = None  # None: the Engine's mode
    spec: SpecConfig | None = None  # None: the Engine's speculation settings
    logprobs: int | None = None  # each token's log-probability and this many alternatives
    grammar: str | None = None  # GBNF the answer must follow
    tools: Sequence[dict[str, Any]] | None = None  # OpenAI-style tools shown to the model
    reproducible: bool = False  # identical requests, identical answers (see Engine.stream)
    memory_partition: str = ""  # whose earlier generations the suffix drafter draws on
    remember: bool = True  # False: this generation does not enter the memory (a baseline)

    @classmethod
    def pick(cls, source: object, **given: Any) -> GenerationSettings:
        """The settings found on ``source`` under their own names (parsed flags, a request
        body, the chat's options), with ``given`` values taking precedence."""
        found = {f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)}
        return cls(**{**found, **given})

    def but(self, **changes: Any) -> GenerationSettings:
        return replace(self, **changes)

    @property
    def penalties(self) -> Penalties:
        return Penalties(
            self.repeat_penalty, self.frequency_penalty, self.presence_penalty, self.repeat_last_n
        )

    def bias(self, eog_tokens: Sequence[int]) -> LogitBias:
        """The logit bias, with ``ignore_eos``'s ban of ``eog_tokens`` (as llama-server)."""
        banned = [(token, -math.inf) for token in eog_tokens] if self.ignore_eos else []
        return LogitBias(tuple((int(t), float(b)) for t, b in [*self.logit_bias, *banned]))

    @property
    def seeded(self) -> bool:
        """Sampled with a seed of its own: the caller expects the answer that seed gave before."""
        return self.temperature > 0 and self.seed is not None and self.seed != -1
