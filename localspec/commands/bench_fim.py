"""`localspec bench MODEL --fim`: code completion as an editor asks for it (fill-in-the-middle,
``localspec/prompts/fim.toml``), the time to the whole completion with plain decoding and
with speculation, and with ``--native DIR`` llama-server's ``/infill`` on the same requests.

The cursor of every case sits on an empty line, so llama-server's prompt and localspec's are
the same tokens (``engine.fim``) and greedy answers can be compared. Each case is asked once
to warm the cache (an editor asks again as you type), then ``--repeat`` times, every
configuration in turn: localspec plain and speculative, and llama-server plain and with
ngram-simple (two servers started beside the engine for the whole bench), so that a drift of
the machine's speed during the bench moves every configuration alike."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from localspec import native_server as ns
from localspec.commands.bench_output import parse_list, print_table, write_text
from localspec.commands.flags import engine_options
from localspec.engine.fim import ExtraFile, FimPrompt, MiddleEnd
from localspec.errors import LocalspecError
from localspec.hardware import machine_load
from localspec.progress import report_console

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLAIN, SPEC = "plain", "speculative"
# typed word by word on the cursor's line of the first case, one request per word
TYPED_LINE = (
    '    orders = [Order(id=row["id"], customer_id=row["customer_id"], amount=row["amount"]) '
    'for row in json.loads(path.read_text(encoding="utf-8")) if not row.get("deleted")]'
)

NATIVE_PLAIN, NATIVE_SPEC = "llama-server plain", "llama-server ngram-simple"
# llama-server asked for as many tokens as localspec's plain decoding wrote to end the middle,
# where that one ended sooner: the same decoding work, and so what speculation itself gains,
# apart from where the middle ends
AS_MANY = ", as many tokens"
# a pause before each timed request: what the last one left running (a server's worker
# threads spinning down, its slot's bookkeeping) does not land in the next one's time
SETTLE_S = 0.05


@dataclass(frozen=True)
class FimCase:
    name: str
    kind: str  # "copying" or "ordinary"
    language: str
    prompt: FimPrompt


@dataclass(frozen=True)
class Answer:
    """One completion: its time, text, tokens, the tokens generated to end it (a round of
    drafts kept whole may run past where a rule cuts the middle, and the same middle must
    count the same) and (localspec's) one decoding step after the first token."""

    seconds: float
    text: str
    tokens: int
    written: int
    step_s: float = 0.0


@dataclass
class Timings:
    """One configuration on one case: the seconds and tokens of each timed request, and
    its answer (the warm-up's)."""

    seconds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # tokens of each timed answer
    written: list[int] = field(default_factory=list)  # tokens generated to end it (see AS_MANY)
    tokens: int = 0
    text: str = ""
    written_first: int = 0  # the warm-up's tokens generated (see ``decoded``)
    step_s: float = 0.0  # one decoding step after the first token (the warm-up's)

    def warmed(self, answer: Answer) -> None:
        self.text, self.tokens = answer.text, answer.tokens
        self.written_first, self.step_s = answer.written, answer.step_s

    def timed(self, answer: Answer) -> None:
        self.seconds.append(answer.seconds)
        self.counts.append(answer.tokens)
        self.written.append(answer.written)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def decoded(self) -> int:
        """The tokens generated to end the answer, those after the end a rule saw included
        (the first lines of a loop's copies, of a definition, of a fence): the decoding work
        of a plain answer, which llama-server is asked for (AS_MANY)."""
        if self.written:
            return round(statistics.median(self.written))
        return self.written_first or self.tokens

    @property
    def length(self) -> float:
        """The timed answers' median length in tokens (greedy answers part at a near tie
        now and then: a cache laid out otherwise rounds one logit differently)."""
        return statistics.median(self.counts) if self.counts else float(self.tokens)


def speedup(base: Timings, faster: Timings) -> tuple[float, bool]:
    """How much sooner ``faster`` completes than ``base``; where their answers differ in
    length (parted at a near tie), by the time per token instead, and True."""
    if base.length == faster.length or not (base.length and faster.length):
        return base.median / faster.median, False
    return (base.median / base.length) / (faster.median / faster.length), True


def fim_cases(names: str | None = None) -> list[FimCase]:
    """The built-in completion requests, or (``--prompts`` with ``--fim``) those named, in
    the order given."""
    text = resources.files("localspec.prompts").joinpath("fim.toml").read_text("utf-8")
    cases = []
    for raw in tomllib.loads(text)["case"]:
        extra = tuple(ExtraFile(e["text"], e["filename"]) for e in raw.get("extra", []))
        prompt = FimPrompt(raw["prefix"], raw["suffix"], extra)
        cases.append(FimCase(raw["name"], raw["kind"], raw["language"], prompt))
    if names is None:
        return cases
    by_name = {case.name: case for case in cases}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown or not wanted:
        raise LocalspecError(
            f"--prompts with --fim: no completion named {', '.join(unknown) or '(none)'}",
            f"name some of {', '.join(by_name)}",
        )
    return [by_name[name] for name in dict.fromkeys(wanted)]


def run_fim(args: argparse.Namespace) -> int:
    from localspec.api import Engine
    from localspec.modes import canonical

    mode = check_args(args, canonical)
    args.mode = mode  # the engine loads what this mode needs
    cases = fim_cases(args.prompts)
    console = report_console(stderr=True)
    machine = machine_load()
    console.print(machine.describe())
    if args.native is not None:
        ns.check_server(Path(args.native))
    results: dict[str, dict[str, Timings]] = {}
    with Engine.load(**{**engine_options(args), "parallel": 1}) as engine, ExitStack() as stack:
        urls: dict[str, str] = {}
        if args.native is not None:
            server = native_settings(args, engine)
            for config, native_mode in ((NATIVE_PLAIN, "none"), (NATIVE_SPEC, mode)):
                urls[config] = stack.enter_context(ns.running_server(server, 1, native_mode))
        for case in cases:
            results[case.name] = got = time_case(engine, urls, case, mode, args)
            for config, timings in got.items():
                tokens = f"{timings.length:g} tokens"
                console.print(f"  {case.name:18} {config:40} {tokens:>11} {timings.median:6.2f} s")
        typing = keystrokes(engine, cases[0], mode, results[cases[0].name][PLAIN])
        console.print(f"  keystrokes: first token {typing.describe()}")
        model = engine.target_path.name
    header = (
        f"localspec bench --fim: {model}, {mode}, up to {args.n_predict} tokens, T=0, "
        f"{args.repeat} repeat(s), machine {'busy' if machine.busy else 'quiet'}"
    )
    report(args, header, cases, results, typing)
    return 0


def check_args(args: argparse.Namespace, canonical: Callable[[str], str]) -> str:
    benches = (
        ("--concurrency", args.concurrency),
        ("--rate", args.rate),
        ("--scenarios", args.scenarios),
    )
    for flag, value in benches:
        if value is not None:
            raise LocalspecError(f"--fim and {flag} are two different benches", "run one")
    if args.plot is not None:
        raise LocalspecError("--plot does not apply to --fim (its table has no curve)", "drop it")
    modes = [m for m in parse_list(args.modes or "ngram-simple", "--modes", canonical)]
    modes = [m for m in modes if m != "none"]
    if len(modes) != 1:
        raise LocalspecError("--modes with --fim: give the one speculative mode to measure")
    return modes[0]


def time_case(engine, urls: dict[str, str], case: FimCase, mode: str, args) -> dict[str, Timings]:  # type: ignore[no-untyped-def]
    """Every configuration on one case, localspec's and (``urls``) llama-server's: a warm-up
    each, then ``--repeat`` rounds in which each is timed once, in turn, so that a machine
    whose speed drifts during the bench moves them all alike. Where localspec's middle ended
    sooner, llama-server is also asked for as many tokens as plain decoding wrote (AS_MANY)."""
    runs: dict[str, Callable[[], Answer]] = {
        PLAIN: lambda: engine_answer(engine, case.prompt, args.n_predict, "none"),
        SPEC: lambda: engine_answer(engine, case.prompt, args.n_predict, mode),
    }
    for config, url in urls.items():
        runs[config] = native_answer(url, case.prompt, args.n_predict)
    got = {config: Timings() for config in runs}
    for config, run in runs.items():  # the warm-ups: the answers, not the times
        got[config].warmed(run())
    if urls and ended_sooner(got):
        for config, url in urls.items():
            runs[config + AS_MANY] = native_answer(url, case.prompt, got[PLAIN].decoded)
            got[config + AS_MANY] = Timings()
            got[config + AS_MANY].warmed(runs[config + AS_MANY]())
    for _ in range(args.repeat):
        for config, run in runs.items():
            time.sleep(SETTLE_S)
            got[config].timed(run())
    return got


def engine_answer(engine, prompt: FimPrompt, n_predict: int, mode: str) -> Answer:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    text, stats = complete(engine, prompt, n_predict, mode)
    seconds = time.perf_counter() - t0
    tokens = len(engine.target.tokenize(text, add_special=False, parse_special=False))
    step_s = stats.gen_ms / 1000 / max(1, stats.n_tokens - 1)
    return Answer(seconds, text, tokens, stats.n_tokens, step_s)


def native_answer(url: str, prompt: FimPrompt, n_predict: int) -> Callable[[], Answer]:
    """One llama-server ``/infill`` request, as ``engine_answer`` reports it."""
    body = infill_body(prompt, n_predict)

    def answer() -> Answer:
        t0 = time.perf_counter()
        reply = post_json(f"{url}/infill", body)
        seconds = time.perf_counter() - t0
        tokens = int(reply.get("tokens_predicted", 0))
        return Answer(seconds, str(reply.get("content", "")), tokens, tokens)

    return answer


def complete(engine, prompt: FimPrompt, n_predict: int, mode: str):  # type: ignore[no-untyped-def]
    """One completion as ``/infill`` answers it: greedy, ended by the model, the token limit
    or the middle's end rules (``MiddleEnd``); its text and statistics."""
    end = MiddleEnd.of(prompt)
    parts, stats = [], None
    events = engine.stream(prompt, max_tokens=n_predict, temperature=0.0, mode=mode)
    try:
        for event in events:
            parts.append(end.feed(event.text))
            stats = event.stats
            if end.ended:
                break
        parts.append(end.finish())
    finally:
        events.close()
    return "".join(parts), stats


@dataclass(frozen=True)
class Keystrokes:
    """Time to the first token of each request as a line is typed word by word (the first
    request, which reads the whole prompt, left out), against one plain decoding step."""

    first_token_s: list[float]
    step_s: float
    prompt_read: list[int]  # prompt tokens read by each request (the rest came from cache)

    @property
    def ratio(self) -> float:
        return statistics.median(self.first_token_s) / self.step_s

    def describe(self) -> str:
        return (
            f"{1000 * statistics.median(self.first_token_s):.0f} ms after each word "
            f"(median of {len(self.first_token_s)}; {self.ratio:.2f}x a {1000 * self.step_s:.0f} "
            f"ms decoding step; prompt tokens read: {', '.join(map(str, self.prompt_read))})"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "first_token_s": [round(s, 4) for s in self.first_token_s],
            "step_s": round(self.step_s, 4),
            "ratio": round(self.ratio, 3),
            "prompt_read": self.prompt_read,
        }


def keystrokes(engine, case: FimCase, mode: str, plain: Timings) -> Keystrokes:  # type: ignore[no-untyped-def]
    """Type ``TYPED_LINE`` into ``case`` a word at a time, asking for the first token after
    each word, as an editor does while you type."""
    indent = len(TYPED_LINE) - len(TYPED_LINE.lstrip())
    words = TYPED_LINE[indent:].split(" ")
    typed = [TYPED_LINE[:indent] + " ".join(words[: i + 1]) for i in range(len(words))]
    times, read = [], []
    for i, text in enumerate(typed):
        prompt = dataclasses.replace(case.prompt, typed=text)
        t0 = time.perf_counter()
        result = engine.generate(prompt, max_tokens=1, temperature=0.0, mode=mode)
        if i:  # the first request reads the whole prompt
            times.append(time.perf_counter() - t0)
            read.append(result.stats.n_prompt - result.stats.n_cached)
    return Keystrokes(times, plain.step_s, read)


def infill_body(prompt: FimPrompt, n_predict: int) -> dict[str, object]:
    """llama.vim's request, greedy (``prompt``: the cursor's empty line)."""
    return {
        "input_prefix": prompt.prefix,
        "input_suffix": prompt.suffix,
        "input_extra": [{"filename": e.filename, "text": e.text} for e in prompt.extra],
        "prompt": prompt.typed,
        "n_predict": n_predict,
        "temperature": 0,
        "cache_prompt": True,
        "stream": False,
    }


def post_json(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=ns.REQUEST_TIMEOUT_S) as answer:
            return dict(json.loads(answer.read()))
    except OSError as exc:
        raise LocalspecError(f"{ns.SERVER} did not answer /infill: {exc}") from None


def native_settings(args: argparse.Namespace, engine) -> ns.ServerSettings:  # type: ignore[no-untyped-def]
    from localspec.hardware import default_threads

    options = engine_options(args)
    return ns.ServerSettings(
        Path(args.native),
        engine.target_path,
        None,
        engine.target.options.n_threads or default_threads(),
        options["n_ctx"],
        options["spec"].n_max,
        engine.target.flash_attn,
    )


# ----- the report --------------------------------------------------------------------------


def ratios(
    cases: Sequence[FimCase], results: dict[str, dict[str, Timings]], suffix: str = ""
) -> dict[str, float]:
    """Per case: how much faster localspec's speculation finishes than the better of
    llama-server's configurations (absent without --native; ``suffix`` AS_MANY: llama-server
    asked for as many tokens, for the cases where localspec's middle ended sooner)."""
    out = {}
    for case in cases:
        got = results[case.name]
        native = [got[c + suffix].median for c in (NATIVE_PLAIN, NATIVE_SPEC) if c + suffix in got]
        if native:
            out[case.name] = min(native) / got[SPEC].median
    return out


def speculation_alone(
    cases: Sequence[FimCase], results: dict[str, dict[str, Timings]]
) -> dict[str, float]:
    """Per case: localspec's speculation against the better llama-server on the same number
    of tokens (the whole completion, or as many tokens where localspec's ended sooner)."""
    return {**ratios(cases, results), **ratios(cases, results, AS_MANY)}


def report(args, header: str, cases, results, typing: Keystrokes) -> None:  # type: ignore[no-untyped-def]
    configs = [c for c in (PLAIN, SPEC, NATIVE_PLAIN, NATIVE_SPEC) if c in results[cases[0].name]]
    native = NATIVE_PLAIN in configs
    tokens = "tokens: plain/spec. (llama-server's)" if native else "tokens: plain/spec."
    columns = ["case", "kind", tokens, *[f"{c} s" for c in configs], "vs plain", "vs native"]
    versus, alone = ratios(cases, results), speculation_alone(cases, results)
    rows = []
    for case in cases:
        got = results[case.name]
        rows.append(
            [
                case.name,
                case.kind,
                f"{got[PLAIN].length:g}/{got[SPEC].length:g}"
                + (f" ({got[NATIVE_PLAIN].length:g})" if native else ""),
                *[spread(got[c].seconds) for c in configs],
                versus_plain(got),
                vs_native(case.name, versus, alone, ended_sooner(got)),
            ]
        )
    console = report_console()
    print_table(console, header, columns, rows)
    lines = summary(cases, results, versus, alone)
    lines.append(f"keystrokes: first token {typing.describe()}")
    for line in lines:
        console.print(f"  {line}")
    if args.markdown:
        cells = ["| " + " | ".join(r) + " |" for r in [columns, ["---"] * len(columns), *rows]]
        bullets = "".join(f"- {line}\n" for line in lines)
        write_text(args.markdown, f"**{header}**\n\n" + "\n".join(cells) + "\n\n" + bullets)
    if args.json:
        data = {
            "header": header,
            "cases": {
                c.name: {
                    "kind": c.kind,
                    **{
                        k: {
                            "seconds": [round(s, 4) for s in t.seconds],
                            "tokens": t.counts,
                            **({"written": t.written} if t.written else {}),
                        }
                        for k, t in results[c.name].items()
                    },
                    "same_answer_as_native": same_answers(results[c.name]),
                }
                for c in cases
            },
            "keystrokes": typing.to_dict(),
            "summary": lines,
        }
        write_text(args.json, json.dumps(data, indent=2))


def vs_native(name: str, versus: dict[str, float], alone: dict[str, float], sooner: bool) -> str:
    """The ratio to the better llama-server; where localspec ended sooner (``+``), with the
    ratio on as many tokens after it."""
    if name not in versus:
        return "-"
    if not sooner:
        return f"{versus[name]:.2f}x"
    same = alone.get(name, versus[name])
    return f"{versus[name]:.2f}x+" + (f" ({same:.2f}x)" if same != versus[name] else "")


def summary(cases, results, versus, alone) -> list[str]:  # type: ignore[no-untyped-def]
    lines = []
    for kind in ("copying", "ordinary"):
        mine = [c for c in cases if c.kind == kind]
        if not mine:
            continue
        plain = [speedup(results[c.name][PLAIN], results[c.name][SPEC])[0] for c in mine]
        mean = statistics.geometric_mean(plain)
        line = f"{kind}: speculation vs plain, geometric mean {mean:.2f}x"
        native = [versus[c.name] for c in mine if c.name in versus]
        if native:
            line += (
                f"; vs the better llama-server, geometric mean "
                f"{statistics.geometric_mean(native):.2f}x, lowest {min(native):.2f}x"
            )
        same = [alone[c.name] for c in mine if c.name in alone]
        if same and same != native:
            line += (
                f"; on as many tokens (speculation alone), geometric mean "
                f"{statistics.geometric_mean(same):.2f}x, lowest {min(same):.2f}x"
            )
        lines.append(line)
    parted = [c.name for c in cases if speedup(results[c.name][PLAIN], results[c.name][SPEC])[1]]
    if parted:
        lines.append(
            "answers of plain and speculative decoding of different lengths (parted at a near "
            f"tie), compared per token (*): {', '.join(parted)}"
        )
    sooner = [c.name for c in cases if ended_sooner(results[c.name])]
    if sooner:
        lines.append(
            "localspec ended the middle sooner than llama-server (where it rejoins the suffix, "
            "leaves the code, the block the suffix closes or the one it is in, skips the body "
            "at the cursor, begins a definition of its own or loops), the time to each one's "
            "whole completion compared (+), and in brackets llama-server asked for the tokens "
            f"plain decoding wrote: {', '.join(sooner)}"
        )
    differing = [c.name for c in cases if same_answers(results[c.name]) is False]
    if differing:
        lines.append(f"answers differing from llama-server's (near ties?): {', '.join(differing)}")
    return lines


def ended_sooner(got: dict[str, Timings]) -> bool:
    """localspec's middle is shorter than llama-server's by more than a near tie's parting:
    one of its end rules cut it (llama-server writes on to its token limit). llama-server
    counts the end token in an answer the model ended, localspec does not."""
    native = got.get(NATIVE_PLAIN)
    return native is not None and got[SPEC].length + 1 < 0.9 * native.length


def versus_plain(got: dict[str, Timings]) -> str:
    ratio, per_token = speedup(got[PLAIN], got[SPEC])
    return f"{ratio:.2f}x" + ("*" if per_token else "")


def same_answers(got: dict[str, Timings]) -> bool | None:
    """llama-server's answers begin with localspec's (which may end sooner: llama-server
    goes on where the model rewrites the suffix)."""
    native = [got[c].text for c in (NATIVE_PLAIN, NATIVE_SPEC) if c in got]
    return None if not native else all(t.startswith(got[SPEC].text.rstrip()) for t in native)


def spread(seconds: Sequence[float]) -> str:
    return f"{statistics.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f})"
