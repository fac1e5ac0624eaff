"""RLP2 (ReLoop2 error memory + error compensation) as a continual baseline."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import drifting_stream
from fedlib.engine import AveragingState, BatchedExecutor, FederatedConfig, LocalBatch, SequentialExecutor, bce_client_loss
from fedlib.baselines.continual.continual import fedmf_backbone, pfedrec_backbone, run_continual
from fedlib.baselines.continual.rlp2 import (RLP2, ErrorCompensatedModel, ErrorMemory, ErrorMemoryLoss, error_compensation,
                                 hidden_representations)
from fedlib.models import FedMF, FedNCF, PFedRec


def _write(memory, user, items, residuals, keys=None, select=None):
    items = torch.tensor([items])
    residuals = torch.tensor([residuals], dtype=torch.float32)
    if keys is None:  # key = (item, residual): easy to recognise
        keys = torch.stack([items.float(), residuals], dim=-1)
    else:
        keys = torch.tensor([keys], dtype=torch.float32)
    select = torch.ones_like(items, dtype=torch.bool) if select is None else torch.tensor([select])
    memory.write(torch.tensor([user]), items, keys, residuals, select)


def test_memory_write_order_refresh_and_wrap_around():
    memory = ErrorMemory(capacity=3, num_users=2)
    _write(memory, 1, [5, 6], [0.9, -0.8], keys=[[1.0, 0.0], [0.0, 1.0]])
    assert memory.items.tolist() == [[-1, -1, -1], [5, 6, -1]]
    assert memory.filled.tolist() == [[False] * 3, [True, True, False]]
    assert memory.pointer.tolist() == [0, 2]
    assert torch.equal(memory.keys[1, :2], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert torch.allclose(memory.residuals[1], torch.tensor([0.9, -0.8, 0.0]))

    # item 6 is stored: refreshed in place (slot 1); 8, 9, 10 are new: slots 2, 0 (wrap,
    # evicts 5), 1 (the ring reaches the refreshed slot and overwrites it)
    _write(memory, 1, [6, 8, 9, 10], [-0.7, 0.6, -0.6, 0.75])
    assert memory.items[1].tolist() == [9, 10, 8]
    assert torch.allclose(memory.residuals[1], torch.tensor([-0.6, 0.75, 0.6]))
    assert torch.allclose(memory.keys[1], torch.tensor([[9.0, -0.6], [10.0, 0.75], [8.0, 0.6]]))
    assert memory.pointer.tolist() == [0, 2]

    # a refresh alone takes no new slot
    _write(memory, 1, [8], [0.55])
    assert memory.items[1].tolist() == [9, 10, 8] and memory.pointer[1] == 2
    assert math.isclose(float(memory.residuals[1, 2]), 0.55, rel_tol=1e-6)

    # more new entries than slots in one call: the last M survive, as if written one by one
    _write(memory, 0, [1, 2, 3, 4], [0.6, 0.7, 0.8, 0.9])
    assert memory.items[0].tolist() == [4, 2, 3] and memory.pointer[0] == 1
    assert torch.allclose(memory.residuals[0], torch.tensor([0.9, 0.7, 0.8]))

    # duplicates within a call: one slot (first occurrence's place), the last values; unselected skipped
    memory = ErrorMemory(capacity=4, num_users=1)
    _write(memory, 0, [7, 3, 7, 2], [0.6, -0.9, 0.8, 0.7], select=[True, True, True, False])
    assert memory.items[0].tolist() == [7, 3, -1, -1] and memory.pointer[0] == 2
    assert torch.allclose(memory.residuals[0, :2], torch.tensor([0.8, -0.9]))
    assert torch.allclose(memory.keys[0, 0], torch.tensor([7.0, 0.8]))


def test_memory_grows_and_snapshots():
    memory = ErrorMemory(capacity=2, num_users=1)
    memory.grow(3)  # not allocated yet: only the size changes
    _write(memory, 2, [4], [0.9])
    assert memory.keys.shape == (3, 2, 2) and memory.items[2].tolist() == [4, -1]
    snap = memory.snapshot()
    memory.grow(5)
    _write(memory, 4, [1], [-0.9])
    assert memory.filled.shape == (5, 2) and memory.items[4].tolist() == [1, -1]
    memory.load(snap)
    assert memory.filled.shape == (5, 2) and not bool(memory.filled[3:].any())
    assert memory.items[2].tolist() == [4, -1]


def test_hidden_representation_is_the_item_rows_contribution_to_the_logit():
    gen = torch.Generator().manual_seed(0)
    rows = torch.tensor([[0, 2, 2], [1, 3, 0]])  # an item twice: each example keeps its own key
    mf = FedMF(2, 4, dim=3)
    params = {"item_emb": torch.randn(4, 3, generator=gen), "user_emb": torch.randn(2, 3, generator=gen)}
    logits, keys = hidden_representations(mf, params, rows)
    assert torch.allclose(logits, mf.logits(params, rows))
    assert torch.allclose(keys, params["user_emb"][:, None, :] * params["item_emb"][rows])  # GMF p_u ⊙ q_i

    ncf = FedNCF.f3crec_variant(2, 4, dim=3)
    params = {"item_emb": torch.randn(4, 3, generator=gen), "user_emb": torch.randn(2, 3, generator=gen),
              "head_w": torch.randn(2, 6, generator=gen), "head_b": torch.randn(2, generator=gen)}
    _, keys = hidden_representations(ncf, params, rows)
    assert torch.allclose(keys, params["head_w"][:, None, 3:] * params["item_emb"][rows])

    pf = PFedRec(2, 4, dim=3)
    params = {"item_emb": torch.randn(4, 3, generator=gen), "head_w": torch.randn(2, 3, generator=gen),
              "head_b": torch.randn(2, generator=gen)}
    _, keys = hidden_representations(pf, params, rows)
    assert torch.allclose(keys, params["head_w"][:, None, :] * params["item_emb"][rows])


def test_loss_is_the_base_loss_and_writes_only_large_errors():
    model = FedMF(1, 4, dim=2)
    params = {"user_emb": torch.tensor([[1.0, 2.0]]),
              "item_emb": torch.tensor([[3.0, 0.0], [-3.0, 0.0], [0.1, 0.0], [-5.0, 0.0]])}
    # item 0: y=1, σ(3)=0.95 (small error, skipped); item 1: y=1, σ(−3) (written);
    # item 2: y=0, σ(0.1)=0.525 (written); item 3: padding with a huge error (skipped)
    batch = LocalBatch(clients=torch.tensor([0]), rows=torch.tensor([[0, 1, 2, 3]]), items=torch.tensor([[0, 1, 2, 3]]),
                       labels=torch.tensor([[1.0, 1.0, 0.0, 1.0]]), mask=torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    memory = ErrorMemory(capacity=5, num_users=1)
    loss = ErrorMemoryLoss(memory, threshold=0.5)(model, params, batch)
    assert torch.allclose(loss, bce_client_loss(model, params, batch))
    assert memory.items[0].tolist() == [1, 2, -1, -1, -1]
    sig = torch.sigmoid(torch.tensor([-3.0, 0.1]))
    assert torch.allclose(memory.residuals[0, :2], torch.tensor([1.0, 0.0]) - sig)
    assert torch.allclose(memory.keys[0, :2], torch.tensor([[-3.0, 0.0], [0.1, 0.0]]))
    # a stricter threshold writes nothing new
    memory = ErrorMemory(capacity=5, num_users=1)
    ErrorMemoryLoss(memory, threshold=0.96)(model, params, batch)
    assert not memory.allocated or not bool(memory.filled.any())


def test_error_compensation_hand_computed():
    queries = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (1, I=2, d=2)
    keys = torch.tensor([[[2.0, 0.0], [1.0, 1.0], [1.0, 0.0]]])  # third slot empty (must be ignored)
    residuals = torch.tensor([[0.8, -0.4, 100.0]])
    filled = torch.tensor([[True, True, False]])
    e = error_compensation(queries, keys, residuals, filled, top_k=2, temperature=0.5)
    c = 1 / math.sqrt(2)
    w0 = math.exp(1 / 0.5) / (math.exp(1 / 0.5) + math.exp(c / 0.5))  # item 0: cos 1 and 1/√2
    w1 = math.exp(0.0) / (math.exp(0.0) + math.exp(c / 0.5))  # item 1: cos 0 and 1/√2
    expected = torch.tensor([[w0 * 0.8 + (1 - w0) * -0.4, w1 * 0.8 + (1 - w1) * -0.4]])
    assert torch.allclose(e, expected, atol=1e-6)
    e1 = error_compensation(queries, keys, residuals, filled, top_k=1, temperature=0.5)
    assert torch.allclose(e1, torch.tensor([[0.8, -0.4]]))
    # top_k larger than the filled entries: the empty slot still gets no weight
    e3 = error_compensation(queries, keys, residuals, filled, top_k=3, temperature=0.5)
    assert torch.allclose(e3, expected, atol=1e-6)
    # empty memory: no compensation
    assert torch.equal(error_compensation(queries, keys, residuals, torch.zeros_like(filled), 2, 0.5),
                       torch.zeros(1, 2))


def test_compensated_scores_on_a_hand_built_memory():
    model = FedMF(2, 3, dim=2)
    global_state = {"item_emb": torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])}
    private_state = {"user_emb": torch.tensor([[0.5, -1.0], [1.0, 1.0]])}
    memory = ErrorMemory(capacity=2, num_users=2)
    # user 1 remembers: items like (1, 0) were over-predicted by 0.6
    _write(memory, 1, [0], [-0.6], keys=[[3.0, 0.0]])
    wrapped = ErrorCompensatedModel(model, memory, alpha=0.5, top_k=5, temperature=0.1)
    assert wrapped.param_kinds == model.param_kinds and wrapped.num_items == 3 and wrapped.dim == 2
    users = torch.tensor([0, 1])
    scores = wrapped.score_users(global_state, private_state, users)
    plain = torch.sigmoid(model.score_users(global_state, private_state, users))
    assert torch.equal(scores[0], plain[0])  # empty memory: the backbone's probabilities
    # one entry: every query gets its residual (softmax over one neighbour = 1)
    assert torch.allclose(scores[1], plain[1] + 0.5 * -0.6)
    _write(memory, 1, [1], [0.4], keys=[[0.0, 1.0]])  # second entry, orthogonal to the first
    scores = wrapped.score_users(global_state, private_state, users)
    # queries p_1 ⊙ q_i: (2, 0), (0, 1), (1, 1): cosines with the keys (1, 0) / (0, 1)
    w = math.exp(1 / 0.1) / (math.exp(1 / 0.1) + 1.0)
    e = torch.tensor([w * -0.6 + (1 - w) * 0.4, (1 - w) * -0.6 + w * 0.4, 0.5 * -0.6 + 0.5 * 0.4])
    assert torch.allclose(scores[1], plain[1] + 0.5 * e, atol=1e-6)
    assert torch.equal(scores[0], plain[0])
    assert torch.equal(ErrorCompensatedModel(model, memory, alpha=0.0).score_users(global_state, private_state, users),
                       plain)


def test_method_keeps_the_memory_of_the_selected_round():
    method = RLP2(memory_size=2)
    method.memory.grow(1)
    _write(method.memory, 0, [3], [0.9])
    best_g, best_p = {"item_emb": torch.ones(2, 2)}, {"user_emb": torch.ones(1, 2)}
    hook = method._before_round(None)
    hook(SimpleNamespace(best_round=4, best_state=AveragingState(best_g, best_p)), 4, None)  # the run, as the trainer has it
    _write(method.memory, 0, [5], [0.7])  # a later, unselected round
    assert method._snapshot_for({"item_emb": torch.zeros(2, 2)}, best_p) is None
    snap = method._snapshot_for({k: v.clone() for k, v in best_g.items()}, best_p)
    assert snap["items"][0].tolist() == [3, -1]
    method.after_block(None, best_g, best_p)
    assert method.memory.items[0].tolist() == [3, -1]


# -- on the engine ---------------------------------------------------------------------
TINY = FederatedConfig(rounds=2, seed=1, batch_size=32, patience=None)


@pytest.fixture(scope="module")
def tiny_stream():
    return drifting_stream(num_users=24, num_items=40, interactions_per_user=30, seed=3)


@pytest.mark.parametrize("backbone", [fedmf_backbone(dim=4, lr=2.0), pfedrec_backbone(dim=4)], ids=["fedmf", "pfedrec"])
def test_batched_and_sequential_executors_fill_the_same_memory(tiny_stream, backbone):
    runs = {}
    for name, executor in (("sequential", SequentialExecutor()), ("batched", BatchedExecutor(chunk_size=7))):
        method = RLP2(memory_size=6)
        result = run_continual(tiny_stream, backbone, method, TINY, executor=executor, num_blocks=2,
                               accuracy_matrix=False, device="cpu")
        runs[name] = (method.memory, result)
    (m_s, r_s), (m_b, r_b) = runs["sequential"], runs["batched"]
    assert bool(m_s.filled.any())
    assert torch.equal(m_s.items, m_b.items) and torch.equal(m_s.filled, m_b.filled)
    assert torch.equal(m_s.pointer, m_b.pointer)
    assert torch.allclose(m_s.keys, m_b.keys, atol=1e-5) and torch.allclose(m_s.residuals, m_b.residuals, atol=1e-5)
    for a, b in zip(r_s.blocks, r_b.blocks):
        assert a.best_round == b.best_round
        for k in a.test_metrics:
            assert a.test_metrics[k] == pytest.approx(b.test_metrics[k], abs=1e-6)


def test_run_continual_end_to_end_memory_grows_with_new_users(tiny_stream):
    method = RLP2(memory_size=8)
    sizes = []
    result = run_continual(tiny_stream, fedmf_backbone(dim=4, lr=2.0), method, TINY, num_blocks=3, device="cpu",
                           on_block_start=lambda ctx, state: sizes.append(method.memory.num_users))
    assert sizes == [tiny_stream[t].num_users for t in range(3)]
    assert tiny_stream[2].num_users > tiny_stream[0].num_users  # the stream does bring new users
    assert method.memory.filled.shape == (tiny_stream[2].num_users, 8)
    new_users = torch.arange(tiny_stream[0].num_users, tiny_stream[2].num_users)
    assert bool(method.memory.filled[new_users].any())  # new users write their own errors
    assert bool(method.memory.filled[: tiny_stream[0].num_users].any())
    for block in result.blocks:
        assert all(np.isfinite(v) for v in block.test_metrics.values())
    assert np.isfinite(result.accuracy["NDCG@20"][2, :3]).all()
    # compensation changes the block-1 scores (block 0 stays the plain backbone)
    b1 = result.blocks[1].selected_state
    model = fedmf_backbone(dim=4).make_model(tiny_stream[1].num_users, tiny_stream[1].num_items)
    wrapped = ErrorCompensatedModel(model, method.memory)
    users = torch.arange(tiny_stream[1].num_users)
    plain = torch.sigmoid(model.score_users(b1.global_state, b1.private_state, users))
    assert not torch.allclose(wrapped.score_users(b1.global_state, b1.private_state, users), plain)
