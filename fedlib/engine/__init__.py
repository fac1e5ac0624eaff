"""The federated engine: the algorithm interface, the trainer, executors, aggregation, checkpoints.

Every method of the course is an :class:`Algorithm` (``init``, ``plan_round``, ``run_round``,
``evaluate`` over a named state) trained by the one loop over rounds, :func:`train`, which owns
the :class:`Schedule`, validation :class:`Selection`, early stopping, checkpoints, the ledger
and the :class:`RunResult`. :class:`ParameterAveraging` is the algorithm of the FedAvg family;
:func:`run_federated` builds it from a :class:`FederatedMethod` and trains it.

Typical use (FedMF on a split, batched executor)::

    from fedlib.engine import (FederatedConfig, RankingEvaluator, BatchedExecutor,
                               fedmf_method, run_federated)
    from fedlib.models import FedMF

    method = fedmf_method(FedMF(split.num_users, split.num_items, dim=32), lr=1.0)
    config = FederatedConfig(rounds=100, seed=0, patience=30)
    run = run_federated(method, split.train, config, executor=BatchedExecutor(),
                        evaluator=RankingEvaluator(split.train, split.valid, split.test))
    run.best_metrics, run.test_metrics, run.selected_state.global_state

F3CRec's noisy uploads (§5.6) and the bytes sent, recorded per round::

    method = fedmf_method(model, lr=1.0, upload_noise=UploadNoise(0.1, support="full"))
    ledger = CommunicationLedger()
    run = run_federated(method, split.train, config, ledger=ledger)
    ledger.per_round()

FedRKG's local differential privacy (clip each local step's gradient of ``P_u`` to 0.1, add
Gaussian noise) and its ε under user-level adjacency (Opacus' RDP accountant)::

    noise = GradientNoise(clip_norm=0.1, noise_multiplier=1.0, params=("personal_item_emb",))
    method = personal_table_method(model, gradient_noise=noise)
    dp_epsilon(noise, steps_per_round=1, rounds=1000, sample_rate=1.0, delta=1e-5)

Adam on the server (FedAdam; FedDAE's code), its moments kept in the run's state and checkpoints::

    method = dataclasses.replace(method, server_optimizer=ServerAdam(lr=1e-3))
"""
from fedlib.engine.algorithm import Algorithm, RoundContext, RoundReport
from fedlib.engine.aggregation import Aggregation, client_weights, fedavg, interpolate_with_previous
from fedlib.engine.centralised import train_centralised
from fedlib.engine.checkpoint import Checkpointer, checkpoint_progress
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.evaluation import RankingEvaluator, union_pairs
from fedlib.engine.executors import BatchedExecutor, LocalUpdateResult, SequentialExecutor, make_executor
from fedlib.engine.loop import (
    AveragingState, FederatedConfig, ParameterAveraging, run_federated,
)
from fedlib.engine.method import (
    FederatedMethod, GradientNoise, LocalBatch, UploadNoise, bce_client_loss, chain_hooks, fedmf_method,
    fedncf_method, pfedrec_method, personal_table_method,
)
from fedlib.engine.privacy import dp_epsilon
from fedlib.engine.selection import Selection
from fedlib.engine.server_optim import ServerAdam
from fedlib.engine.trainer import RunResult, Schedule, train
from fedlib.engine.plan import (
    RoundPlan, client_noise_generator, make_round_plan, round_generator, round_noise_key, select_clients,
)
from fedlib.engine.uploads import (
    ClientRowUpdates, client_gradient_noise, client_upload_noise, gradient_noise_shapes, record_round_communication,
)

__all__ = [
    "Algorithm", "RoundContext", "RoundReport", "Schedule", "Selection", "RunResult", "train",
    "ParameterAveraging", "AveragingState",
    "Aggregation", "client_weights", "fedavg", "interpolate_with_previous",
    "train_centralised", "Checkpointer", "checkpoint_progress", "CommunicationLedger", "RankingEvaluator", "union_pairs",
    "BatchedExecutor", "SequentialExecutor", "LocalUpdateResult", "make_executor",
    "FederatedConfig", "run_federated",
    "FederatedMethod", "LocalBatch", "UploadNoise", "GradientNoise", "ServerAdam", "dp_epsilon", "bce_client_loss",
    "fedmf_method", "fedncf_method", "pfedrec_method", "personal_table_method", "chain_hooks",
    "RoundPlan", "make_round_plan", "round_generator", "round_noise_key", "client_noise_generator", "select_clients",
    "ClientRowUpdates", "client_upload_noise", "client_gradient_noise", "gradient_noise_shapes",
    "record_round_communication",
]
