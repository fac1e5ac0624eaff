"""CL-DTCDR: InfoNCE, the graph augmentation, the inter-domain positives, the fusion, a short training run."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.data.synthetic import overlapping_domains
from fedlib.baselines.cross_domain import cl_dtcdr as C
from fedlib.baselines.cross_domain.cdr_common import audit_blocks, history_rows, selected_blocks
from fedlib.models.lightgcn import normalized_adjacency


# ----------------------------------------------------------------------------- InfoNCE
def test_info_nce_matches_the_hand_computed_value():
    anchors = torch.eye(2)
    # cos = identity, τ = 1: each row is −log(e / (e + 1)).
    assert C.info_nce(anchors, anchors, 1.0).item() == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)
    # τ = 0.5 doubles the logits.
    assert C.info_nce(anchors, anchors, 0.5).item() == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)


def test_info_nce_is_lower_for_aligned_than_for_shuffled_pairs():
    generator = torch.Generator().manual_seed(0)
    anchors = torch.randn(32, 64, generator=generator)
    aligned = anchors + 0.1 * torch.randn(32, 64, generator=generator)
    shuffled = aligned[torch.roll(torch.arange(32), 1)]
    assert C.info_nce(anchors, aligned, 0.2) < 0.5
    assert C.info_nce(anchors, shuffled, 0.2) > math.log(32)  # worse than a uniform guess


def test_info_nce_does_not_use_a_shared_positive_as_a_negative():
    anchors = torch.tensor([[1.0, 0.0], [0.8, 0.6]])
    positives = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # both anchors point at the same user
    masked = C.info_nce(anchors, positives, 0.2, positive_ids=torch.tensor([7, 7]))
    assert masked.item() == pytest.approx(0.0, abs=1e-6)  # nothing left to contrast against
    assert C.info_nce(anchors, positives, 0.2) > 0.5  # without ids: the duplicate is a negative


# ----------------------------------------------------------------------------- augmentation
def test_drop_edges_keeps_all_edges_at_zero_and_renormalises_what_it_keeps():
    train = Pairs.from_arrays([0, 0, 1, 2, 2, 2], [0, 1, 1, 0, 1, 2], 3)
    full = C.drop_edges(train, 3, 3, 0.0, np.random.default_rng(0))
    assert torch.allclose(full.to_dense(), normalized_adjacency(train, 3, 3).to_dense())
    big = Pairs.from_arrays(np.repeat(np.arange(50), 20), np.tile(np.arange(20), 50), 50)
    half = C.drop_edges(big, 50, 20, 0.5, np.random.default_rng(0))
    assert half.layout == torch.sparse_csr
    kept_edges = half._nnz() // 2
    assert 400 < kept_edges < 600  # about half of the 1000 edges
    # Degrees are those of the kept graph: D^{-1/2} A D^{-1/2} has largest eigenvalue 1.
    assert torch.linalg.eigvalsh(half.to_dense()).max().item() == pytest.approx(1.0, abs=1e-5)


# ----------------------------------------------------------------------------- positives
def test_inter_domain_positives_overlap_users_are_their_own_and_others_their_nearest():
    own = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.2, 0.9]])
    other = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.7, 0.7]])
    via_overlap = C.inter_domain_positives(own, other, 2, "overlap_neighbour")
    assert via_overlap.tolist() == [0, 1, 0, 1]
    nearest = C.inter_domain_positives(own, other, 2, "nearest", chunk_size=1)
    assert nearest.tolist() == [0, 1, 1, 0]  # user 2 is closest to other-domain user 1, user 3 to user 0
    with pytest.raises(ValueError, match="at least one overlapping user"):
        C.inter_domain_positives(own, other, 0, "overlap_neighbour")


# ----------------------------------------------------------------------------- model
SMALL = overlapping_domains(num_users=80, items_per_domain=100, overlap=0.5, seed=1, num_negatives=30)


def test_fusion_mixes_only_the_overlapping_users():
    model = C.CLDTCDRModel(SMALL, C.CLDTCDRConfig(dim=8), torch.Generator().manual_seed(0))
    n_o = SMALL.num_overlap_users
    own, other = model.propagate(0)[0], model.propagate(1)[0]
    fused = model.fused_users(own, other, 0)
    assert torch.allclose(fused[:n_o], 0.5 * (own[:n_o] + other[:n_o]))  # σ(0) = ½ at start
    assert torch.equal(fused[n_o:], own[n_o:])
    off = C.CLDTCDRModel(SMALL, C.CLDTCDRConfig(dim=8, fuse_overlap=False), torch.Generator().manual_seed(0))
    assert torch.equal(off.fused_users(own, other, 0), own)


def test_config_rejects_bad_values():
    for bad, pattern in ((dict(edge_drop=1.0), "edge_drop"), (dict(inter_tau=0.0), "inter_tau"),
                         (dict(intra_weight=-1.0), "intra_weight"), (dict(inter_positive="same"), "inter_positive"),
                         (dict(batch_size=0), "batch_size")):
        with pytest.raises(ValueError, match=pattern):
            C.CLDTCDRConfig(**bad)
    three = overlapping_domains(domains=("A", "B", "C"), num_users=60, items_per_domain=100, num_negatives=30)
    with pytest.raises(ValueError, match="exactly 2 domains"):
        C.CLDTCDRModel(three, C.CLDTCDRConfig(), torch.Generator().manual_seed(0))


def test_inter_domain_cl_aligns_the_overlapping_users_two_embeddings():
    torch.set_num_threads(1)

    def alignment(inter_weight):
        config = C.CLDTCDRConfig(dim=16, epochs=2, lr=5e-3, intra_weight=0.0, inter_weight=inter_weight, seed=0)
        model = C.train_cl_dtcdr(SMALL, config).artifacts["models"]["A"]
        with torch.no_grad():
            a, b = model.propagate(0)[0], model.propagate(1)[0]
        n_o = SMALL.num_overlap_users
        return torch.cosine_similarity(a[:n_o], b[:n_o], dim=-1).mean().item()

    assert alignment(1.0) > alignment(0.0) + 0.3


# ----------------------------------------------------------------------------- training
def test_training_beats_random_ranking_and_is_deterministic():
    torch.set_num_threads(1)
    split = overlapping_domains(num_users=300, items_per_domain=150, overlap=0.5, seed=0)
    config = C.CLDTCDRConfig(dim=32, lr=5e-3, epochs=4, patience=4)
    rows = []
    result = C.train_cl_dtcdr(split, config, progress=lambda epoch, row: rows.append(row))
    history = history_rows(result)
    assert rows == history and len(history) == 4
    best_valid = max(row["valid/HR@10"] for row in history)
    assert best_valid > 0.2, best_valid  # random ranking of 1 + 99 candidates: 0.1
    assert all(row["loss_intra"] > 0 and row["loss_inter"] > 0 for row in history)
    assert set(result.artifacts["inter_positives"]) == {"A", "B"}
    short = C.CLDTCDRConfig(dim=32, lr=5e-3, epochs=1)
    first, second = C.train_cl_dtcdr(split, short), C.train_cl_dtcdr(split, short)
    assert history_rows(first)[0]["loss"] == history_rows(second)[0]["loss"]
    assert selected_blocks(first) == selected_blocks(second)


class _Killed(RuntimeError):
    pass


def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    """CL-DTCDR's state (cdr_common.JointModelState plus the last epoch's inter-domain positives):
    the model, Adam, the epoch generator (batches, negatives, edge dropout) and the positives are
    in the checkpoint; killed in epoch 3 and resumed = uninterrupted. NMCDR and GA hold the same
    JointModelState without extra fields (GA's resume is tested in test_ga_cdr.py)."""
    from fedlib.engine import Checkpointer

    torch.set_num_threads(1)
    config = C.CLDTCDRConfig(dim=8, lr=5e-3, epochs=4, patience=4, seed=2)
    full = C.train_cl_dtcdr(SMALL, config)

    def kill_in_epoch_3(run, record):
        if run.round_index == 3:
            raise _Killed

    with pytest.raises(_Killed):
        C.train_cl_dtcdr(SMALL, config, checkpointer=Checkpointer(tmp_path, every=1), on_round_end=kill_in_epoch_3)
    checkpointer = Checkpointer(tmp_path, every=1)
    resumed = C.train_cl_dtcdr(SMALL, config, checkpointer=checkpointer)
    assert checkpointer.resumed_at == [2]
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert strip(resumed) == strip(full)
    assert (selected_blocks(resumed), audit_blocks(resumed), resumed.artifacts["scalars"]) == \
        (selected_blocks(full), audit_blocks(full), full.artifacts["scalars"])
    for key, value in full.artifacts["models"]["A"].state_dict().items():
        assert torch.equal(value, resumed.artifacts["models"]["A"].state_dict()[key]), key
    for name in SMALL.domains:
        assert torch.equal(full.artifacts["inter_positives"][name], resumed.artifacts["inter_positives"][name])
