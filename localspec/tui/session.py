"""The conversation itself, independent of the UI: messages, trimming, save and load.

Saved as JSON with an atomic write; a damaged or foreign file raises LocalspecError and
leaves the current conversation untouched."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.fileops import atomic_path

FORMAT = "localspec-chat"
VERSION = 1


@dataclass
class ChatSession:
    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)  # user/assistant messages

    def messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [dict(m) for m in self.turns]

    def add(self, role: str, content: str) -> None:
        self.turns.append({"role": role, "content": content})

    def last_answer(self) -> str | None:
        return next((m["content"] for m in reversed(self.turns) if m["role"] == "assistant"), None)

    def trim_oldest_turn(self) -> bool:
        """Drop the oldest user message and the answer to it; False if nothing to drop."""
        if len(self.turns) <= 1:
            return False
        del self.turns[0]
        while self.turns and self.turns[0]["role"] != "user":
            del self.turns[0]
        return True

    def clear(self) -> None:
        self.turns.clear()

    def save(self, path: Path, model: str) -> None:
        data = {
            "format": FORMAT,
            "version": VERSION,
            "model": model,
            "system": self.system,
            "messages": self.turns,
        }
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> ChatSession:
        pick = "pick a file saved by localspec chat"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise LocalspecError(f"cannot read {path}: {exc.strerror}") from None
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            why = exc if isinstance(exc, ValueError) else "nested too deeply"
            raise LocalspecError(f"{path} is not valid JSON ({why})", pick) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise LocalspecError(f"{path} is not a localspec chat file", pick)
        version = data.get("version")
        if type(version) is not int or version < 1:
            raise LocalspecError(f"{path}: field 'version' is damaged ({version!r})", pick)
        if version > VERSION:
            raise LocalspecError(
                f"{path} was saved by a newer localspec (chat file version {version}; this "
                f"one reads version {VERSION})",
                "upgrade localspec to open it",
            )
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict)
            and m.get("role") in ("user", "assistant")
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise LocalspecError(
                f"{path}: field 'messages' is damaged",
                "each message needs a role (user/assistant) and content",
            )
        system = data.get("system")
        if system is not None and not isinstance(system, str):
            raise LocalspecError(
                f"{path}: field 'system' is damaged (a {type(system).__name__}, not text)", pick
            )
        return cls(
            system,
            [{"role": m["role"], "content": m["content"]} for m in messages],
        )
