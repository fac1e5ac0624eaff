"""GA-DTCDR / GA-MTCDR-P: element-wise attention, personalised term, spectral embedding, short runs."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.data.synthetic import overlapping_domains
from fedlib.baselines.cross_domain import ga_cdr as G
from fedlib.baselines.cross_domain.cdr_common import audit_blocks, history_rows, selected_blocks


@pytest.fixture(scope="module")
def tiny_split():
    return overlapping_domains(num_users=60, items_per_domain=40, interactions_per_user=8, overlap=0.5,
                               num_negatives=10, seed=3)


@pytest.fixture(scope="module")
def train_split():
    return overlapping_domains(num_users=300, items_per_domain=150, overlap=0.5, num_negatives=30, seed=0)


# ----------------------------------------------------------------------------- Eq. 3
def test_element_wise_attention_is_a_per_dimension_convex_combination():
    views = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # (n=1, M=2, d=2)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    # dim 0: weights (1/2, 1/2) -> 2; dim 1: weights (3/4, 1/4) -> 0.75·2 + 0.25·4 = 2.5
    assert torch.allclose(G.element_wise_attention(views, logits), torch.tensor([[2.0, 2.5]]))
    assert torch.allclose(G.element_wise_attention(views, torch.zeros_like(views)), views.mean(1))
    with pytest.raises(ValueError, match="same"):
        G.element_wise_attention(views, torch.zeros(1, 3, 2))


def test_common_users_are_attended_per_target_and_other_users_keep_their_own_embedding(tiny_split):
    model = G.GAModel(tiny_split, G.GADTCDRConfig(dim=8, tower=(8,)))
    n_o = tiny_split.num_overlap_users
    assert model.attention_logits.shape == (2, n_o, 2, 8)
    with torch.no_grad():
        model.attention_logits[0, :, 0] = 30.0  # target A: keep A's embedding
        model.attention_logits[1, :, 0] = 30.0  # target B: take A's embedding as well
    tables = model.base_tables()
    common, local = torch.tensor([0, 1]), torch.tensor([n_o, n_o + 1])
    own_a = model.user_proj[0](tables[0][0][common])
    from_a_in_b, _ = model.user_embeddings(tables, 1, common)
    kept_in_a, views = model.user_embeddings(tables, 0, common)
    assert torch.allclose(kept_in_a, own_a, atol=1e-6)
    assert torch.allclose(from_a_in_b, own_a, atol=1e-6)  # B's common users now carry A's embedding
    assert views.shape == (2, 2, 8)
    own_b_local = model.user_proj[1](tables[1][0][local])
    out_local, views_local = model.user_embeddings(tables, 1, local)
    assert torch.equal(out_local, own_b_local) and views_local.shape[0] == 0
    # A domain-local user's loss never reaches the other domain's projection.
    model.zero_grad()
    out_local.sum().backward()
    assert model.user_proj[0].weight.grad is None or torch.all(model.user_proj[0].weight.grad == 0)
    assert model.user_proj[1].weight.grad.abs().sum() > 0


def test_without_attention_each_domain_uses_its_own_embedding(tiny_split):
    model = G.GAModel(tiny_split, G.GADTCDRConfig(dim=8, tower=(8,), attention=False))
    assert model.attention_logits is None and model.attention_weights(0) is None
    tables = model.base_tables()
    users = torch.tensor([0, 1, 2])
    out, views = model.user_embeddings(tables, 0, users)
    assert views is None and torch.equal(out, model.user_proj[0](tables[0][0][users]))


# ----------------------------------------------------------------------------- Eq. 8
def test_personalized_term_pulls_only_the_sparser_domain_towards_the_richer_one():
    views = torch.tensor([[[1.0], [3.0]], [[2.0], [2.0]]], requires_grad=True)  # (n=2, M=2, d=1)
    richer = torch.tensor([[False, True], [False, False]])  # domain 1 is richer than domain 0
    loss = G.personalized_alignment_loss(views, 0, richer)
    assert loss.item() == pytest.approx(((1 - 3) ** 2 + 0) / (3 ** 2 + 2 ** 2))
    loss.backward()
    assert torch.all(views.grad[:, 1] == 0)  # the richer domain is an anchor (stop-gradient)
    assert views.grad[0, 0, 0] < 0  # the sparser user moves up, towards 3
    richest = G.personalized_alignment_loss(views, 1, richer)
    assert richest.item() == 0.0 and not richest.requires_grad


def test_richness_counts_training_pairs_of_common_users(tiny_split):
    richer, richness = G.richer_domains(tiny_split)
    n_o = tiny_split.num_overlap_users
    expected = [int((tiny_split[d].train.users < n_o).sum()) for d in tiny_split.domains]
    assert richness == expected
    assert bool(richer[0, 1]) == (expected[1] > expected[0]) and bool(richer[1, 0]) == (expected[0] > expected[1])
    assert not richer.diagonal().any()


# ----------------------------------------------------------------------------- Eq. 7
def test_normalized_rating_cross_entropy_by_hand():
    y = torch.tensor([0.8, 0.3])
    assert G.normalized_rating_cross_entropy(y, torch.tensor([1.0, 0.0])).item() == pytest.approx(
        -(math.log(0.8) + math.log(0.7)) / 2, rel=1e-6)
    # rating 4 of 5 -> target 0.8
    assert G.normalized_rating_cross_entropy(torch.tensor([0.5]), torch.tensor([4.0]), 5.0).item() == pytest.approx(
        -(0.8 * math.log(0.5) + 0.2 * math.log(0.5)), rel=1e-6)


# ----------------------------------------------------------------------------- Eq. 1 (spectral substitute)
def test_spectral_embedding_factorises_the_normalised_biadjacency():
    # user 0: items 0, 1; user 1: item 1 (twice: counts once); user 2: item 2
    pairs = Pairs.from_arrays([0, 0, 1, 1, 2], [0, 1, 1, 1, 2], num_users=3)
    users, items, sigma = G.spectral_embedding(pairs, 3, 3, dim=5)
    expected = torch.tensor([[1 / math.sqrt(2), 0.5, 0.0],
                             [0.0, 1 / math.sqrt(2), 0.0],
                             [0.0, 0.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(users @ items.T, expected, atol=1e-10)
    assert users.shape == (3, 5) and torch.all(users[:, 3:] == 0) and torch.all(sigma[3:] == 0)
    assert sigma[0].item() == pytest.approx(1.0)  # the largest singular value of D^-1/2 R D^-1/2 is 1
    # rank 1: the best rank-1 approximation keeps only the largest singular value
    u1, i1, s1 = G.spectral_embedding(pairs, 3, 3, dim=1)
    assert torch.linalg.matrix_rank(u1 @ i1.T).item() == 1 and s1[0].item() == pytest.approx(1.0)


def test_randomised_svd_is_seeded_and_matches_the_exact_one():
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 80, 900), rng.integers(0, 60, 900)
    pairs = Pairs.from_arrays(users, items, num_users=80)
    _, _, exact = G.spectral_embedding(pairs, 80, 60, dim=6)
    ua, ia, approx = G.spectral_embedding(pairs, 80, 60, dim=6, seed=4, dense_max_cells=0)
    ub, ib, _ = G.spectral_embedding(pairs, 80, 60, dim=6, seed=4, dense_max_cells=0)
    assert approx[0].item() == pytest.approx(1.0, abs=1e-9)
    # a uniform random graph has a flat spectrum, the hardest case for the randomised SVD
    assert torch.allclose(approx, exact, atol=2e-3)
    assert torch.equal(ua, ub) and torch.equal(ia, ib)


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("bad", [dict(embedding="node2vec"), dict(dim=0), dict(tower=()), dict(tower=(64, 0)),
                                 dict(personal_weight=-1.0), dict(select_on="train"), dict(eps=0.7),
                                 dict(num_layers=-1), dict(lr=0.0)])
def test_bad_config_values_are_rejected(bad):
    with pytest.raises(ValueError):
        G.GAConfig(**bad)


def test_presets_and_names():
    assert G.method_name(G.GADTCDRConfig()) == "GA-DTCDR"
    assert G.method_name(G.GAMTCDRPConfig()) == "GA-MTCDR-P"
    assert G.method_name(G.GADTCDRConfig(personalized=True)) == "GA-DTCDR-P"
    assert G.GAMTCDRPConfig().embedding == "gnn" and G.GADTCDRConfig().embedding == "spectral"


def test_one_domain_is_rejected(tiny_split):
    from dataclasses import replace
    single = replace(tiny_split, domains=tiny_split.domains[:1])
    with pytest.raises(ValueError, match="at least 2 domains"):
        G.train_ga(single, G.GADTCDRConfig(epochs=1))


# ----------------------------------------------------------------------------- training
RANDOM_HR10 = 10 / 31  # 1 positive + 30 negatives


def test_ga_dtcdr_learns_and_is_deterministic(train_split):
    torch.set_num_threads(1)
    config = G.GADTCDRConfig(dim=32, tower=(64, 32), epochs=2, patience=2)
    first = G.train_ga_dtcdr(train_split, config)
    second = G.train_ga_dtcdr(train_split, config)
    assert first.method == "GA-DTCDR"
    best_valid = max(row["valid/HR@10"] for row in history_rows(first))
    assert best_valid > RANDOM_HR10 + 0.25
    assert [row["valid/HR@10"] for row in history_rows(first)] == [row["valid/HR@10"] for row in history_rows(second)]
    assert selected_blocks(first) == selected_blocks(second)
    weights = first.artifacts["attention_weights"]["A"]
    assert weights.shape == (train_split.num_overlap_users, 2, 32)
    assert torch.allclose(weights.sum(1), torch.ones(weights.shape[0], 32), atol=1e-5)


def test_ga_mtcdr_p_learns_and_personalises_only_the_sparser_domain(train_split):
    torch.set_num_threads(1)
    result = G.train_ga_mtcdr_p(train_split, G.GAMTCDRPConfig(dim=32, tower=(64, 32), epochs=4, patience=4))
    assert result.method == "GA-MTCDR-P"
    assert max(row["valid/HR@10"] for row in history_rows(result)) > RANDOM_HR10 + 0.25
    richness = result.artifacts["richness"]
    sparser, richest = sorted(richness, key=richness.get)
    last = history_rows(result)[-1]
    assert last[f"{richest}/personal"] == 0.0
    assert last[f"{sparser}/personal"] > 0.0


class _Killed(RuntimeError):
    pass


def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    """GA-MTCDR-P (GNN embeddings, personalised): model, Adam and the epoch generator are in the
    checkpoint (cdr_common.JointModelState, shared with NMCDR and CL-DTCDR); killed in epoch 3
    and resumed = uninterrupted."""
    from fedlib.engine import Checkpointer

    torch.set_num_threads(1)
    split = overlapping_domains(num_users=80, items_per_domain=120, overlap=0.5, num_negatives=20, seed=3)
    config = G.GAMTCDRPConfig(dim=8, epochs=4, patience=4, seed=1)
    full = G.train_ga(split, config)

    def kill_in_epoch_3(run, record):
        if run.round_index == 3:
            raise _Killed

    with pytest.raises(_Killed):
        G.train_ga(split, config, checkpointer=Checkpointer(tmp_path, every=1), on_round_end=kill_in_epoch_3)
    checkpointer = Checkpointer(tmp_path, every=1)
    resumed = G.train_ga(split, config, checkpointer=checkpointer)
    assert checkpointer.resumed_at == [2]
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert strip(resumed) == strip(full)
    assert (selected_blocks(resumed), audit_blocks(resumed)) == (selected_blocks(full), audit_blocks(full))
    name = split.domains[0]
    for key, value in full.artifacts["models"][name].state_dict().items():
        assert torch.equal(value, resumed.artifacts["models"][name].state_dict()[key]), key
