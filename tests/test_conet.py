"""CoNet baseline: cross connections on a hand-checked toy, interface shapes, a short training run."""
import pytest
import torch

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential.conet import CoNet, CoNetConfig, CrossUnit
from fedlib.baselines.sequential.sequences import make_batch

from _sequence_training import heldout_mrr, random_mrr, train_steps

torch.set_num_threads(1)

NA, NB = 3, 2


def _model(**kw):
    return CoNet(NA, NB, CoNetConfig(dim=8, maxlen=6, hidden=(8, 4), dropout=0.0, **kw))


def test_cross_unit_matches_hand_computation():
    unit = CrossUnit(2, 2)
    with torch.no_grad():
        unit.lin_a.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        unit.lin_a.bias.copy_(torch.tensor([0.0, -5.0]))
        unit.lin_b.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
        unit.lin_b.bias.zero_()
        unit.cross.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))   # H swaps the coordinates
    a_a, a_b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])
    out_a, out_b = unit(a_a, a_b)
    # a_A' = relu(W_A a_A + b_A + H a_B) = relu([1, 2 - 5] + [4, 3]) = [5, 0]
    assert out_a.tolist() == [[5.0, 0.0]]
    # a_B' = relu(W_B a_B + b_B + H a_A) = relu([6, 0] + [2, 1]) = [8, 1]   (same H)
    assert out_b.tolist() == [[8.0, 1.0]]


def test_other_domain_tower_changes_the_score_only_through_cross_connections():
    model = _model().eval()
    b = make_batch([[0, 3, 1, 2]], NA, NB, maxlen=6)
    cands, dom = torch.tensor([[0, 1, 2]]), torch.tensor([0])
    with torch.no_grad():
        base = model.score(b.inputs, cands, dom)
        # Another latest B item (3 → 4) changes only the B tower's input; the A scores move via H.
        other = make_batch([[0, 4, 1, 2]], NA, NB, maxlen=6)
        model.user_b.weight.zero_()                   # remove the B item's effect on the pooled user part
        s1, s2 = model.score(b.inputs, cands, dom), model.score(other.inputs, cands, dom)
        assert not torch.allclose(s1, s2)
        for unit in model.units:
            unit.cross.weight.zero_()                 # cut the cross connections: the towers are independent
        s1, s2 = model.score(b.inputs, cands, dom), model.score(other.inputs, cands, dom)
        assert torch.allclose(s1, s2)
    assert base.shape == (1, 3)


def test_shapes_history_dependence_and_seed():
    seqs = [[0, 3, 1, 4, 2], [3, 4, 0, 1], [1, 2, 3, 0, 4, 3]]
    b = make_batch(seqs, NA, NB, maxlen=6)
    model = _model()
    loss = model.loss(b)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.units[0].cross.weight.grad.abs().sum() > 0
    model.eval()
    cands = torch.tensor([[0, 1, 2], [3, 4, 3], [0, 2, 1]])
    dom = torch.tensor([0, 1, 0])
    with torch.no_grad():
        s = model.score(b.inputs, cands, dom)
        assert s.shape == (3, 3)
        # row 0's window is [0, 3, 1, 4] (target 2); change its latest A item 1 → 2
        sa = b.inputs.single_a.clone()
        col = int((b.inputs.single_a[0] == 1).nonzero()[0])
        sa[0, col] = 2
        s2 = model.score(b.inputs._replace(single_a=sa), cands, dom)
        assert not torch.allclose(s[0], s2[0]) and torch.allclose(s[1:], s2[1:])
    twin = _model()
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), twin.state_dict().values()))
    assert not torch.equal(_model(seed=1).item_a.weight, twin.item_a.weight)


def test_candidates_outside_the_domain_are_rejected():
    model = _model().eval()
    b = make_batch([[0, 3, 1]], NA, NB, maxlen=6)
    with pytest.raises(ValueError, match="domain"):
        model.score(b.inputs, torch.tensor([[0, 3]]), torch.tensor([0]))


def test_short_training_ranks_the_ground_truth_well():
    split = cross_domain_sequences(num_users=200, items_a=60, items_b=60, num_negatives=49)
    na, nb = split.num_items_a, split.num_items_b
    torch.manual_seed(0)
    model = CoNet(na, nb, CoNetConfig(dim=32, maxlen=15, seed=0))
    train_steps(model, split, steps=300, lr=3e-3)
    mrr = heldout_mrr(model, split, roles=("test",))
    assert mrr > 2 * random_mrr(split), mrr


@pytest.mark.parametrize("hidden", [(64, 32, 16), (8,)])
@pytest.mark.parametrize("candidates", [7, 60])          # per-candidate path, then the projected-table path
def test_split_first_layer_equals_the_concatenated_towers(hidden, candidates):
    """towers (first layer split by input blocks) = towers_reference (Eqs. 1-4 on [u; e]):
    logits and every gradient, both domains, float64, dropout off."""
    torch.manual_seed(0)
    model = CoNet(30, 20, CoNetConfig(dim=8, hidden=hidden, dropout=0.0)).double()
    for domain, (n_items, n_other) in enumerate(((30, 20), (20, 30))):
        u = torch.randn(4, 16, dtype=torch.float64)
        items = torch.randint(0, n_items + 1, (4, candidates))
        context = torch.randint(0, n_other + 1, (4,))
        fast = model.towers(u, items, context, domain)
        reference = model.towers_reference(u, items, context, domain)
        assert fast.shape == (4, candidates)
        assert torch.allclose(fast, reference, atol=1e-12)
        params = list(model.parameters())
        g_fast = torch.autograd.grad(fast.square().sum(), params, allow_unused=True)
        g_reference = torch.autograd.grad(reference.square().sum(), params, allow_unused=True)
        for (name, _), a, b in zip(model.named_parameters(), g_fast, g_reference):
            a = torch.zeros_like(_) if a is None else a
            b = torch.zeros_like(_) if b is None else b
            assert torch.allclose(a, b, atol=1e-10), (domain, name)
