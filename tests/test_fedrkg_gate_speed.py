"""FedRKG's gate training on FedMF's linear head: the unpadded closed-form path equals the autograd one.

``train_gates`` evaluates the gradients of Eqs. 6–8 in closed form on the real examples only
(no padding, no autograd) and :class:`KnowledgeGuidance` trains the clients in chunks of
similar example counts. These tests hold it to the padded autograd implementation it
replaces (kept below as ``_train_gates_autograd``) and to the per-user reference
``train_gates_sequential``, on cases built to stress what the rewrite touches: skewed
example counts, an item repeated inside one batch (its table-gradient rows add up before the
clip takes the norm), holes in the mask, batches with gaps, active and inactive clipping,
early exits triggered and not.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedlib.engine.knowledge import global_knowledge
from fedlib.papers.fedrkg import gates as G
from fedlib.papers.fedrkg.gates import GateExamples, fused_logits, train_gates, train_gates_sequential
from fedlib.papers.fedrkg.guidance import adaptive_guidance
from fedlib.papers.fedrkg.method import GATE_BIAS_KEY, GATE_WEIGHT_KEY, LOG_KEY, KnowledgeGuidance

torch.set_num_threads(1)  # other experiments share this machine

F64, F32 = torch.float64, torch.float32


# -- the previous implementation: padded (C, B) matrices, gradients by autograd ---------------------
def _train_gates_autograd(personal_tables, global_table, head_w, head_b, gate_weight, gate_bias, users, items,
                          labels, mask, *, beta, lr=1e-4, epochs=5, steps=None, clip_norm=None, tol=None):
    users, beta, lr, epochs = G._check_training_inputs(personal_tables, global_table, head_w, head_b, gate_weight,
                                                       gate_bias, users, items, labels, mask, steps, beta, lr,
                                                       epochs, clip_norm, tol)
    device, dtype = personal_tables.device, personal_tables.dtype
    users = users.to(device)
    num_clients = items.shape[0]
    num_items, dim = global_table.shape
    items = items.to(device)
    mask = mask.to(device=device, dtype=dtype)
    labels = labels.to(device=device, dtype=dtype)
    steps = torch.zeros_like(items) if steps is None else steps.to(device)
    with torch.no_grad():
        rows = personal_tables[users[:, None], items]  # (C, B, d)
        global_rows = global_table[items]  # (C, B, d)
    head_w_c, head_b_c = head_w[users].detach(), head_b[users].detach()
    weight = gate_weight[users].detach().clone()
    bias = gate_bias[users].detach().clone()
    keys, key_index = torch.unique(torch.arange(num_clients, device=device)[:, None] * num_items + items,
                                   return_inverse=True)
    key_client = keys // num_items

    def batch_gradients(weight, bias, in_batch, count):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (weight, bias, rows, head_w_c, head_b_c)]
            logits = fused_logits(leaves[2], global_rows, leaves[3], leaves[4], leaves[0], leaves[1], beta)
            per_example = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
            client_loss = (per_example * in_batch).sum(1) / count.clamp(min=1.0)
            wrt = leaves if clip_norm is not None else leaves[:2]
            grads = torch.autograd.grad(client_loss.sum(), wrt)
        grad_w, grad_b = grads[0], grads[1]
        if clip_norm is not None:
            row_grad = torch.zeros(keys.numel(), dim, dtype=dtype, device=device)
            row_grad.index_add_(0, key_index.reshape(-1), grads[2].reshape(-1, dim))
            squared = torch.zeros(num_clients, dtype=dtype, device=device)
            squared.index_add_(0, key_client, row_grad.pow(2).sum(1))
            squared = squared + grad_w.pow(2).sum(1) + grad_b.pow(2) + grads[3].pow(2).sum(1) + grads[4].pow(2)
            factor = (float(clip_norm) / (squared.sqrt() + G._CLIP_EPS)).clamp(max=1.0)
            grad_w, grad_b = grad_w * factor[:, None], grad_b * factor
        return client_loss, grad_w, grad_b

    return G._nested_gate_sgd(weight, bias, mask, steps, lr, epochs, tol, batch_gradients)


# -- cases ------------------------------------------------------------------------------------------
COUNTS = (41, 0, 1, 3, 2, 17, 5, 1, 9)  # examples per client: skewed, one client without any


def _case(seed=0, dtype=F64, num_users=12, num_items=6, dim=4, batch=5, counts=COUNTS, holes=True, gaps=True):
    """Random state and padded examples of ``len(counts)`` clients (shuffled user ids).

    With ``num_items`` small against ``batch`` items repeat inside batches. ``holes``: the
    real examples sit at random columns (padding in between); ``gaps``: a few clients skip a
    batch index. Padding slots hold random items, labels and steps, which must be ignored.
    """
    g = torch.Generator().manual_seed(seed)
    tables = torch.randn(num_users, num_items, dim, generator=g, dtype=dtype)
    p_g = torch.randn(num_items, dim, generator=g, dtype=dtype)
    head_w = torch.randn(num_users, dim, generator=g, dtype=dtype)
    head_b = torch.randn(num_users, generator=g, dtype=dtype)
    gate_w = 0.5 * torch.randn(num_users, 3 * dim, generator=g, dtype=dtype)
    gate_b = 0.5 * torch.randn(num_users, generator=g, dtype=dtype)
    num_clients = len(counts)
    width = max(counts) + 4
    users = torch.randperm(num_users, generator=g)[:num_clients]
    items = torch.randint(0, num_items, (num_clients, width), generator=g)
    labels = (torch.rand(num_clients, width, generator=g) < 0.3).to(dtype)
    steps = torch.randint(0, 9, (num_clients, width), generator=g)  # garbage on padding
    mask = torch.zeros(num_clients, width, dtype=dtype)
    for c, count in enumerate(counts):
        columns = torch.randperm(width, generator=g)[:count].sort().values if holes else torch.arange(count)
        mask[c, columns] = 1.0
        batches = torch.arange(count) // batch
        if gaps and c % 3 == 0:
            batches = batches + (batches >= 1).long()  # batch 1 left empty
        steps[c, columns] = batches
    state = (tables, p_g, head_w, head_b, gate_w, gate_b)
    return state, (users, items, labels, mask, steps)


def _has_repeat_in_a_batch(items, mask, steps):
    for c in range(items.shape[0]):
        real = mask[c] > 0
        for step in steps[c][real].unique().tolist():
            batch_items = items[c][real & (steps[c] == step)]
            if batch_items.unique().numel() < batch_items.numel():
                return True
    return False


def _run(fn, state, examples, **kwargs):
    users, items, labels, mask, steps = examples
    return fn(*state, users, items, labels, mask, steps=steps, **kwargs)


def _assert_same(got, want, rtol, what=""):
    """Gates equal up to ``rtol`` relative to each client's gate norm; identical early exits."""
    assert torch.equal(got.epochs_run, want.epochs_run), what
    scale_w = want.weight.norm(dim=1, keepdim=True).clamp(min=1e-30)
    assert float(((got.weight - want.weight).abs() / scale_w).max()) <= rtol, what
    scale_b = want.bias.abs().clamp(min=1e-30)
    assert float(((got.bias - want.bias).abs() / scale_b).max()) <= rtol, what
    assert torch.allclose(got.losses, want.losses, rtol=rtol, atol=0, equal_nan=True), what


# -- the closed-form path equals the autograd path ------------------------------------------------
CASES = {  # clip_norm, tol: clipping active / inactive, early exit triggered / not
    "plain": (None, None),
    "clip_active": (0.05, None),
    "clip_inactive": (1e6, None),
    "clip_and_exit": (0.3, 2e-3),
    "exit_only": (None, 2e-3),
    "exit_never": (0.3, 1e-15),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_closed_form_equals_autograd_and_sequential_float64(case, seed):
    clip_norm, tol = CASES[case]
    state, examples = _case(seed)
    assert _has_repeat_in_a_batch(examples[1], examples[3], examples[4])
    kwargs = dict(beta=0.7, lr=0.5, epochs=5, clip_norm=clip_norm, tol=tol)
    fast = _run(train_gates, state, examples, **kwargs)
    autograd = _run(_train_gates_autograd, state, examples, **kwargs)
    sequential = _run(train_gates_sequential, state, examples, **kwargs)
    _assert_same(fast, autograd, 1e-10, case)
    _assert_same(fast, sequential, 1e-10, case)
    users = examples[0]
    moved = COUNTS.index(0)
    assert torch.equal(fast.weight[moved], state[4][users[moved]]) and int(fast.epochs_run[moved]) == 0
    others = [c for c, count in enumerate(COUNTS) if count]
    assert not torch.allclose(fast.weight[others], state[4][users[others]])  # the gates moved
    if case == "clip_inactive":  # the norm is computed but never reaches the bound: plain SGD
        plain = _run(train_gates, state, examples, **{**kwargs, "clip_norm": None})
        _assert_same(fast, plain, 1e-12, case)
    elif clip_norm is not None:  # the clip shrank some steps, so it was compared too
        plain = _run(train_gates, state, examples, **{**kwargs, "clip_norm": None})
        assert not torch.allclose(plain.weight, fast.weight, rtol=0, atol=1e-6)
    ran = fast.epochs_run[fast.epochs_run > 0]
    if case in ("clip_and_exit", "exit_only"):  # someone stopped early, someone did not
        assert int(ran.min()) < 5 and int(ran.max()) == 5
    else:
        assert bool((ran == 5).all())


def test_repeated_item_rows_add_up_before_the_norm():
    """One client, one batch, a single item read twice: the clip sees ‖2 ∇row‖, not √2 ‖∇row‖."""
    state, _ = _case(3, num_users=2, num_items=3)
    users = torch.tensor([1])
    items = torch.tensor([[2, 2, 0]])
    labels = torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)
    mask = torch.ones(1, 3, dtype=F64)
    kwargs = dict(beta=0.6, lr=0.5, epochs=1, clip_norm=0.05)
    fast = train_gates(*state, users, items, labels, mask, **kwargs)
    for reference in (_train_gates_autograd, train_gates_sequential):
        want = reference(*state, users, items, labels, mask, **kwargs)
        _assert_same(fast, want, 1e-12)
    # Guard: had the repeated rows been normed separately, the step would differ.
    split = train_gates(*state, users, torch.tensor([[2, 1, 0]]), labels, mask, **kwargs)
    assert not torch.allclose(split.weight, fast.weight, rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", ["plain", "clip_and_exit", "exit_never"])
def test_closed_form_equals_autograd_float32(case):
    clip_norm, tol = CASES[case]
    state, examples = _case(5, dtype=F32)
    kwargs = dict(beta=0.7, lr=0.5, epochs=5, clip_norm=clip_norm, tol=tol)
    fast = _run(train_gates, state, examples, **kwargs)
    autograd = _run(_train_gates_autograd, state, examples, **kwargs)
    _assert_same(fast, autograd, 1e-6, case)


def test_code_settings_float32():
    """β = 0.99, lr 1e-4, clip 1, tol 1e-4 (the code's), zero-initialised gates: same gates and exits."""
    state, examples = _case(7, dtype=F32, num_users=40, num_items=30, dim=8, batch=16,
                            counts=(300, 12, 40, 0, 80, 7, 160, 33, 1, 64))
    tables, p_g, head_w, head_b, gate_w, gate_b = state
    state = (tables, p_g, head_w, head_b, torch.zeros_like(gate_w), torch.zeros_like(gate_b))
    kwargs = dict(beta=0.99, lr=1e-4, epochs=5, clip_norm=1.0, tol=1e-4)
    fast = _run(train_gates, state, examples, **kwargs)
    autograd = _run(_train_gates_autograd, state, examples, **kwargs)
    _assert_same(fast, autograd, 1e-6)
    assert int(fast.epochs_run.max()) < 5  # the early exit fired


def test_no_example_no_epoch_and_inputs_untouched():
    state, examples = _case(2)
    before = [t.clone() for t in state]
    users, items, labels, mask, steps = examples
    empty = train_gates(*state, users, items, labels, torch.zeros_like(mask), steps=steps, beta=0.5, lr=0.5,
                        clip_norm=0.1, tol=1e-3)
    assert torch.equal(empty.weight, state[4][users]) and torch.equal(empty.bias, state[5][users])
    assert bool(empty.losses.isnan().all()) and int(empty.epochs_run.sum()) == 0
    zero_epochs = train_gates(*state, users, items, labels, mask, steps=steps, beta=0.5, epochs=0)
    assert zero_epochs.losses.shape == (len(COUNTS), 0) and torch.equal(zero_epochs.weight, state[4][users])
    for old, new in zip(before, state):
        assert torch.equal(old, new)


# -- chunks of similar example counts: results go back to the right users --------------------------
def _gate_examples(examples):
    users, items, labels, mask, steps = examples
    return GateExamples(users, items, labels, mask, steps)


def test_buckets_cover_every_client_once_in_order_of_counts():
    _, examples = _case(0)
    gate_examples = _gate_examples(examples)
    buckets = G._buckets_by_count(gate_examples, 4)
    positions = torch.cat([p for p, _ in buckets])
    assert sorted(positions.tolist()) == list(range(len(COUNTS)))
    counts = torch.tensor(COUNTS)[positions]
    assert bool((counts[1:] >= counts[:-1]).all())
    for index, part in buckets:
        assert torch.equal(part.users, gate_examples.users[index])
        width = part.items.shape[1]
        assert torch.equal(part.mask, gate_examples.mask[index][:, :width])
        assert not bool((gate_examples.mask[index][:, width:] > 0).any())  # only padding was cut
        assert width <= gate_examples.items.shape[1]
    assert buckets[0][1].items.shape[1] < gate_examples.items.shape[1]  # the small clients are padded less


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 100])
def test_bucketed_training_returns_results_in_the_original_order(chunk_size):
    state, examples = _case(1)
    kwargs = dict(beta=0.7, lr=0.5, epochs=5, clip_norm=0.3, tol=2e-3)
    whole = _run(train_gates, state, examples, **kwargs)
    bucketed = G._train_gates_bucketed(*state, _gate_examples(examples), chunk_size, **kwargs)
    _assert_same(bucketed, whole, 1e-12)
    for c in range(len(COUNTS)):  # client by client, alone
        one = [t[c:c + 1] for t in examples]
        alone = train_gates(*state, *one[:4], steps=one[4], **kwargs)
        _assert_same(GateTrainingRow(bucketed, c), alone, 1e-12)


def GateTrainingRow(result, c):  # noqa: N802  (one client of a GateTraining)
    return G.GateTraining(result.weight[c:c + 1], result.bias[c:c + 1], result.losses[c:c + 1],
                          result.epochs_run[c:c + 1])


@pytest.mark.parametrize("chunk_size", [2, 256])
def test_guide_stores_each_users_trained_gate(chunk_size):
    state, examples = _case(4)
    tables, p_g, head_w, head_b, gate_w, gate_b = state
    num_users = tables.shape[0]
    guidance = KnowledgeGuidance(beta=0.7, interval=1, mode="adaptive", gate_lr=0.5, gate_epochs=5,
                                 gate_clip_norm=0.3, gate_tol=2e-3, chunk_size=chunk_size)
    private = {"personal_item_emb": tables.clone(), "head_w": head_w.clone(), "head_b": head_b.clone()}
    extra = {GATE_WEIGHT_KEY: gate_w.clone(), GATE_BIAS_KEY: gate_b.clone()}
    participants = [0, 3, 5, 6]
    record = guidance.guide(private, extra, participants, _gate_examples(examples), round_index=3)
    p_g = global_knowledge(tables, participants)
    want = _run(_train_gates_autograd, (tables, p_g, head_w, head_b, gate_w, gate_b), examples, beta=0.7, lr=0.5,
                epochs=5, clip_norm=0.3, tol=2e-3)
    users = examples[0]
    torch.testing.assert_close(extra[GATE_WEIGHT_KEY][users], want.weight, rtol=0, atol=1e-12)
    torch.testing.assert_close(extra[GATE_BIAS_KEY][users], want.bias, rtol=0, atol=1e-12)
    untouched = torch.ones(num_users, dtype=torch.bool)
    untouched[users] = False  # users without examples keep their gate
    assert torch.equal(extra[GATE_WEIGHT_KEY][untouched], gate_w[untouched])
    ran = want.epochs_run > 0
    last = want.losses[ran].gather(1, (want.epochs_run[ran] - 1)[:, None])[:, 0]
    assert record["gate_loss_first_epoch"] == pytest.approx(float(want.losses[ran, 0].mean()), rel=1e-12)
    assert record["gate_loss_last_epoch"] == pytest.approx(float(last.mean()), rel=1e-12)
    assert extra[LOG_KEY][-1] is record
    committed = adaptive_guidance(tables, p_g, extra[GATE_WEIGHT_KEY], extra[GATE_BIAS_KEY], 0.7)
    torch.testing.assert_close(private["personal_item_emb"], committed, rtol=0, atol=1e-12)
