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
    measured on a machine too busy to trust is refused."""
    data = _saved(target)
    winner = data.get("winner") if data is not None else None
    if not isinstance(winner, dict):
        return None
    if winner.get("noisy"):
        raise LocalspecError(
            f"--mode auto: the saved probe of {target.name} could not measure its winner "
            f"reliably (the machine was busy; {winner.get('config', '?')} at "
            f"{winner.get('speedup', 0):.2f}x is only an estimate)",
            f"rerun `localspec probe {target} --save` when the machine is quieter, "
            "or choose a --mode",
        )
    if winner.get("speedup", 0) < WORTH_IT:
        return ProbeConfig("none", 0)
    return ProbeConfig(winner["mode"], int(winner["n_max"]), winner.get("draft"))


def saved_speedup(target: Path, mode: str) -> float | None:
    """The best measured speedup of this mode in the saved probe of this target, if any."""
    data = _saved(target) or {}
    ranking = data.get("ranking")
    speeds = [
        r["speedup"]
        for r in (ranking if isinstance(ranking, list) else [])
        if isinstance(r, dict)
        and r.get("mode") == mode
        and isinstance(r.get("speedup"), float | int)
    ]
    return max(speeds) if speeds else None
