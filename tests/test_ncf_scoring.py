"""Whole-catalogue scoring of FedNCF and FedRKG's guided FedNCF with the first layer split.

``score_users`` computes ``W0 [p_u; q_i] + b0`` as ``(W0[:, :d] p_u + b0) + W0[:, d:] q_i`` and
broadcast-adds the halves (issue 43: one FedRKG FedNCF evaluation on LastFM-2K went from about
12 to 1 CPU-s). It must give the logits of :meth:`FedNCF.logits` on every (user, item) pair,
``score_users_reference``: checked in float64 to 1e-10 on small random models of every variant,
for shared and per-user item tables, consecutive and scattered users, one and several chunks.
"""
from __future__ import annotations

import pytest
import torch

from fedlib.models.ncf import FedNCF
from fedlib.papers.fedrkg.guidance import GuidedFedNCF

NUM_USERS, NUM_ITEMS, DIM = 9, 13, 4

NCF_CONFIGS = {
    "mlp": dict(variant="mlp", hidden=(6, 5, 3)),
    "mlp one layer": dict(variant="mlp", hidden=(5,)),
    "gmf": dict(variant="gmf"),
    "neumf": dict(variant="neumf", hidden=(6, 3)),
    "neumf private head": dict(variant="neumf", hidden=(6, 3), private_head=True),
    "f3crec (no tower, private head)": dict(variant="mlp", hidden=(), private_head=True, init="torch_default"),
}

USER_SETS = {
    "all": torch.arange(NUM_USERS),
    "scattered": torch.tensor([7, 0, 3, 4, 8, 1]),
    "one": torch.tensor([5]),
}


def _perturbed(state, generator):
    """Every tensor moved by N(0, 0.5²), so that heads and biases are not at their zero init."""
    return {k: v + 0.5 * torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in state.items()}


def _states(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    global_state = _perturbed(model.init_global(g, dtype=torch.float64), g)
    private_state = _perturbed(model.init_private(g, dtype=torch.float64), g)
    return global_state, private_state


@pytest.mark.parametrize("pairs_per_chunk", [1, 2 * NUM_ITEMS, 10_000])
@pytest.mark.parametrize("users", list(USER_SETS))
@pytest.mark.parametrize("config", list(NCF_CONFIGS))
def test_fedncf_split_scores_equal_the_pairwise_logits(config, users, pairs_per_chunk):
    model = FedNCF(NUM_USERS, NUM_ITEMS, DIM, **NCF_CONFIGS[config])
    model.score_pairs_per_chunk = pairs_per_chunk
    global_state, private_state = _states(model)
    ids = USER_SETS[users]
    fast = model.score_users(global_state, private_state, ids)
    reference = model.score_users_reference(global_state, private_state, ids)
    assert fast.shape == (ids.numel(), NUM_ITEMS)
    assert fast.dtype == torch.float64
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-10)


@pytest.mark.parametrize("users", list(USER_SETS))
@pytest.mark.parametrize("options", [dict(), dict(hidden=(6, 3), private_head=True), dict(variant="gmf"),
                                     dict(init="torch_default")], ids=["fedrkg", "deep private head", "gmf", "torch init"])
def test_guided_fedncf_split_scores_equal_the_training_logits(options, users):
    model = GuidedFedNCF(NUM_USERS, NUM_ITEMS, DIM, **options)
    global_state, private_state = _states(model, seed=1)
    # every user's table different (they start from one shared draw)
    g = torch.Generator().manual_seed(2)
    private_state["personal_item_emb"] = private_state["personal_item_emb"] + torch.randn(
        private_state["personal_item_emb"].shape, generator=g, dtype=torch.float64)
    ids = USER_SETS[users]
    for pairs_per_chunk in (1, 3 * NUM_ITEMS):
        model.base.score_pairs_per_chunk = pairs_per_chunk
        fast = model.score_users(global_state, private_state, ids)
        reference = model.score_users_reference(global_state, private_state, ids)
        torch.testing.assert_close(fast, reference, rtol=0, atol=1e-10)


def test_guided_fedncf_scores_read_each_users_own_table():
    """Changing one user's table changes that user's scores only (the view/copy of the rows is right)."""
    model = GuidedFedNCF(NUM_USERS, NUM_ITEMS, DIM)
    global_state, private_state = _states(model, seed=3)
    before = model.score_users(global_state, private_state, USER_SETS["all"])
    private_state["personal_item_emb"][4] += 1.0
    after = model.score_users(global_state, private_state, USER_SETS["all"])
    changed = (before - after).abs().amax(1) > 1e-9
    assert changed.tolist() == [u == 4 for u in range(NUM_USERS)]


def test_score_users_empty_and_bad_chunk():
    model = FedNCF(NUM_USERS, NUM_ITEMS, DIM, variant="mlp", hidden=(5,))
    global_state, private_state = _states(model)
    assert model.score_users(global_state, private_state, torch.zeros(0, dtype=torch.long)).shape == (0, NUM_ITEMS)
    with pytest.raises(ValueError, match="chunk"):
        model.score_users(global_state, private_state, USER_SETS["all"], chunk=0)
    guided = GuidedFedNCF(NUM_USERS, NUM_ITEMS, DIM)
    g_state, p_state = _states(guided)
    assert guided.score_users(g_state, p_state, torch.zeros(0, dtype=torch.long)).shape == (0, NUM_ITEMS)
