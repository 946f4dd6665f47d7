"""draft-mtp on tiny Qwen3.5 GGUFs with a NextN block, through the real llama.cpp path.

No public MTP model can be downloaded here, so ``mtp_gguf.py`` writes tiny ``qwen35`` and
``qwen35moe`` files (random weights, llama.cpp's tensor names and shapes, SmolLM2's
tokenizer): an ``agree`` variant whose head predicts what the trunk will (every draft
accepted) and a ``random`` one (nearly every draft rejected, so the hybrid target's
recurrent state is rolled back every round). A tiny ``hy_v3`` file with three NextN heads
covers chained heads (draft step i runs head i)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localspec import Engine, SpecConfig
from localspec.engine import nextn_ext
from localspec.engine.mtp import MtpContext
from localspec.errors import LocalspecError
from localspec.lossless import compare

from .mtp_gguf import build_hy_v3_mtp, build_qwen35_mtp
from .test_lossless_real import assert_stats_consistent

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away", "def add(a, b):"]
N_TOKENS = 48


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, smollm_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp")
    return {
        f"{arch}-{variant}": build_qwen35_mtp(
            root / f"{arch}-{variant}.gguf",
            variant=variant,  # type: ignore[arg-type]
            moe=arch == "qwen35moe",
            tokenizer_from=smollm_path,
        )
        for arch in ("qwen35", "qwen35moe")
        for variant in ("agree", "random")
    }


N_HEADS = 3


@pytest.fixture(scope="module")
def chained_models(tmp_path_factory: pytest.TempPathFactory, smollm_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp-chained")
    return {
        variant: build_hy_v3_mtp(
            root / f"hy_v3-{variant}.gguf",
            variant=variant,  # type: ignore[arg-type]
            n_nextn=N_HEADS,
            tokenizer_from=smollm_path,
        )
        for variant in ("agree", "random")
    }


def run_against_plain(engine: Engine, spec: SpecConfig, mode: str = "draft-mtp") -> list:  # type: ignore[type-arg]
    results = []
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=N_TOKENS, mode="none", record_margins=True)
        spec_run = engine.generate(prompt, max_tokens=N_TOKENS, mode=mode, spec=spec)
        report = compare(plain.tokens, plain.margins, spec_run.tokens, plain.runners_up)
        assert report.ok, f"{prompt!r}: {report}"
        assert_stats_consistent(spec_run)
        results.append((report, spec_run))
    exact = sum(r.identical for r, _ in results)
    print(f"\n{mode}: exact match {exact}/{len(results)}")
    return results


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_agreeing_heads_draft_and_everything_is_accepted(tiny_models, arch: str) -> None:  # type: ignore[no-untyped-def]
    with Engine.load(tiny_models[f"{arch}-agree"], mode="draft-mtp", n_ctx=512) as engine:
        assert engine.available_modes() == [
            "none",
            "ngram-simple",
            "suffix",
            "suffix+ngram-simple",
            "draft-mtp",
            "ngram-simple+draft-mtp",
            "suffix+draft-mtp",
        ]
        results = run_against_plain(engine, SpecConfig(n_max=4, adaptive=False))
    for _, r in results:
        s = r.stats
        assert s.drafted > 0 and s.accepted == s.drafted  # the full-accept path
        assert s.acceptance_per_position == (1.0, 1.0, 1.0, 1.0)
        # one plain first token, then rounds of 4 accepted + 1 bonus token (the last round's
        # draft is cut to the tokens still wanted)
        assert s.drafted_at[3] >= s.verifications - 1
        assert s.verifications == pytest.approx((N_TOKENS - 1) / 5, abs=1)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_random_heads_are_rejected_and_output_is_unchanged(tiny_models, arch: str) -> None:  # type: ignore[no-untyped-def]
    with Engine.load(tiny_models[f"{arch}-random"], mode="draft-mtp", n_ctx=512) as engine:
        results = run_against_plain(engine, SpecConfig(n_max=4, adaptive=False))
    drafted = sum(r.stats.drafted for _, r in results)
    accepted = sum(r.stats.accepted for _, r in results)
    assert drafted > 0 and accepted / drafted < 0.2  # the reject path, every round
    # every round verifies a draft (but a last one with room for a single token)
    assert all(r.stats.verifications >= r.stats.rounds - 1 for _, r in results)


def test_sampling_and_chain_and_prefix_reuse(tiny_models) -> None:  # type: ignore[no-untyped-def]
    with Engine.load(tiny_models["qwen35-agree"], mode="draft-mtp", n_ctx=512) as engine:
        spec = SpecConfig(n_max=4, adaptive=False)
        a = engine.generate(PROMPTS[0], max_tokens=32, temperature=0.8, seed=3, spec=spec)
        b = engine.generate(PROMPTS[0], max_tokens=32, temperature=0.8, seed=3, spec=spec)
        assert a.tokens == b.tokens and a.stats.drafted > 0
        assert_stats_consistent(a)
        # a chain: the n-gram lookup first, the head when the lookup has nothing
        chained = run_against_plain(engine, spec, "ngram-simple,draft-mtp")
        names = {name for _, r in chained for name, *_ in r.stats.by_drafter}
        assert "draft-mtp" in names
        # a second prompt sharing a prefix: the target re-uses its cache (a deep cut of the
        # recurrent state re-decodes) and the MTP context resumes from there
        engine.generate(PROMPTS[1], max_tokens=8)
        reused = engine.generate(PROMPTS[1] + " there", max_tokens=24, spec=spec)
    with Engine.load(tiny_models["qwen35-agree"], mode="none", n_ctx=512) as fresh:
        plain = fresh.generate(PROMPTS[1] + " there", max_tokens=24, record_margins=True)
    assert compare(plain.tokens, plain.margins, reused.tokens, plain.runners_up).ok
    assert reused.stats.accepted == reused.stats.drafted > 0


def test_a_model_without_nextn_layers_is_refused(qwen_path: Path) -> None:
    with pytest.raises(LocalspecError) as err:
        Engine.load(qwen_path, mode="draft-mtp")
    assert "no NextN (MTP) layers" in err.value.message
    assert "-MTP" in (err.value.hint or "")


def test_chained_heads_agreeing_draft_one_token_per_head(chained_models) -> None:  # type: ignore[no-untyped-def]
    with Engine.load(chained_models["agree"], mode="draft-mtp", n_ctx=512) as engine:
        assert engine.mtp is not None and engine.mtp.chained
        assert engine.mtp.n_heads == engine.mtp.max_draft == N_HEADS
        results = run_against_plain(engine, SpecConfig(n_max=8, adaptive=False))
    for _, r in results:
        s = r.stats
        assert s.drafted > 0 and s.accepted == s.drafted  # every head predicts the trunk
        assert len(s.drafted_at) == N_HEADS  # n_max=8 is capped at one token per head
        assert s.acceptance_per_position == (1.0,) * N_HEADS
        assert s.drafted_at[N_HEADS - 1] >= s.verifications - 1
        assert s.verifications == pytest.approx((N_TOKENS - 1) / (N_HEADS + 1), abs=1)


def test_chained_heads_random_are_lossless(chained_models) -> None:  # type: ignore[no-untyped-def]
    with Engine.load(chained_models["random"], mode="draft-mtp", n_ctx=512) as engine:
        assert engine.mtp is not None and engine.mtp.chained
        results = run_against_plain(engine, SpecConfig(n_max=8, adaptive=False))
        sampled = engine.generate(
            PROMPTS[0], max_tokens=24, temperature=0.8, seed=5, spec=SpecConfig(n_max=8)
        )
    assert_stats_consistent(sampled)
    assert len(sampled.stats.drafted_at) <= N_HEADS
    drafted = sum(r.stats.drafted for _, r in results)
    accepted = sum(r.stats.accepted for _, r in results)
    assert drafted > 0 and accepted / drafted < 0.2  # the reject path, every round
    assert all(len(r.stats.drafted_at) <= N_HEADS for _, r in results)


def _reference_chain(mtp, tokens: list[int], k: int) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """llama.cpp's chained draft after ``tokens[:k]``, recomputed from scratch in a fresh MTP
    context: step i = head i over every pair (h_{p-1}, x_p), p < k, plus the draft prefix."""
    ctx = MtpContext._new_context(mtp.target)
    nextn_ext.llama_set_embeddings_nextn(ctx, True, True)
    chain = [(tokens[k], mtp.hidden[k - 1])]
    rows = []
    with nextn_ext.MtpBatch(ctx, mtp.n_embd) as batch:
        for head in range(mtp.n_heads):
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, 0, -1)
            nextn_ext.llama_set_nextn_layer_offset(ctx, head)
            batch.clear()
            # every entry an output: hy_v3 exposes h_nextn before selecting the output rows
            for p in range(k):
                h = mtp.hidden[p - 1] if p else np.zeros(mtp.n_embd)
                batch.add(tokens[p], p, h, output=True)
            for t, (tok, h) in enumerate(chain):
                batch.add(tok, k + t, h, output=True)
            assert batch.decode() == 0
            logits = llama_cpp.llama_get_logits_ith(ctx, -1)
            rows.append(np.ctypeslib.as_array(logits, shape=(mtp.n_vocab,)).copy())
            h_next = nextn_ext.nextn_row(ctx, batch.n - 1, mtp.n_embd)
            chain.append((int(rows[-1].argmax()), h_next))
    llama_cpp.llama_free(ctx)
    return rows


def test_chained_heads_follow_the_target_per_head(chained_models) -> None:  # type: ignore[no-untyped-def]
    """The incremental per-head catch-up (with cuts, as after rejected drafts) leaves every
    head's cache as if it had decoded the accepted history at once; each draft step runs
    the next head (random heads: every head predicts something else)."""
    with Engine.load(chained_models["random"], mode="draft-mtp", n_ctx=512) as engine:
        mtp, target = engine.mtp, engine.target
        tokens = target.tokenize(PROMPTS[1] + " " + PROMPTS[2])
        k = len(tokens) - 2
        mtp.active = True
        target.trim(0)
        target.decode(tokens[:6])
        target.decode([*tokens[6:9], 7, 8, 9])  # three "rejected draft" tokens ...
        target.trim(9)  # ... rolled back, then re-fed from there
        target.decode(tokens[9:k])
        rows = [mtp.first_step(tokens[k], k).copy()]
        for i in range(1, mtp.n_heads):
            rows.append(mtp.next_step(int(rows[-1].argmax()), k + i).copy())
        reference = _reference_chain(mtp, tokens, k)
    assert [int(r.argmax()) for r in rows] == [int(r.argmax()) for r in reference]
    assert len({int(r.argmax()) for r in rows}) > 1
    for got, want in zip(rows, reference, strict=True):
        assert np.abs(got - want).max() < 1e-3
