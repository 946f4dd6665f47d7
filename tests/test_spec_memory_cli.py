"""The speculation memory as users meet it: on by default in serve and chat, off with one
flag, kept in a file across `localspec run`s (a damaged file is rebuilt), one partition per
API key in serve."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from localspec.api import Engine
from localspec.cli import build_parser
from localspec.commands.flags import engine_options
from localspec.engine.loop import SpecConfig
from localspec.memory_bank import default_memory_file
from localspec.server.app import ServerSettings
from tests.test_cli import error_of, run_cli
from tests.test_server import LiveServer

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def options(*argv: str) -> dict:  # type: ignore[type-arg]
    return engine_options(build_parser().parse_args(list(argv)))


def test_the_python_api_drafts_as_long_as_the_command_line(smollm_path: Path) -> None:
    """Without ``spec``, ``Engine.load`` sizes drafts as the flags do: a lookup's up to its
    size-m, the rest 16; a ``SpecConfig`` given is kept."""
    for mode, n_max in (("ngram-simple", 48), ("suffix+ngram-simple", 48), ("none", 16)):
        with Engine.load(smollm_path, mode=mode, n_ctx=256) as engine:
            assert engine.spec.n_max == n_max == options("run", "--mode", mode)["spec"].n_max
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=256, spec=SpecConfig(8)) as engine:
        assert engine.spec.n_max == 8


def test_serve_and_chat_remember_by_default_and_run_does_not() -> None:
    for command in ("serve", "chat"):
        assert options(command)["mode"] == "suffix+ngram-simple"
        assert options(command)["spec"].n_max == 48  # a lookup first: the n-gram size-m
        off = options(command, "--no-spec-memory")
        assert off["mode"] == "ngram-simple" and off["spec_memory_mb"] == 0
        assert options(command, "--mode", "ngram-simple")["mode"] == "ngram-simple"
    assert options("run")["mode"] == "ngram-simple"
    kept = options("run", "--spec-memory", "mem.npz")
    assert kept["mode"] == "suffix+ngram-simple" and kept["spec_memory_path"] == "mem.npz"
    assert options("serve", "--spec-memory")["spec_memory_path"] is True
    for command in ("serve", "chat"):  # with a draft model: the memory before it
        assert options(command, "-md", "d.gguf")["mode"] == "suffix+draft-model"
        assert options(command, "-md", "d.gguf", "--no-spec-memory")["mode"] == "draft-model"
    assert options("run", "-md", "d.gguf")["mode"] == "draft-model"


@pytest.mark.slow
def test_a_draft_model_follows_the_memory(qwen_cpu_pair: Engine) -> None:
    """The chain serve and chat run with -md: remembered text drafted without the draft
    model, the rest by it; greedy output as plain decoding's, up to a measured near tie."""
    from localspec.lossless import compare

    mode = "suffix+draft-model"
    assert mode in qwen_cpu_pair.available_modes()
    plain = qwen_cpu_pair.generate(PROMPT, max_tokens=64, mode="none", record_margins=True)
    qwen_cpu_pair.generate(PROMPT, max_tokens=64, mode=mode)  # remembered
    again = qwen_cpu_pair.generate(PROMPT, max_tokens=64, mode=mode)
    report = compare(plain.tokens, plain.margins, again.tokens, plain.runners_up)
    assert report.ok, report
    by = again.stats.by_drafter_dict()
    assert by["suffix"]["accepted"] >= 32  # the earlier answer, drafted from memory


def test_memory_flags_are_checked(capsys, qwen_path: Path) -> None:  # type: ignore[no-untyped-def]
    q = str(qwen_path)
    err = error_of(capsys, "run", q, "--mode", "suffix", "--no-spec-memory", "-n", "4")
    assert "turned off" in err and "--no-spec-memory" in err
    err = error_of(capsys, "serve", q, "--spec-memory", "m.npz", "--no-spec-memory")
    assert "not allowed with argument" in err
    assert "--spec-memory-mb: 0 is out of range" in error_of(
        capsys, "run", q, "--spec-memory-mb", "0"
    )
    err = error_of(capsys, "run", q, "--no-spec-memory", "--spec-memory-mb", "10")
    assert "turns off" in err
    # PATH is optional: a model written after the flag would be taken for the file
    err = error_of(capsys, "run", "--spec-memory", "qwen2.5-coder-0.5b", "-p", "x")
    assert "that is a model" in err and "before the flag" in err
    assert "that is a model" in error_of(capsys, "run", q, "--spec-memory", q)
    # after a model too: a memory file named like a catalog model would hide that model
    err = error_of(capsys, "run", q, "--spec-memory", "smollm2-135m", "-p", "x")
    assert "that is a model" in err and "named like a catalog model" in err
    assert "the path is empty" in error_of(capsys, "run", q, "--spec-memory", "")


def test_a_file_that_hides_a_catalog_name_is_named(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").write_bytes(b"PK\x03\x04 not a model")
    err = error_of(capsys, "run", "smollm2-135m", "-p", "x")
    assert "hides the catalog model smollm2-135m" in err and "rename or move" in err


@pytest.mark.slow
def test_run_remembers_across_processes_through_the_file(qwen_path: Path, tmp_path: Path) -> None:
    memory = tmp_path / "memory.npz"
    args = ("run", str(qwen_path), "-p", PROMPT, "-n", "48", "--spec-memory", str(memory))
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert memory.exists()
    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    assert "[suffix+ngram-simple]" in second.stdout + second.stderr
    line = next(x for x in second.stderr.splitlines() if x.strip().startswith("suffix: drafted"))
    assert int(line.split("drafted")[1].split(",")[0]) >= 32  # drafted from the first answer
    assert "speculation memory: 1 earlier generation from" in second.stderr
    memory.write_bytes(memory.read_bytes()[:300])  # a memory file cut short
    damaged = run_cli(*args)
    assert damaged.returncode == 0 and "is damaged" in damaged.stderr
    assert len(memory.read_bytes()) > 300  # rebuilt: a whole numpy archive again
    notes = tmp_path / "notes.txt"
    notes.write_text("not a memory file")
    foreign = run_cli(*args[:-1], str(notes))
    assert foreign.returncode == 2 and "refusing to overwrite it" in foreign.stderr
    assert notes.read_text() == "not a memory file"


@pytest.mark.slow
def test_compare_keeps_its_plain_runs_out_of_the_memory(qwen_path: Path, tmp_path: Path) -> None:
    """The plain baselines of --compare are not remembered: the speculative run would copy
    them and report a speedup no new request gets."""
    memory = tmp_path / "memory.npz"
    args = ("run", str(qwen_path), "-p", PROMPT, "-n", "24", "--compare", "--json")
    done = run_cli(*args, "--spec-memory", str(memory))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["by_drafter"].get("suffix", {}).get("drafted", 0) == 0
    with np.load(memory) as kept:
        assert kept["lengths"].size == 1  # the speculative run only


@pytest.mark.slow
def test_each_api_key_has_its_own_memory(qwen_path: Path, tmp_path: Path) -> None:
    with (
        Engine.load(
            qwen_path, mode="suffix+ngram-simple", spec_memory_path=tmp_path / "m.npz"
        ) as engine,
        LiveServer(engine, ServerSettings(api_keys=("alice", "bob"))) as url,
    ):

        def ask(key: str) -> dict:  # type: ignore[type-arg]
            reply = httpx.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": 48,
                    "temperature": 0,
                },
                timeout=300,
            )
            reply.raise_for_status()
            return reply.json()["speculative"]["by_drafter"].get("suffix", {"drafted": 0})

        assert ask("alice")["drafted"] == 0  # nothing remembered yet
        assert ask("bob")["drafted"] == 0  # alice's answer is not bob's memory
        assert ask("alice")["drafted"] >= 32  # her own first answer is
    assert (tmp_path / "m.npz").exists()  # saved when the engine closed


def test_the_default_file_is_one_per_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    path = default_memory_file(Path("/models/qwen.gguf"))
    assert path == tmp_path / "spec-memory" / "qwen.npz"
