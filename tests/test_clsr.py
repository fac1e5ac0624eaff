"""CLSR baseline: proxies, BPR contrast, causal encoders, target-aware fusion, interface, learning."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential.clsr import CLSR, CLSRConfig, bpr_contrast, contrastive_loss, interest_proxies
from fedlib.baselines.sequential.sequences import make_batch

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)
CFG = CLSRConfig(dim=16, maxlen=15, short_k=3, dropout=0.0, seed=1)


@pytest.fixture(scope="module")
def split():
    return cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)


def _model(split, cfg=CFG):
    return CLSR(split.num_items_a, split.num_items_b, cfg)


# ----------------------------------------------------------------------------- mechanism
def test_proxies_are_causal_means_of_all_and_of_the_latest_k():
    x = torch.tensor([[[0.0], [1.0], [2.0], [4.0], [8.0]]])   # first column padding
    pos = torch.tensor([[0, 1, 2, 3, 4]])
    p_l, p_s = interest_proxies(x, pos, short_k=2)
    assert p_l[0, :, 0].tolist() == pytest.approx([0.0, 1.0, 1.5, 7 / 3, 15 / 4])
    assert p_s[0, :, 0].tolist() == pytest.approx([0.0, 1.0, 1.5, 3.0, 6.0])


def test_bpr_contrast_and_the_four_term_loss_hand_computed():
    a, p, q = torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0]), torch.tensor([0.0, 5.0])
    assert bpr_contrast(a, p, q).item() == pytest.approx(math.log1p(math.exp(-2.0)))
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    # u_l = p_l, u_s = p_s (disentangled): each term softplus(0 − 1)
    assert contrastive_loss(e1, e2, e1, e2).item() == pytest.approx(4 * math.log1p(math.exp(-1.0)))
    # swapped interests: each term softplus(1 − 0)
    assert contrastive_loss(e2, e1, e1, e2).item() == pytest.approx(4 * math.log1p(math.exp(1.0)))


def test_encoders_are_causal(split):
    model = _model(split).eval()
    inputs = make_batch(split.test, split.num_items_a, split.num_items_b, 15, rows=np.arange(4)).inputs
    cross = inputs.cross.clone()
    cross[:, -1] = (cross[:, -1] + 1) % split.num_items_a    # change only the latest item
    with torch.no_grad():
        z1, z2 = model.interests(inputs), model.interests(inputs._replace(cross=cross))
    for key in ("u_l", "u_s", "p_l", "p_s", "h"):
        assert torch.allclose(z1[key][:, :-1], z2[key][:, :-1], atol=1e-6), key
        assert not torch.allclose(z1[key][:, -1], z2[key][:, -1]), key


def test_fusion_is_target_aware_and_mixes_the_two_interests(split):
    model = _model(split).eval()
    torch.manual_seed(0)
    h, u_l, u_s = torch.randn(3, 2, 16).unbind(0)
    items = torch.tensor([[0, 5, 70], [3, 4, 100]])
    with torch.no_grad():
        scores, a = model.fused_scores(h, u_l, u_s, items)
        v = model.item_emb(items)                              # (2, 3, 16)
        expected = (a * (v * u_l[:, None]).sum(-1) + (1 - a) * (v * u_s[:, None]).sum(-1)
                    + model.item_bias[items])
        assert torch.allclose(scores, expected, atol=1e-5)
        assert a[0].std() > 0                                   # a depends on the candidate item
        model.fuse_out.bias.fill_(50.0)                         # a → 1: long-term interest only
        s_long, _ = model.fused_scores(h, u_l, u_s, items)
    assert torch.allclose(s_long, (v * u_l[:, None]).sum(-1) + model.item_bias[items], atol=1e-4)


def test_loss_parts_include_the_contrastive_term(split):
    model = _model(split)
    batch = make_batch(split.train, split.num_items_a, split.num_items_b, 15, rows=np.arange(8))
    parts = model.loss_parts(batch)
    assert parts["total"].item() == pytest.approx(parts["rec"].item() + CFG.beta * parts["con"].item(), rel=1e-5)
    parts["con"].backward()                                    # the contrast trains both encoders
    assert model.long_att.mlp[0].weight.grad.abs().sum() > 0
    assert model.short_gru.weight_ih.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- interface
def test_loss_and_score_shapes_and_history_dependence(split):
    model = _model(split)
    na, nb = split.num_items_a, split.num_items_b
    loss = model.loss(make_batch(split.train, na, nb, 15, rows=np.arange(8)))
    assert loss.dim() == 0 and torch.isfinite(loss)
    model.eval()
    inputs = make_batch(split.test, na, nb, 15, rows=np.arange(6)).inputs
    cand = torch.as_tensor(split.test_candidates[:6])
    gt = (cand[:, 0] >= na).long()
    with torch.no_grad():
        s = model.score(inputs, cand, gt)
        assert s.shape == cand.shape
        cross = inputs.cross.clone()
        last = cross[:, -1]
        cross[:, -1] = torch.where(last < na, (last + 1) % na, na + (last - na + 1) % nb)
        s2 = model.score(inputs._replace(cross=cross), cand, gt)
    assert not torch.allclose(s, s2)
    with pytest.raises(ValueError, match="domain"):
        model.score(inputs, cand, 1 - gt)


def test_construction_is_deterministic_from_the_seed(split):
    a, b, c = _model(split), _model(split), _model(split, CLSRConfig(dim=16, dropout=0.0, seed=2))
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.item_emb.weight, c.item_emb.weight)


def test_centralised_training_beats_random(split):
    torch.manual_seed(0)
    model = _model(split, CLSRConfig(dim=16, dropout=0.1, seed=0))
    train_steps(model, split, steps=200, lr=5e-3)
    assert heldout_mrr(model, split) > 2 * random_mrr(split)


def test_pair_attention_over_every_pair_is_the_mlp_on_the_concatenated_pairs():
    """PairAttention.pairs splits the first layer by its four inputs; in float64 it equals the MLP
    on the materialised [a_j, b_i, a_j − b_i, a_j ⊙ b_i] of every pair, values and gradients."""
    from fedlib.baselines.sequential.clsr import PairAttention

    torch.manual_seed(0)
    att = PairAttention(8).double()
    a = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    reference = att(a.unsqueeze(1).expand(3, 5, 5, -1), b.unsqueeze(2).expand(3, 5, 5, -1))  # [i, j] = τ(a_j, b_i)
    fast = att.pairs(a, b)
    assert fast.shape == (3, 5, 5) and torch.allclose(fast, reference, rtol=0, atol=1e-12)
    assert not torch.allclose(fast, fast.transpose(1, 2))                 # τ is not symmetric: the order matters
    weights = torch.randn(3, 5, 5, dtype=torch.float64)
    grads = [torch.autograd.grad((out * weights).sum(), [a, b, *att.parameters()]) for out in (reference, fast)]
    for g_reference, g_fast in zip(*grads):
        assert torch.allclose(g_fast, g_reference, rtol=0, atol=1e-10)
