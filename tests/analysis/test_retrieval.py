"""Retrieval heads: the scores on hand-built captures against a direct count, the lookback ratio against its formula,
the rankings' stability and the max-T correction's null rejection rate (docs/probes.md#retrieval-heads)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from probe.analysis.max_t import max_t_sign_flip
from scripts.simulate import simulate_null
from probe.analysis.retrieval import retrieval_heads
from probe.attention.retrieval import chance_score, pooled_score, top_heads, trial_retrieval
from probe.attention.answer import AnswerAttention

KINDS = ("sink", "germane", "extraneous", "germane", "question")
SPANS = ((0, 1), (1, 5), (5, 9), (9, 12), (12, 14))


def capture(rng: np.random.Generator, n_layers: int = 2, n_heads: int = 3, n_gen: int = 8,
            copy_head: tuple[int, int] | None = None) -> AnswerAttention:
    """A random capture over a 14-token prompt; ``copy_head`` points its top key at a germane copy of each token."""
    prompt = rng.integers(0, 20, size=14)
    tokens = np.concatenate([prompt[[2, 3, 10]], rng.integers(0, 40, size=n_gen - 3)]).astype(np.int64)
    mass = rng.dirichlet(np.ones(len(KINDS) + 1), size=(n_gen, n_layers, n_heads)).astype(np.float32)
    mass[0, ..., -1] = 0.0  # row 0 sees no answer token
    mass[0] /= mass[0].sum(-1, keepdims=True)
    top = np.stack([rng.integers(0, 14 + t, size=(n_layers, n_heads)) for t in range(n_gen)]).astype(np.int32)
    if copy_head is not None:
        germ = [p for (a, b), k in zip(SPANS, KINDS) if k == "germane" for p in range(a, b)]
        for t, tok in enumerate(tokens):
            hits = [p for p in germ if prompt[p] == tok]
            if hits:
                top[t, copy_head[0], copy_head[1]] = hits[0]
    return AnswerAttention(tokens=tokens, mass=mass, vmass=None, top_key=top, prompt_ids=prompt.astype(np.int64),
                           segment_kinds=KINDS, segment_labels=tuple(f"s{i}" for i in range(len(KINDS))),
                           segment_spans=SPANS)


def direct_count(ans: AnswerAttention) -> tuple[np.ndarray, int]:
    """Copied tokens per head and copyable tokens, by looping over every row and head."""
    seq = list(ans.prompt_ids) + list(ans.tokens)
    germ = {p for (a, b), k in zip(SPANS, KINDS) if k == "germane" for p in range(a, b)}
    germ_ids = {int(ans.prompt_ids[p]) for p in germ}
    n_t, n_l, n_h = ans.top_key.shape
    copied = np.zeros((n_l, n_h), dtype=int)
    copyable = 0
    for t in range(n_t):
        tok = int(ans.tokens[t])
        if tok not in germ_ids:
            continue
        copyable += 1
        for li in range(n_l):
            for h in range(n_h):
                k = int(ans.top_key[t, li, h])
                if k in germ and int(seq[k]) == tok:
                    copied[li, h] += 1
    return copied, copyable


def test_scores_equal_a_direct_count():
    rng = np.random.default_rng(3)
    for _ in range(20):
        ans = capture(rng, copy_head=(1, 2))
        tr = trial_retrieval(ans)
        copied, copyable = direct_count(ans)
        np.testing.assert_array_equal(tr.copied, copied)
        assert tr.copyable == copyable >= 3
        assert tr.copied[1, 2] == copyable  # the planted head copies every copyable token
        np.testing.assert_allclose(tr.score, copied / copyable)


def test_a_top_key_in_an_extraneous_segment_is_no_copy():
    rng = np.random.default_rng(5)
    ans = capture(rng, copy_head=(0, 0))
    prompt = ans.prompt_ids.copy()
    prompt[5:9] = prompt[2]  # the extraneous segment repeats a germane token copied at row 0
    top = ans.top_key.copy()
    top[0, 0, 0] = 6
    moved = AnswerAttention(ans.tokens, ans.mass, None, top, prompt, KINDS, ans.segment_labels, SPANS)
    assert trial_retrieval(moved).copied[0, 0] == trial_retrieval(ans).copied[0, 0] - 1


def test_lookback_and_answer_p_ext_follow_their_formulas():
    rng = np.random.default_rng(1)
    ans = capture(rng)
    tr = trial_retrieval(ans)
    m = ans.mass.astype(float)
    n_t = len(ans.tokens)
    for li in range(2):
        for h in range(3):
            lr = []
            pe = []
            for t in range(n_t):
                ctx, new = m[t, li, h, :5].sum(), m[t, li, h, 5]
                if t >= 1:
                    lr.append((ctx / 14) / (ctx / 14 + new / t))
                pe.append(m[t, li, h, 2] / (m[t, li, h, 1:5].sum() + new))
            assert tr.lookback[li, h] == pytest.approx(np.mean(lr), rel=1e-6)
            assert tr.answer_p_ext[li, h] == pytest.approx(np.mean(pe), rel=1e-6)


def test_chance_score_is_the_mean_score_of_uniform_top_keys():
    rng = np.random.default_rng(2)
    ans = capture(rng)
    sims = []
    sim_rng = np.random.default_rng(9)
    for _ in range(4000):
        top = np.stack([sim_rng.integers(0, 14 + t, size=(2, 3)) for t in range(len(ans.tokens))]).astype(np.int32)
        a = AnswerAttention(ans.tokens, ans.mass, None, top, ans.prompt_ids, KINDS, ans.segment_labels, SPANS)
        sims.append(trial_retrieval(a).score.mean())
    assert np.mean(sims) == pytest.approx(chance_score(ans), abs=3 * np.std(sims) / np.sqrt(len(sims)) + 1e-9)


def test_pooled_score_is_a_ratio_of_sums_and_top_heads_rank_it():
    copied = np.array([[[1, 0], [2, 0]], [[3, 1], [0, 0]]])
    copyable = np.array([2, 4])
    np.testing.assert_allclose(pooled_score(copied, copyable), np.array([[4, 1], [2, 0]]) / 6)
    assert top_heads(pooled_score(copied, copyable), 3) == [(0, 0), (1, 0), (0, 1)]


def _study(rng: np.random.Generator, n_q: int, copy_head: tuple[int, int] | None,
           sat_head: tuple[int, int] | None = None) -> tuple[pd.DataFrame, list]:
    rows, trials = [], []
    for q in range(n_q):
        for cond, load in (("Control", 0), ("Saturation", 20), ("Saturation", 80)):
            head = copy_head if cond == "Control" or sat_head is None else sat_head
            ans = capture(rng, copy_head=head)
            rows.append({"task_id": f"q{q}", "condition": cond, "load": load, "em": float(rng.random() < 0.5)})
            trials.append(trial_retrieval(ans))
    return pd.DataFrame(rows), trials


def test_planted_head_tops_every_ranking_and_is_stable():
    rng = np.random.default_rng(0)
    sub, trials = _study(rng, 8, (1, 2))
    res = retrieval_heads(sub, trials, "m", k=2, seed=1, n_boot=200)
    assert res.control is not None and (res.control.top[0].layer, res.control.top[0].head) == (1, 2)
    assert res.control.top[0].score == 1.0
    assert all((c.top[0].layer, c.top[0].head) == (1, 2) for c in res.cells)
    for s in res.stability:
        assert s.spearman is not None and s.spearman_ci_low is not None and s.spearman_ci_low <= s.spearman_ci_high
        assert s.overlap is not None and s.overlap >= 0.5  # the planted head is in both top-2
    # Control score map = a pooled direct count
    ctrl = [t for t, c in zip(trials, sub["condition"]) if c == "Control"]
    expect = sum(t.copied for t in ctrl) / sum(t.copyable for t in ctrl)
    np.testing.assert_allclose(res.control.score.values, expect, rtol=1e-6)


def test_stability_spearman_matches_scipy():
    rng = np.random.default_rng(4)
    sub, trials = _study(rng, 6, None)
    res = retrieval_heads(sub, trials, "m", k=3, seed=0, n_boot=50)
    assert res.control is not None
    cell = next(c for c in res.cells if c.condition == "Saturation" and c.load == 20)
    agree = next(s for s in res.stability if s.condition == "Saturation" and s.load == 20)
    rho = scipy.stats.spearmanr(res.control.score.values.ravel(), cell.score.values.ravel()).statistic
    assert agree.spearman == pytest.approx(rho, abs=1e-6)


def test_rank_correlation_interval_is_bca_and_covers_better_than_the_percentile():
    """Seeded simulation against a known ρ (scripts/simulate.py rho_coverage; the table in docs/statistics.md): the
    percentile interval of ρ̂ often ends at ρ̂ itself (resampling attenuates ρ further) and under-covers; the BCa
    interval the analysis now gives covers more, and equals scipy's BCa on the same resamples."""
    from probe.analysis.retrieval import rho_interval
    from scripts.simulate import rho_coverage

    row = rho_coverage(2026, 20, 100, target=0.6)
    assert row.percentile_at_top > 0.2 and row.bca >= row.percentile + 0.05
    # the interval is scipy's BCa of the statistic over questions, seeded by the generator given
    x = np.random.default_rng(3).normal(size=(12, 30))
    y = x + np.random.default_rng(4).normal(size=(12, 30))

    def rho_of(w):
        a, b = np.tensordot(w, x, 1), np.tensordot(w, y, 1)
        return np.array([scipy.stats.spearmanr(u, v).statistic for u, v in zip(a, b)])

    lo, hi = rho_interval(rho_of, 12, 0.05, 199, np.random.default_rng(9))
    ref = scipy.stats.bootstrap((np.arange(12),), lambda i, axis=-1: rho_of(np.stack(
        [np.bincount(r, minlength=12) for r in np.reshape(i, (-1, np.shape(i)[-1]))]).astype(float)).reshape(
            np.shape(i)[:-1]),
        n_resamples=199, vectorized=True, method="BCa", rng=np.random.default_rng(9)).confidence_interval
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-9)


def test_saturation_drop_finds_a_head_that_stops_copying_under_saturation():
    rng = np.random.default_rng(7)
    sub, trials = _study(rng, 10, (1, 2), sat_head=(0, 1))
    res = retrieval_heads(sub, trials, "m", k=2, seed=0, n_boot=50)
    drop = res.saturation_drop
    assert drop is not None and drop.is_test
    found = {(h.layer, h.head) for h in drop.max_t.significant}
    assert (1, 2) in found and (0, 1) in found
    est = drop.estimates.values
    assert est[1, 2] < 0 < est[0, 1]


def test_random_captures_find_no_head_above_chance():
    """A random model: top keys uniform over visible keys. No head's pooled Control score differs from chance beyond
    sampling error, and the Saturation - Control map has no max-T-significant head."""
    rng = np.random.default_rng(11)
    sub, trials = _study(rng, 12, None)
    res = retrieval_heads(sub, trials, "m", k=3, seed=0, n_boot=50)
    assert res.control is not None and res.control.chance is not None
    score = res.control.score.values
    n = res.control.n_copyable
    se = np.sqrt(res.control.chance * (1 - res.control.chance) / n)
    assert np.all(np.abs(score - res.control.chance) < 4 * se + 1e-9)
    assert res.saturation_drop is not None
    assert not res.saturation_drop.max_t.significant


def test_max_t_exact_matches_enumeration_and_holds_its_level():
    rng = np.random.default_rng(0)
    D = rng.normal(size=(6, 2, 2))
    res = max_t_sign_flip(D)
    assert res.is_exact and res.n_assignments == 64
    # direct enumeration
    import itertools
    flat = D.reshape(6, -1)

    def tstat(x: np.ndarray) -> np.ndarray:
        return x.mean(0) / (x.std(0, ddof=1) / np.sqrt(len(x)))

    obs = np.abs(tstat(flat))
    maxes = [np.abs(tstat(np.array(s)[:, None] * flat)).max() for s in itertools.product((1, -1), repeat=6)]
    expect = [(np.array(maxes) >= o - 1e-12).mean() for o in obs]
    np.testing.assert_allclose(res.p_max_t.ravel(), expect)
    np.testing.assert_allclose(res.p.ravel(), scipy.stats.ttest_1samp(flat, 0).pvalue)
    rates = simulate_null(n_sims=120, n_questions=14, grid=(4, 4), n_resamples=199, seed=3)
    assert rates["max_t"] <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 120)


def test_max_t_of_a_head_with_the_same_contrast_in_every_question():
    """A head whose every question has the same non-zero contrast is the strongest a sign flip can see: only the
    identity and the all-flipped assignment reach it (p = 2 / 2^G, enumerated directly here); one with every
    contrast 0 has nothing to test (NaN); the other heads keep their enumerated p-values."""
    import itertools

    rng = np.random.default_rng(4)
    D = rng.normal(size=(7, 2, 2))
    D[:, 0, 0] = 0.3
    D[:, 1, 1] = 0.0
    res = max_t_sign_flip(D)
    assert res.p_max_t[0, 0] == pytest.approx(2 / 2 ** 7) and res.p[0, 0] == 0.0
    assert np.isnan(res.p_max_t[1, 1]) and np.isnan(res.p[1, 1])
    flat = D.reshape(7, -1)[:, :3]  # the constant head and the two that vary (the all-0 head never counts)

    def max_abs_t(x: np.ndarray) -> float:
        sd = x.std(0, ddof=1)
        t = np.where(sd > 0, x.mean(0) / (np.where(sd > 0, sd, 1.0) / np.sqrt(7)), np.inf)  # constant: inf
        return float(np.abs(t).max())

    obs = np.abs(flat[:, 1:].mean(0) / (flat[:, 1:].std(0, ddof=1) / np.sqrt(7)))
    maxes = [max_abs_t(np.array(s)[:, None] * flat) for s in itertools.product((1, -1), repeat=7)]
    np.testing.assert_allclose([res.p_max_t[0, 1], res.p_max_t[1, 0]],
                               [(np.array(maxes) >= o - 1e-12).mean() for o in obs])


def test_select_heads_by_retrieval_pools_copied_over_copyable(tmp_path, monkeypatch):
    """``heads = {top_k = K, by = "retrieval"}``: the heads with the largest pooled score of a separate run's records
    (records read through a stand-in loader: one capture per file, the planted head copying in every one)."""
    from types import SimpleNamespace

    from probe.attention import result
    from probe.runner.resolve import select_heads
    from probe.runfolder import RunFolder

    run = RunFolder(tmp_path / "sel")
    folder = run.attention_dir("m")
    folder.mkdir(parents=True)
    run.prompts.write_text("")
    rng = np.random.default_rng(8)
    caps = {}
    for i in range(4):
        path = folder / f"p{i}.npz"
        path.write_bytes(b"")
        caps[str(path)] = capture(rng, copy_head=(0, 1))
    caps[str(folder / "none.npz")] = None  # a record without an answer capture is left out
    (folder / "none.npz").write_bytes(b"")
    monkeypatch.setattr(result.SegmentAttention, "load", staticmethod(lambda p: SimpleNamespace(answer=caps[str(p)])))
    heads, n = select_heads(run.root, "m", 2, "retrieval", 2, 3, [])
    trs = [trial_retrieval(a) for a in caps.values() if a is not None]
    want = top_heads(sum(t.copied for t in trs) / sum(t.copyable for t in trs), 2)
    assert n == 4 and list(heads) == want and heads[0] == (0, 1)
    caps.update({k: None for k in caps})
    from probe.errors import ConfigError
    with pytest.raises(ConfigError, match="answer capture"):
        select_heads(run.root, "m", 2, "retrieval", 2, 3, [])


def test_retrieval_section_round_trips_and_is_absent_when_empty():
    """``families.ice.retrieval`` reads back into the same types; an ICE result without it writes no key and a file
    without the key reads as an empty section (files written before it existed read unchanged)."""
    from probe.analysis.ice import IceResult
    from probe.analysis.results import from_json
    from probe.codec import encode

    sub, trials = _study(np.random.default_rng(0), 6, (1, 2))
    res = retrieval_heads(sub, trials, "m", k=2, n_boot=30)
    empty = IceResult(models=("m",), cells=(), h1=(), h2=(), h3=(), residue_attention=(), attention_cells=(),
                      attention_behaviour=(), taxonomy=())
    full = IceResult(**{**empty.__dict__, "retrieval": (res,)})
    assert "retrieval" not in encode(empty, {})
    assert from_json(IceResult, encode(empty, {})) == empty
    arrays: dict[str, np.ndarray] = {}
    back = from_json(IceResult, encode(full, arrays), arrays=arrays)
    assert back == full and back.retrieval[0].control.top[0].layer == 1


def test_report_draws_the_map_and_tables_and_says_why_when_there_is_no_capture(tmp_path):
    from probe.analysis.attention_link import AttentionCell
    from probe.codec import Grid
    from probe.analysis.ice import IceResult
    from probe.config import AnalysisSection
    from probe.report.blocks import ReportContext, to_html, to_markdown
    from probe.report.retrieval import NO_CAPTURE, retrieval_blocks, retrieval_tables

    sub, trials = _study(np.random.default_rng(0), 8, (1, 2))
    res = retrieval_heads(sub, trials, "m", k=2, n_boot=50)
    cell = AttentionCell(model="m", condition="Control", load=0, measure="p_ext", label="P_ext", n_prompts=1,
                         n_layers=2, n_heads=3, mean=None, values=Grid(np.zeros((2, 3))), enrichment_mean=None,
                         enrichment=None, chance=None, targets=())
    base = IceResult(models=("m",), cells=(), h1=(), h2=(), h3=(), residue_attention=(), attention_cells=(cell,),
                     attention_behaviour=(), taxonomy=())
    ctx = ReportContext(AnalysisSection(), figures_dir=tmp_path)
    html = to_html(retrieval_blocks(IceResult(**{**base.__dict__, "retrieval": (res,)})), ctx)
    assert "L1.H2" in html and "Spearman" in html and "<img" in html
    assert [p.name for p in ctx.written] == ["retrieval_m.png"]
    tables = dict(retrieval_tables(IceResult(**{**base.__dict__, "retrieval": (res,)})))
    assert tables["retrieval_top_heads"][0]["layer"] == 1 and len(tables["retrieval_stability"]) == 2
    assert NO_CAPTURE in to_html(retrieval_blocks(base), ReportContext(AnalysisSection()))
    assert NO_CAPTURE in to_markdown(retrieval_blocks(base)) and retrieval_tables(base) == []


def test_failed_vs_correct_maps_equal_statsmodels_and_find_a_planted_head():
    """The score map's estimate is statsmodels' OLS coefficient of failed on [1, failed, load, condition]; a head that
    copies only in correct trials is found (q < 0.05)."""
    import statsmodels.api as sm

    rng = np.random.default_rng(12)
    rows, trials = [], []
    for q in range(10):
        for cond, load in (("Control", 0), ("Saturation", 20), ("Saturation", 80), ("Residue", 50)):
            ok = bool(rng.random() < 0.5)
            trials.append(trial_retrieval(capture(rng, copy_head=(0, 2) if ok else None)))
            rows.append({"task_id": f"q{q}", "condition": cond, "load": load, "em": float(ok)})
    sub = pd.DataFrame(rows)
    res = retrieval_heads(sub, trials, "m", k=2, n_boot=20)
    score = next(t for t in res.failed_vs_correct if t.measure.startswith("trial retrieval"))
    assert score.is_test and (0, 2) in {(h.layer, h.head) for h, _ in score.listed()}
    y = np.stack([t.score for t in trials])[:, 0, 2]
    X = np.column_stack([np.ones(len(sub)), (sub["em"] < 0.5).astype(float), sub["load"],
                         (sub["condition"] == "Residue").astype(float),
                         (sub["condition"] == "Saturation").astype(float)])
    assert score.estimates.values[0, 2] == pytest.approx(sm.OLS(y, X).fit().params[1], rel=1e-5)
    assert score.estimates.values[0, 2] < 0
    # the max-T over the map finds the planted head, and no other (per-question failed - correct contrasts)
    pm = score.max_t.p_max_t.values
    assert pm[0, 2] < 0.05 and np.all(np.delete(pm.ravel(), 2) >= 0.05)
    assert next(h for h, _ in score.listed() if (h.layer, h.head) == (0, 2)).p_max_t == pytest.approx(pm[0, 2])
    p_ext = next(t for t in res.failed_vs_correct if t.measure.startswith("answer-time"))
    assert p_ext.n == 30  # Saturation and Residue trials only


def test_no_copyable_token_gives_reasons_not_errors():
    rng = np.random.default_rng(0)
    sub, trials = _study(rng, 6, None)
    empty = [trial_retrieval(AnswerAttention(np.full(4, 99), a.mass[:4], None, a.top_key[:4], a.prompt_ids, KINDS,
                                             a.segment_labels, SPANS))
             for a in [capture(rng) for _ in trials]]  # token 99 never occurs in the prompt
    res = retrieval_heads(sub, empty, "m", k=2, n_boot=20)
    assert res.saturation_drop is not None and not res.saturation_drop.is_test
    assert "copyable" in (res.saturation_drop.reason or "")
    assert max_t_sign_flip(np.zeros((0, 2, 3))).reason is not None


def test_failed_vs_correct_with_one_load_per_condition_is_not_rank_deficient():
    rng = np.random.default_rng(2)
    rows, trials = [], []
    for q in range(8):
        for cond, load in (("Control", 0), ("Saturation", 20)):
            rows.append({"task_id": f"q{q}", "condition": cond, "load": load, "em": float(rng.random() < 0.5)})
            trials.append(trial_retrieval(capture(rng, copy_head=(1, 1))))
    res = retrieval_heads(pd.DataFrame(rows), trials, "m", k=2, n_boot=20)
    assert all("rank deficient" not in (t.reason or "") for t in res.failed_vs_correct)
    assert res.failed_vs_correct[0].is_test
