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

    def save(self, path: Path, model: str) -> None:
        """Write the conversation to ``path``; a file there that is not a chat file (notes, a
        model...) is refused, not replaced."""
        if not overwritable(path):
            raise LocalspecError(
                f"{path} holds something else than a localspec chat: not replaced",
                "pick another name, or delete that file first",
            )
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
            and is_text(m.get("content"))
            for m in messages
        ):
            raise LocalspecError(
                f"{path}: field 'messages' is damaged",
                "each message needs a role (user/assistant) and content (valid Unicode text)",
            )
        system = data.get("system")
        if system is not None and not is_text(system):
            raise LocalspecError(
                f"{path}: field 'system' is damaged (not valid Unicode text)", pick
            )
        return cls(
            system,
            [{"role": m["role"], "content": m["content"]} for m in messages],
        )


def is_text(value: object) -> bool:
    """A string that is valid Unicode (JSON escapes can spell lone surrogates, which no
    model can tokenize)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def overwritable(path: Path) -> bool:
    """Whether saving a chat may replace what is at ``path``: nothing, an empty file, or a
    chat file (damaged ones included); a device or a folder is refused by ``atomic_path``."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return True
        with path.open("rb") as f:
            head = f.read(256)
    except OSError:
        return True  # the write itself will say what is wrong
    return FORMAT.encode() in head
