"""TiSASRec baseline: clipped personalised intervals, interval-aware attention, interface, learning."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.papers.fedcsr import experiment as X
from fedlib.baselines.sequential.sequences import draw_negatives_torch, make_batch
from fedlib.baselines.sequential.tisasrec import TiSASRec, TiSASRecConfig, TimeIntervalAttention, relation_matrix

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)
CFG = TiSASRecConfig(dim=16, maxlen=15, num_blocks=2, dropout=0.0, seed=1)


@pytest.fixture(scope="module")
def split():
    return cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)


def _model(split, cfg=CFG):
    return TiSASRec(split.num_items_a, split.num_items_b, cfg)


# ----------------------------------------------------------------------------- mechanism
def test_relation_matrix_is_personalised_and_clipped():
    times = torch.tensor([[0, 10, 13, 19]])                  # first column padding
    real = torch.tensor([[False, True, True, True]])
    # r_min = 3: |10−13| = 3 → 1, |13−19| = 6 → 2, |10−19| = 9 → 3
    expected = torch.tensor([[[0, 0, 0, 0], [0, 0, 1, 3], [0, 1, 0, 2], [0, 3, 2, 0]]])
    assert torch.equal(relation_matrix(times, real, 256), expected)
    assert torch.equal(relation_matrix(times, real, 2), expected.clamp(max=2))   # clip k = 2
    # positions as stamps (the interface case): r_ij = |i − j|
    pos = torch.tensor([[0, 1, 2, 3]])
    assert relation_matrix(pos, pos > 0, 256)[0, 3, 1].item() == 2


def test_interval_embeddings_enter_keys_and_values_hand_computed():
    block = TimeIntervalAttention(dim=2, maxlen=4, time_span=2, dropout=0.0)
    with torch.no_grad():
        for lin in (block.q, block.k, block.v):
            lin.weight.copy_(torch.eye(2))
        for emb in (block.pos_k, block.pos_v):
            emb.weight.zero_()
        block.rel_k.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
        block.rel_v.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 3.0], [0.0, 0.0]]))
    h = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])             # (1, 2, 2); LN rows → [1, −1], [−1, 1]
    positions = torch.tensor([[1, 2]])
    rel = torch.tensor([[[0, 1], [1, 0]]])
    z, alpha, _ = block.attention(h, positions, rel)
    # query 1 = [−1, 1]: e_10 = q·(x_0 + R^K[1])/√2 = q·[1, 2]/√2 = 1/√2, e_11 = q·x_1/√2 = 2/√2
    a = torch.softmax(torch.tensor([1.0, 2.0]) / math.sqrt(2), dim=0)
    assert torch.allclose(alpha[0, 1], a, atol=1e-5)
    assert torch.allclose(alpha[0, 0], torch.tensor([1.0, 0.0]))            # causal: only itself
    # z_1 = α_0 (x_0 + R^V[1]) + α_1 x_1 ;  z_0 = x_0
    assert torch.allclose(z[0, 1], a[0] * torch.tensor([1.0, 3.0]) + a[1] * torch.tensor([0.0, 2.0]), atol=1e-5)
    assert torch.allclose(z[0, 0], torch.tensor([1.0, 0.0]), atol=1e-6)
    # without the interval key embedding the weights would differ (the mechanism matters)
    with torch.no_grad():
        block.rel_k.weight.zero_()
    _, alpha0, _ = block.attention(h, positions, rel)
    assert not torch.allclose(alpha0[0, 1], a, atol=1e-3)


def test_model_uses_the_time_intervals(split):
    model = _model(split).eval()
    inputs = make_batch(split.test, split.num_items_a, split.num_items_b, 15, rows=np.arange(4)).inputs
    with torch.no_grad():
        default = model.hidden(inputs)                        # stamps = positions
        stretched = model.hidden(inputs, times=inputs.pos_cross ** 2)   # growing gaps
    assert not torch.allclose(default, stretched)


# ----------------------------------------------------------------------------- sampled softmax
def _full_logit_loss(model, batch):
    """Reference: each domain's CE from the complete (B, L, |V^d|) logits."""
    h = model.hidden(batch.inputs)                                          # (B, L, n)
    ma, mb = batch.unified_a_mask, batch.unified_b_mask
    return (F.cross_entropy(model.head_a(h)[ma], batch.unified_a[ma])
            + F.cross_entropy(model.head_b(h)[mb], batch.unified_b[mb]))


def test_default_loss_is_the_full_softmax_and_draws_nothing(split):
    model = _model(split).eval()
    batch = make_batch(split.train, split.num_items_a, split.num_items_b, 15, rows=np.arange(16))
    assert model.config.sampled_negatives is None
    with torch.no_grad():
        state = torch.get_rng_state()
        loss = model.loss(batch)
        assert torch.equal(torch.get_rng_state(), state)                   # no negatives drawn
        assert torch.allclose(loss, _full_logit_loss(model, batch), rtol=1e-6, atol=1e-6)


def test_sampled_softmax_over_every_item_is_the_full_softmax(split):
    na, nb = split.num_items_a, split.num_items_b
    model = _model(split, dataclasses.replace(CFG, sampled_negatives=5)).eval()
    full = _model(split).eval()                                             # same seed, same weights
    batch = make_batch(split.train, na, nb, 15, rows=np.arange(16))
    every = (torch.randperm(na), torch.randperm(nb))
    with torch.no_grad():
        ref = full.loss(batch)
        assert torch.allclose(model.loss(batch, negatives=every), ref, rtol=1e-5, atol=1e-6)
        torch.manual_seed(3)
        sampled = model.loss(batch)                                         # 5 drawn negatives per domain
        torch.manual_seed(3)
        drawn = draw_negatives_torch(na, nb, 5, "cpu")
        assert drawn[0].shape == (5,) and int(drawn[0].max()) < na and int(drawn[1].max()) < nb
        assert torch.equal(sampled, model.loss(batch, negatives=drawn))     # drawn from torch's global RNG
        assert not torch.allclose(sampled, ref, rtol=1e-2)                  # really a smaller softmax
    # the sampled loss only touches the head rows of targets and negatives
    model.train().loss(batch, negatives=drawn).backward()
    used = torch.zeros(na, dtype=torch.bool)
    used[batch.unified_a[batch.unified_a_mask]] = True
    used[drawn[0]] = True
    grad_rows = model.head_a.weight.grad.abs().sum(1) > 0                   # (|A|,)
    assert bool(grad_rows[used].all()) and not bool(grad_rows[~used].any())


def test_sampled_negatives_is_validated_and_set_by_the_grid(split):
    for bad in (0, -3, 2.5, True, "1000"):
        with pytest.raises(ValueError, match=r"sampled_negatives must be None .*positive int"):
            TiSASRecConfig(sampled_negatives=bad)
    assert TiSASRecConfig(sampled_negatives=1000).sampled_negatives == 1000
    real = X.baseline_factory(X.cell("Food-Kitchen", "TiSASRec", dim=8), split)()
    assert real.config.sampled_negatives == 1000  # the spec's sampled softmax on real data
    assert X.baseline_factory(X.cell("synthetic", "TiSASRec", dim=8), split)().config.sampled_negatives is None


# ----------------------------------------------------------------------------- interface
def test_loss_and_score_shapes_and_history_dependence(split):
    model = _model(split)
    na, nb = split.num_items_a, split.num_items_b
    batch = make_batch(split.train, na, nb, 15, rows=np.arange(8))
    loss = model.loss(batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.head_b.weight.grad is not None and model.item_emb.weight.grad.abs().sum() > 0
    model.eval()
    inputs = make_batch(split.test, na, nb, 15, rows=np.arange(6)).inputs
    cand = torch.as_tensor(split.test_candidates[:6])
    gt = (cand[:, 0] >= na).long()
    with torch.no_grad():
        s = model.score(inputs, cand, gt)
        assert s.shape == cand.shape
        cross = inputs.cross.clone()
        last = cross[:, -1]
        cross[:, -1] = torch.where(last < na, (last + 1) % na, na + (last - na + 1) % nb)   # same domain, new item
        s2 = model.score(inputs._replace(cross=cross), cand, gt)
    assert not torch.allclose(s, s2)
    with pytest.raises(ValueError, match="domain"):
        model.score(inputs, cand, 1 - gt)


def test_construction_is_deterministic_from_the_seed(split):
    a, b, c = _model(split), _model(split), _model(split, TiSASRecConfig(dim=16, dropout=0.0, seed=2))
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.item_emb.weight, c.item_emb.weight)


def test_centralised_training_beats_random(split):
    torch.manual_seed(0)
    model = _model(split, TiSASRecConfig(dim=16, dropout=0.1, seed=0))
    train_steps(model, split, steps=200, lr=5e-3)
    assert heldout_mrr(model, split) > 2 * random_mrr(split)
