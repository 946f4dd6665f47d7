"""`localspec bench` on a tiny run with a real model, the native runner's command line, and
`localspec doctor`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from localspec import native
from localspec.bench import NativeCellRun, Run, run_cells, summarise
from localspec.cli import main
from localspec.engine.costs import VerifyCost
from localspec.engine.spec_memory import SpecMemory
from localspec.engine.stats import Stats
from localspec.prompts import PromptCase


@pytest.mark.slow
def test_tiny_bench_writes_json_markdown_and_png(capsys, tmp_path: Path, smollm_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    png = tmp_path / "bench.png"
    code = main(
        [
            "bench",
            str(smollm_path),
            "--modes",
            "none,ngram-simple",
            "--prompts",
            "code-edit,chat",  # chat: a multi-turn conversation from the suite
            "--temps",
            "0,0.7",
            "-n",
            "16",
            "--repeat",
            "1",
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    cells = {(c["mode"], c["kind"], c["temperature"]): c for c in report["cells"]}
    assert set(cells) == {
        (m, k, t)
        for m in ("none", "ngram-simple")
        for k in ("code-edit", "chat")
        for t in (0.0, 0.7)
    }
    for key, cell in cells.items():
        assert cell["tokens_per_s_median"] > 0
        if key[0] == "none":
            assert cell["speedup_median"] == pytest.approx(1.0)
            assert cell["predicted_median"] is None
        else:  # the clock-free figure beside the measured one
            assert 0.1 < cell["predicted_median"] <= report["ceiling"] * 1.1
        if key[2] == 0.0:
            assert cell["exact_match"] in ("identical", "near tie")
    assert report["ceiling"] > 1.0
    assert "| ngram-simple | code-edit | 0 |" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr()
    assert "ceiling on this machine" in printed.out  # the results: `bench > results.txt`
    assert "tok/s" in printed.err and "ceiling on this machine" not in printed.err  # progress


def test_speedups_come_from_the_raw_timings() -> None:
    from localspec.bench import Run, summarise

    def run(mode: str, tps: float, repeat: int) -> Run:
        return Run(
            mode, "p", "qa", 0.7, repeat, 10, 1000 * 10 / tps, tps, 4, 2, 1.5, (0.5,), 1.0, 9.0
        )

    cells = summarise(
        [
            run("none", 20, 0),
            run("ngram-simple", 30, 0),
            run("none", 10, 1),
            run("ngram-simple", 12, 1),
        ]
    )
    spec = next(c for c in cells if c.mode == "ngram-simple")
    assert spec.speedup_min == pytest.approx(1.2) and spec.speedup_max == pytest.approx(1.5)
    assert spec.speedup_median == pytest.approx(1.35)
    assert spec.tokens_per_s_min == 12 and spec.draft_share == pytest.approx(0.1)


def test_a_divergence_says_how_far_from_a_tie_it_is() -> None:
    from localspec.bench import Run, exact_match

    def run(mode: str, tokens: tuple[int, ...]) -> Run:
        return Run(mode, "p", "qa", 0.0, 0, 3, 1.0, 1.0, 0, 0, 1.0, (), 0.0, 0.0, tokens,
                   (2.0, 0.61, 3.0), ((), (), ()))  # fmt: skip

    plain = {("p", 0.0, 0): run("none", (1, 2, 3))}
    assert exact_match([run("ngram-simple", (1, 8, 3))], plain) == "DIVERGED (gap 0.61)"
    assert exact_match([run("ngram-simple", (1, 2, 3))], plain) == "identical"


def test_native_command_line_and_output_parsing(tmp_path: Path) -> None:
    s = native.NativeSettings(
        tmp_path, Path("/m/t.gguf"), Path("/m/d.gguf"), 64, 2, 4096, 8, flash_attn="off"
    )
    cmd = native.command(s, "draft-model", Path("/tmp/p.txt"), 0.0)
    assert cmd[0] == str(tmp_path / "llama-speculative-simple")
    joined = " ".join(cmd)
    for part in (
        "-m /m/t.gguf",
        "-md /m/d.gguf",
        "--spec-type draft-simple",
        "-f /tmp/p.txt",
        "-n 64",
        "--temp 0",
        "-t 2",
        "-c 4096",
        "-fa off",
        "--spec-draft-n-max 8",
    ):
        assert part in joined
    ngram = " ".join(native.command(s, "ngram-simple", Path("/tmp/p.txt"), 0.7, seed=2))
    assert "--spec-type ngram-simple" in ngram and "-md" not in ngram
    # each repeat samples its own answer, as localspec's repeats do
    assert "--seed 2" in ngram and "--seed 0" in joined
    # the distribution localspec's bench samples from: temperature alone
    assert "--top-k 0 --top-p 1 --min-p 0" in ngram
    # llama.cpp drops a prompt file's last newline: the chat prompt's own must survive it
    assert native.prompt_file_text("<|im_start|>assistant\n").endswith("assistant\n\n")
    parsed = native.parse_run(
        "encoded  12 tokens in 0.1 seconds\n"
        "decoded   64 tokens in    1.234 seconds, speed:   51.864 t/s\n"
        "n_draft   = 48\nn_drafted = 96\nn_accept  = 61\naccept    = 63.5%"
    )
    assert parsed == native.NativeRun(pytest.approx(51.864), 96, 61)
    # its last round overshoots the tokens asked for: those extra tokens are not counted
    over = native.parse_run("decoded  241 tokens in    9.047 seconds, speed:   26.638 t/s\n", 192)
    assert over.tokens_per_s == pytest.approx(192 / 9.047)
    assert native.parse_run("decoded  64 tokens in 1.234 seconds, speed: 51.864 t/s", 64) == (
        native.NativeRun(pytest.approx(51.864), 0, 0)
    )


def test_the_native_tools_answer_is_compared_with_plain_decodings() -> None:
    """At T=0 the tool should write the model's greedy answer; where its verify batches tip a
    near tie it writes (and is timed on) another text, and the cell says so."""
    from localspec.commands.bench import native_texts

    prompt = "<|im_start|>user\nRewrite it.<|im_end|>\n<|im_start|>assistant\n"
    printed = f"\n\n{prompt}Bonjour, le 21 c'était l'ancienne date\n\n\n\n"
    assert native.answer_text(printed, prompt) == "Bonjour, le 21 c'était l'ancienne date"
    assert native.answer_text(printed, "another prompt") is None
    # the tool writes a few tokens past the count; plain decoding may stop sooner
    assert not native.parts_from("Bonjour, le 21 c'était", "Bonjour, le 21")
    assert not native.parts_from("Bonjour\n", "Bonjour\n\nLe")
    assert not native.parts_from("Le d\ufffd", "Le dé")  # cut inside a character
    assert native.parts_from("compris, le 21", "compris. Le 21")

    def run(prompt: str, mode: str, tokens: tuple[int, ...]) -> Run:
        return Run(mode, prompt, "french", 0.0, 0, 3, 1.0, 3.0, 0, 0, 1.0, (), 0.0, 0.0, tokens)

    words = {1: "compris", 2: ".", 3: ","}
    runs = [run("a", "none", (1, 2)), run("b", "none", (1, 3)), run("b", "ngram-simple", (1, 3))]
    tool = {
        "a": [native.NativeRun(9.0, 4, 2, "compris, le 21")],  # parted at the tie
        "b": [native.NativeRun(9.0, 4, 2, "compris, le"), native.NativeRun(9.0, 4, 2, None)],
        "c": [native.NativeRun(9.0, 4, 2, "no plain run for it")],
    }
    text_of = lambda tokens: "".join(words[t] for t in tokens)  # noqa: E731
    assert native_texts(text_of, tool, runs) == (1, 2)
    assert native_texts(text_of, {"c": tool["c"]}, runs) is None


def test_native_tools_run_when_built(tmp_path: Path, qwen_path: Path) -> None:
    tools = Path(__file__).resolve().parents[1] / "native"
    if not (tools / native.TOOL).exists():
        pytest.skip("llama.cpp tools not built (scripts/build-llama-cpp-tools native)")
    s = native.NativeSettings(tools, qwen_path, None, 16, 2, 2048, 16, "off")
    run = native.run(s, "ngram-simple", "def fib(n):", 0.0)
    assert run.tokens_per_s > 0 and 0 <= run.accepted <= run.drafted
    assert run.text  # its answer, for the comparison with plain decoding's


def test_doctor(capsys, smollm_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["doctor", str(smollm_path), "-fa", "on"]) == 0
    out = capsys.readouterr().out
    assert "ceiling for speculation here" in out and "GPU offload" in out
    assert "flash attention on" in " ".join(out.split())
    assert "machine quiet" in out or "machine busy" in out
    # the ceiling follows from the two figures printed beside it
    flat = " ".join(out.split())
    step, size, batch, ceiling = re.search(
        r"one-token step ([\d.]+) ms; batch of (\d+) ([\d.]+) ms.*?here: ([\d.]+)x", flat
    ).groups()
    assert float(ceiling) == pytest.approx(int(size) * float(step) / float(batch), rel=0.03)


def test_an_interrupted_repeat_without_its_plain_run_is_summarised() -> None:
    from localspec.bench import Run, summarise

    def run(mode: str, repeat: int) -> Run:
        return Run(mode, "p", "qa", 0.0, repeat, 10, 500.0, 20.0, 4, 2, 1.5, (0.5,), 1.0, 9.0)

    # repeat 1 rotated ngram-simple before plain, and Ctrl-C came in between
    cells = summarise([run("none", 0), run("ngram-simple", 0), run("ngram-simple", 1)])
    spec = next(c for c in cells if c.mode == "ngram-simple")
    assert spec.speedup_median == pytest.approx(1.0) and spec.exact_match == "identical"


def test_cells_above_the_ceiling_are_flagged_and_not_printed() -> None:
    from localspec.bench import Run, flag_noise, markdown, summarise

    def run(mode: str, tps: float) -> Run:
        return Run(mode, "p", "qa", 0.0, 0, 10, 1000 * 10 / tps, tps, 4, 2, 1.5, (0.5,), 1.0, 9.0)

    cells = flag_noise(summarise([run("none", 2.0), run("ngram-simple", 80.0)]), ceiling=2.5)
    spec = next(c for c in cells if c.mode == "ngram-simple")
    assert spec.noisy and "above this machine's 2.50x ceiling" in spec.noise[0]
    table = markdown(cells, "header", 2.5)
    assert "noisy (above the 2.50x ceiling)" in table and "40.00x" not in table
    assert spec.to_dict()["noisy"] is True


def test_a_speedup_with_nothing_accepted_is_noise() -> None:
    """Every token then costs a plain step at least: 1.3x is the machine's speed moving."""
    from localspec.bench import Run, flag_noise, meaning, summarise

    def run(mode: str, tps: float, accepted: int) -> Run:
        ms = 1000 * 10 / tps
        return Run(mode, "p", "qa", 0.0, 0, 10, ms, tps, 4, accepted, 1.0, (0.0,), 1.0, 9.0)

    cells = flag_noise(summarise([run("none", 10.0, 0), run("ngram-simple", 13.0, 0)]), 3.0)
    spec = next(c for c in cells if c.mode == "ngram-simple")
    assert spec.noisy and "no drafted token accepted" in spec.noise[0]
    assert meaning("ngram-simple", cells, 3.0) == ""  # no "up to 1.30x" from noise
    kept = flag_noise(summarise([run("none", 10.0, 0), run("ngram-simple", 13.0, 2)]), 3.0)
    assert not next(c for c in kept if c.mode == "ngram-simple").noisy


def test_a_lookup_that_drafted_nothing_ran_plain_steps() -> None:
    """0.82x with nothing drafted is not the mode's cost ("slower than plain everywhere"):
    it ran plain decoding's steps, and the machine's speed moved."""
    from localspec.bench import Run, flag_noise, meaning, summarise

    def run(mode: str, tps: float, drafted: int) -> Run:
        ms = 1000 * 10 / tps
        return Run(mode, "p", "qa", 0.0, 0, 10, ms, tps, drafted, 0, 1.0, (), 0.0, 9.0)

    cells = flag_noise(summarise([run("none", 10.0, 0), run("ngram-simple", 8.2, 0)]), 3.0)
    spec = next(c for c in cells if c.mode == "ngram-simple")
    assert spec.noise == ("nothing drafted (plain decoding's steps) yet 0.82x",)
    assert meaning("ngram-simple", cells, 3.0) == ""
    same = flag_noise(summarise([run("none", 10.0, 0), run("ngram-simple", 9.8, 0)]), 3.0)
    assert not next(c for c in same if c.mode == "ngram-simple").noisy  # within 5%: as plain
    drafted = flag_noise(summarise([run("none", 10.0, 0), run("ngram-simple", 8.2, 6)]), 3.0)
    assert not next(c for c in drafted if c.mode == "ngram-simple").noisy  # a real cost


class Recorder:
    """A recording stand-in for the engine: the (seed, mode) of each generation asked."""

    memory = SpecMemory()

    def __init__(self) -> None:
        self.order: list[tuple[int, str]] = []

    def generate(self, text: str, **kwargs: object) -> SimpleNamespace:
        self.order.append((kwargs["seed"], kwargs["mode"]))  # type: ignore[arg-type]
        return SimpleNamespace(stats=Stats(), tokens=[], margins=[], runners_up=[])

    def verify_cost(self) -> VerifyCost:
        return VerifyCost(np.array([1, 2]), np.array([0.01, 0.015]))

    def draft_step_seconds(self) -> None:
        return None


def test_mode_order_rotates_with_the_repeat() -> None:
    """Scheduling only: each mode, plain included, takes each place in the order once over
    as many repeats as there are modes."""
    engine = Recorder()
    case = PromptCase("p", "qa", "en", "hello")
    runs = list(run_cells(engine, ["ngram-simple", "draft-self"], [case], [0.0], 8, 3))  # type: ignore[arg-type]
    assert len(runs) == 9
    by_repeat = [[mode for seed, mode in engine.order if seed == r] for r in range(3)]
    assert by_repeat == [
        ["none", "ngram-simple", "draft-self"],
        ["ngram-simple", "draft-self", "none"],
        ["draft-self", "none", "ngram-simple"],
    ]


def test_the_native_tool_runs_among_localspecs_runs_of_each_prompt() -> None:
    """llama.cpp's tool takes its turns in the rotation beside localspec's modes (a tool run
    minutes later would time another moment of the machine), with the repeat's seed; a mode
    it has no counterpart for is skipped, and its runs make the cells' native figures."""
    from localspec.commands.bench import add_native_figures

    engine = Recorder()

    def tool(mode: str, case: PromptCase, temperature: float, seed: int) -> native.NativeRun | None:
        engine.order.append((seed, f"native {mode}"))
        return native.NativeRun(20.0 + seed, 0, 0) if mode == "ngram-simple" else None

    cases = [PromptCase("p", "qa", "en", "hello")]
    runs = list(run_cells(engine, ["ngram-simple", "draft-self"], cases, [0.7], 8, 2, native=tool))  # type: ignore[arg-type]
    by_repeat = [[mode for seed, mode in engine.order if seed == r] for r in range(2)]
    assert by_repeat == [
        ["none", "ngram-simple", "draft-self", "native ngram-simple", "native draft-self"],
        ["ngram-simple", "draft-self", "native ngram-simple", "native draft-self", "none"],
    ]
    native_runs = [r for r in runs if isinstance(r, NativeCellRun)]
    assert [(r.mode, r.repeat, r.run.tokens_per_s) for r in native_runs] == [
        ("ngram-simple", 0, 20.0),
        ("ngram-simple", 1, 21.0),
    ]
    assert sum(isinstance(r, Run) for r in runs) == 6
    mine = [  # localspec's runs of the cells, timed
        Run(mode, "p", "qa", 0.7, 0, 10, 500.0, 20.0, 0, 0, 1.0, (), 0.0, 0.0)
        for mode in ("none", "ngram-simple", "draft-self")
    ]
    cells = add_native_figures(summarise(mine), native_runs, mine, str)
    by_mode = {c.mode: c for c in cells}
    assert by_mode["ngram-simple"].native_tokens_per_s == pytest.approx(20.5)
    assert by_mode["draft-self"].native_tokens_per_s is None


def test_native_ratio_per_cell_and_per_mode() -> None:
    """localspec / llama.cpp's own tool, per cell (table, markdown, JSON) and as a geometric
    mean per mode, so the comparison is visible wherever the native tools are built."""
    from dataclasses import replace

    from localspec.bench import markdown, native_lines, native_ratios, summarise

    def run(mode: str, kind: str, tps: float) -> Run:
        return Run(mode, kind, kind, 0.0, 0, 10, 1000 * 10 / tps, tps, 4, 2, 1.5, (0.5,), 1.0, 9.0)

    runs = [run("none", k, 50.0) for k in ("qa", "story")]
    runs += [run("ngram-simple", "qa", 100.0), run("ngram-simple", "story", 60.0)]
    native_speed = {("ngram-simple", "qa"): 80.0, ("ngram-simple", "story"): 75.0}
    native_drafted = {("ngram-simple", "qa"): 0, ("ngram-simple", "story"): 40}
    texts = {("ngram-simple", "qa"): (0, 1), ("ngram-simple", "story"): (1, 2)}
    cells = [
        replace(
            c,
            native_tokens_per_s=native_speed.get((c.mode, c.kind)),
            native_drafted=native_drafted.get((c.mode, c.kind)),
            native_texts=texts.get((c.mode, c.kind)),
        )
        for c in summarise(runs)
    ]
    story = next(c for c in cells if c.mode == "ngram-simple" and c.kind == "story")
    assert story.native_ratio == pytest.approx(0.8) and story.to_dict()["native_ratio"] == 0.8
    mean, low, high, n = native_ratios(cells)["ngram-simple"]
    assert mean == pytest.approx((1.25 * 0.8) ** 0.5) and (low, high, n) == (0.8, 1.25, 2)
    assert "none" not in native_ratios(cells)
    assert "75.0 (0.80x, another text: 1 of 2)" in markdown(cells, "h", 3.0)
    assert "80.0 (1.25x, no drafts)" in markdown(cells, "h", 3.0)  # the tool decoded plainly
    assert story.to_dict()["native_texts"] == (1, 2)
    assert native_lines(cells) == [
        "ngram-simple vs llama.cpp's own: 1.00x geometric mean over 2 cell(s) (0.80-1.25)",
        "llama.cpp's tool wrote another answer than plain decoding in 1 cell(s) ('another "
        "text': a near tie went the other way, so the ratio compares two texts)",
    ]


def test_a_native_tool_that_fails_leaves_localspecs_runs_and_says_why(
    capsys, tmp_path: Path, smollm_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The tool fails on its first run: it runs no more, localspec's runs go on and are
    reported, and the bench ends with one line on why (exit status 2)."""
    tool = tmp_path / native.TOOL
    calls = tmp_path / "calls"
    tool.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'error: failed to load model'\nexit 1\n")
    tool.chmod(0o755)
    args = ["bench", str(smollm_path), "--modes", "none,ngram-simple", "--prompts", "qa"]
    code = main([*args, "-n", "8", "--repeat", "2", "--native", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "the native runs failed" in err
    assert calls.read_text().split() == ["run"]  # not tried again after it failed
    assert "ngram-simple" in out and "qa" in out  # the cells measured, with no native figure
    assert err.count("ngram-simple") >= 2  # both repeats of localspec's runs
