"""FedCSR model, losses and augmentation: hand-computed toy cases and one tiny training step."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.splits import Sequences
from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential import sequences as S
from fedlib.papers.fedcsr import model as M

torch.set_num_threads(1)

NA, NB = 3, 2          # A items 0, 1, 2; B items 3, 4; pad 5
PAD = NA + NB


def _tiny(dim=8, dropout=0.0, **flags):
    cfg = M.FedCSRConfig(dim=dim, maxlen=6, dropout=dropout, **flags)
    seqs = [[0, 3, 1, 4, 2], [3, 4, 0, 1], [1, 2, 3, 0, 4, 3]]
    torch.manual_seed(0)
    model = M.FedCSRModel(NA, NB, cfg, S.transition_graphs(seqs, NA, NB))
    return cfg, seqs, model


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, hint", [
    ({"dim": 1}, "dim // 2"), ({"dim": 10, "num_heads": 3}, "divisor"), ({"alpha": 1.5}, "0.3"),
    ({"tau": 0.0}, "0.5"), ({"lambdas": (1.0, -1.0, 0.5)}, "λ1 for L_Pre"), ({"dropout": 1.0}, "[0, 1)"),
    ({"maxlen": 1}, "15"),
])
def test_config_errors_say_what_to_fix(kwargs, hint):
    with pytest.raises(ValueError) as err:
        M.FedCSRConfig(**kwargs)
    assert hint in str(err.value)


def test_config_defaults_follow_the_paper():
    cfg = M.FedCSRConfig()
    assert (cfg.dim, cfg.maxlen, cfg.num_blocks, cfg.num_heads, cfg.dropout) == (256, 15, 2, 1, 0.3)
    assert (cfg.alpha, cfg.tau, cfg.lambdas) == (0.3, 0.5, (0.5, 1.5, 0.5))


# ----------------------------------------------------------------------------- batching and index spaces
def test_batch_of_a_toy_sequence_matches_hand_computation():
    b = S.make_batch([[0, 3, 1, 4, 2]], NA, NB, maxlen=5)
    x = b.inputs
    assert x.cross.tolist() == [[PAD, 0, 3, 1, 4]]
    assert x.single_a.tolist() == [[PAD, 0, PAD, 1, PAD]]
    assert x.single_b.tolist() == [[PAD, PAD, 3, PAD, 4]]
    assert x.pos_cross.tolist() == [[0, 1, 2, 3, 4]]
    assert x.pos_a.tolist() == [[0, 1, 0, 2, 0]] and x.pos_b.tolist() == [[0, 0, 1, 0, 2]]
    # Unified heads: next cross item 0, 3, 1, 4, 2 routed to its domain's head.
    assert b.unified_a_mask.tolist() == [[False, False, True, False, True]]
    assert b.unified_a[b.unified_a_mask].tolist() == [1, 2]
    assert b.unified_b_mask.tolist() == [[False, True, False, True, False]]
    assert b.unified_b[b.unified_b_mask].tolist() == [0, 1]          # item 3 = first B item → index 0
    # Single/cross heads: at each domain position, the next item of that domain.
    assert b.next_a_mask.tolist() == [[False, True, False, True, False]]
    assert b.next_a[b.next_a_mask].tolist() == [1, 2]
    assert b.next_b_mask.tolist() == [[False, False, True, False, False]]  # item 4 has no later B item
    assert b.next_b[b.next_b_mask].tolist() == [1]


def test_batch_keeps_the_latest_maxlen_inputs():
    seq = Sequences.from_lists([0], [[0, 3, 1, 4, 2]])
    b = S.make_batch(seq, NA, NB, maxlen=3)
    assert b.inputs.cross.tolist() == [[3, 1, 4]]
    assert b.unified_a[b.unified_a_mask].tolist() == [1, 2]


def test_first_b_item_is_b_in_every_index_space():
    is_b, idx = S.domain_index(torch.tensor([NA - 1, NA, NA + NB - 1]), NA)
    assert is_b.tolist() == [False, True, True] and idx.tolist() == [NA - 1, 0, NB - 1]
    b = S.make_batch([[0, NA]], NA, NB, maxlen=3)                     # the target is the first B item
    assert b.unified_b_mask.any() and not b.unified_a_mask.any()
    assert b.unified_b[b.unified_b_mask].tolist() == [0]
    # The B head's column 0 is that item: making it certain drives the unified-B CE to ~0.
    _, _, model = _tiny()
    model.eval()
    with torch.no_grad():
        model.head_b.weight.zero_()
        model.head_b.bias.copy_(torch.tensor([50.0, -50.0]))
        terms = S.prediction_loss((model.head_a, model.head_b), *model.represent(b.inputs)[:3], b)
    assert terms["unified_b"].item() < 1e-6
    assert model.head_a.out_features == NA and model.head_b.out_features == NB


def test_prediction_loss_on_gathered_rows_equals_the_full_logit_cross_entropy():
    """Eq. 17 computed only at target positions equals CE over Eq. 16's full (B, L, |V|) logits."""
    _, seqs, model = _tiny()
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    model.eval()
    with torch.no_grad():
        h_cross, h_a, h_b = model.represent(batch.inputs)[:3]
        full = model.logits(h_cross, h_a, h_b)
        terms = S.prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch)
    targets = {"single": ("next_a", "next_b"), "cross": ("next_a", "next_b"), "unified": ("unified_a", "unified_b")}
    assert set(terms) == {f"{k}_{d}" for k in targets for d in "ab"}
    for kind, (ta, tb) in targets.items():
        for d, t in (("a", ta), ("b", tb)):
            mask = getattr(batch, t + "_mask")
            assert mask.any()
            expected = torch.nn.functional.cross_entropy(full[f"{kind}_{d}"][mask], getattr(batch, t)[mask])
            torch.testing.assert_close(terms[f"{kind}_{d}"], expected)
    empty = S.head_cross_entropy(model.head_a, h_a, batch.next_a, torch.zeros_like(batch.next_a_mask))
    assert empty.item() == 0.0


def test_sampled_softmax_over_every_item_equals_the_full_softmax_and_needs_an_rng():
    _, seqs, model = _tiny()
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    h = torch.randn(*batch.next_a.shape, 8)
    full = S.head_cross_entropy(model.head_a, h, batch.next_a, batch.next_a_mask)
    every = S.head_cross_entropy(model.head_a, h, batch.next_a, batch.next_a_mask, torch.arange(NA))
    torch.testing.assert_close(every, full)                  # the target's own column is masked out of the negatives
    few = S.head_cross_entropy(model.head_a, h, batch.next_a, batch.next_a_mask, torch.tensor([0]))
    assert few.item() < full.item()                          # fewer competitors → smaller loss
    negs = S.draw_negatives(NA, NB, 2, np.random.default_rng(0), "cpu")
    assert negs[0].max() < NA and negs[1].max() < NB and len(negs[0]) == 2
    assert S.draw_negatives(NA, NB, None, np.random.default_rng(0), "cpu") is None
    cfg = M.FedCSRConfig(dim=8, maxlen=6, sampled_negatives=2, use_mcl=False, use_scl=False)
    with pytest.raises(ValueError, match="rng"):
        M.fedcsr_loss(model, batch, config=cfg)
    with pytest.raises(ValueError, match="sampled_negatives"):
        M.FedCSRConfig(sampled_negatives=0)


# ----------------------------------------------------------------------------- graphs
def test_transition_graph_of_a_toy_sequence_equals_the_hand_matrix():
    g = S.transition_graphs([[0, 3, 1, 0, 4], [0, 3]], NA, NB)
    cross = torch.zeros(5, 5)
    cross[0, 3] = cross[0, 4] = 0.5      # 0→3 (twice: binary), 0→4
    cross[3, 1] = 1.0
    cross[1, 0] = 1.0
    assert torch.allclose(g.cross.to_dense(), cross)
    a = torch.zeros(3, 3)
    a[0, 1] = a[1, 0] = 1.0              # s^A = [0, 1, 0] and [0]
    assert torch.allclose(g.a.to_dense(), a)
    assert torch.allclose(g.b.to_dense(), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))  # s^B = [3, 4] → local 0→1
    counted = S.transition_graphs([[0, 3, 1, 0, 4], [0, 3]], NA, NB, binary=False).cross.to_dense()
    assert torch.allclose(counted[0], torch.tensor([0.0, 0.0, 0.0, 2 / 3, 1 / 3]))


def test_propagation_is_the_mean_of_input_and_neighbours():
    g = S.transition_graphs([[0, 1], [0, 2]], NA, NB).a               # row 0: ½·e1 + ½·e2
    table = torch.arange(8, dtype=torch.float32).reshape(4, 2)        # 3 items + pad row
    out = S.propagate(g, table)
    assert torch.allclose(out[0], 0.5 * (table[0] + 0.5 * (table[1] + table[2])))
    assert torch.allclose(out[1], 0.5 * table[1]) and torch.equal(out[3], table[3])



def test_row_propagation_equals_indexing_the_full_propagation_with_its_gradient():
    rng = np.random.default_rng(0)
    n = 40
    sequences = [list(rng.integers(0, n, size=rng.integers(2, 10))) for _ in range(30)]
    graph = S.transition_graphs(sequences, n, 5).a.double()           # domain A graph over n items
    table = torch.randn(n + 1, 6, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[3, 3, 7, n, n], [39, 0, 1, 2, n]])           # repeats and padding
    full, rows = S.propagate(graph, table)[ids], S.propagate_rows(graph, table, ids)
    assert rows.shape == (2, 5, 6)
    assert torch.allclose(full, rows, atol=1e-12)
    weights = torch.randn_like(full)
    grad_full, = torch.autograd.grad((full * weights).sum(), table)
    grad_rows, = torch.autograd.grad((rows * weights).sum(), table)
    assert torch.allclose(grad_full, grad_rows, atol=1e-12)
    toy = S.transition_graphs([[0, 1], [0, 2]], NA, NB).a             # items 1, 2 have no successor
    small = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    out = S.propagate_rows(toy, small, torch.tensor([2, 0, PAD - NB]))
    assert torch.allclose(out, torch.stack([0.5 * small[2], 0.5 * (small[0] + 0.5 * (small[1] + small[2])), small[3]]))

def _reads_of(output: torch.Tensor, parameter: torch.Tensor) -> int:
    """How many nodes of ``output``'s autograd graph read ``parameter`` directly (edges into its
    AccumulateGrad node). Each such read of an embedding table or head costs the backward a
    zero-filled gradient of the whole parameter."""
    seen, stack, reads, target = set(), [output.grad_fn], 0, None
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for child, _ in node.next_functions:
            if child is not None and type(child).__name__ == "AccumulateGrad" and child.variable is parameter:
                reads += 1
            else:
                stack.append(child)
    return reads


def test_residual_row_propagation_reads_the_table_once_with_the_same_values_and_gradient():
    rng = np.random.default_rng(1)
    n = 30
    sequences = [list(rng.integers(0, n, size=rng.integers(2, 9))) for _ in range(25)]
    graph = S.transition_graphs(sequences, n, 4).a.double()
    table = torch.nn.Parameter(torch.randn(n + 1, 5, dtype=torch.float64))
    ids = torch.tensor([[4, 4, 9, n], [29, 0, 1, n]])
    expected = S.propagate(graph, table)[ids] + table[ids]                 # Eq. 1's E + propagate(E), direct form
    got = S.propagate_rows(graph, table, ids, residual=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    weights = torch.randn_like(got)
    grad_expected, = torch.autograd.grad((expected * weights).sum(), table)
    grad_got, = torch.autograd.grad((got * weights).sum(), table)
    torch.testing.assert_close(grad_got, grad_expected, rtol=0, atol=1e-12)
    assert _reads_of(got.sum(), table) == 1                                 # one gather, one full-size zero fill
    assert _reads_of(expected.sum(), table) > 1


def test_one_domain_head_is_read_once_for_all_its_sampled_softmax_terms():
    """prediction_loss with shared negatives: each head's rows are gathered once per step, and
    every term equals the direct sampled softmax (weight[target], weight[negatives]) in value
    and gradient."""
    _, seqs, model = _tiny()
    model.double()
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    h_cross, h_a, h_b = (h.detach().requires_grad_() for h in model.represent(batch.inputs)[:3])
    negatives = (torch.tensor([0, 2, 2, 1]), torch.tensor([1, 0]))
    terms = S.prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch, negatives=negatives)

    def direct(head, hidden, target, mask, neg):
        rows, tgt = hidden[mask], target[mask]
        pos = (rows * head.weight[tgt]).sum(-1) + head.bias[tgt]
        other = (rows @ head.weight[neg].T + head.bias[neg]).masked_fill(neg[None] == tgt[:, None], float("-inf"))
        return torch.nn.functional.cross_entropy(torch.cat([pos[:, None], other], 1), torch.zeros_like(tgt))

    inputs = {"cross_a": (model.head_a, h_a + h_cross, batch.next_a, batch.next_a_mask, negatives[0]),
              "cross_b": (model.head_b, h_b + h_cross, batch.next_b, batch.next_b_mask, negatives[1]),
              "single_a": (model.head_a, h_a, batch.next_a, batch.next_a_mask, negatives[0]),
              "single_b": (model.head_b, h_b, batch.next_b, batch.next_b_mask, negatives[1]),
              "unified_a": (model.head_a, h_cross, batch.unified_a, batch.unified_a_mask, negatives[0]),
              "unified_b": (model.head_b, h_cross, batch.unified_b, batch.unified_b_mask, negatives[1])}
    assert list(terms) == list(inputs)                                      # Eq. 17's terms, in order
    reference = {name: direct(*args) for name, args in inputs.items()}
    for name in inputs:
        torch.testing.assert_close(terms[name], reference[name], rtol=0, atol=1e-12)
    total, total_ref = sum(terms.values()), sum(reference.values())
    wrt = [model.head_a.weight, model.head_a.bias, model.head_b.weight, h_cross, h_a, h_b]
    for got, want in zip(torch.autograd.grad(total, wrt), torch.autograd.grad(total_ref, wrt)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert _reads_of(total, model.head_a.weight) == 1 and _reads_of(total, model.head_b.bias) == 1
    assert _reads_of(total_ref, model.head_a.weight) == 6
    none = S.prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch, negatives=negatives,
                             use_single=False, use_unified=False)
    assert list(none) == ["cross_a", "cross_b"]
    torch.testing.assert_close(none["cross_a"], reference["cross_a"], rtol=0, atol=1e-12)


def test_encoder_reads_each_item_table_once_per_forward():
    _, seqs, model = _tiny()
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    h_cross, h_a, h_b = model.encoder(batch.inputs)
    for table, out in ((model.encoder.emb_cross, h_cross), (model.encoder.emb_a, h_a), (model.encoder.emb_b, h_b)):
        assert _reads_of(out.sum(), table.weight) == 1


# ----------------------------------------------------------------------------- encoder
def test_causal_encoder_does_not_look_ahead():
    _, _, model = _tiny()
    model.eval()
    x1 = S.make_batch([[0, 3, 1, 4, 2, 0]], NA, NB, maxlen=6).inputs
    x2 = S.make_batch([[0, 3, 1, 2, 3, 0]], NA, NB, maxlen=6).inputs  # differs from position 3 on
    with torch.no_grad():
        h1, h2 = model.encoder(x1), model.encoder(x2)
    for a, b in zip(h1, h2):
        assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)          # pad + 3 unchanged positions
    assert not torch.allclose(h1[0][:, 4:], h2[0][:, 4:])


@pytest.mark.parametrize("heads", [1, 2])
def test_packed_encoder_equals_the_padded_reference(heads):
    """forward (real tokens only) = forward_reference (nn.MultiheadAttention on every position):
    values and every gradient, in float64 with dropout off; rows with no real token included."""
    torch.manual_seed(0)
    enc = S.CausalSelfAttention(8, 6, 2, heads, 0.3).double().eval()
    positions = torch.tensor([[0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6],
                              [0, 1, 0, 2, 0, 3], [0, 0, 0, 0, 0, 1]])
    x = torch.randn(5, 6, 8, dtype=torch.float64, requires_grad=True)
    params = [x] + list(enc.parameters())
    packed = enc(x, positions)
    reference = enc.forward_reference(x, positions)
    assert torch.allclose(packed, reference, atol=1e-12)
    assert torch.all(packed[positions == 0] == 0)
    grads_packed = torch.autograd.grad((packed ** 2).sum(), params)
    grads_reference = torch.autograd.grad((reference ** 2).sum(), params)
    for name, a, b in zip(["x"] + [n for n, _ in enc.named_parameters()], grads_packed, grads_reference):
        assert torch.allclose(a, b, atol=1e-10), name
    # train mode: dropout acts on the real tokens, padding stays zero
    enc.train()
    out = enc(x, positions)
    assert torch.all(out[positions == 0] == 0) and not torch.allclose(out, packed)


def test_aligned_single_domain_encoding_equals_the_compacted_sequence():
    _, _, model = _tiny()
    model.eval()
    mixed = S.inputs_from_cross(np.array([[0, 3, 1, 4]]), NA, NB)
    only_a = S.inputs_from_cross(np.array([[PAD, PAD, 0, 1]]), NA, NB)
    with torch.no_grad():
        h_mixed, h_only = model.encoder(mixed)[1], model.encoder(only_a)[1]
    assert torch.allclose(h_mixed[0, [0, 2]], h_only[0, [2, 3]], atol=1e-5)
    assert torch.all(h_mixed[0, [1, 3]] == 0)                        # other-domain positions are padding


def test_encoder_without_graphs_raises():
    model = M.FedCSRModel(NA, NB, M.FedCSRConfig(dim=4, maxlen=4))
    with pytest.raises(ValueError, match="set_graphs"):
        model.represent(S.make_batch([[0, 3]], NA, NB, maxlen=4).inputs)


# ----------------------------------------------------------------------------- augmentation
def test_augmentation_replaces_and_reorders_the_stated_parts():
    na, nb = 30, 30
    seq = np.arange(20)                                                # 20 distinct A items
    changed_order = False
    for seed in range(20):
        aug = M.augment_sequence(seq, na, nb, 0.3, np.random.default_rng(seed))
        first = aug[:10]
        replaced = first != seq[:10]
        assert replaced.sum() == 3                                     # ⌊0.3·10⌋ replacements
        assert np.all((first[replaced] >= na) & (first[replaced] < na + nb))  # from the other domain
        assert np.array_equal(aug[10:17], seq[10:17])                  # only the latest ⌊0.3·10⌋ = 3 move
        assert sorted(aug[17:]) == sorted(seq[17:])
        changed_order |= not np.array_equal(aug[17:], seq[17:])
    assert changed_order
    b_seq = np.arange(na, na + 10)                                     # B items are replaced by A items
    aug = M.augment_sequence(b_seq, na, nb, 0.5, np.random.default_rng(0))
    assert np.all(aug[:5][aug[:5] != b_seq[:5]] < na)
    assert np.array_equal(M.augment_sequence(seq, na, nb, 0.0, np.random.default_rng(0)), seq)


def test_augmented_single_domain_rows_are_derived_from_the_augmented_cross_row():
    split = cross_domain_sequences(num_users=40, items_a=20, items_b=16, topics=4, num_negatives=5, seed=1)
    na, nb = split.num_items_a, split.num_items_b
    x = S.make_batch(split.train, na, nb, maxlen=15).inputs
    aug = M.augment_inputs(x, na, nb, 0.5, np.random.default_rng(0))
    pad = na + nb
    assert not torch.equal(aug.cross, x.cross)
    assert torch.equal(aug.cross == pad, x.cross == pad)               # lengths and padding kept
    assert torch.equal(aug.single_a, torch.where(aug.cross < na, aug.cross, pad))
    assert torch.equal(aug.single_b, torch.where((aug.cross >= na) & (aug.cross < pad), aug.cross, pad))
    for single, pos in ((aug.single_a, aug.pos_a), (aug.single_b, aug.pos_b)):
        real = single != pad
        assert torch.equal(pos, torch.cumsum(real.long(), 1) * real)


# ----------------------------------------------------------------------------- MCL
def test_mcl_loss_on_a_hand_case_and_equals_the_ig_ratio():
    zl = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])]
    zg = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])]
    # Each domain: cos = 1 with its positive, 0 with the other domain's global → −log(e²/(e²+1)).
    assert M.mcl_loss(zl, zg, 0.5).item() == pytest.approx(2 * math.log(1 + math.exp(-2)), rel=1e-6)
    g = torch.Generator().manual_seed(0)
    zl = [torch.randn(5, 4, generator=g) for _ in range(2)]
    zg = [torch.randn(5, 4, generator=g) for _ in range(2)]
    literal = 0.0
    for d in range(2):
        ig = [M.information_gap(zl[d], zg[e], 0.5) for e in range(2)]
        literal -= torch.log(ig[d] / (ig[0] + ig[1])).mean()
    assert M.mcl_loss(zl, zg, 0.5).item() == pytest.approx(literal.item(), rel=1e-5)


def test_mcl_loss_is_lower_for_aligned_than_for_shuffled_pairs():
    g = torch.Generator().manual_seed(0)
    zg = [torch.randn(32, 8, generator=g) for _ in range(2)]
    aligned = [z + 0.1 * torch.randn(32, 8, generator=g) for z in zg]
    perm = torch.randperm(32, generator=g)
    shuffled = [z[perm] for z in aligned]
    assert M.mcl_loss(aligned, zg, 0.5) < M.mcl_loss(shuffled, zg, 0.5) - 0.2


# ----------------------------------------------------------------------------- SCL
def test_scl_stop_gradient_blocks_the_target_branch():
    g = torch.Generator().manual_seed(0)
    q, p_aug, q_aug, p = (torch.randn(4, 6, generator=g).requires_grad_() for _ in range(4))
    loss = M.scl_loss(q, p_aug, q_aug, p)
    loss.backward()
    assert p.grad is None and p_aug.grad is None
    assert q.grad.abs().sum() > 0 and q_aug.grad.abs().sum() > 0
    # Perfect prediction gives the minimum −2.
    assert M.scl_loss(p_aug, p_aug, p, p).item() == pytest.approx(-2.0)


# ----------------------------------------------------------------------------- total loss
def test_forward_backward_on_a_synthetic_batch_trains_every_parameter():
    split = cross_domain_sequences(num_users=50, items_a=15, items_b=18, topics=4, num_negatives=5, seed=0)
    na, nb = split.num_items_a, split.num_items_b
    cfg = M.FedCSRConfig(dim=16, dropout=0.1)
    torch.manual_seed(0)
    model = M.FedCSRModel(na, nb, cfg, S.transition_graphs(split.train, na, nb))
    global_model = M.frozen_copy(model)
    batch = S.make_batch(split.train, na, nb, cfg.maxlen, rows=np.arange(16))
    loss, parts = M.fedcsr_loss(model, batch, global_model=global_model, rng=np.random.default_rng(0))
    loss.backward()
    assert torch.isfinite(loss) and {"pre", "mcl", "scl"} <= parts.keys()
    assert len([k for k in parts if k.startswith("ce_")]) == 6
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert all(p.grad is None and not p.requires_grad for p in global_model.parameters())


def test_total_loss_weights_and_ablation_flags():
    cfg, seqs, model = _tiny()
    model.eval()                                                       # deterministic passes
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    aug = M.augment_inputs(batch.inputs, NA, NB, 0.5, np.random.default_rng(0))
    glob = M.frozen_copy(model)
    total, parts = M.fedcsr_loss(model, batch, augmented=aug, global_model=glob)
    expected = 0.5 * parts["pre"] + 1.5 * parts["mcl"] + 0.5 * parts["scl"]
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    assert parts["pre"].item() == pytest.approx(sum(v.item() for k, v in parts.items() if k.startswith("ce_")), rel=1e-6)
    # w/o MCL needs no global model; w/o SCL needs no augmentation.
    flags = M.FedCSRConfig(dim=8, maxlen=6, dropout=0.0, use_mcl=False, use_scl=False)
    total, parts = M.fedcsr_loss(model, batch, config=flags)
    assert "mcl" not in parts and "scl" not in parts and total.item() == pytest.approx(0.5 * parts["pre"].item())
    no_single = M.FedCSRConfig(dim=8, maxlen=6, use_mcl=False, use_scl=False, use_single=False)
    no_unified = M.FedCSRConfig(dim=8, maxlen=6, use_mcl=False, use_scl=False, use_unified=False)
    assert sorted(k for k in M.fedcsr_loss(model, batch, config=no_single)[1] if k.startswith("ce_")) == \
        ["ce_cross_a", "ce_cross_b", "ce_unified_a", "ce_unified_b"]
    assert sorted(k for k in M.fedcsr_loss(model, batch, config=no_unified)[1] if k.startswith("ce_")) == \
        ["ce_cross_a", "ce_cross_b", "ce_single_a", "ce_single_b"]
    with pytest.raises(ValueError, match="frozen_copy"):
        M.fedcsr_loss(model, batch, augmented=aug)
    with pytest.raises(ValueError, match="augment_inputs"):
        M.fedcsr_loss(model, batch, global_model=glob)


def test_mcl_pulls_the_local_model_towards_the_global_one():
    """A few steps on MCL alone raise the local/global agreement of the same domain."""
    cfg, seqs, model = _tiny(dim=8)
    batch = S.make_batch(seqs, NA, NB, maxlen=6)
    glob = M.frozen_copy(model)
    with torch.no_grad():                                              # start away from the global model
        for p in model.encoder.parameters():
            p.add_(0.3 * torch.randn_like(p))
    only_mcl = M.FedCSRConfig(dim=8, maxlen=6, dropout=0.0, use_scl=False, lambdas=(0.0, 1.0, 0.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss, parts = M.fedcsr_loss(model, batch, global_model=glob, config=only_mcl)
        loss.backward()
        opt.step()
        first = parts["mcl"].item() if first is None else first
    assert parts["mcl"].item() < first
