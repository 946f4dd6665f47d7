"""Saved probe results: where ``localspec probe --save`` writes them, and what reads them
(``--mode auto`` picks the winner; the chat's side panel shows the measured speedup).

One small module, so that the Engine and the TUI can read results without importing the
probe itself (which needs the Engine)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError
from localspec.fileops import atomic_path
from localspec.sources import cache_dir

WORTH_IT = 1.03  # below this mean speedup, speculation is not worth recommending


@dataclass(frozen=True)
class ProbeConfig:
    mode: str
    n_max: int
    draft: str | None = None  # path of the draft model for draft-model

    @property
    def label(self) -> str:
        who = f" {Path(self.draft).name}" if self.draft else ""
        return f"{self.mode}{who} n={self.n_max}"


def probe_file(target: Path) -> Path:
    st = target.stat()
    key = hashlib.sha256(f"{os.path.realpath(target)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return cache_dir() / "probe" / f"{target.stem}-{key.hexdigest()[:16]}.json"


def write(target: Path, data: dict[str, Any]) -> Path:
    dest = probe_file(target)
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=2))
    return dest


def _saved(target: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(probe_file(target).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def saved_choice(target: Path) -> ProbeConfig | None:
    """The saved winner for this target, ``ProbeConfig('none', 0)`` when the probe found
    that speculation does not pay here, or None when no probe was saved. A winner that was
    measured on a machine too busy to trust is refused, and so is a damaged or stale file."""
    if not probe_file(target).exists():
        return None
    data = _saved(target)
    winner = data.get("winner") if data is not None else None
    if not isinstance(winner, dict):
        raise _unusable(target, "damaged: not a probe's results")
    choice = _winner(target, winner)
    if winner.get("noisy"):
        raise LocalspecError(
            f"--mode auto: the saved probe of {target.name} could not measure its winner "
            f"reliably (the machine was busy; {winner.get('config', '?')} at "
            f"{winner.get('speedup', 0):.2f}x is only an estimate)",
            f"rerun `localspec probe {target} --save` when the machine is quieter, "
            "or choose a --mode",
        )
    if winner["speedup"] < WORTH_IT:
        return ProbeConfig("none", 0)
    return choice


def _winner(target: Path, winner: dict[str, Any]) -> ProbeConfig:
    """The winner's configuration, checked: the file is the user's to edit or damage."""
    from localspec.engine.loop import SpecConfig
    from localspec.modes import parse_mode

    mode, n_max, draft = winner.get("mode"), winner.get("n_max"), winner.get("draft")
    speedup = winner.get("speedup")
    if not isinstance(speedup, int | float) or isinstance(speedup, bool):
        raise _unusable(target, f"damaged: its winner's speedup is {speedup!r}")
    if type(n_max) is not int or not (isinstance(draft, str) or draft is None):
        raise _unusable(target, "damaged: its winner has no draft length or a bad draft")
    try:
        parse_mode(mode)  # type: ignore[arg-type]
        if mode != "none":
            SpecConfig(n_max=n_max, n_min=0).validate()
    except LocalspecError as exc:
        why = f"damaged: its winner's settings are wrong ({exc.message})"
        raise _unusable(target, why) from None
    if draft is not None and not Path(draft).is_file():
        raise _unusable(target, f"stale: its winner's draft model {draft} is gone")
    return ProbeConfig(mode, n_max, draft)  # type: ignore[arg-type]


def _unusable(target: Path, why: str) -> LocalspecError:
    return LocalspecError(
        f"--mode auto: the saved probe of {target.name} ({probe_file(target)}) is {why}",
        f"rerun `localspec probe {target} --save`, or choose a --mode",
    )


def saved_speedup(target: Path, mode: str) -> float | None:
    """The best measured speedup of this mode in the saved probe of this target, if any."""
    data = _saved(target) or {}
    ranking = data.get("ranking")
    speeds = [
        r["speedup"]
        for r in (ranking if isinstance(ranking, list) else [])
        if isinstance(r, dict)
        and r.get("mode") == mode
        and not r.get("noisy")  # an estimate is not a measured speedup
        and isinstance(r.get("speedup"), float | int)
    ]
    return max(speeds) if speeds else None


def saved_notes(target: Path) -> list[str]:
    """What the saved probe of this target noted about this machine (a compute-bound
    target, say), for ``localspec pairs``."""
    notes = (_saved(target) or {}).get("notes")
    return [n for n in notes if isinstance(n, str)] if isinstance(notes, list) else []
