"""The suffix drafter's memories: partitions, the memory file (atomic, damaged files refused
and rebuilt, another model's refused), and lookup cost with a full memory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from localspec.api import Engine
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine.costs import one_token_seconds
from localspec.errors import LocalspecError
from localspec.memory_bank import MemoryBank, partition_for_key

ANSWER = list(range(100, 140))


def test_partitions_do_not_draft_each_others_answers() -> None:
    bank = MemoryBank(1.0)
    alice, bob = partition_for_key("alice-key"), partition_for_key("bob-key")
    bank.remember([1, 2, 3, 4, *ANSWER], alice)
    assert bank.partition(alice).lookup([1, 2, 3, 4], 8)[0] == ANSWER[:8]
    assert bank.partition(bob).lookup([1, 2, 3, 4], 8) == ([], 0)
    assert "alice-key" not in alice and len(alice) == 16  # a digest, not the key


def test_the_file_keeps_every_partition_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "mem.npz"
    bank = MemoryBank(1.0, path, "model-a")
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.remember([9, 8, 7, 6, 5, 4], partition_for_key("k"))
    bank.close()
    again = MemoryBank(1.0, path, "model-a")
    assert again.partition().lookup([1, 2, 3, 4], 5)[0] == ANSWER[:5]
    assert again.partition(partition_for_key("k")).lookup([9, 8, 7, 6], 2)[0] == [5, 4]
    assert list(tmp_path.iterdir()) == [path]  # no scratch file left


def test_a_damaged_file_is_refused_and_replaced(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mem.npz"
    bank = MemoryBank(1.0, path, "model-a")
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.close()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a truncated write
    damaged = MemoryBank(1.0, path, "model-a")
    assert "damaged" in capsys.readouterr().err
    assert damaged.partition().lookup([1, 2, 3, 4], 5) == ([], 0)
    damaged.close()  # rebuilt, even with nothing new to remember
    assert MemoryBank(1.0, path, "model-a").partition().n_tokens == 0


def test_a_file_of_another_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mem.npz"
    bank = MemoryBank(1.0, path, "model-a")
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.close()
    with pytest.raises(LocalspecError, match="another model"):
        MemoryBank(1.0, path, "model-b")


def test_saves_are_spaced_while_generating(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mem.npz"
    bank = MemoryBank(1.0, path, "m")
    bank.remember([1, 2, 3, 4, *ANSWER])
    assert not path.exists()  # the first save waits SAVE_EVERY_S
    monkeypatch.setattr("localspec.memory_bank.SAVE_EVERY_S", 0.0)
    bank.remember([5, 6, 7, 8, *ANSWER])
    assert path.exists()


def test_off_remembers_nothing() -> None:
    bank = MemoryBank(0.0)
    bank.remember([1, 2, 3, 4, *ANSWER])
    assert not bank.enabled and bank.partition().n_tokens == 0


@pytest.mark.slow
def test_a_lookup_in_a_full_50_mb_memory_costs_microseconds(qwen: Engine) -> None:
    """The cost of a proposal (the lookup, and the count of what the places found agree
    on) does not grow with the history (an index of 4-token keys, at most MAX_CANDIDATES
    places examined): under 1% of a decoding step of the test model on this machine."""
    step = one_token_seconds(qwen.target)
    bank = MemoryBank(50.0)
    rng = np.random.default_rng(0)
    memory = bank.partition()
    while memory.n_tokens < 0.95 * memory.max_tokens:  # ~3M tokens of text-like ids
        memory.add(rng.zipf(1.3, 4000).clip(max=150_000).tolist())
    skeleton = list(range(200_000, 200_040))  # shared by many records, values apart
    for value in range(300):
        memory.add([*rng.zipf(1.3, 50).clip(max=150_000).tolist(), *skeleton, value, *skeleton])
    context = rng.zipf(1.3, 2000).clip(max=150_000).tolist()
    drafter = SuffixDrafter(memory)
    drafted, batches = 0, []
    for batch in range(5):  # the fastest batch, as the step is the fastest of its runs
        t0 = time.perf_counter()
        for i in range(40 * batch, 40 * batch + 40):
            drafted += len(drafter.propose([*context[: 1000 + i], *skeleton[: 4 + i % 8]], 48))
        batches.append((time.perf_counter() - t0) / 40)
    per_lookup = min(batches)
    assert drafted > 100 * 30  # every other lookup drafts the rest of a skeleton
    assert per_lookup < 0.01 * step, (per_lookup, step)


def test_an_unwritable_memory_file_is_a_warning_not_a_lost_answer(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    blocked = tmp_path / "blocked"
    bank = MemoryBank(1.0, blocked / "mem.npz", "m")
    blocked.write_text("a file where the folder was")  # replaced while serving
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.close()
    assert "cannot save --spec-memory" in capsys.readouterr().err


def _written(path: Path) -> None:
    bank = MemoryBank(1.0, path, "model-a", 1000)
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.close()


@pytest.mark.parametrize(
    "content", [b"GGUF\x03\x00\x00\x00 weights", b"my notes\n", b"PK\x03\x04 another zip"]
)
def test_a_file_that_is_not_a_memory_file_is_refused_and_left_alone(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "precious"
    path.write_bytes(content)
    with pytest.raises(LocalspecError, match="not a localspec speculation-memory file"):
        MemoryBank(1.0, path, "model-a")
    assert path.read_bytes() == content


def test_a_device_is_refused() -> None:
    with pytest.raises(LocalspecError, match="not a regular file"):
        MemoryBank(1.0, Path(os.devnull), "model-a")


def test_an_empty_file_is_taken_as_an_empty_memory(tmp_path: Path) -> None:
    path = tmp_path / "mem.npz"
    path.touch()
    bank = MemoryBank(1.0, path, "model-a")
    bank.remember([1, 2, 3, 4, *ANSWER])
    bank.close()
    assert MemoryBank(1.0, path, "model-a").partition().lookup([1, 2, 3, 4], 2)[0] == ANSWER[:2]


def test_a_linked_memory_file_is_rewritten_through_its_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    real, link = tmp_path / "real" / "mem.npz", tmp_path / "mem.npz"
    _written(real)
    link.symlink_to(real)
    bank = MemoryBank(1.0, link, "model-a", 1000)
    bank.remember([9, 8, 7, 6, 5, 4])
    bank.close()
    assert link.is_symlink()
    assert MemoryBank(1.0, real, "model-a").partition().lookup([9, 8, 7, 6], 2)[0] == [5, 4]


def _rewritten(path: Path, **changes: np.ndarray) -> None:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays.update(changes)
    with path.open("wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "changes",
    [
        {"lengths": np.array([44.0])},  # not integers
        {"tokens": np.array([str(t) for t in [1, 2, 3, 4, *ANSWER]])},
        {"tokens": np.array([1, 2, 3, 4, *ANSWER[:-1], 10**9])},  # beyond the vocabulary
        {"tokens": np.array([-5, 2, 3, 4, *ANSWER])},
        {"partitions": np.array([1])},
        {"format": np.array(["x", "y"])},
    ],
)
def test_a_memory_file_with_wrong_contents_is_damaged_and_rebuilt(
    tmp_path: Path, capsys, changes: dict[str, np.ndarray]
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mem.npz"
    _written(path)
    _rewritten(path, **changes)
    bank = MemoryBank(1.0, path, "model-a", 1000)
    assert "is damaged" in capsys.readouterr().err
    assert bank.partition().n_tokens == 0
    bank.close()
    assert MemoryBank(1.0, path, "model-a", 1000).partition().n_tokens == 0


def test_one_writer_per_memory_file(tmp_path: Path) -> None:
    """Two writers would each save what they saw, the last erasing the other's answers."""
    path = tmp_path / "mem.npz"
    first = MemoryBank(1.0, path, "model-a")
    with pytest.raises(LocalspecError, match="is in use by another Engine"):
        MemoryBank(1.0, path, "model-a")
    first.remember([1, 2, 3, 4, *ANSWER])
    first.close()
    second = MemoryBank(1.0, path, "model-a")  # free once the first is closed
    assert second.partition().lookup([1, 2, 3, 4], 2)[0] == ANSWER[:2]
    second.close()
    assert list(tmp_path.iterdir()) == [path]  # no lock file beside the user's file


def test_a_file_of_a_newer_format_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "mem.npz"
    _written(path)
    _rewritten(path, format=np.array("localspec-spec-memory-2"))
    before = path.read_bytes()
    with pytest.raises(LocalspecError, match="written by a newer localspec"):
        MemoryBank(1.0, path, "model-a", 1000)
    assert path.read_bytes() == before


def test_a_lower_cap_keeps_the_newest_generations_and_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mem.npz"
    bank = MemoryBank(10.0, path, "model-a")
    docs = [[n, n + 1, n + 2, n + 3, *range(1000, 1000 + 5000)] for n in range(0, 400, 4)]
    for doc in docs:  # 100 generations of 5004 tokens
        bank.remember(doc)
    bank.close()
    capsys.readouterr()
    small = MemoryBank(0.1, path, "model-a")  # room for a few of them
    kept = small.partition()
    assert 0 < len(kept) < len(docs)
    assert f"the newest {len(kept)} of 100 earlier generations" in capsys.readouterr().err
    newest = [d.tolist() for d in kept.documents()]
    assert newest == docs[-len(kept) :]
