"""π-Net: SFU gates on a hand-checked toy, parallel targets, transfer through the CTU, training."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential.sequences import make_batch
from fedlib.baselines.sequential.pinet import PiNet, PiNetConfig, SharedAccountFilter, parallel_targets
from fedlib.baselines.sequential.psjnet import PSJNet, PSJNetConfig

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)

CFG = PiNetConfig(dim=16, maxlen=8, num_members=3, dropout=0.0, seed=1)


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def toy_batch():
    # A ids 0..2, B ids 3..5, pad 6
    return make_batch([[0, 3, 4, 1, 5], [2, 1, 4, 0, 3, 0]], 3, 3, maxlen=4)


# ----------------------------------------------------------------------------- mechanism
def test_parallel_targets_are_the_next_item_of_each_domain_after_every_prefix():
    ta, ma, tb, mb = parallel_targets(toy_batch())
    # row 0: inputs [0, 3, 4, 1], final 5 → next A after each prefix: 1, 1, 1, none
    assert ta[0].tolist() == [1, 1, 1, 0] and ma[0].tolist() == [True, True, True, False]
    # next B (index = id − 3): 3→0, 4→1, 5→2 (after the A item 1), 5→2
    assert tb[0].tolist() == [0, 1, 2, 2] and mb[0].tolist() == [True] * 4
    # row 1: inputs [1, 4, 0, 3], final 0 → next A: 0, 0, 0, 0; next B: 4→1, 3→0, 3→0, none
    assert ta[1].tolist() == [0, 0, 0, 0] and ma[1].tolist() == [True] * 4
    assert tb[1].tolist() == [1, 0, 0, 0] and mb[1].tolist() == [True, True, True, False]


def _hand_sfu():
    sfu = SharedAccountFilter(dim=2, num_members=2)
    with torch.no_grad():
        for p in sfu.parameters():
            p.zero_()
        sfu.members.copy_(torch.eye(2))                 # r_1 = (1, 0), r_2 = (0, 1)
        sfu.gate_member.weight.copy_(torch.eye(2))      # V_f = I → f^k = σ(r_k)
        sfu.cand_in.bias.copy_(torch.tensor([math.atanh(0.5), math.atanh(-0.5)]))  # s̃ = (0.5, −0.5)
    return sfu


def test_shared_account_filter_step_matches_hand_computation():
    sfu = _hand_sfu()
    h = torch.zeros(1, 2)
    for prev in ([0.0, 0.0], [1.0, 1.0]):
        p = torch.tensor([prev])
        out, f, per_member = sfu.step(h, h, p)
        f1, f2 = [sig(1), sig(0)], [sig(0), sig(1)]
        cand = [0.5, -0.5]
        s1 = [f1[i] * cand[i] + (1 - f1[i]) * prev[i] for i in range(2)]
        s2 = [f2[i] * cand[i] + (1 - f2[i]) * prev[i] for i in range(2)]
        assert torch.allclose(f[0], torch.tensor([f1, f2]), atol=1e-6)
        assert torch.allclose(per_member[0], torch.tensor([s1, s2]), atol=1e-6)
        assert torch.allclose(out[0], torch.tensor([(s1[0] + s2[0]) / 2, (s1[1] + s2[1]) / 2]), atol=1e-6)
    # prev = 0: mean over members of σ(r_k)·s̃ = ((σ(1) + σ(0)) / 2)·(0.5, −0.5)
    out, _, _ = sfu.step(h, h, torch.zeros(1, 2))
    assert out[0, 0].item() == pytest.approx((sig(1) + 0.5) / 2 * 0.5, abs=1e-6)


def test_filter_state_only_moves_at_source_domain_steps():
    sfu = _hand_sfu()
    h = torch.zeros(1, 3, 2)
    out = sfu(h, h, torch.tensor([[True, False, True]]))   # (1, 3, 2)
    assert torch.equal(out[0, 1], out[0, 0]) and not torch.allclose(out[0, 2], out[0, 1])
    assert torch.equal(sfu(h, h, torch.tensor([[False, False, False]])), torch.zeros(1, 3, 2))


def test_domain_b_scores_see_domain_a_only_through_the_sfu_gate():
    na = nb = 5
    seqs = [[0, 5, 1, 6, 7], [2, 8, 3, 9, 6]]
    seqs_swapped = [[4, 5, 1, 6, 7], [0, 8, 3, 9, 6]]     # another A item at the same step
    inp, inp2 = (make_batch(s, na, nb, maxlen=4).inputs for s in (seqs, seqs_swapped))
    cand = torch.tensor([[5, 6, 7, 8, 9]] * 2)
    gt = torch.ones(2, dtype=torch.long)                   # ground truth in B
    model = PiNet(na, nb, CFG).eval()
    assert not torch.allclose(model.score(inp, cand, gt), model.score(inp2, cand, gt))  # A → B transfer
    with torch.no_grad():                                  # close the A → B gate: f = 0
        model.sfu_ab.gate_in.weight.zero_()
        model.sfu_ab.gate_member.weight.zero_()
        model.sfu_ab.gate_in.bias.fill_(-1e4)
    assert torch.allclose(model.score(inp, cand, gt), model.score(inp2, cand, gt), atol=1e-6)


# ----------------------------------------------------------------------------- interface
@pytest.mark.parametrize("model_class, config, transfer_parameter", [
    (PiNet, CFG, "sfu_ab.members"),
    (PSJNet, PSJNetConfig(dim=16, maxlen=8, num_roles=3, dropout=0.0, seed=1), "split_ab.roles"),
], ids=["PiNet", "PSJNet"])
def test_shapes_history_dependence_and_determinism(model_class, config, transfer_parameter):
    """The parallel framework (π-Net and PSJNet): shapes, gradients through the transfer, seeds."""
    na = nb = 5
    batch = make_batch([[0, 5, 1, 6, 7], [2, 8, 3, 9, 6], [1, 2, 3, 4]], na, nb, maxlen=4)
    model = model_class(na, nb, config)
    loss = model.loss(batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grad = model.get_parameter(transfer_parameter).grad
    assert grad is not None and grad.abs().sum() > 0
    model.eval()
    cand = torch.tensor([[5, 6, 7], [7, 8, 9], [0, 1, 2]])
    gt = torch.tensor([1, 1, 0])
    s = model.score(batch.inputs, cand, gt)
    assert s.shape == (3, 3)
    # change the last history item (the final item of each list is the target, not history)
    other = make_batch([[0, 5, 1, 8, 7], [2, 8, 3, 5, 6], [1, 2, 0, 4]], na, nb, maxlen=4).inputs
    s2 = model.score(other, cand, gt)
    assert all(not torch.allclose(s[i], s2[i]) for i in range(3))     # last history item changed
    twin, other_seed = model_class(na, nb, config), model_class(na, nb, dataclasses.replace(config, seed=2))
    for (k, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), k
    assert not torch.equal(model.head_a.weight, other_seed.head_a.weight)
    with pytest.raises(ValueError, match="domain"):
        model.score(batch.inputs, cand, torch.tensor([0, 1, 0]))      # B ids under an A ground truth


@pytest.mark.parametrize("name", ["PiNet", "PSJNet"])
def test_scores_read_the_heads_at_the_last_position_as_the_full_logits_do(name):
    """score computes Eqs. 7-8 at the last position only; in float64 it equals the candidates'
    entries of the full (B, L, |V|) logits at that position, for rows of either GT domain."""
    split = cross_domain_sequences(num_users=300, items_a=30, items_b=40, num_negatives=9)
    na, nb = split.num_items_a, split.num_items_b
    cls, cfg = _model(name, dropout=0.3)
    model = cls(na, nb, cfg).double().eval()
    inputs = make_batch(split.test, na, nb, 8).inputs                            # every test row
    candidates = torch.as_tensor(np.asarray(split.test_candidates))              # (B, 10) global ids, GT first
    gt_domain = (candidates[:, 0] >= na).to(torch.int64)
    assert 0 < int(gt_domain.sum()) < len(gt_domain)                             # both domains are scored
    with torch.no_grad():
        logit_a, logit_b = model.logits(inputs)                                  # (B, L, |A|), (B, L, |B|)
        reference = torch.where(gt_domain.bool().view(-1, 1), logit_b[:, -1].gather(1, (candidates - na).clamp(min=0)),
                                logit_a[:, -1].gather(1, candidates.clamp(max=na - 1)))
    assert torch.allclose(model.score(inputs, candidates, gt_domain), reference, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- sampled softmax
def _sampled_setup():
    split = cross_domain_sequences(num_users=60, items_a=30, items_b=40, num_negatives=9)
    na, nb = split.num_items_a, split.num_items_b
    return na, nb, make_batch(split.train, na, nb, 8, rows=np.arange(12))


def _model(name, **changes):
    """π-Net or PSJNet (same loss, Eq. 9) with the module's test config and ``changes``."""
    from fedlib.baselines.sequential.psjnet import PSJNet, PSJNetConfig
    if name == "PiNet":
        return PiNet, dataclasses.replace(CFG, **changes)
    return PSJNet, PSJNetConfig(**{"dim": 16, "maxlen": 8, "num_roles": 3, "dropout": 0.0, "seed": 1, **changes})


@pytest.mark.parametrize("name", ["PiNet", "PSJNet"])
def test_default_loss_is_the_full_softmax_of_the_logits(name):
    na, nb, batch = _sampled_setup()
    cls, cfg = _model(name)
    model = cls(na, nb, cfg).eval()
    assert model.config.sampled_negatives is None
    ta, ma, tb, mb = parallel_targets(batch)
    with torch.no_grad():
        state = torch.get_rng_state()
        loss = model.loss(batch)
        assert torch.equal(torch.get_rng_state(), state)                   # no negatives drawn
        logit_a, logit_b = model.logits(batch.inputs)                       # (B, L, |A|), (B, L, |B|)
        ref = F.cross_entropy(logit_a[ma], ta[ma]) + F.cross_entropy(logit_b[mb], tb[mb])
    assert torch.allclose(loss, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["PiNet", "PSJNet"])
def test_sampled_softmax_over_every_item_is_the_full_softmax(name):
    na, nb, batch = _sampled_setup()
    cls, cfg = _model(name, sampled_negatives=4)
    model, full = cls(na, nb, cfg).eval(), cls(na, nb, _model(name)[1]).eval()   # same seed, same weights
    every = (torch.arange(na).flip(0), torch.arange(nb))
    with torch.no_grad():
        ref = full.loss(batch)
        assert torch.allclose(model.loss(batch, negatives=every), ref, rtol=1e-5, atol=1e-6)
        torch.manual_seed(0)
        sampled = model.loss(batch)                                         # 4 drawn negatives per domain
        assert torch.isfinite(sampled) and not torch.allclose(sampled, ref, rtol=1e-2)
    # training mode (dropout on the features, then the sampled head) still reaches every module
    torch.manual_seed(0)
    drop = cls(na, nb, _model(name, dropout=0.3, sampled_negatives=4)[1])
    drop.loss(batch).backward()
    assert drop.head_b.weight.grad.abs().sum() > 0 and drop.emb_a.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["PiNet", "PSJNet"])
def test_sampled_negatives_is_validated(name):
    for bad in (0, -1, 10.0, True, "1000"):
        with pytest.raises(ValueError, match=r"sampled_negatives must be None .*positive int"):
            _model(name, sampled_negatives=bad)
    assert _model(name, sampled_negatives=1000)[1].sampled_negatives == 1000


# ----------------------------------------------------------------------------- learning
def test_short_centralised_training_ranks_the_ground_truth_well():
    split = cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)
    na, nb = split.num_items_a, split.num_items_b
    cfg = PiNetConfig(dim=32, maxlen=15, num_members=4, dropout=0.1, seed=0)
    model = PiNet(na, nb, cfg)
    train_steps(model, split, steps=300, lr=5e-3)
    mrr = heldout_mrr(model, split)
    assert mrr > 2 * random_mrr(split), mrr
