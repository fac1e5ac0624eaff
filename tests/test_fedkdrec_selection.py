"""FedKDRec server → clients selection: the μ cap, the order of V^s, and the shaped rewards' sign.

The inputs are tiny and built by hand (a few users and items, fixed seeds) so every
expected value below follows from the paper's definitions, not from the code under test:

* §3.3: the server walks ``V^s`` (the previous round's uploaded items) ordered per client by
  its own prediction, at most ``μ`` states, and sends what the actor selects;
* PTF-FedRec (variant ``~s``): half the most uploaded items, half the client's top
  predictions, at most ``μ`` and at most ``|train_i|`` items;
* App. C.3: ``R − p/(ρ|S|)·|R|`` when selected, ``R + p/(ρ|S|)·|R|`` when skipped.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.models.stacked import Backbone
from fedlib.papers.fedkdrec import agents as A
from fedlib.papers.fedkdrec.clients import Uploads, variant_config
from fedlib.papers.fedkdrec.method import _Server

NUM_USERS, NUM_ITEMS = 6, 20


def tiny_server(variant: str, mu: int, seed: int = 0):
    """A NeuMF server (the default backbone) of a named variant with a small ``μ``."""
    config = variant_config(variant, backbone="neumf", hidden=(8,), dim=4, mu=mu, server_epochs=1, seed=seed)
    backbone = Backbone(config.backbone, NUM_USERS, NUM_ITEMS, config.dim, config.hidden)
    server = _Server(backbone, backbone.init_server(torch.Generator().manual_seed(seed)), config, "cpu")
    return config, server


def upload_round(server: _Server, uploaded: dict) -> torch.Tensor:
    """Feed the server one round of uploads ``{client: [items]}`` through ``_Server.train``.

    Returns the distinct uploaded items (what ``V^s`` must be drawn from next round).
    """
    clients = sorted(uploaded)
    width = max(len(v) for v in uploaded.values())
    items = torch.zeros(len(clients), width, dtype=torch.long)
    keep = torch.zeros(len(clients), width, dtype=torch.bool)
    for row, user in enumerate(clients):
        items[row, :len(uploaded[user])] = torch.tensor(uploaded[user])
        keep[row, :len(uploaded[user])] = True
    labels = torch.rand(items.shape, generator=torch.Generator().manual_seed(5))
    uploads = Uploads(clients=np.array(clients), items=items, labels=labels, keep=keep,
                      private=keep.clone(), hard=torch.zeros_like(labels), swapped=torch.zeros_like(keep))
    server.train(uploads, torch.tensor(clients), np.random.default_rng(0))
    return torch.unique(items[keep])


# three clients upload 11 distinct items: |V^s| = 11 > μ
PREVIOUS_UPLOADS = {0: [1, 2, 3, 4], 2: [3, 5, 7, 9, 11], 4: [2, 12, 13, 14, 15, 16]}


# ---------------------------------------------------------------------------- 1. the μ cap
@pytest.mark.parametrize("mu", [1, 3, 5])
def test_actor_critic_sends_at_most_mu_items_from_the_previous_uploads(mu):
    config, server = tiny_server("FedKDRec", mu)
    assert config.transfer == "agent"  # the default FedKDRec config walks V^s with the actor
    previous = upload_round(server, PREVIOUS_UPLOADS)
    assert previous.numel() > mu and torch.equal(server.last_items, previous)
    clients = torch.arange(NUM_USERS)
    train_sizes = torch.full((NUM_USERS,), 50)
    # an actor that always selects: without the cap every client would get all |V^s| items
    always = tiny_server("FedKDRec", mu)[1]
    upload_round(always, PREVIOUS_UPLOADS)
    with torch.no_grad():
        always.transfer.actor[2].weight.zero_()
        always.transfer.actor[2].bias.fill_(30.0)
    for probe, seed in [(server, 0), (server, 1), (server, 2), (always, 0)]:
        sent, labels, episode = probe.select(clients, train_sizes, torch.Generator().manual_seed(seed))
        count = (sent >= 0).sum(1)
        assert bool((count <= mu).all()), f"a client was sent {count.tolist()} items with mu = {mu}"
        assert episode["states"].shape[1] <= mu and episode["items"].shape[1] <= mu  # the walk itself is capped
        real = sent[sent >= 0]
        assert bool(((real >= 0) & (real < NUM_ITEMS)).all())
        assert bool(torch.isin(real, previous).all()), "sent an item nobody uploaded last round"
        for row in sent:
            kept = row[row >= 0].tolist()
            assert len(kept) == len(set(kept))
        assert labels.shape == sent.shape and bool(((labels > 0) & (labels < 1)).all())
    assert count.tolist() == [mu] * NUM_USERS  # the always-select actor fills the cap exactly


@pytest.mark.parametrize("mu", [2, 3, 4])
def test_confidence_selection_sends_at_most_mu_items(mu):
    config, server = tiny_server("~s", mu)
    assert config.transfer == "confidence"
    previous = upload_round(server, PREVIOUS_UPLOADS)
    assert previous.numel() > mu
    frequency = torch.bincount(torch.tensor(sum(PREVIOUS_UPLOADS.values(), [])), minlength=NUM_ITEMS)
    clients = torch.arange(NUM_USERS)
    train_sizes = torch.tensor([50, 50, mu, 1, 0, 2])
    sent, labels, episode = server.select(clients, train_sizes, torch.Generator().manual_seed(0))
    assert episode is None
    count = (sent >= 0).sum(1)
    assert bool((count <= mu).all()), f"a client was sent {count.tolist()} items with mu = {mu}"
    assert count.tolist() == torch.clamp(train_sizes, max=mu).tolist()  # PTF-FedRec fills min(μ, |train_i|)
    real = sent[sent >= 0]
    assert bool(((real >= 0) & (real < NUM_ITEMS)).all())
    for row, quota in zip(sent, torch.clamp(train_sizes, max=mu).tolist()):
        kept = row[row >= 0].tolist()
        assert len(kept) == len(set(kept))
        # the popular half comes from V^s, most uploaded first (items 2 and 3 were uploaded twice)
        popular = kept[:quota // 2]
        assert set(popular) <= set(previous.tolist())
        assert all(frequency[item] == 2 for item in popular)
        # the personal half is the server's top predictions over all items (PTF-FedRec), so it
        # need not lie in V^s: only the popular half is pinned to the previous uploads
    assert bool(((labels > 0) == (sent >= 0)).all())


# ---------------------------------------------------------------------------- 2. the order of V^s
# a NeuMF whose logit is the GMF dot product alone: zero MLP tower, head = 1 on the GMF part
GMF_USERS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # user 2 ranks exactly opposite to user 0
GMF_ITEMS = torch.tensor([
    [2.0, 2.0],     # 0  not uploaded: users 0 and 1 would love it
    [-0.5, 0.8],    # 1
    [0.9, -0.3],    # 2
    [1.5, 1.5],     # 3  not uploaded
    [-0.2, 0.5],    # 4
    [0.7, -0.7],    # 5
    [-2.0, 0.0],    # 6  not uploaded: user 2 would love it
    [-0.9, 0.1],    # 7
    [0.6, 0.3],     # 8
    [0.2, -0.1],    # 9
])
LAST_ITEMS = torch.tensor([1, 2, 4, 5, 7, 8, 9])
# by hand: user 0 ranks V^s by the first column, user 1 by the second, user 2 by minus the first
EXPECTED_TOP4 = {0: [2, 5, 8, 9], 1: [1, 4, 8, 7], 2: [7, 1, 4, 9]}


def known_server(mu: int):
    config = variant_config("FedKDRec", backbone="neumf", hidden=(2,), dim=2, mu=mu, seed=0)
    backbone = Backbone("neumf", 3, GMF_ITEMS.shape[0], config.dim, config.hidden)
    params = backbone.init_server(torch.Generator().manual_seed(0))  # MLP embeddings stay random: not in the score
    params["user_emb_gmf"], params["item_emb_gmf"] = GMF_USERS.clone(), GMF_ITEMS.clone()
    params["mlp0_w"].zero_()
    params["mlp0_b"].zero_()
    params["head_w"] = torch.tensor([1.0, 1.0, 0.0, 0.0])  # [GMF (d = 2); MLP (h = 2)]
    params["head_b"] = torch.tensor(0.0)
    server = _Server(backbone, params, config, "cpu")
    server.last_items = LAST_ITEMS.clone()
    server.last_frequency = torch.zeros(GMF_ITEMS.shape[0])
    server.last_frequency[LAST_ITEMS] = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 2.0, 1.0])
    server.last_clients = 3.0
    return config, server


def test_state_sequence_is_the_top_mu_of_last_items_by_the_servers_prediction():
    config, server = known_server(mu=4)
    clients = torch.tensor([2, 0, 1])  # not sorted: rows must follow the clients given
    with torch.no_grad():
        logits = server.backbone.server_scores(server.params, torch.arange(3))
    assert torch.allclose(logits, GMF_USERS @ GMF_ITEMS.T, atol=1e-6)  # the hand-built model scores as intended
    scores = (GMF_USERS @ GMF_ITEMS.T).tolist()
    for user, expected in EXPECTED_TOP4.items():  # the hand ranking agrees with the definition
        ranked = sorted(LAST_ITEMS.tolist(), key=lambda item: -scores[user][item])
        assert ranked[:config.mu] == expected
    sent, labels, episode = server.select(clients, torch.full((3,), 50), torch.Generator().manual_seed(0))
    d = config.dim
    for row, user in enumerate(clients.tolist()):
        expected = EXPECTED_TOP4[user]
        assert episode["items"][row].tolist() == expected, f"client {user}: V^s walked in the wrong order"
        states = episode["states"][row]  # (S, 2d + 3): [r̃, frequency, user emb, item emb, count so far]
        want_prob = torch.sigmoid(torch.tensor([scores[user][item] for item in expected]))
        assert torch.allclose(states[:, 0], want_prob, atol=1e-6)
        assert torch.allclose(states[:, 1], server.last_frequency[expected] / 3.0)
        assert torch.allclose(states[:, 2:2 + d], server.params["user_emb"][user].detach().expand(len(expected), -1))
        assert torch.allclose(states[:, 2 + d:2 + 2 * d], server.params["item_emb"][expected].detach())
        assert torch.allclose(labels[row], want_prob, atol=1e-6)
        taken = episode["actions"][row] > 0
        assert sent[row][taken].tolist() == torch.tensor(expected)[taken].tolist()
        assert bool((sent[row][~taken] == -1).all())


def test_state_sequence_covers_all_of_v_s_when_it_is_shorter_than_mu():
    config, server = known_server(mu=30)
    _, _, episode = server.select(torch.tensor([0]), torch.tensor([50]), torch.Generator().manual_seed(0))
    assert episode["items"][0].tolist() == [2, 5, 8, 9, 4, 1, 7]  # all 7 items, user 0's order


# ---------------------------------------------------------------------------- 3. shaped rewards' sign
def test_position_adjustment_uses_the_magnitude_of_a_negative_or_zero_reward():
    reward = torch.tensor([-2.0, 0.0, -1.0])
    actions = torch.tensor([[1.0, 0.0, 1.0, 0.0],
                            [1.0, 0.0, 1.0, 1.0],
                            [0.0, 1.0, 0.0, 0.0]])
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0],
                          [1.0, 1.0, 1.0, 1.0],
                          [1.0, 1.0, 0.0, 0.0]])
    shaped = A.shaped_rewards(reward, actions, valid, rho=4.0)
    # App. C.3 with ρ = 4: factor p/(ρ|S|) times ||R||_1, subtracted if selected, added if skipped
    # client 0: R = -2, |S| = 3 -> factors 1/12, 2/12, 3/12 of 2
    # client 1: R = 0 -> every adjustment is 0
    # client 2: R = -1, |S| = 2 -> factors 1/8, 2/8 of 1
    expected = torch.tensor([[-2 - 2 / 12, -2 + 4 / 12, -2 - 6 / 12, 0.0],
                             [0.0, 0.0, 0.0, 0.0],
                             [-1 + 1 / 8, -1 - 2 / 8, 0.0, 0.0]])
    assert torch.allclose(shaped, expected, atol=1e-6)
    # the sign that matters: selecting is penalised and skipping rewarded whatever the sign of R
    selected, skipped = (actions > 0) & (valid > 0), (actions == 0) & (valid > 0)
    negative = (reward < 0)[:, None]
    assert bool((shaped[selected & negative] < reward[:, None].expand_as(shaped)[selected & negative]).all())
    assert bool((shaped[skipped & negative] > reward[:, None].expand_as(shaped)[skipped & negative]).all())
