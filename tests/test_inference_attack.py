"""Positive-item inference from row uploads (F3CRec §5.6): hand-checked scores, attack strength
without noise, and how Laplace noise weakens it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (BatchedExecutor, ClientRowUpdates, FederatedConfig, UploadNoise, fedmf_method,
                           ParameterAveraging, make_round_plan, round_generator)
from fedlib.audits.inference_attack import (ClientRowGuesses, attack_scores, changed_rows_attack, sign_attack)
from fedlib.models import FedMF

NUM_USERS, NUM_ITEMS, DIM, NEGATIVES = 50, 400, 8, 4


def synthetic_train(seed=0):
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(NUM_USERS):
        n = int(rng.integers(4, 16))
        users += [u] * n
        items += rng.choice(NUM_ITEMS, size=n, replace=False).tolist()
    return Pairs.from_arrays(users, items, NUM_USERS)


TRAIN = synthetic_train()


def round_uploads(noise=None, seed=0, batch_size=4096):
    """Every client's item-row uploads after one FedMF round (one local batch each by default)."""
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), lr=1.0, upload_noise=noise)
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(seed)
    plan = make_round_plan(TRAIN, NegativeSampler(TRAIN, NUM_ITEMS), round_generator(seed, 0),
                           num_negatives=NEGATIVES, batch_size=batch_size)
    weights = method.aggregation.client_weights(plan.num_examples)
    result = BatchedExecutor().local_updates(method, state.global_state, state.private_state, plan, weights,
                                             return_client_updates=True)
    return result.client_updates["item_emb"], plan


# -- scoring by hand -----------------------------------------------------------------------------
def test_attack_scores_by_hand():
    # Client 3 has positives {1, 4, 7}, client 8 has {2}, client 5 (not attacked) has {0}.
    truth = Pairs.from_arrays([3, 3, 3, 8, 5], [1, 4, 7, 2, 0], 10)
    guesses = ClientRowGuesses(
        clients=torch.tensor([3, 3, 3, 3, 8, 8, 9]),
        rows=torch.tensor([1, 2, 4, 6, 2, 5, 0]),
        guessed=torch.tensor([True, True, True, False, False, False, True]),
        scores=torch.zeros(7),
    )
    scores = attack_scores(guesses, truth)
    np.testing.assert_array_equal(scores.clients, [3, 8, 9])
    # Client 3: guessed {1, 2, 4}, hits {1, 4} -> precision 2/3, recall 2/3.
    # Client 8: nothing guessed -> precision undefined (NaN), recall 0/1.
    # Client 9: guessed {0} but has no positives -> precision 0/1, recall undefined.
    np.testing.assert_array_equal(scores.num_guessed, [3, 0, 1])
    np.testing.assert_array_equal(scores.num_hits, [2, 0, 0])
    np.testing.assert_array_equal(scores.num_positives, [3, 1, 0])
    np.testing.assert_allclose(scores.per_client_precision, [2 / 3, np.nan, 0.0])
    np.testing.assert_allclose(scores.per_client_recall, [2 / 3, 0.0, np.nan])
    assert scores.precision == pytest.approx(1 / 3)  # mean of 2/3 and 0
    assert scores.recall == pytest.approx(1 / 3)  # mean of 2/3 and 0
    assert scores["precision"] == scores.precision and scores.summary()["clients"] == 3
    assert list(scores.to_frame().columns) == ["client", "guessed", "positives", "hits", "precision", "recall"]


def test_attacks_on_a_hand_made_upload():
    # Client 0 trained on positive 5 and negatives 1, 2, 3: FedMF-like changes +a·p and -b·p.
    # Client 1's changes point along another line, with positives 7, 8 and negatives 0, 4, 6, 9.
    p0, p1 = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64), torch.tensor([0.0, -1.0, 1.0], dtype=torch.float64)
    clients = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    rows = torch.tensor([1, 2, 3, 5, 6, 0, 4, 6, 7, 8, 9, 3])
    coefficient = torch.tensor([-0.2, -0.3, -0.1, 0.9, 0.0, -0.5, -0.4, -0.1, 0.7, 0.8, -0.3, 0.0], dtype=torch.float64)
    directions = torch.stack([p0 if c == 0 else p1 for c in clients.tolist()])
    updates = ClientRowUpdates(clients, rows, coefficient[:, None] * directions)
    truth = Pairs.from_arrays([0, 1, 1], [5, 7, 8], 2)

    changed = changed_rows_attack(updates)
    assert changed.guessed.tolist() == (coefficient != 0).tolist()  # the zero rows are not "changed"
    scores = attack_scores(changed, truth)
    np.testing.assert_allclose(scores.per_client_precision, [1 / 4, 2 / 6])
    np.testing.assert_allclose(scores.per_client_recall, [1.0, 1.0])

    for direction in ("singular", "largest"):
        signed = sign_attack(updates, direction=direction)
        assert signed.guessed.tolist() == (coefficient > 0).tolist(), direction
        assert (signed.scores[signed.guessed] > 0).all()
    # A threshold just above client 1's row 7 (norm 0.7·|p1| ≈ 0.99) leaves client 0 only its
    # positive 5 (0.9·|p0| ≈ 2.01) and client 1 only its positive 8 (0.8·|p1| ≈ 1.13): with one
    # side empty, the other side is guessed.
    high = float(updates.norms()[rows == 7]) + 1e-9
    signed = sign_attack(updates, threshold=high)
    assert attack_scores(signed, truth).per_client_recall.tolist() == [1.0, 0.5]


# -- on a FedMF round ------------------------------------------------------------------------
def test_without_noise_changed_rows_give_n_pos_over_touched_and_signs_give_the_positives():
    updates, plan = round_uploads()
    assert (plan.num_steps == 1).all()  # one batch per client: every change is ±c·p_u
    changed = attack_scores(changed_rows_attack(updates), TRAIN)
    # Exactly n+ / (n+ + distinct negatives) per client, recall 1 ...
    touched = plan.touched_row_counts(NUM_ITEMS)
    positives = np.diff(TRAIN.indptr)[plan.clients]
    np.testing.assert_allclose(changed.per_client_precision, positives / touched)
    np.testing.assert_array_equal(changed.per_client_recall, 1.0)
    # ... which is about 1 / (1 + negatives) (slightly above: repeated negatives count once).
    assert changed.precision == pytest.approx(1 / (1 + NEGATIVES), abs=0.03)

    signed = attack_scores(sign_attack(updates), TRAIN)
    assert signed.precision >= 0.95
    assert signed.recall >= 0.95
    largest = attack_scores(sign_attack(updates, direction="largest"), TRAIN)
    assert largest.precision >= 0.95


def test_sign_attack_survives_several_local_steps():
    updates, plan = round_uploads(batch_size=12)
    assert plan.num_steps.max() >= 5
    assert attack_scores(sign_attack(updates), TRAIN).precision >= 0.9


def test_full_support_noise_makes_every_row_look_changed():
    updates, _ = round_uploads(UploadNoise(0.01, "full"))
    scores = attack_scores(changed_rows_attack(updates), TRAIN)
    np.testing.assert_array_equal(scores.num_guessed, NUM_ITEMS)
    positives = np.diff(TRAIN.indptr)[scores.clients]
    np.testing.assert_allclose(scores.per_client_precision, positives / NUM_ITEMS)  # n+ / I
    assert scores.precision < 0.05


def test_touched_support_noise_leaves_the_changed_rows_attack_intact():
    clean = attack_scores(changed_rows_attack(round_uploads()[0]), TRAIN)
    noisy = attack_scores(changed_rows_attack(round_uploads(UploadNoise(0.01, "touched"))[0]), TRAIN)
    np.testing.assert_allclose(noisy.per_client_precision, clean.per_client_precision)


@pytest.mark.parametrize("support", ["touched", "full"])
def test_sign_attack_degrades_as_noise_grows(support):
    clean, _ = round_uploads()
    # Noise scales relative to the typical size of one coordinate of a row change.
    unit = float(clean.norms().median()) / np.sqrt(DIM)
    multiples = [0.0, 0.3, 1.0, 3.0]
    precision = []
    for multiple in multiples:
        values = []
        for seed in range(3):
            updates, _ = round_uploads(UploadNoise(multiple * unit, support) if multiple else None, seed=seed)
            # Against full-support noise the attacker first drops rows with small changes.
            threshold = 3 * np.sqrt(DIM) * multiple * unit if support == "full" else 0.0
            values.append(attack_scores(sign_attack(updates, threshold=threshold), TRAIN).precision)
        precision.append(float(np.mean(values)))
    assert precision[0] >= 0.95
    assert all(later <= earlier + 0.02 for earlier, later in zip(precision, precision[1:])), precision
    assert precision[-1] < 0.6 * precision[0], precision


def test_sign_attack_direction_is_each_clients_top_singular_vector():
    # Ragged clients (1 to 40 rows) with unrelated random changes: the projections must match a
    # per-client SVD, whatever the padding used to batch clients of different sizes.
    generator = torch.Generator().manual_seed(0)
    sizes = [1, 3, 4, 7, 9, 16, 17, 40, 2]
    clients = torch.repeat_interleave(torch.arange(len(sizes)) * 10, torch.tensor(sizes))
    rows = torch.cat([torch.randperm(50, generator=generator)[:n] for n in sizes])
    delta = torch.randn(len(rows), 5, generator=generator, dtype=torch.float64)
    signed = sign_attack(ClientRowUpdates(clients, rows, delta))
    for user in clients.unique().tolist():
        mine = clients == user
        top = torch.linalg.svd(delta[mine], full_matrices=False).Vh[0]
        torch.testing.assert_close(signed.scores[mine].abs(), (delta[mine] @ top).abs(), atol=1e-9, rtol=0)
