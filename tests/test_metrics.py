"""Ranking metrics: hand-computed cases, tie rules, masking, chunking, reference cross-check."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlib.metrics import (
    csr_to_dense_mask,
    full_ranking_metrics,
    full_ranking_metrics_from_score_fn,
    mean_over_users,
    paired_ttest,
    rank_of_positive,
    sampled_metrics,
    select_csr_rows,
)

LOG2_3 = math.log2(3)  # discount of rank 2 is 1/log2(3) = 0.630930
ALL_METRICS = ("recall", "ndcg", "hr", "precision", "mrr")


def csr(rows):
    """CSR arrays from a list of per-user item lists."""
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    items = np.array([i for r in rows for i in r], dtype=np.int64)
    return indptr, items


def assert_close(actual, expected, tol=1e-9):
    actual = actual.tolist() if isinstance(actual, torch.Tensor) else list(actual)
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        if e is None or (isinstance(e, float) and math.isnan(e)):
            assert math.isnan(a), (actual, expected)
        else:
            assert a == pytest.approx(e, abs=tol), (actual, expected)


# --------------------------------------------------------------------------------------
# Full ranking, hand-computed
# --------------------------------------------------------------------------------------
@pytest.fixture
def three_users():
    scores = torch.tensor(
        [
            [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],  # ranking: items 0,1,2,3,4,5
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # ranking: items 5,4,3,2,1,0
            [0.3, 0.1, 0.2, 0.6, 0.5, 0.4],  # has no targets
        ]
    )
    targets = csr([[1, 4, 5], [5], []])
    return scores, targets


def test_full_ranking_hand_computed(three_users):
    scores, (t_ptr, t_items) = three_users
    out = full_ranking_metrics(scores, t_ptr, t_items, ks=(2, 5), metrics=ALL_METRICS)
    # User 0: targets {1,4,5} at ranks 2, 5, 6.
    #   @2: one hit (rank 2).  Recall = 1/3, Precision = 1/2, HR = 1, MRR = 1/2
    #       DCG = 1/log2(3); IDCG over min(2,3)=2 slots = 1 + 1/log2(3)
    #   @5: hits at ranks 2 and 5. Recall = 2/3, Precision = 2/5
    #       DCG = 1/log2(3) + 1/log2(6); IDCG = 1 + 1/log2(3) + 1/log2(4)
    # User 1: target {5} at rank 1 -> every metric 1, Precision@2 = 1/2, Precision@5 = 1/5.
    # User 2: no targets -> NaN everywhere.
    ndcg0_2 = (1 / LOG2_3) / (1 + 1 / LOG2_3)  # 0.386853
    ndcg0_5 = (1 / LOG2_3 + 1 / math.log2(6)) / (1 + 1 / LOG2_3 + 0.5)  # 0.477624
    assert ndcg0_2 == pytest.approx(0.386853, abs=1e-6)
    assert ndcg0_5 == pytest.approx(0.477624, abs=1e-6)
    nan = float("nan")
    assert_close(out["Recall@2"], [1 / 3, 1.0, nan])
    assert_close(out["Recall@5"], [2 / 3, 1.0, nan])
    assert_close(out["NDCG@2"], [ndcg0_2, 1.0, nan])
    assert_close(out["NDCG@5"], [ndcg0_5, 1.0, nan])
    assert_close(out["HR@2"], [1.0, 1.0, nan])
    assert_close(out["Precision@2"], [0.5, 0.5, nan])
    assert_close(out["Precision@5"], [0.4, 0.2, nan])
    assert_close(out["MRR@2"], [0.5, 1.0, nan])
    assert set(out) == {f"{m}@{k}" for k in (2, 5) for m in ("Recall", "NDCG", "HR", "Precision", "MRR")}
    assert all(v.shape == (3,) and v.dtype == torch.float64 for v in out.values())


def test_recall_denominators(three_users):
    scores, (t_ptr, t_items) = three_users
    default = full_ranking_metrics(scores, t_ptr, t_items, ks=(2,), metrics=("recall",))
    min_k = full_ranking_metrics(scores, t_ptr, t_items, ks=(2,), metrics=("recall",), recall_denominator="min_k")
    # User 0 has 1 hit in the top-2 and |T| = 3: 1/3 with |T|, 1/min(2, 3) = 1/2 with min_k.
    assert default["Recall@2"][0].item() == pytest.approx(1 / 3)
    assert min_k["Recall@2"][0].item() == pytest.approx(1 / 2)
    assert min_k["Recall@2"][1].item() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr, t_items, recall_denominator="k")


def test_masked_items_are_skipped_and_masked_targets_are_misses():
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.9, 0.8, 0.7, 0.6]])
    # User 0: item 0 masked, target 2 -> ranking 1, 2, 3: target at rank 2.
    # User 1: item 0 masked but also a target, other target 2 at rank 2; |T| = 2.
    t_ptr, t_items = csr([[2], [0, 2]])
    m_ptr, m_items = csr([[0], [0]])
    out = full_ranking_metrics(scores, t_ptr, t_items, ks=(1, 2), mask_indptr=m_ptr, mask_items=m_items)
    # User 0: Recall@1 = 0, Recall@2 = 1, NDCG@2 = (1/log2 3) / 1.
    # User 1: Recall@2 = 1/2, NDCG@2 = (1/log2 3) / (1 + 1/log2 3) = 0.386853.
    assert_close(out["Recall@1"], [0.0, 0.0])
    assert_close(out["Recall@2"], [1.0, 0.5])
    assert_close(out["NDCG@2"], [1 / LOG2_3, (1 / LOG2_3) / (1 + 1 / LOG2_3)])
    unmasked = full_ranking_metrics(scores, t_ptr, t_items, ks=(1,))
    assert_close(unmasked["Recall@1"], [0.0, 0.5])  # without the mask item 0 is a hit at rank 1


def test_k_larger_than_candidate_count():
    scores = torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1]])
    # Item 0 masked for both users. User 0's target 2 ends at rank 2 of the 2 candidates.
    # User 1's only target is the masked item 0: it still enters torch.topk (with -inf)
    # because K > #candidates, but must not count as a hit.
    t_ptr, t_items = csr([[2], [0]])
    m_ptr, m_items = csr([[0], [0]])
    out = full_ranking_metrics(scores, t_ptr, t_items, ks=(10,), mask_indptr=m_ptr, mask_items=m_items, metrics=ALL_METRICS)
    assert_close(out["Recall@10"], [1.0, 0.0])
    assert_close(out["HR@10"], [1.0, 0.0])
    assert_close(out["NDCG@10"], [1 / LOG2_3, 0.0])
    assert_close(out["Precision@10"], [0.1, 0.0])  # Precision divides by K = 10, not by 3
    assert_close(out["MRR@10"], [0.5, 0.0])


def test_tie_rules_full_ranking():
    scores = torch.tensor([[0.5, 0.5, 0.5, 0.1], [0.5, 0.5, 0.5, 0.5]])
    # User 0: target 1 tied with non-targets 0 and 2.
    #   pessimistic: order 0, 2, 1, 3 -> target at rank 3: Recall@2 = 0, NDCG@3 = 1/log2(4) = 0.5
    #   optimistic:  target at rank 1: Recall@2 = 1, NDCG@3 = 1
    # User 1: all four tied, targets {0, 3}.
    #   pessimistic: non-targets 1, 2 first -> targets at ranks 3, 4:
    #     NDCG@4 = (1/log2 4 + 1/log2 5) / (1 + 1/log2 3) = 0.570642
    #   optimistic: targets at ranks 1, 2 -> NDCG@4 = 1
    t_ptr, t_items = csr([[1], [0, 3]])
    pess = full_ranking_metrics(scores, t_ptr, t_items, ks=(2, 3, 4), tie_rule="pessimistic")
    opt = full_ranking_metrics(scores, t_ptr, t_items, ks=(2, 3, 4), tie_rule="optimistic")
    ndcg1_pess = (0.5 + 1 / math.log2(5)) / (1 + 1 / LOG2_3)
    assert ndcg1_pess == pytest.approx(0.570642, abs=1e-6)
    assert_close(pess["Recall@2"], [0.0, 0.0])
    assert_close(pess["NDCG@3"], [0.5, (0.5) / (1 + 1 / LOG2_3)])  # user 1: one target at rank 3
    assert_close(pess["NDCG@4"], [0.5, ndcg1_pess])
    assert_close(opt["Recall@2"], [1.0, 1.0])
    assert_close(opt["NDCG@4"], [1.0, 1.0])
    # torch.topk's order is unspecified for ties, but must lie between the two bounds.
    any_order = full_ranking_metrics(scores, t_ptr, t_items, ks=(2, 3, 4))
    for key in any_order:
        assert torch.all(pess[key] <= any_order[key] + 1e-12) and torch.all(any_order[key] <= opt[key] + 1e-12)
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr, t_items, tie_rule="random")


def test_duplicate_targets_counted_once():
    scores = torch.tensor([[0.9, 0.8, 0.7]])
    t_ptr, t_items = csr([[1, 1]])  # the same target listed twice
    out = full_ranking_metrics(scores, t_ptr, t_items, ks=(2,))
    # |T| = 1, hit at rank 2: Recall = 1, NDCG = 1/log2(3)
    assert_close(out["Recall@2"], [1.0])
    assert_close(out["NDCG@2"], [1 / LOG2_3])


def test_input_validation():
    scores = torch.zeros(2, 3)
    t_ptr, t_items = csr([[0], [1]])
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr[:-1], t_items)  # wrong number of rows
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, *csr([[0], [7]]))  # item id out of range
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr, t_items, ks=(0,))
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr, t_items, metrics=("auc",))
    with pytest.raises(ValueError):
        full_ranking_metrics(torch.tensor([[0.1, float("nan"), 0.2], [0, 0, 0.0]]), t_ptr, t_items)
    with pytest.raises(ValueError):
        full_ranking_metrics(scores, t_ptr, t_items, mask_indptr=t_ptr)  # mask_items missing
    with pytest.raises(TypeError):
        full_ranking_metrics(torch.zeros(2, 3, dtype=torch.int64), t_ptr, t_items)


# --------------------------------------------------------------------------------------
# Chunking, dtypes, score_fn, reference cross-check
# --------------------------------------------------------------------------------------
def random_case(num_users=37, num_items=29, seed=0, integer_scores=False):
    rng = np.random.default_rng(seed)
    if integer_scores:  # few distinct values -> many ties
        scores = torch.from_numpy(rng.integers(0, 4, size=(num_users, num_items)).astype(np.float64))
    else:
        scores = torch.from_numpy(rng.standard_normal((num_users, num_items)).astype(np.float32)).double()
    targets, masks = [], []
    for u in range(num_users):
        perm = rng.permutation(num_items)
        n_t = int(rng.integers(0, 12))  # some users get no targets, some more than K
        n_m = int(rng.integers(0, 8))
        targets.append(sorted(perm[:n_t].tolist()))
        masks.append(sorted(perm[n_t - 1 if n_t and rng.random() < 0.2 else n_t : n_t + n_m].tolist()))
    return scores, csr(targets), csr(masks), targets, masks


def reference_metrics(scores, targets, masks, ks, tie_rule, recall_denominator="num_targets"):
    """Straightforward per-user implementation with explicit sorting."""
    out = {}
    for u in range(scores.shape[0]):
        t_set, m_set = set(targets[u]), set(masks[u])
        row = scores[u].tolist()
        candidates = [i for i in range(len(row)) if i not in m_set]
        # Sort by score descending; among ties, non-targets first (pessimistic) or last.
        if tie_rule == "pessimistic":
            ranked = sorted(candidates, key=lambda i: (-row[i], i in t_set))
        else:
            ranked = sorted(candidates, key=lambda i: (-row[i], i not in t_set))
        for k in ks:
            rel = [1 if i in t_set else 0 for i in ranked[:k]]
            n = len(t_set)
            if n == 0:
                vals = dict.fromkeys(("Recall", "NDCG", "HR", "Precision", "MRR"), float("nan"))
            else:
                dcg = sum(r / math.log2(pos + 2) for pos, r in enumerate(rel))
                idcg = sum(1 / math.log2(pos + 2) for pos in range(min(k, n)))
                first = next((pos + 1 for pos, r in enumerate(rel) if r), None)
                denom = n if recall_denominator == "num_targets" else min(k, n)
                vals = {"Recall": sum(rel) / denom, "NDCG": dcg / idcg, "HR": float(sum(rel) > 0),
                        "Precision": sum(rel) / k, "MRR": 1 / first if first else 0.0}
            for name, v in vals.items():
                out.setdefault(f"{name}@{k}", []).append(v)
    return out


@pytest.mark.parametrize("tie_rule", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("recall_denominator", ["num_targets", "min_k"])
def test_random_cross_check_with_ties(tie_rule, recall_denominator):
    scores, (t_ptr, t_items), (m_ptr, m_items), targets, masks = random_case(integer_scores=True, seed=1)
    ks = (1, 3, 10, 40)  # 40 > number of items
    out = full_ranking_metrics(scores, t_ptr, t_items, ks, m_ptr, m_items, ALL_METRICS,
                               tie_rule=tie_rule, recall_denominator=recall_denominator, chunk_size=8)
    ref = reference_metrics(scores, targets, masks, ks, tie_rule, recall_denominator)
    assert set(out) == set(ref)
    for key in ref:
        assert_close(out[key], ref[key], tol=1e-12)


def test_random_cross_check_topk_without_ties():
    scores, (t_ptr, t_items), (m_ptr, m_items), targets, masks = random_case(seed=2)
    out = full_ranking_metrics(scores, t_ptr, t_items, (5, 20), m_ptr, m_items, ALL_METRICS)
    ref = reference_metrics(scores, targets, masks, (5, 20), "pessimistic")  # no ties: any rule
    for key in ref:
        assert_close(out[key], ref[key], tol=1e-12)


def test_chunked_equals_unchunked_and_float32_equals_float64():
    scores, (t_ptr, t_items), (m_ptr, m_items), _, _ = random_case(num_users=50, num_items=40, seed=3)
    whole = full_ranking_metrics(scores, t_ptr, t_items, (5, 10), m_ptr, m_items, ALL_METRICS, chunk_size=1000)
    chunked = full_ranking_metrics(scores, t_ptr, t_items, (5, 10), m_ptr, m_items, ALL_METRICS, chunk_size=7)
    single = full_ranking_metrics(scores.float(), t_ptr, t_items, (5, 10), m_ptr, m_items, ALL_METRICS, chunk_size=1)
    for key in whole:
        assert torch.equal(torch.isnan(whole[key]), torch.isnan(chunked[key]))
        assert torch.allclose(whole[key], chunked[key], equal_nan=True, atol=0)
        # scores were drawn in float32, so the float32 ranking is the same as the float64 one
        assert torch.allclose(whole[key], single[key], equal_nan=True, atol=0)
        assert single[key].dtype == torch.float64


def test_torch_index_inputs_match_numpy_inputs():
    scores, (t_ptr, t_items), (m_ptr, m_items), _, _ = random_case(seed=4)
    a = full_ranking_metrics(scores, t_ptr, t_items, (10,), m_ptr, m_items)
    b = full_ranking_metrics(scores, torch.from_numpy(t_ptr), torch.from_numpy(t_items), (10,),
                             torch.from_numpy(m_ptr), torch.from_numpy(m_items))
    for key in a:
        assert torch.allclose(a[key], b[key], equal_nan=True)


def test_score_fn_matches_full_matrix_on_a_user_subset():
    scores, (t_ptr, t_items), (m_ptr, m_items), _, _ = random_case(num_users=40, seed=5)
    users = np.array([7, 3, 39, 0, 3, 22])  # out of order, with a repeat
    calls = []

    def score_fn(user_ids):
        calls.append(len(user_ids))
        return scores[user_ids]

    out = full_ranking_metrics_from_score_fn(score_fn, users, t_ptr, t_items, (3, 10), m_ptr, m_items,
                                             ALL_METRICS, chunk_size=4)
    full = full_ranking_metrics(scores, t_ptr, t_items, (3, 10), m_ptr, m_items, ALL_METRICS)
    assert calls == [4, 2]  # bounded chunks, never the whole matrix
    for key in full:
        assert torch.allclose(out[key], full[key][torch.from_numpy(users)], equal_nan=True)


def test_select_csr_rows_and_dense_mask():
    indptr, items = csr([[4, 1], [], [2, 0, 3]])
    sub_ptr, sub_items = select_csr_rows(indptr, items, [2, 0, 1, 2])
    assert sub_ptr.tolist() == [0, 3, 5, 5, 8]
    assert sub_items.tolist() == [2, 0, 3, 4, 1, 2, 0, 3]
    dense = csr_to_dense_mask(indptr, items, 5)
    assert dense.tolist() == [
        [False, True, False, False, True],
        [False, False, False, False, False],
        [True, False, True, True, False],
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():  # pragma: no cover - only on GPU machines
    scores, (t_ptr, t_items), (m_ptr, m_items), _, _ = random_case(seed=6)
    cpu = full_ranking_metrics(scores, t_ptr, t_items, (5,), m_ptr, m_items, tie_rule="pessimistic")
    gpu = full_ranking_metrics(scores.cuda(), t_ptr, t_items, (5,), m_ptr, m_items, tie_rule="pessimistic")
    for key in cpu:
        assert gpu[key].device.type == "cuda"
        assert torch.allclose(cpu[key], gpu[key].cpu(), equal_nan=True)


# --------------------------------------------------------------------------------------
# Sampled candidates
# --------------------------------------------------------------------------------------
POS = torch.tensor([0.5, 0.5, 0.9])
NEG = torch.tensor(
    [
        [0.6, 0.5, 0.1, 0.5],  # 1 negative above, 2 tied
        [0.1, 0.2, 0.3, 0.4],  # none above, none tied
        [0.9, 0.9, 0.9, 0.9],  # none above, 4 tied (a constant scorer)
    ]
)


def test_rank_of_positive_tie_rules():
    # pessimistic = 1 + above + tied; optimistic = 1 + above; average = 1 + above + tied/2
    assert_close(rank_of_positive(POS, NEG, "pessimistic"), [4.0, 1.0, 5.0])
    assert_close(rank_of_positive(POS, NEG, "optimistic"), [2.0, 1.0, 1.0])
    assert_close(rank_of_positive(POS, NEG, "average"), [3.0, 1.0, 3.0])
    with pytest.raises(ValueError):
        rank_of_positive(POS, NEG, "first")


def test_sampled_metrics_pessimistic_and_optimistic():
    pess = sampled_metrics(POS, NEG, ks=(1, 2, 5))
    # ranks 4, 1, 5
    assert_close(pess["HR@1"], [0.0, 1.0, 0.0])
    assert_close(pess["HR@2"], [0.0, 1.0, 0.0])
    assert_close(pess["HR@5"], [1.0, 1.0, 1.0])
    assert_close(pess["NDCG@5"], [1 / math.log2(5), 1.0, 1 / math.log2(6)])  # 0.430677, 1, 0.386853
    assert_close(pess["NDCG@2"], [0.0, 1.0, 0.0])
    assert_close(pess["MRR"], [0.25, 1.0, 0.2])
    opt = sampled_metrics(POS, NEG, ks=(1, 2), tie_rule="optimistic")
    # ranks 2, 1, 1
    assert_close(opt["HR@1"], [0.0, 1.0, 1.0])
    assert_close(opt["NDCG@2"], [1 / LOG2_3, 1.0, 1.0])
    assert_close(opt["MRR"], [0.5, 1.0, 1.0])
    assert set(pess) == {"HR@1", "NDCG@1", "HR@2", "NDCG@2", "HR@5", "NDCG@5", "MRR"}


def test_sampled_metrics_average_is_expectation_over_tie_orders():
    avg = sampled_metrics(POS, NEG, ks=(1, 2, 5), tie_rule="average")
    # User 0: ranks 2, 3, 4 equally likely.
    #   HR@2 = 1/3; NDCG@2 = (1/log2 3)/3 = 0.210310
    #   NDCG@5 = (1/log2 3 + 1/log2 4 + 1/log2 5)/3 = 0.520536; MRR = (1/2 + 1/3 + 1/4)/3 = 0.361111
    # User 2: ranks 1..5 equally likely (constant scorer, C = 4):
    #   HR@K = K/5; MRR = (1 + 1/2 + 1/3 + 1/4 + 1/5)/5 = 0.456667
    assert_close(avg["HR@1"], [0.0, 1.0, 0.2])
    assert_close(avg["HR@2"], [1 / 3, 1.0, 0.4])
    assert_close(avg["HR@5"], [1.0, 1.0, 1.0])
    assert_close(avg["NDCG@2"][:1], [(1 / LOG2_3) / 3])
    assert avg["NDCG@5"][0].item() == pytest.approx(0.520536, abs=1e-6)
    assert avg["MRR"][0].item() == pytest.approx(0.361111, abs=1e-6)
    assert avg["MRR"][2].item() == pytest.approx(0.456667, abs=1e-6)


def test_sampled_tie_tolerance_and_padding():
    pos = torch.tensor([0.5, 0.5], dtype=torch.float64)
    neg = torch.tensor([[0.500004, 0.49, 0.2], [0.9, 0.1, 99.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    # Exact comparison: 0.500004 > 0.5 is above -> rank 2. With FedCSR's rule (optimistic,
    # tolerance 1e-5) it counts as a tie favouring the positive -> rank 1.
    assert_close(rank_of_positive(pos[:1], neg[:1], "optimistic"), [2.0])
    assert_close(rank_of_positive(pos[:1], neg[:1], "optimistic", tie_tolerance=1e-5), [1.0])
    assert_close(rank_of_positive(pos[:1], neg[:1], "pessimistic", tie_tolerance=1e-5), [2.0])
    # Padding column (99.0) is ignored: only 0.9 is above -> rank 2.
    assert_close(rank_of_positive(pos[1:], neg[1:], neg_valid=valid[1:]), [2.0])
    avg = sampled_metrics(pos[1:], neg[1:], ks=(1,), tie_rule="average", neg_valid=valid[1:])
    assert_close(avg["MRR"], [0.5])


def test_sampled_random_cross_check_and_dtypes():
    rng = np.random.default_rng(7)
    pos = torch.from_numpy(rng.integers(0, 5, size=64).astype(np.float32))
    neg = torch.from_numpy(rng.integers(0, 5, size=(64, 20)).astype(np.float32))
    for rule in ("pessimistic", "optimistic", "average"):
        out32 = sampled_metrics(pos, neg, ks=(1, 5, 10), tie_rule=rule)
        out64 = sampled_metrics(pos.double(), neg.double(), ks=(1, 5, 10), tie_rule=rule)
        for u in range(64):
            above = int((neg[u] > pos[u]).sum())
            tied = int((neg[u] == pos[u]).sum())
            ranks = {"pessimistic": [above + tied + 1], "optimistic": [above + 1],
                     "average": list(range(above + 1, above + tied + 2))}[rule]
            for k in (1, 5, 10):
                hr = np.mean([r <= k for r in ranks])
                ndcg = np.mean([1 / math.log2(r + 1) if r <= k else 0.0 for r in ranks])
                assert out32[f"HR@{k}"][u].item() == pytest.approx(hr, abs=1e-12)
                assert out32[f"NDCG@{k}"][u].item() == pytest.approx(ndcg, abs=1e-12)
            assert out32["MRR"][u].item() == pytest.approx(np.mean([1 / r for r in ranks]), abs=1e-12)
        for key in out32:
            assert torch.equal(out32[key], out64[key])


def test_sampled_input_validation():
    with pytest.raises(ValueError):
        sampled_metrics(POS, NEG[:2])
    with pytest.raises(ValueError):
        sampled_metrics(torch.tensor([float("nan"), 0.0, 0.0]), NEG)
    with pytest.raises(ValueError):
        rank_of_positive(POS, NEG, tie_tolerance=-1.0)


# --------------------------------------------------------------------------------------
# Aggregation and significance
# --------------------------------------------------------------------------------------
def test_mean_over_users_ignores_nan():
    assert mean_over_users(torch.tensor([1.0, float("nan"), 0.0])) == pytest.approx(0.5)
    assert math.isnan(mean_over_users(torch.tensor([float("nan")])))
    means = mean_over_users({"a": torch.tensor([1.0, 0.0, 0.5]), "b": torch.tensor([float("nan"), 1.0, 1.0])})
    assert means == {"a": pytest.approx(0.5), "b": pytest.approx(1.0)}


def test_paired_ttest_hand_computed():
    a = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    b = np.array([0.0, 1.0, 1.0, 5.0])
    # Users present in both: the first three, differences d = 1, 1, 2.
    # mean(d) = 4/3, sd(d) = sqrt(((1/3)^2 + (1/3)^2 + (2/3)^2) / 2) = sqrt(1/3)
    # t = mean / (sd / sqrt(3)) = (4/3) / (1/3) = 4, df = 2.
    # Student t with 2 df: CDF(t) = 1/2 + t / (2 sqrt(2 + t^2)) -> p = 1 - 4/sqrt(18) = 0.057191
    result = paired_ttest(a, b)
    assert result.n == 3
    assert result.statistic == pytest.approx(4.0)
    assert result.pvalue == pytest.approx(1 - 4 / math.sqrt(18), abs=1e-9)
    flipped = paired_ttest(b, a)
    assert flipped.statistic == pytest.approx(-4.0)
    same = paired_ttest(a, a)
    assert math.isnan(same.statistic) and same.n == 3
    with pytest.raises(ValueError):
        paired_ttest(a, b[:3])


def test_candidate_set_metrics_gathers_the_candidate_scores():
    """Two users, 5 items; candidates [positive, negatives...] in column 0 first.

    user 0 scores items 0..4 as [0.9, 0.1, 0.5, 0.3, 0.7]; candidates [2, 0, 1] -> the
    positive (0.5) is beaten by item 0 (0.9): rank 2, HR@1 = 0, MRR = 1/2.
    user 1 scores [0.2, 0.2, 0.8, 0.0, 0.1]; candidates [1, 0, 3] -> a tie with item 0 counts
    against the positive (pessimistic): rank 2; optimistic: rank 1.
    """
    from fedlib.metrics import candidate_set_metrics

    table = torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.7], [0.2, 0.2, 0.8, 0.0, 0.1]], dtype=torch.float64)
    users = np.array([0, 1])
    cands = np.array([[2, 0, 1], [1, 0, 3]])
    pessimistic = candidate_set_metrics(lambda u: table[u], users, cands, ks=(1,), chunk_size=1)
    assert pessimistic["HR@1"].tolist() == [0.0, 0.0]
    assert pessimistic["MRR"].tolist() == [0.5, 0.5]
    optimistic = candidate_set_metrics(lambda u: table[u], users, cands, ks=(1,), tie_rule="optimistic")
    assert optimistic["HR@1"].tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="candidates must be"):
        candidate_set_metrics(lambda u: table[u], users, cands[:1], ks=(1,))
