"""FedCSR's training step against the implementation it replaced (issue 43: cheaper steps, same numbers).

The fast step (compacted attention rows, the item tables read once for the batch and its augmented
view) must give the loss, every parameter's gradient and the random generators' states of the
previous implementation, which is kept here verbatim as the reference (``*_before``), in float64
with dropout on, sampled negatives and both contrastive losses.
"""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.baselines.sequential import sequences as S
from fedlib.data.synthetic import cross_domain_sequences
from fedlib.models.dropout import dropout as drop_out
from fedlib.papers.fedcsr import model as M

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- the previous implementation
def _attention_before(enc: S.CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """CausalSelfAttention.forward before issue 43: attention on the (B, L) layout, padding included."""
    B, L, n = x.shape
    heads, head_dim = enc.num_heads, n // enc.num_heads
    token = (positions > 0).reshape(-1).nonzero().squeeze(1)
    h = enc.drop(x.reshape(B * L, n)[token] + enc.pos(positions.reshape(-1)[token]))
    blocked = ~enc._allowed(positions).unsqueeze(1)
    for norm, attn, fnorm, ffn in zip(enc.attn_norm, enc.attn, enc.ffn_norm, enc.ffn):
        q = norm(h)
        w, b = attn.in_proj_weight, attn.in_proj_bias
        qkv = torch.cat([F.linear(q, w[:n], b[:n]), F.linear(h, w[n:], b[n:])], dim=1)
        padded = qkv.new_zeros(B * L, 3 * n).index_copy(0, token, qkv)
        qp, kp, vp = padded.view(B, L, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = (qp @ kp.transpose(-1, -2)) / math.sqrt(head_dim)
        weights = drop_out(torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1),
                           attn.dropout, enc.training)
        mixed = (weights @ vp).transpose(1, 2).reshape(B * L, n)[token]
        a = F.linear(mixed, attn.out_proj.weight, attn.out_proj.bias)
        h = fnorm(q + a)
        h = h + ffn(h)
    out = enc.last_norm(h)
    return out.new_zeros(B * L, n).index_copy(0, token, out).view(B, L, n)


def _encoder_before(encoder: S.GAEncoder, inputs: S.SequenceInputs):
    """GAEncoder.forward before issue 43: each table read by its own call."""
    na, nb = encoder.num_items_a, encoder.num_items_b
    ids_a = inputs.single_a.clamp(max=na)
    ids_b = (inputs.single_b - na).clamp(min=0, max=nb)
    h_cross = _attention_before(encoder.enc_cross, encoder._features(encoder.emb_cross, encoder.graphs.cross,
                                                                     inputs.cross), inputs.pos_cross)
    h_a = _attention_before(encoder.enc_a, encoder._features(encoder.emb_a, encoder.graphs.a, ids_a), inputs.pos_a)
    h_b = _attention_before(encoder.enc_b, encoder._features(encoder.emb_b, encoder.graphs.b, ids_b), inputs.pos_b)
    return h_cross, h_a, h_b


def _represent_before(model: M.FedCSRModel, inputs: S.SequenceInputs):
    h_cross, h_a, h_b = _encoder_before(model.encoder, inputs)
    return (h_cross, h_a, h_b, *M.sequence_representations(h_cross, h_a, h_b, inputs.pos_cross))


def _fedcsr_loss_before(model, batch, *, global_model, rng):
    """fedcsr_loss before issue 43 (the batch and the augmented view encoded by separate calls)."""
    cfg = model.config
    h_cross, h_a, h_b, r_a, r_b = _represent_before(model, batch.inputs)
    negatives = S.draw_negatives(model.num_items_a, model.num_items_b, cfg.sampled_negatives, rng, h_cross.device)
    terms = S.prediction_loss((model.head_a, model.head_b), h_cross, h_a, h_b, batch,
                              use_unified=cfg.use_unified, use_single=cfg.use_single, negatives=negatives)
    parts = {"pre": sum(terms.values())}
    parts.update({f"ce_{k}": v for k, v in terms.items()})
    lam_pre, lam_mcl, lam_scl = cfg.lambdas
    total = lam_pre * parts["pre"]
    if cfg.use_mcl:
        with torch.no_grad():
            *_, g_a, g_b = _represent_before(global_model, batch.inputs)
        z_l = [model.projector(r_a), model.projector(r_b)]
        z_g = [model.projector(g_a), model.projector(g_b)]
        parts["mcl"] = M.mcl_loss(z_l, z_g, cfg.tau)
        total = total + lam_mcl * parts["mcl"]
    if cfg.use_scl:
        augmented = M.augment_inputs(batch.inputs, model.num_items_a, model.num_items_b, cfg.alpha, rng)
        *_, ra_aug, rb_aug = _represent_before(model, augmented)
        scl = r_a.new_zeros(())
        for d, (r, r_aug) in enumerate(((r_a, ra_aug), (r_b, rb_aug))):
            p, p_aug = model.transform(r), model.transform(r_aug)
            q, q_aug = model.matchers[d](p), model.matchers[d](p_aug)
            scl = scl + M.scl_loss(q, p_aug, q_aug, p)
        parts["scl"] = scl
        total = total + lam_scl * scl
    return total, parts


# ----------------------------------------------------------------------------- the comparison
def _problem(num_heads=1, **flags):
    """A small float64 FedCSR model in train mode (dropout 0.3), its frozen global twin and one batch
    whose windows (maxlen 10) hold 2-9 real items, so rows differ in length and in domain mix."""
    split = cross_domain_sequences(num_users=60, items_a=23, items_b=19, topics=4, min_len=3, max_len=10,
                                   num_negatives=5, seed=3)
    na, nb = split.num_items_a, split.num_items_b
    cfg = M.FedCSRConfig(dim=12, maxlen=10, num_heads=num_heads, dropout=0.3, sampled_negatives=9, **flags)
    torch.manual_seed(1)
    model = M.FedCSRModel(na, nb, cfg, S.transition_graphs(split.train, na, nb)).double().train()
    with torch.no_grad():                                   # a global model that differs from the local one
        twin = M.FedCSRModel(na, nb, cfg, model.encoder.graphs).double()
        twin.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()})
    batch = S.make_batch(split.train, na, nb, cfg.maxlen, rows=np.arange(24))
    counts = (batch.inputs.pos_cross > 0).sum(1)
    assert counts.min() < counts.max() < cfg.maxlen         # compaction has rows of several widths below L
    return model, M.frozen_copy(twin), batch


def _step(loss_fn, model, target, batch, seed):
    """Loss, parts, parameter gradients and the generators' states after one loss + backward."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.zero_grad(set_to_none=True)
    total, parts = loss_fn(model, batch, global_model=target, rng=rng)
    total.backward()
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}  # None: unused
    return total.detach(), {k: v.detach() for k, v in parts.items()}, grads, torch.get_rng_state(), \
        rng.bit_generator.state


@pytest.mark.parametrize("num_heads, flags", [(1, {}), (2, {}), (1, {"use_scl": False}), (2, {"use_mcl": False})])
def test_fast_step_equals_the_previous_implementation_in_float64(num_heads, flags):
    model, target, batch = _problem(num_heads, **flags)
    for seed in (0, 1):
        new = _step(M.fedcsr_loss, model, target, batch, seed)
        old = _step(_fedcsr_loss_before, model, target, batch, seed)
        torch.testing.assert_close(new[0], old[0], rtol=0, atol=1e-6)
        assert new[1].keys() == old[1].keys()
        for key in old[1]:
            torch.testing.assert_close(new[1][key], old[1][key], rtol=0, atol=1e-6, msg=key)
        assert new[2].keys() == old[2].keys()
        for name in old[2]:
            if old[2][name] is None:                       # the ablated loss's modules get no gradient
                assert new[2][name] is None, name
            else:
                torch.testing.assert_close(new[2][name], old[2][name], rtol=0, atol=1e-6, msg=name)
        assert torch.equal(new[3], old[3]), "the dropout masks drew a different torch stream"
        assert new[4] == old[4], "the negatives / augmentation drew a different numpy stream"
    # dropout is on and acts: two seeds give different losses
    assert not torch.allclose(_step(M.fedcsr_loss, model, target, batch, 0)[0],
                              _step(M.fedcsr_loss, model, target, batch, 1)[0])


def test_compacted_attention_equals_the_padded_layout_with_dropout():
    """CausalSelfAttention.forward (attention on each row's real tokens) = the (B, L) layout it replaced,
    in train mode (the attention dropout mask read at the compacted pairs); rows with no real token,
    scattered single-domain positions and a full row included."""
    torch.manual_seed(0)
    enc = S.CausalSelfAttention(8, 6, 2, 2, 0.3).double().train()
    positions = torch.tensor([[0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6],
                              [0, 1, 0, 2, 0, 3], [0, 0, 0, 0, 0, 1]])
    x = torch.randn(5, 6, 8, dtype=torch.float64, requires_grad=True)
    params = [x] + list(enc.parameters())
    outputs, grads = [], []
    for forward in (enc.forward, lambda x, p: _attention_before(enc, x, p)):
        torch.manual_seed(7)
        out = forward(x, positions)
        outputs.append(out)
        grads.append(torch.autograd.grad((out ** 2).sum(), params))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-12)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_a_step_reads_each_item_table_once_for_the_batch_and_its_augmented_view():
    model, target, batch = _problem()
    total, _ = M.fedcsr_loss(model, batch, global_model=target, rng=np.random.default_rng(0))
    encoder = model.encoder
    from test_fedcsr import _reads_of
    for table in (encoder.emb_cross.weight, encoder.emb_a.weight, encoder.emb_b.weight):
        assert _reads_of(total, table) == 1
    before, _ = _fedcsr_loss_before(model, batch, global_model=target, rng=np.random.default_rng(0))
    assert _reads_of(before, encoder.emb_cross.weight) == 2


def test_kept_table_gradients_give_the_adam_steps_of_fresh_gradients():
    """The training loop's KeptTableGradients (dense table gradients kept between steps, filled by
    sparse reads) takes the same Adam steps as zero_grad(set_to_none=True) with dense reads, in
    float64, including a step whose batch has no domain-B target (head_b unread: Adam skips it)."""
    from fedlib.engine.optim import adam
    from fedlib.papers.fedcsr.training import KeptTableGradients

    model, target, batch = _problem()
    reference = copy.deepcopy(model)
    na, nb = model.num_items_a, model.num_items_b
    only_a = S.make_batch([[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]], na, nb, model.config.maxlen)
    assert not only_a.next_b_mask.any() and not only_a.unified_b_mask.any()
    opt_kept, opt_ref = (adam(m.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.0) for m in (model, reference))
    with KeptTableGradients(model) as tables:
        assert model.encoder.sparse_table_grads
        for step, (seed, b) in enumerate(((0, batch), (1, only_a), (2, batch))):
            torch.manual_seed(seed)
            loss, _ = M.fedcsr_loss(model, b, global_model=target, rng=np.random.default_rng(seed))
            tables.zero_grad(opt_kept)
            loss.backward()
            tables.before_step()
            torch.manual_seed(seed)
            loss_ref, _ = M.fedcsr_loss(reference, b, global_model=target, rng=np.random.default_rng(seed))
            opt_ref.zero_grad(set_to_none=True)
            loss_ref.backward()
            torch.testing.assert_close(loss, loss_ref, rtol=0, atol=1e-12)
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert (p.grad is None) == (q.grad is None), (step, name)
                if p.grad is not None:
                    assert p.grad.layout == torch.strided, name           # Adam gets a dense gradient
                    torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12, msg=f"step {step}: {name}")
            assert (model.head_b.weight.grad is None) == (b is only_a)
            opt_kept.step()
            opt_ref.step()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p, q, rtol=0, atol=1e-10, msg=f"step {step}: {name}")
    assert not model.encoder.sparse_table_grads and model.encoder.emb_cross.weight.grad is None


# ----------------------------------------------------------------------------- the local epochs
def _local_epochs_before(model, optimizer, split, rows, target, tc, rng, device):
    """training._local_epochs before issue 43's second round: the frozen target re-encodes every batch
    of every epoch, and every gradient is fresh (dense reads, zero_grad(set_to_none=True))."""
    model.train()
    total, parts_sum, steps = 0.0, {}, 0
    for _ in range(tc.local_epochs):
        order = rows[rng.permutation(rows.size)]
        for start in range(0, order.size, tc.batch_size):
            batch = S.make_batch(split.train, split.num_items_a, split.num_items_b, model.config.maxlen,
                                 rows=order[start:start + tc.batch_size]).to(device)
            loss, parts = M.fedcsr_loss(model, batch, global_model=target, rng=rng)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            for key, value in parts.items():
                parts_sum[key] = parts_sum.get(key, 0.0) + float(value.detach())
            steps += 1
    steps_div = max(steps, 1)
    return total / steps_div, {k: v / steps_div for k, v in parts_sum.items()}, steps


@pytest.mark.parametrize("flags", [{}, {"use_mcl": False}])
def test_local_epochs_equal_the_previous_loop_in_float64(flags):
    """_local_epochs (the target's representations computed once per row, the tables' gradient rows
    zeroed where the last step wrote them) = the loop it replaced, over three epochs of five
    batches in float64 with dropout on: losses, parts, every parameter after the last Adam step, the
    generators' states. The target is encoded once per row (the first epoch's batches), not per step."""
    from fedlib.engine.optim import adam
    from fedlib.papers.fedcsr import training as T

    model, target, _ = _problem(**flags)
    split = cross_domain_sequences(num_users=60, items_a=23, items_b=19, topics=4, min_len=3, max_len=10,
                                   num_negatives=5, seed=3)
    rows = np.arange(len(split.train))[np.arange(len(split.train)) % 6 != 1][:40]  # 40 rows, not a prefix
    tc = T.FedCSRTrainConfig(local_epochs=3, batch_size=9, lr=1e-2)        # 5 batches per epoch, the last short
    reference = copy.deepcopy(model)
    represent_calls = []
    counting = copy.deepcopy(target)
    counting.represent = lambda inputs: represent_calls.append(inputs.cross.shape[0]) or target.represent(inputs)
    results = []
    for net, loop, tgt in ((model, T._local_epochs, counting), (reference, _local_epochs_before, target)):
        opt = adam(net.parameters(), lr=tc.lr, betas=tuple(tc.betas))
        torch.manual_seed(5)
        rng = np.random.default_rng(5)
        out = loop(net, opt, split, rows, tgt if net.config.use_mcl else None, tc, rng, torch.device("cpu"))
        results.append((out, torch.get_rng_state(), rng.bit_generator.state))
    (new, new_torch, new_np), (old, old_torch, old_np) = results
    assert new[2] == old[2] == 15
    assert abs(new[0] - old[0]) < 1e-6
    assert new[1].keys() == old[1].keys()
    for key in old[1]:
        assert abs(new[1][key] - old[1][key]) < 1e-6, key
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    assert torch.equal(new_torch, old_torch) and new_np == old_np
    if model.config.use_mcl:
        assert sum(represent_calls) == rows.size and len(represent_calls) == 5   # the first epoch's batches only
    else:
        assert represent_calls == []
