"""Lesson 00's exercises at smoke size: each parameter change, made through the function the
exercise calls (``short_run`` or ``attack_one_round``), changes the result as the exercise says."""
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.synthetic import drifting_stream
from fedlib.engine import FederatedConfig, FederatedMethod, RankingEvaluator, UploadNoise, fedmf_method, run_federated
from fedlib.experiments.intro import attack_one_round, short_run, train_centralised_selected
from fedlib.models import MF, FedMF

LR = 0.5


@pytest.fixture(scope="module")
def toy():
    split = drifting_stream(num_users=150, num_items=240, interactions_per_user=40, drift=0.0, seed=0)[0]
    model = FedMF(split.num_users, split.num_items, dim=16)
    evaluator = RankingEvaluator(split.train, split.valid, split.test, ks=(20,))
    return split, model, evaluator


@pytest.fixture(scope="module")
def trained(toy):
    split, model, _ = toy
    method = fedmf_method(model, lr=LR)
    run = run_federated(method, split.train, FederatedConfig(rounds=6, seed=0, test_at_end=False), device="cpu")
    return method, run.state, NegativeSampler(split.train, split.num_items)


def test_exercise_1_unscaled_item_learning_rate_barely_moves_the_table(toy):
    split, model, evaluator = toy
    scaled = short_run(fedmf_method(model, lr=LR), split.train, evaluator, rounds=4, seed=0, device="cpu")
    unscaled = short_run(FederatedMethod(model, {"user_emb": LR, "item_emb": LR}), split.train, evaluator,
                         rounds=4, seed=0, device="cpu")
    assert unscaled["item table change"] < 0.02 * scaled["item table change"]
    assert scaled["item table change"] > 0.01
    # without the scaling the model stays where it started (within noise of its initial NDCG)
    assert abs(unscaled["valid NDCG@20"] - unscaled["valid NDCG@20 at start"]) < \
        abs(scaled["valid NDCG@20"] - scaled["valid NDCG@20 at start"]) + 0.005


def test_exercise_2_sampling_clients_trains_fewer_users_per_round(toy):
    split, model, evaluator = toy
    method = fedmf_method(model, lr=LR)
    everyone = short_run(method, split.train, evaluator, rounds=4, seed=0, device="cpu")
    tenth = short_run(method, split.train, evaluator, rounds=4, seed=0, clients_per_round=split.num_users // 10,
                      device="cpu")
    assert everyone["users trained"] == pytest.approx(1.0)
    # 4 rounds of 10 % each: at most 40 % of the users were ever trained
    assert 0.1 <= tenth["users trained"] <= 0.4 + 1e-9
    assert tenth["valid NDCG@20"] != everyone["valid NDCG@20"]


def _precision(table, attack):
    return float(table.set_index("attack").loc[attack, "precision"])


def test_exercise_3_touched_only_noise_leaves_the_changed_rows_visible(toy, trained):
    split, model, _ = toy
    method, state, sampler = trained

    def attack(noise):
        noisy = fedmf_method(model, lr=LR, upload_noise=noise)
        return attack_one_round(noisy, state.global_state, state.private_state, split.train, sampler,
                                clients_per_round=60, seed=0)

    clean, touched = attack(None), attack(UploadNoise(scale=0.3, support="touched"))
    full = attack(UploadNoise(scale=0.3, support="full"))
    assert _precision(touched, "changed rows") == pytest.approx(_precision(clean, "changed rows"), abs=1e-9)
    assert _precision(full, "changed rows") == pytest.approx(float(full["positive share"].iloc[0]), abs=1e-9)
    assert _precision(full, "changed rows") < 0.7 * _precision(touched, "changed rows")


def test_exercise_4_fewer_negatives_raise_changed_rows_precision_and_break_the_sign_attack(toy, trained):
    split, _, _ = toy
    method, state, sampler = trained
    four, one = (attack_one_round(method, state.global_state, state.private_state, split.train, sampler,
                                  clients_per_round=60, seed=0, num_negatives=k) for k in (4, 1))
    assert _precision(four, "changed rows") == pytest.approx(1 / 5, abs=0.07)
    assert _precision(one, "changed rows") == pytest.approx(1 / 2, abs=0.07)
    assert _precision(four, "sign") > 0.9 and _precision(one, "sign") < 0.6


def test_attack_one_round_leaves_the_states_untouched(toy, trained):
    split, _, _ = toy
    method, state, sampler = trained
    before = {k: v.clone() for k, v in {**state.global_state, **state.private_state}.items()}
    attack_one_round(method, state.global_state, state.private_state, split.train, sampler, clients_per_round=20, seed=0)
    after = {**state.global_state, **state.private_state}
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_train_centralised_selected_keeps_the_best_validation_state(toy):
    split, _, _ = toy
    scores = iter([0.1, 0.3, 0.2, 0.25])  # epochs 1-4: the best is epoch 2
    model = MF(split.num_users, split.num_items, dim=8)
    seen = []

    def evaluate_valid(global_state, private_state):
        seen.append(global_state["item_emb"].clone())
        return next(scores)

    best_global, _, history = train_centralised_selected(
        model, split.train, split.num_items, evaluate_valid, epochs=4, lr=1.0, batch_size=256, num_negatives=2,
        seed=0, eval_every=1, patience=None)
    assert list(history["round"]) == [1, 2, 3, 4]
    assert torch.equal(best_global["item_emb"], seen[1]) and not torch.equal(seen[1], seen[3])
    # patience 1: stops after the first evaluation without improvement (epoch 3)
    scores = iter([0.1, 0.3, 0.2, 0.25])
    _, _, stopped = train_centralised_selected(
        MF(split.num_users, split.num_items, dim=8), split.train, split.num_items, lambda g, p: next(scores),
        epochs=4, lr=1.0, batch_size=256, num_negatives=2, seed=0, eval_every=1, patience=1)
    assert list(stopped["round"]) == [1, 2, 3]
