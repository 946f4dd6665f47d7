"""`localspec pairs`: which drafts work with this target, and why the others do not."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from localspec import argtypes as at
from localspec.catalog import Catalog, load_catalog
from localspec.derivation.gguf_info import gguf_info
from localspec.errors import LocalspecError
from localspec.pairing import Verdict, check, draftless_modes
from localspec.probe_results import saved_notes
from localspec.progress import report_console
from localspec.sources import local_path, resolve_model
from localspec.vocab import Vocab

GIB = 1 << 30


@dataclass(frozen=True)
class Candidate:
    label: str  # what the user will recognise: the name typed, or the path found
    path: Path | None
    problem: str | None = None  # why it could not even be read


def hf_cache_ggufs() -> list[Path]:
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    return sorted(root.glob("models--*/snapshots/*/**/*.gguf")) if root.is_dir() else []


def scan_folder(folder: Path) -> list[Path]:
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "no such folder"
        raise LocalspecError(f"--scan {folder}: {what}", "give an existing directory")
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file())


def gather_candidates(
    args: argparse.Namespace, catalog: Catalog
) -> tuple[list[Candidate], list[str]]:
    """Candidates from the arguments, scanned folders, the HF cache and the catalog (what is
    already on disk); plus notes (e.g. an empty folder)."""
    found: list[Candidate] = []
    notes: list[str] = []
    for ref in args.candidates:
        try:
            found.append(Candidate(ref, resolve_model(ref, catalog)))
        except LocalspecError as exc:
            found.append(Candidate(ref, None, exc.message))
    for folder in args.scan:
        paths = scan_folder(Path(folder))
        if not paths:
            notes.append(f"no .gguf files in {folder}")
        found += [Candidate(str(p), p) for p in paths]
    if not args.no_hf_cache:
        found += [Candidate(str(p), p) for p in hf_cache_ggufs()]
    for name, entry in catalog.models.items():
        path = local_path(entry, catalog)
        if path is not None:
            found.append(Candidate(name, path))
    return found, notes


def unreadable(candidates: list[Candidate]) -> LocalspecError | None:
    """The error for the drafts named on the command line that could not be found or read
    (None: every one was)."""
    bad = [c for c in candidates if c.path is None]
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return LocalspecError(
        f"draft {bad[0].label!r}: {bad[0].problem}{more}",
        "give the path of a .gguf file or a catalog name (`localspec models` lists them)",
    )


def unique(candidates: list[Candidate], target: Path) -> list[Candidate]:
    seen = {os.path.realpath(target)}
    kept = []
    for c in candidates:
        key = os.path.realpath(c.path) if c.path else c.label
        if key not in seen:
            seen.add(key)
            kept.append(c)
    return kept


def judge(
    target: Path, candidates: list[Candidate], n_ctx: int
) -> list[tuple[Candidate, Verdict | None, str | None]]:
    rows = []
    with Vocab.load(target) as target_vocab:
        for c in candidates:
            if c.path is None:
                rows.append((c, None, c.problem))
                continue
            try:
                rows.append((c, check(target, c.path, n_ctx, target_vocab), None))
            except LocalspecError as exc:
                rows.append((c, None, exc.message))
    return rows


def run(args: argparse.Namespace) -> int:
    catalog = load_catalog()
    target = resolve_model(args.target, catalog)
    info = gguf_info(target)
    candidates, notes = gather_candidates(args, catalog)
    rows = judge(target, unique(candidates, target), args.ctx_size)
    notes += measured_notes(target)
    known = [
        p
        for p in catalog.drafts_for(args.target)
        if local_path(catalog.models[p.draft], catalog) is None
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "target": info.to_dict(),
                    "candidates": [
                        {
                            "candidate": c.label,
                            **(v.to_dict() if v else {"compatible": False, "unreadable": problem}),
                        }
                        for c, v, problem in rows
                    ],
                    "draftless_modes": [
                        {"mode": m, "available": ok, "why": why}
                        for m, ok, why in draftless_modes(info)
                    ],
                    "catalog_pairs_not_on_disk": [
                        {"draft": p.draft, "note": p.note} for p in known
                    ],
                    "notes": notes,
                },
                indent=2,
                default=str,
            )
        )
    else:
        print_pairs(info, rows, notes, known)
    if (problem := unreadable(candidates)) is not None:  # after the verdicts on the others
        raise problem
    return 0


# what every listing says: a compatible draft is not yet a draft that pays
COST_NOTE = (
    "compatible is not faster: a draft model pays only where its token costs well under "
    "what a verify batch saves on this machine (size: the draft's file as a share of the "
    "target's, roughly its share of a step); `localspec probe TARGET` measures it, and on "
    "a compute-bound target (a 1.5B model on a small CPU) only free drafts pay: "
    "ngram-simple, suffix"
)


def measured_notes(target: Path) -> list[str]:
    """The saved probe's findings about this target on this machine, else how to get them."""
    saved = [f"measured by `localspec probe`: {n}" for n in saved_notes(target)]
    return saved or [COST_NOTE]


def print_pairs(info, rows, notes, known) -> None:  # type: ignore[no-untyped-def]
    console = report_console()
    console.print(
        f"[bold]target[/]: {info.path}  ({info.family}, {info.size_label or '?'}, "
        f"{info.file_type}, {info.file_size / GIB:.2f} GiB, vocab {info.vocab_size})"
    )
    table = Table(show_lines=False)
    for col in ("candidate", "family", "size", "verdict", "why"):
        table.add_column(col, overflow="fold")
    for c, verdict, problem in rows:
        if verdict is None:
            table.add_row(c.label, "-", "-", "[red]unreadable[/]", problem or "")
            continue
        ok = "[green]compatible[/]" if verdict.compatible else "[red]incompatible[/]"
        why = "; ".join(verdict.reasons + verdict.warnings) or "same tokenizer and family"
        share = verdict.draft.file_size / info.file_size if info.file_size else 0.0
        size = f"{verdict.draft.file_size / GIB:.2f} GiB ({share:.0%})"
        table.add_row(c.label, verdict.draft.family, size, ok, why)
    if rows:
        console.print(table)
    else:
        console.print("no draft candidates found (give paths, --scan DIR, or `localspec pull`)")
    for note in notes:
        console.print(f"note: {note}")
    console.print("[bold]draftless modes[/]:")
    modes = draftless_modes(info)
    width = max(len(mode) for mode, _, _ in modes)
    for mode, available, why in modes:
        mark = "[green]yes[/]" if available else "[red]no[/] "
        console.print(f"  {mode:{width}} {mark}  {why}")
    for p in known:
        console.print(
            f"catalog pair not on disk: {p.draft} ({p.note}); "
            f"get it with `localspec pull {p.draft}`"
        )


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("pairs", help="which draft models work with a target, and why")
    p.add_argument("target", help="target model: a .gguf path or a catalog name")
    # a default: argparse would call the optional list required when the target is missing
    p.add_argument(
        "candidates", nargs="*", default=[], help="draft candidates (paths or catalog names)"
    )
    p.add_argument(
        "--scan",
        action="append",
        default=[],
        metavar="DIR",
        help="also consider every .gguf under DIR (repeatable)",
    )
    p.add_argument(
        "--no-hf-cache",
        action="store_true",
        help="do not consider the GGUFs in the Hugging Face cache",
    )
    p.add_argument(
        "-c", "--ctx-size", type=at.context, default=4096, help="context size for the memory check"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)
