"""C2DSR: infomax objective and corruption on toy cases, interface shapes, history dependence, training."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential import c2dsr as C
from fedlib.baselines.sequential.sequences import make_batch, transition_graphs

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)

NA, NB = 3, 2          # A items 0, 1, 2; B items 3, 4; pad 5
PAD = NA + NB
SEQS = [[0, 3, 1, 4, 2], [3, 4, 0, 1], [1, 2, 3, 0, 4, 3]]


def _model(seed=0, dim=8, dropout=0.0):
    model = C.C2DSR(NA, NB, C.C2DSRConfig(dim=dim, maxlen=6, dropout=dropout, seed=seed))
    model.set_graphs(transition_graphs(SEQS, NA, NB))
    return model


def test_corruption_replaces_exactly_the_other_domain():
    cross = torch.tensor([[PAD, 0, 3, 1, 4, 2], [3, 4, 0, 1, PAD, PAD]] * 50)   # (100, 6)
    g = torch.Generator().manual_seed(0)
    neg_a = C.corrupt_other_domain(cross, NA, NB, keep_domain=0, generator=g)  # keep A, corrupt B
    is_b = (cross >= NA) & (cross != PAD)
    assert torch.equal(neg_a[~is_b], cross[~is_b])                            # A items and padding kept
    assert bool(((neg_a[is_b] >= NA) & (neg_a[is_b] < PAD)).all())           # B positions hold B items
    assert neg_a[is_b].unique().tolist() == [3, 4]                            # random, not copied
    neg_b = C.corrupt_other_domain(cross, NA, NB, keep_domain=1, generator=g)
    is_a = cross < NA
    assert torch.equal(neg_b[~is_a], cross[~is_a])
    assert bool((neg_b[is_a] < NA).all()) and neg_b[is_a].unique().numel() == 3


def test_infomax_loss_matches_hand_computation():
    disc = C.BilinearDiscriminator(2)
    with torch.no_grad():
        disc.bilinear.weight.copy_(torch.eye(2).unsqueeze(0))                  # D(u, v) = σ(u·v)
        disc.bilinear.bias.fill_(0.0)
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    pos = torch.tensor([[2.0, 1.0], [0.0, 1.0]])                              # u·v = 2, 2
    neg = torch.tensor([[-1.0, 0.0], [1.0, 0.5]])                             # u·v = −1, 1
    sig = lambda t: 1.0 / (1.0 + math.exp(-t))
    row0 = -math.log(sig(2.0)) - math.log(1 - sig(-1.0))
    row1 = -math.log(sig(2.0)) - math.log(1 - sig(1.0))
    assert math.isclose(C.infomax_loss(disc, h, pos, neg).item(), (row0 + row1) / 2, rel_tol=1e-5)
    mask = torch.tensor([False, True])
    assert math.isclose(C.infomax_loss(disc, h, pos, neg, mask).item(), row1, rel_tol=1e-5)
    # A discriminator that ranks the true pair higher has a lower loss than one that inverts it.
    assert C.infomax_loss(disc, h, pos, neg).item() < C.infomax_loss(disc, h, neg, pos).item()


def test_infomax_gradient_reaches_encoders_and_discriminators():
    model = _model()
    batch = make_batch(SEQS, NA, NB, maxlen=6)
    parts = model.loss_parts(batch, generator=torch.Generator().manual_seed(1))
    assert set(parts) == {"pred", "cl_a", "cl_b", "total"}
    assert all(torch.isfinite(v) for v in parts.values()) and parts["cl_a"].item() > 0
    model.zero_grad()
    (parts["cl_a"] + parts["cl_b"]).backward()
    for mod in (model.disc_a, model.disc_b, model.encoder.enc_cross, model.encoder.enc_a, model.encoder.enc_b):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in mod.parameters())


def test_loss_and_score_shapes_and_history_dependence():
    model = _model()
    batch = make_batch(SEQS, NA, NB, maxlen=6)
    loss = model.loss(batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    model.eval()
    cand = torch.tensor([[0, 1, 2], [3, 4, 3], [0, 2, 1]])
    dom = torch.tensor([0, 1, 0])
    with torch.no_grad():
        s = model.score(batch.inputs, cand, dom)
        assert s.shape == (3, 3) and torch.isfinite(s).all()
        changed = make_batch([[0, 3, 1, 4, 2], [3, 4, 1, 1], [1, 2, 3, 0, 4, 3]], NA, NB, maxlen=6).inputs
        s2 = model.score(changed, cand, dom)
    # the history of row 1 ends in 1 instead of 0 (the last item of a row is its target, not history)
    assert torch.equal(s[0], s2[0]) and not torch.allclose(s[1], s2[1])


def test_default_prediction_loss_is_the_full_softmax_of_the_logits():
    model = _model().eval()
    batch = make_batch(SEQS, NA, NB, maxlen=6)
    assert model.config.sampled_negatives is None
    with torch.no_grad():
        pred = model.loss_parts(batch)["pred"]
        h_cross, h_a, h_b = model.encoder(batch.inputs)                     # 3 × (B, L, n)
        ref = 0.0
        for head, h, target, mask in ((model.head_a, h_a + h_cross, batch.next_a, batch.next_a_mask),
                                      (model.head_b, h_b + h_cross, batch.next_b, batch.next_b_mask),
                                      (model.head_a, h_cross, batch.unified_a, batch.unified_a_mask),
                                      (model.head_b, h_cross, batch.unified_b, batch.unified_b_mask)):
            ref = ref + F.cross_entropy(head(h)[mask], target[mask])       # full (B, L, |V^d|) logits
    assert torch.allclose(pred, ref, rtol=1e-6, atol=1e-6)


def test_sampled_softmax_over_every_item_is_the_full_softmax():
    batch = make_batch(SEQS, NA, NB, maxlen=6)
    full = _model().eval()
    model = C.C2DSR(NA, NB, dataclasses.replace(full.config, sampled_negatives=1)).eval()
    model.set_graphs(transition_graphs(SEQS, NA, NB))
    every = (torch.arange(NA), torch.arange(NB).flip(0))
    with torch.no_grad():
        torch.manual_seed(0)
        ref = full.loss(batch)                                              # corruption uses the same draws
        torch.manual_seed(0)
        assert torch.allclose(model.loss(batch, negatives=every), ref, rtol=1e-5, atol=1e-6)
        sampled = model.loss_parts(batch)["pred"]                           # one drawn negative per domain
        assert not torch.allclose(sampled, full.loss_parts(batch)["pred"], rtol=1e-2)
    with pytest.raises(ValueError, match=r"sampled_negatives must be None .*positive int"):
        C.C2DSRConfig(sampled_negatives=0)
    for bad in (-2, 1.0, False, "5"):
        with pytest.raises(ValueError, match="sampled_negatives"):
            C.C2DSRConfig(sampled_negatives=bad)


def test_construction_is_deterministic_from_the_seed():
    a, b, c = _model(seed=3), _model(seed=3), _model(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_short_training_ranks_the_ground_truth_well():
    split = cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49, seed=0)
    na, nb = split.num_items_a, split.num_items_b
    cfg = C.C2DSRConfig(dim=32, maxlen=10, dropout=0.1, seed=0)
    model = C.C2DSR(na, nb, cfg)
    model.set_graphs(transition_graphs(split.train, na, nb))
    torch.manual_seed(0)
    train_steps(model, split, steps=250, lr=3e-3)
    mrr = heldout_mrr(model, split)
    assert mrr > 2 * random_mrr(split), mrr                                  # random ≈ 0.09 (1 + 49)
