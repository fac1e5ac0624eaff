"""CCDR baseline: InfoNCE / graph encoder on hand-checked toys, inter-domain CL, interface, training."""
import math

import pytest
import torch
import torch.nn.functional as F

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential.ccdr import CCDR, CCDRConfig, info_nce, propagate_mean, undirected_edges
from fedlib.baselines.sequential.sequences import make_batch, transition_graphs

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)

NA, NB = 3, 2
SEQS = [[0, 3, 1, 4, 2], [3, 4, 0, 1], [1, 2, 3, 0, 4, 3]]


def _model(**kw):
    cfg = dict(dim=8, maxlen=6, dropout=0.0)
    cfg.update(kw)
    return CCDR(NA, NB, CCDRConfig(**cfg), transition_graphs(SEQS, NA, NB))


def test_info_nce_matches_hand_computation():
    x = torch.eye(2)
    # cos = identity, τ = 1: each row −log(e / (e + 1))
    assert math.isclose(float(info_nce(x, x, 1.0)), -math.log(math.e / (math.e + 1)), rel_tol=1e-6)
    # Swapped positives are far: −log(1 / (1 + e))
    assert math.isclose(float(info_nce(x, x.flip(0), 1.0)), -math.log(1 / (1 + math.e)), rel_tol=1e-6)
    assert float(info_nce(x[:1], x[:1], 1.0)) == 0.0          # a single row has no negatives


def test_graph_encoder_and_edge_drop_on_a_toy_graph():
    g = transition_graphs([[0, 1]], 3, 0).a                    # A graph: 0 → 1 only
    edges = undirected_edges(g)
    assert sorted(map(tuple, edges.T.tolist())) == [(0, 1), (1, 0)]
    e = torch.tensor([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]])
    out = propagate_mean(e, edges, layers=1)
    # (E + ÂE)/2: item 0 ← (e0 + e1)/2, item 1 ← (e1 + e0)/2, isolated item 2 ← e2/2
    assert torch.allclose(out, torch.tensor([[0.5, 1.0], [0.5, 1.0], [2.0, 2.0]]))
    torch.manual_seed(0)
    dropped = propagate_mean(e, edges, layers=1, drop=0.999999)   # every edge dropped → E/2
    assert torch.allclose(dropped, e / 2)


def test_inter_domain_cl_aligns_the_two_domain_user_representations():
    seqs = [[0, 4, 1, 5, 2], [2, 6, 3, 7, 0], [1, 7, 3, 4, 2]]      # 4 A items (0-3), 4 B items (4-7)
    model = CCDR(4, 4, CCDRConfig(dim=8, maxlen=6, dropout=0.0, lambda_intra=0.0), transition_graphs(seqs, 4, 4))
    b = make_batch(seqs, 4, 4, maxlen=6)
    parts = model.loss_parts(b)
    users = [model.user_reps(b.inputs, d, model.item_reps(d))[:, -1] for d in (0, 1)]
    expected = info_nce(users[0], users[1], 0.2) + info_nce(users[1], users[0], 0.2)
    assert torch.allclose(parts["user_cl"], expected)
    # Gradient of the user CL reaches both domains' encoders (this is the cross-domain transfer).
    parts["user_cl"].backward()
    assert model.emb[0].grad.abs().sum() > 0 and model.emb[1].grad.abs().sum() > 0
    assert model.user_mlp[0][0].weight.grad.abs().sum() > 0 and model.user_mlp[1][0].weight.grad.abs().sum() > 0
    # A few steps on the inter-domain CL alone raise the cosine of each row's (u_A, u_B) over the others.
    model.zero_grad()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def margin():
        with torch.no_grad():
            ua, ub = [torch.nn.functional.normalize(model.user_reps(b.inputs, d, model.item_reps(d))[:, -1], dim=-1)
                      for d in (0, 1)]
            sim = ua @ ub.T
            return float(sim.diag().mean() - sim[~torch.eye(3, dtype=torch.bool)].mean())

    before = margin()
    for _ in range(50):
        p = model.loss_parts(b)
        opt.zero_grad()
        (p["user_cl"] + p["neigh_cl"]).backward()
        opt.step()
    after = margin()
    print(f"margin {before:.3f} -> {after:.3f}")
    assert after > before + 0.5


def test_shapes_history_dependence_seed_and_graph_requirement():
    b = make_batch(SEQS, NA, NB, maxlen=6)
    model = _model()
    loss = model.loss(b)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    model.eval()
    cands, dom = torch.tensor([[0, 1, 2], [3, 4, 3], [0, 2, 1]]), torch.tensor([0, 1, 0])
    with torch.no_grad():
        s = model.score(b.inputs, cands, dom)
        assert s.shape == (3, 3)
        sa = b.inputs.single_a.clone()                          # row 0 window [0, 3, 1, 4]: latest A item 1 → 2
        sa[0, int((sa[0] == 1).nonzero()[0])] = 2
        s2 = model.score(b.inputs._replace(single_a=sa), cands, dom)
        assert not torch.allclose(s[0], s2[0]) and torch.allclose(s[1:], s2[1:])
        with pytest.raises(ValueError, match="domain"):
            model.score(b.inputs, torch.tensor([[0, 3]] * 3), torch.tensor([0, 0, 0]))
    twin = _model()
    assert all(torch.equal(p, q) for p, q in zip(_model().state_dict().values(), twin.state_dict().values()))
    assert not torch.equal(_model(seed=1).emb[0], twin.emb[0])
    with pytest.raises(ValueError, match="set_graphs"):
        CCDR(NA, NB, CCDRConfig(dim=8, maxlen=6)).loss(b)


def test_default_match_loss_is_the_full_softmax_over_the_domain():
    b = make_batch(SEQS, NA, NB, maxlen=6)
    model = _model().eval()
    assert model.config.sampled_negatives is None
    with torch.no_grad():
        match = model.loss_parts(b)["match"]
        ref = 0.0
        for d, (target, mask) in enumerate(((b.unified_a, b.unified_a_mask), (b.unified_b, b.unified_b_mask))):
            reps = model.item_reps(d)                                      # (n_d + 1, n)
            logits = model.user_reps(b.inputs, d, reps) @ reps[:-1].T      # (B, L, n_d) every item
            ref = ref + F.cross_entropy(logits[mask], target[mask])
    assert torch.allclose(match, ref, rtol=1e-6, atol=1e-6)


def test_sampled_softmax_over_every_item_is_the_full_softmax():
    b = make_batch(SEQS, NA, NB, maxlen=6)
    full, model = _model().eval(), _model(sampled_negatives=1).eval()      # same seed, same weights
    every = (torch.arange(NA).flip(0), torch.arange(NB))
    with torch.no_grad():
        torch.manual_seed(0)
        ref = full.loss_parts(b)                                           # edge dropout uses the same draws
        torch.manual_seed(0)
        got = model.loss_parts(b, negatives=every)
        assert torch.allclose(got["match"], ref["match"], rtol=1e-5, atol=1e-6)
        assert torch.allclose(got["intra"], ref["intra"])
        sampled = model.loss_parts(b)["match"]                             # one drawn negative per domain
        assert not torch.allclose(sampled, ref["match"], rtol=1e-2)
    model.train().loss(b).backward()
    assert model.emb[0].grad.abs().sum() > 0 and model.emb[1].grad.abs().sum() > 0
    for bad in (0, -1, 3.0, True, "100"):
        with pytest.raises(ValueError, match=r"sampled_negatives must be None .*positive int"):
            CCDRConfig(sampled_negatives=bad)


def test_short_training_ranks_the_ground_truth_well():
    split = cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)
    na, nb = split.num_items_a, split.num_items_b
    model = CCDR(na, nb, CCDRConfig(dim=32, maxlen=15, seed=0))
    model.set_graphs(transition_graphs(split.train, na, nb))
    torch.manual_seed(0)
    train_steps(model, split, steps=300, lr=3e-3)
    mrr = heldout_mrr(model, split, roles=("test",))
    assert mrr > 2 * random_mrr(split), mrr
