"""Bad input as users type it: every case ends with a non-zero exit status and one clear
line saying what is wrong, never a traceback or an internal error, and before any long
work starts (cases that would otherwise load a model name one that does not exist, so a
check that came too late would report the missing model instead)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.engine.loop import SpecConfig

MISSING = "/nonexistent/model.gguf"


def outcome(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """Exit status and everything printed, as the command line would see them."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a flag value with exit status 2
        code = exc.code if isinstance(exc.code, int) else 1
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def assert_refused(code: int, text: str, expected: str) -> None:
    assert code not in (0, 70), text  # 70: the catch-all for bugs
    assert "Traceback" not in text and "internal error" not in text, text
    assert expected in text, text


# (argv, what the error line must say)
FLAG_CASES = [
    # numbers: nan/inf slip through comparisons, so they are refused by the flag types
    (["run", MISSING, "--temp", "nan"], "argument --temp: 'nan' is not a finite number"),
    (["run", MISSING, "--temp", "inf"], "'inf' is not a finite number"),
    (["run", MISSING, "--temp", "-1"], "must be within [0, 100]"),
    (["run", MISSING, "--top-p", "nan"], "argument --top-p: 'nan' is not a finite number"),
    (["run", MISSING, "--top-p", "0"], "must be within (0, 1]"),
    (["run", MISSING, "--min-p", "2"], "argument --min-p: 2 is out of range"),
    (["run", MISSING, "--top-k", "-1"], "argument --top-k: -1 is out of range"),
    (["run", MISSING, "-s", "-2"], "(-1: a random seed)"),
    # structured output: refused before any model loads
    (["run", MISSING, "--json-schema", "[1, 2]"], "--json-schema: a schema is a JSON object"),
    (["run", MISSING, "--json-schema", "nofile.json"], "'nofile.json': no such file"),
    (["run", MISSING, "--json-schema", "{bad"], "not valid JSON"),
    (
        ["run", MISSING, "--json-schema", '{"type": "string", "minLength": 5, "maxLength": 2}'],
        "cannot be satisfied: at the schema: minLength 5 and maxLength 2 leave nothing",
    ),
    (["run", MISSING, "--json-schema", '{"type": 3}'], "cannot be turned into a grammar"),
    (["run", MISSING, "--json-schema", "{}", "--grammar", "g"], "not allowed with argument"),
    (["run", MISSING, "-s", str(1 << 64)], "argument -s/--seed"),
    (["run", MISSING, "-s", "abc"], "'abc' is not an integer"),
    (["run", MISSING, "-n", "0"], "argument -n/--n-predict/--max-tokens: 0 is out of range"),
    (["run", MISSING, "-c", "1"], "too small a context: give at least 64"),
    (["run", MISSING, "-c", "-5"], "argument -c/--ctx-size"),
    (["run", MISSING, "--threads", "0"], "argument -t/--threads: 0 is out of range"),
    (["run", MISSING, "--threads", "-1"], "leave -t out to use every physical core"),
    (["run", MISSING, "-ngl", "-2"], "argument -ngl/--gpu-layers/--n-gpu-layers"),
    (["run", MISSING, "--flash-attn", "maybe"], "argument -fa/--flash-attn: invalid choice"),
    (["run", MISSING, "--spec-draft-n-max", "0"], "argument --spec-draft-n-max"),
    (["run", MISSING, "--spec-draft-p-min", "nan"], "argument --spec-draft-p-min"),
    (["run", MISSING, "--spec-ngram-simple-size-n", "0"], "--spec-ngram-simple-size-n"),
    (["pairs", MISSING, "-c", "-5"], "argument -c/--ctx-size"),
    (["chat", MISSING, "--temp", "nan"], "argument --temp"),
    (["chat", MISSING, "-n", "-3"], "argument -n/--n-predict"),
    (["probe", MISSING, "--temp", "inf"], "argument --temp"),
    (["probe", MISSING, "-n", "0"], "argument -n/--n-predict"),
    (["probe", MISSING, "-s", "-7"], "argument -s/--seed"),
    (["probe", MISSING, "--threads", "0"], "argument -t/--threads"),
    (["probe", MISSING, "--lengths", "4,x"], "--lengths '4,x': not a list of integers"),
    (["probe", MISSING, "--lengths", "0"], "lengths must be >= 1"),
    (["bench", MISSING, "--temps", "nan"], "--temps 'nan': not a comma-separated list"),
    (["bench", MISSING, "--temps", "0,x"], "--temps '0,x'"),
    (["bench", MISSING, "--repeat", "0"], "argument --repeat"),
    (["bench", MISSING, "--modes", ""], "--modes is empty"),
    (["bench", MISSING, "--scenarios", "agent", "--modes", ""], "--modes is empty"),
    (["bench", MISSING, "--scenarios", "agent", "--prompts", "qa"], "--prompts does not apply"),
    (["bench", MISSING, "-c", "0", "--threads", "-1"], "argument -t/--threads"),
    (["serve", MISSING, "--port", "70000"], "argument --port: 70000 is out of range"),
    (
        ["serve", MISSING, "-np", "0"],
        "argument -np/--parallel: 0 is out of range: must be between 1 and 64",
    ),
    (
        ["serve", MISSING, "-np", "100"],
        "argument -np/--parallel: 100 is out of range: must be between 1 and 64",
    ),
    (["serve", MISSING, "--max-queue", "-1"], "argument --max-queue"),
    # a mistyped flag: the one it was meant to be
    (["serve", MISSING, "--paralel", "2"], "hint: did you mean --parallel?"),
    (["bench", MISSING, "--concurency=1,2"], "hint: did you mean --concurrency?"),
    (["doctor", MISSING, "-c", "3"], "too small a context"),
    # draft length: more than one verification batch holds, refused before anything loads
    (["run", MISSING, "--spec-draft-n-max", "100000"], "at most 511 drafted tokens"),
    (["bench", MISSING, "--spec-draft-n-max", "512"], "at most 511 drafted tokens"),
    (["serve", MISSING, "--port", "0", "--spec-ngram-simple-size-m", "999"], "at most 511"),
    # pull: what the hub would refuse, said before any network access
    (["pull", "bad repo/x y:z.gguf"], "is not a valid Hugging Face repo id"),
    (["pull", "../..:etc/passwd"], "is not a valid Hugging Face repo id"),
    (["pull", "foo/bar:../../x.gguf"], "must not contain '..'"),
    (["pull", "foo/bar:/etc/x.gguf"], "must be a relative path inside the repo"),
    (["pull", "foo/bar:notes.txt"], "'notes.txt' is not a .gguf file"),
    (["pull", "a/b/c"], "must be a Hugging Face repo id OWNER/NAME"),
    # chat: a missing model is an error line before the full-screen interface starts
    (["chat", "MISSING-MODEL"], "'MISSING-MODEL' is neither a .gguf file nor a model"),
    (["chat", MISSING], "model file not found"),
]


@pytest.mark.parametrize(("argv", "expected"), FLAG_CASES, ids=lambda v: " ".join(v)[:60])
def test_bad_flags_are_refused_with_one_clear_line(capsys, argv, expected) -> None:  # type: ignore[no-untyped-def]
    code, text = outcome(capsys, argv)
    assert_refused(code, text, expected)
    # refused by argparse or after, the line names the command the same way
    assert f"localspec {argv[0]}: error: " in text, text


def test_chat_with_a_missing_draft(capsys, smollm_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, text = outcome(capsys, ["chat", str(smollm_path), "-md", "nope-draft"])
    assert_refused(code, text, "'nope-draft' is neither a .gguf file nor a model")


def test_chat_with_a_memory_file_it_cannot_write(capsys, smollm_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # refused on the terminal, before the full-screen interface starts
    memory = str(tmp_path / "no" / "memory.npz")
    code, text = outcome(capsys, ["chat", str(smollm_path), "--spec-memory", memory])
    assert_refused(code, text, f"the directory {tmp_path / 'no'} does not exist")
    assert "(spec_memory_path)" not in text  # the flag as typed, not the API's name


def test_output_paths_and_tools_are_checked_before_the_bench_runs(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    link, model = tmp_path / "report.json", tmp_path / "model.txt"
    link.symlink_to(tmp_path / "gone" / "deeper" / "report.json")  # a link into nowhere
    model.write_bytes(b"GGUF" + bytes(60))  # a model, whatever its name
    cases = [
        (["--json", str(tmp_path)], f"--json {tmp_path}: is a directory, not a file"),
        (["--markdown", str(tmp_path)], "--markdown"),
        (["--plot", str(tmp_path / "no" / "x.png")], "does not exist"),
        # writable by its permission bits (for root), not in fact
        (
            ["--json", "/proc/bench.json"],
            "--json /proc/bench.json: cannot write there (the file system there takes no new",
        ),
        (["--native", "/nope"], "--native /nope: no executable llama-speculative-simple"),
        (["--plot", str(tmp_path / "x.txt")], "matplotlib writes no 'txt' images"),
        (["--json", str(link)], f"a link into {link.resolve().parent}, which does not exist"),
        (["--markdown", str(model)], "is a model (GGUF), not overwritten"),
    ]
    for extra, expected in cases:
        # the model does not exist either: the output check must come first
        assert_refused(*outcome(capsys, ["bench", MISSING, *extra]), expected)
    assert not (tmp_path / "gone").exists()  # nothing created on the way


def test_a_busy_port_is_refused_before_the_model_loads(capsys) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        code, text = outcome(capsys, ["serve", MISSING, "--port", port])
    assert_refused(code, text, f"cannot listen on 127.0.0.1:{port}")


def test_a_prompt_file_of_the_wrong_shape(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompts = tmp_path / "p.toml"
    prompts.write_text("prompt = [1, 2]\n")
    code, text = outcome(capsys, ["probe", MISSING, "--prompts", str(prompts)])
    assert_refused(code, text, "prompt #1 is not a table")
    code, text = outcome(capsys, ["run", MISSING, "-f", str(tmp_path)])
    assert_refused(code, text, "cannot read the prompt file")


CATALOG_HEAD = 'default_model = "a"\n\n[[model]]\nname = "a"\nrepo = "org/a"\nfile = "a.gguf"\n'
CATALOG_CASES = [
    (
        CATALOG_HEAD + '\n[[model]]\nname = "b"\nderive = { from = "b", ftype = "F16" }\n',
        "models.toml:8: model 'b': field 'derive.from' makes a loop of derivations (b -> b)",
    ),
    (
        CATALOG_HEAD
        + '\n[[model]]\nname = "b"\nderive = { from = "c", ftype = "F16" }\n'
        + '\n[[model]]\nname = "c"\nderive = { from = "b", ftype = "Q8_0" }\n',
        "makes a loop of derivations (b -> c -> b)",
    ),
    ('default_model = "a"\nmodel = 5\n', "'model' must be an array of tables"),
    ("pair = 5\n" + CATALOG_HEAD, "'pair' must be an array of tables"),
    (CATALOG_HEAD.replace('"a.gguf"', '"../../x.gguf"'), "field 'file' must not contain '..'"),
    (CATALOG_HEAD.replace('"org/a"', '"bad repo"'), "field 'repo' must be a Hugging Face repo"),
    (CATALOG_HEAD.replace('default_model = "a"', "default_model = [1]"), "'default_model' ="),
    (CATALOG_HEAD + "\n[[pair]]\ntarget = [1]\ndraft = 2\n", "field 'target' names unknown"),
    (CATALOG_HEAD + "size = true\n", "field 'size' must be a positive integer"),
]


@pytest.mark.parametrize(("text", "expected"), CATALOG_CASES)
def test_bad_catalogs_in_every_command(capsys, monkeypatch, tmp_path, text, expected) -> None:  # type: ignore[no-untyped-def]
    catalog = tmp_path / "models.toml"
    catalog.write_text(text)
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(catalog))
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for argv in (["run", "a"], ["models"], ["pull", "a"], ["pairs", "a"], ["probe", "a"]):
        assert_refused(*outcome(capsys, argv), expected)


def test_a_catalog_that_is_not_utf8(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    catalog = tmp_path / "models.toml"
    catalog.write_bytes(CATALOG_HEAD.encode() + b'description = "caf\xe9"\n')
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(catalog))
    code, text = outcome(capsys, ["models"])
    assert_refused(code, text, f"{catalog}:7: the model catalog is not UTF-8 text")


def localspec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_seed_minus_one_is_a_random_seed(smollm_path: Path) -> None:
    """llama.cpp's convention; it used to end in a ValueError from numpy."""
    done = localspec("run", str(smollm_path), "-p", "hi", "-n", "4", "--mode", "none",
                     "-s", "-1", "--temp", "0.7")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_context_zero_is_the_models_trained_length(smollm_path: Path) -> None:
    done = localspec("run", str(smollm_path), "-p", "hi", "-n", "2", "-c", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert "context: 8192 tokens (-c 0: the model's trained length, 8192)" in done.stderr
    assert json.loads(done.stdout)["n_tokens"] == 2


def test_a_draft_longer_than_a_small_contexts_batch(capsys, smollm_path: Path) -> None:  # type: ignore[no-untyped-def]
    argv = ["run", str(smollm_path), "-c", "128", "--spec-draft-n-max", "200", "-p", "hi"]
    assert_refused(*outcome(capsys, argv), "at most 127 drafted tokens")


def test_internal_errors_are_one_line_unless_debugging(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The last line of defence: a bug still prints one line (and exit status 70)."""
    import localspec.commands.models as models

    def broken(_args: object) -> int:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(models, "run", broken)
    code, text = outcome(capsys, ["models"])
    assert code == 70 and "Traceback" not in text
    assert "internal error: ZeroDivisionError: boom" in text and "LOCALSPEC_DEBUG=1" in text
    monkeypatch.setenv("LOCALSPEC_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["models"])


def test_subprocess_output_has_no_traceback(tmp_path: Path) -> None:
    """The same guarantee seen from outside, for a handful of the cases above."""
    for argv in (
        ["run", MISSING, "--temp", "nan"],
        ["pull", "../..:etc/passwd"],
        ["bench", MISSING, "--json", str(tmp_path)],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "localspec", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1


def test_a_full_disk_is_the_machine_s_failure_not_a_bug() -> None:
    with open("/dev/full", "w") as full:  # every write: no space left on device
        done = subprocess.run(
            [sys.executable, "-m", "localspec", "models"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "localspec models: error: the output: No space left on device",
        "  hint: free some space, or write elsewhere",
    ]


# ----- chat files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON (nested too deeply)"),
        (
            '{"format": "localspec-chat", "version": 1, "system": 5, "messages": []}',
            "field 'system' is damaged (not valid Unicode text)",
        ),
        (
            '{"format": "localspec-chat", "version": 1, "messages": '
            '[{"role": "user", "content": "a\\ud800"}]}',
            "field 'messages' is damaged",
        ),
        (
            '{"format": "localspec-chat", "version": 99, "messages": []}',
            "saved by a newer localspec (chat file version 99",
        ),
        ('{"format": "localspec-chat", "version": "1", "messages": []}', "'version' is damaged"),
    ],
    ids=["deep", "system", "surrogate", "newer", "version-text"],
)
def test_damaged_chat_files_are_refused(tmp_path: Path, content: str, expected: str) -> None:
    from localspec.errors import LocalspecError
    from localspec.tui.session import ChatSession

    path = tmp_path / "chat.json"
    path.write_text(content)
    with pytest.raises(LocalspecError, match=re.escape(expected)):
        ChatSession.load(path)


def test_saving_a_chat_never_replaces_another_file(tmp_path: Path) -> None:
    """Notes, a pipe (or a device) or a folder at the chosen path are refused and left as
    they are; a link is written through; an earlier chat file is replaced."""
    from localspec.errors import LocalspecError
    from localspec.tui.session import ChatSession

    chat = ChatSession(None, [{"role": "user", "content": "hi"}])
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for path in (notes, pipe, tmp_path):
        with pytest.raises(LocalspecError, match="not replaced"):
            chat.save(path, "model")
    assert notes.read_text() == "my notes" and stat.S_ISFIFO(pipe.stat().st_mode)
    saved = tmp_path / "chat.json"
    chat.save(saved, "model")
    link = tmp_path / "link.json"
    link.symlink_to(saved.name)
    ChatSession(None, [{"role": "user", "content": "again"}]).save(link, "model")
    assert link.is_symlink() and ChatSession.load(saved).turns[0]["content"] == "again"


async def test_chat_exits_with_the_error_when_the_model_cannot_load(
    tmp_path: Path, smollm_path
) -> None:  # type: ignore[no-untyped-def]
    """A file that looks like a GGUF but that llama.cpp cannot load: the chat does not stay
    open without a model, it exits and `localspec chat` prints the error (exit status 2)."""
    from localspec.tui.app import ChatApp, ChatOptions

    broken = tmp_path / "broken.gguf"
    with smollm_path.open("rb") as src:
        broken.write_bytes(src.read(3_000_000))
    app = ChatApp(ChatOptions(target=str(broken)))
    async with app.run_test(size=(80, 24)) as pilot:
        while app.is_running and app.load_error is None:
            await pilot.pause(0.05)
    assert app.return_code == 2 and app.load_error is not None
    assert "truncated" in str(app.load_error)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", MISSING, "--stop", ""], "argument --stop: must not be empty"),
        (["serve", MISSING, "--allowed-origins", "evil"], "'evil' is not a web origin"),
        (["pull", "foo/bar:"], "names no file after ':'"),
        (["pull", "nonsense repo!!"], "OWNER/NAME[:FILE.gguf]"),
        (["serve", MISSING, "--host", "not a host!", "--port", "0"], "cannot listen on"),
        (["serve", MISSING, "--host", "\x00", "--port", "0"], "is not a host name or address"),
        (["serve", MISSING, "--no-such-flag"], "see `localspec serve --help`"),
        # flags a command would ignore are not offered
        (["bench", MISSING, "--mode", "draft-self"], "--mode could match --model-draft, --modes"),
        (["doctor", MISSING, "-md", MISSING], "unrecognized arguments: -md"),
        (["bench", MISSING, "--modes", "none,auto"], "unknown mode 'auto'"),
        (["probe", MISSING, "--lengths", "8,600"], "--lengths '8,600': a draft holds at most 511"),
    ],
)
def test_more_bad_input_found_by_trying(capsys, argv, expected) -> None:  # type: ignore[no-untyped-def]
    code, text = outcome(capsys, argv)
    assert_refused(code, text, expected)
    assert "usage:" not in text  # one line and a hint, not argparse's usage block
    assert "warning" not in text  # nothing said before the error about what never happened


def test_a_flash_attention_setting_is_checked_before_any_model_loads() -> None:
    from localspec import Engine, LocalspecError
    from localspec.engine.model_context import ContextOptions, flash_attn_setting

    with pytest.raises(LocalspecError, match="not a flash-attention setting"):
        Engine.load(MISSING, flash_attn="maybe")  # type: ignore[arg-type]
    # "auto" is off when every layer stays on the CPU; an explicit choice is kept
    assert flash_attn_setting(ContextOptions(n_gpu_layers=0)) == "off"
    assert flash_attn_setting(ContextOptions(n_gpu_layers=0, flash_attn="on")) == "on"
    assert flash_attn_setting(ContextOptions(n_gpu_layers=99, flash_attn="off")) == "off"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"spec_memory_mb": "50"}, "spec_memory_mb must be a finite number"),
        ({"spec_memory_mb": float("inf")}, "spec_memory_mb must be a finite number"),
        ({"spec_memory_mb": -5}, "spec_memory_mb must be a finite number"),
        ({"mode": 5}, "mode must be a mode's name"),
        ({"mode": ""}, "mode must be a mode's name"),
        ({"n_ctx": "256"}, "n_ctx must be a whole number"),
        ({"n_ctx": 10}, "too small a context"),
        ({"n_threads": 0}, "n_threads must be >= 1"),
        ({"n_gpu_layers": "x"}, "n_gpu_layers must be a whole number"),
        ({"spec": {"n_max": 4}}, "spec must be a SpecConfig"),
        ({"ngram": {"size_n": 3}}, "ngram must be an NgramParams"),
        ({"progress": 5}, "progress must be a function"),
        ({"spec_memory_path": 5}, "spec_memory_path must be a file path, True or None"),
        ({"spec_memory_mb": 0, "spec_memory_path": "m.bin"}, "spec_memory_mb=0 turns the memory"),
    ],
)
def test_python_api_arguments_of_the_wrong_type_are_refused_before_loading(
    options: dict, expected: str
) -> None:  # type: ignore[type-arg]
    from localspec import Engine, LocalspecError

    with pytest.raises(LocalspecError, match=expected):
        Engine.load(MISSING, **options)


def test_a_context_no_memory_could_hold_is_refused_at_once(smollm_path: Path) -> None:
    """llama.cpp would spend a minute trying to allocate it before failing."""
    from localspec import Engine, LocalspecError

    with pytest.raises(LocalspecError, match=r"needs about \d+ GiB for its cache"):
        Engine.load(smollm_path, n_ctx=10**9)


def test_a_memory_partition_is_a_name(qwen) -> None:  # type: ignore[no-untyped-def]
    from localspec import LocalspecError

    with pytest.raises(LocalspecError, match="memory_partition must be a string"):
        qwen.generate("x", max_tokens=2, memory_partition=3)


WRONG_GENERATION_ARGUMENTS = [
    ({"max_tokens": "5"}, "max_tokens must be a whole number"),
    ({"max_tokens": 2.5}, "max_tokens must be a whole number"),
    ({"max_tokens": True}, "max_tokens must be a whole number"),
    ({"temperature": None}, "temperature must be a number"),
    ({"top_p": "0.9"}, "top_p must be a number"),
    ({"top_k": 1.5, "temperature": 0.8}, "top_k must be a whole number"),
    ({"stop": [1]}, "stop must be a non-empty string"),
    ({"stop": [""]}, "stop must be a non-empty string"),
    ({"stop": None}, "stop must be a non-empty string"),
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"logprobs": -1}, "logprobs must be >= 0"),
    ({"spec": {"n_max": 4}}, "spec must be a SpecConfig"),
    ({"grammar": {"type": "object"}}, "grammar must be a string"),
    ({"grammar": ""}, "grammar is empty"),
    ({"remember": "no"}, "remember must be True or False"),
    ({"tools": [{"type": "function"}]}, "tool #1 is not a function tool"),
    ({"settings": {"max_tokens": 4}}, "settings must be a GenerationSettings"),
    ({"prompt": None}, "the prompt must be text or chat messages"),
    ({"prompt": ["hi"]}, "chat message #1 is not a dict"),
    ({"prompt": []}, "the chat has no messages"),
    ({"prompt": [{"role": "wizard", "content": "hi"}]}, "has the role 'wizard'"),
    # the Python names, not the command line's flags
    ({"temperature": -1.0}, "temperature must be a number >= 0"),
    ({"top_p": 2.0}, "top_p must be within (0, 1]"),
    ({"seed": 2**70}, "seed must be between 0 and 2^64-1"),
    ({"spec": SpecConfig(n_max=0)}, "n_max (--spec-draft-n-max) must be >= 1"),
    ({"temprature": 0.5}, "unknown generation setting 'temprature'"),
]


def test_generation_arguments_of_the_wrong_type_are_refused(qwen) -> None:  # type: ignore[no-untyped-def]
    """Each a LocalspecError naming the argument (not a TypeError from numpy or ctypes), and
    the engine answers as before afterwards."""
    from localspec import LocalspecError

    # reproducible: whatever an earlier test left cached, the prompt is read as afresh
    before = qwen.generate("def add(a, b):", max_tokens=6, mode="none", reproducible=True).tokens
    for arguments, expected in WRONG_GENERATION_ARGUMENTS:
        kwargs = {"prompt": "def add(a, b):", "max_tokens": 6, **arguments}
        with pytest.raises(LocalspecError, match=re.escape(expected)) as refused:
            qwen.generate(**kwargs)
        assert "--temp " not in str(refused.value) and "--top-p" not in str(refused.value)
    with pytest.raises(LocalspecError) as misspelt:
        qwen.generate("x", max_tokens=2, temprature=0.5)
    assert misspelt.value.hint == "did you mean temperature?"
    again = qwen.generate("def add(a, b):", max_tokens=6, mode="none", reproducible=True)
    assert again.tokens == before
    # a string is one stop string, as in OpenAI's API (not one per character)
    kwargs = {"max_tokens": 16, "mode": "none", "reproducible": True}
    full = qwen.generate("def add(a, b):", **kwargs).text
    assert " + " in full
    stopped = qwen.generate("def add(a, b):", **kwargs, stop=" + ").text
    assert stopped == full.split(" + ")[0]


def test_an_empty_prompt_is_refused_before_the_model_loads(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_refused(*outcome(capsys, ["run", MISSING, "-p", ""]), "-p: the prompt is empty")
    assert_refused(*outcome(capsys, ["run", MISSING, "-f", str(empty)]), "the prompt is empty")


def test_an_empty_grammar_file(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.gbnf"
    empty.write_text("\n")
    code, text = outcome(capsys, ["run", MISSING, "--grammar", str(empty)])
    assert_refused(code, text, f"--grammar {empty}: the file is empty")


@pytest.mark.slow
def test_a_named_draft_that_cannot_be_found(capsys, smollm_path: Path) -> None:  # type: ignore[no-untyped-def]
    """pairs still judges the others, then says so; probe says so before measuring."""
    code, text = outcome(capsys, ["pairs", str(smollm_path), MISSING, "--no-hf-cache"])
    assert code == 2 and f"draft '{MISSING}'" in text and "unreadable" in text
    argv = ["probe", str(smollm_path), "--candidates", MISSING, "--modes", "draft-model"]
    code, text = outcome(capsys, argv)
    assert code == 2 and f"draft '{MISSING}'" in text and "plain" not in text


def test_the_library_reports_through_logging_not_on_stderr(smollm_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    """A program using the Python API chooses what it shows (``localspec.status`` records);
    the command line shows every line on stderr."""
    from localspec import Engine
    from localspec.progress import STATUS

    saved = (STATUS.handlers[:], STATUS.level, STATUS.propagate)
    STATUS.handlers.clear()  # a library's defaults (the command line may have run here)
    STATUS.setLevel(logging.NOTSET)
    STATUS.propagate = True
    records: list[logging.LogRecord] = []
    keep = logging.Handler()
    keep.emit = records.append  # type: ignore[method-assign]
    many = 4 * (os.cpu_count() or 1)
    try:
        Engine.load(smollm_path, n_ctx=0, mode="none").close()
        assert "context:" not in capfd.readouterr().err
        STATUS.addHandler(keep)
        STATUS.setLevel(logging.INFO)
        Engine.load(smollm_path, n_ctx=0, n_threads=many, mode="none").close()
    finally:
        STATUS.handlers[:], STATUS.level, STATUS.propagate = saved
    said = {r.getMessage().split(":")[0]: r.levelno for r in records}
    assert said["context"] == logging.INFO
    assert said[f"{many} threads on {os.cpu_count()} logical cores"] == logging.WARNING
