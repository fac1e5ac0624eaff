"""PSJNet-II: split unit (role-specific gated states), join unit (role attention), training."""
import math

import torch

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential.sequences import make_batch
from fedlib.baselines.sequential.psjnet import JoinUnit, PSJNet, PSJNetConfig, SplitUnit

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)

CFG = PSJNetConfig(dim=16, maxlen=8, num_roles=3, dropout=0.0, seed=1)


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _hand_split():
    split = SplitUnit(dim=2, num_roles=2)
    with torch.no_grad():
        for p in split.parameters():
            p.zero_()
        split.roles.copy_(torch.eye(2))                  # r_1 = (1, 0), r_2 = (0, 1)
        split.gate_role.weight.copy_(torch.eye(2))       # f^k = σ(r_k)
        split.cand_in.bias.copy_(torch.tensor([math.atanh(0.5), math.atanh(-0.5)]))  # s̃ = (0.5, −0.5)
    return split


# ----------------------------------------------------------------------------- mechanism
def test_split_keeps_one_gated_state_per_role_hand_checked():
    split = _hand_split()
    h = torch.zeros(1, 2)
    prev = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]])      # (1, K=2, 2): role 1 has history, role 2 none
    new, f = split.step(h, h, prev)
    f1, f2, c = [sig(1), sig(0)], [sig(0), sig(1)], [0.5, -0.5]
    expect_1 = [f1[i] * c[i] + (1 - f1[i]) * 1.0 for i in range(2)]   # role 1 keeps its own state
    expect_2 = [f2[i] * c[i] for i in range(2)]                       # role 2 starts from zero
    assert torch.allclose(f[0], torch.tensor([f1, f2]), atol=1e-6)
    assert torch.allclose(new[0], torch.tensor([expect_1, expect_2]), atol=1e-6)
    # over time: the states move only at source-domain steps
    out = split(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), torch.tensor([[True, False, True]]))  # (1, 3, K, 2)
    assert out.shape == (1, 3, 2, 2)
    assert torch.allclose(out[0, 0], torch.tensor([[f1[0] * 0.5, -f1[1] * 0.5], [f2[0] * 0.5, -f2[1] * 0.5]]),
                          atol=1e-6)
    assert torch.equal(out[0, 1], out[0, 0]) and not torch.allclose(out[0, 2], out[0, 1])


def test_join_weights_roles_by_their_match_with_the_target_state():
    join = JoinUnit(dim=2)
    with torch.no_grad():
        join.w_role.weight.copy_(torch.eye(2))
        join.w_tgt.weight.zero_()
        join.w_tgt.bias.zero_()
        join.v.weight.copy_(torch.tensor([[1.0, 0.0]]))   # e^k = tanh(c^k_0)
    c = torch.tensor([[[[0.5, 3.0], [-1.0, 0.0], [2.0, -2.0]]]])  # (B=1, L=1, K=3, n=2)
    alpha = join.weights(c, torch.zeros(1, 1, 2))
    e = [math.tanh(0.5), math.tanh(-1.0), math.tanh(2.0)]
    z = sum(math.exp(x) for x in e)
    assert torch.allclose(alpha[0, 0], torch.tensor([math.exp(x) / z for x in e]), atol=1e-6)
    # the target state enters the weights: a large target component along W_2 shifts them
    with torch.no_grad():
        join.w_tgt.weight.copy_(torch.eye(2))
    alpha2 = join.weights(c, torch.tensor([[[5.0, 0.0]]]))
    assert torch.allclose(alpha2.sum(-1), torch.ones(1, 1)) and not torch.allclose(alpha, alpha2)


def test_domain_b_scores_see_domain_a_only_through_the_split_gate():
    na = nb = 5
    seqs = [[0, 5, 1, 6, 7], [2, 8, 3, 9, 6]]
    swapped = [[4, 5, 1, 6, 7], [0, 8, 3, 9, 6]]          # another A item at the same step
    inp, inp2 = (make_batch(s, na, nb, maxlen=4).inputs for s in (seqs, swapped))
    cand = torch.tensor([[5, 6, 7, 8, 9]] * 2)
    gt = torch.ones(2, dtype=torch.long)
    model = PSJNet(na, nb, CFG).eval()
    assert not torch.allclose(model.score(inp, cand, gt), model.score(inp2, cand, gt))
    with torch.no_grad():                                  # close the A → B split gate: f = 0
        for lin in (model.split_ab.gate_in, model.split_ab.gate_state, model.split_ab.gate_role):
            lin.weight.zero_()
        model.split_ab.gate_in.bias.fill_(-1e4)
    assert torch.allclose(model.score(inp, cand, gt), model.score(inp2, cand, gt), atol=1e-6)


# ----------------------------------------------------------------------------- learning
def test_short_centralised_training_ranks_the_ground_truth_well():
    split = cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)
    na, nb = split.num_items_a, split.num_items_b
    cfg = PSJNetConfig(dim=32, maxlen=15, num_roles=4, dropout=0.1, seed=0)
    model = PSJNet(na, nb, cfg)
    train_steps(model, split, steps=300, lr=5e-3)
    mrr = heldout_mrr(model, split)
    assert mrr > 2 * random_mrr(split), mrr
