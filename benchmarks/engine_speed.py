"""How fast is one FedMF round on ML-100K? Batched vs sequential vs a reference-style loop.

Setting (F3CRec's FedMF recipe): all 943 users every round, one local epoch, 4 negatives
per positive (resampled every round), batch 512, d = 32, SGD with user lr ``lr`` and item lr
``lr × num_items``, uniform mean of the uploaded item tables. All 100,000 ratings are
training positives (a speed benchmark: 500,000 local examples per round), float32.

Three implementations run the **same round plan** from the **same state**:

(a) ``SequentialExecutor``: one client at a time, autograd + explicit SGD (readable reference);
(b) ``BatchedExecutor``: every client at once (analytic FedMF kernel); its time includes
    drawing the round plan (client order, negatives, shuffles), which is part of a round;
(c) a loop written the way the public reference code is: per client a deep copy of the
    model, a new ``torch.optim.SGD`` and a new ``DataLoader``, upload of the full item table,
    mean of the uploaded tables.

Besides, (b) is timed with F3CRec's upload noise (``Laplace(0, 0.1)`` on the touched rows only,
and on the full table as in the paper; median of ``--noise-rounds`` rounds after a warm-up):
the extra time is drawing the noise, counter-based and keyed by (seed, round, client, element),
for all clients in one vectorised call, and scattering it into the aggregate.

Prints a table, then one JSON line (the last line). ``--rounds`` sets how many rounds of (b)
are timed (the median round is reported, robust to other processes sharing the cores);
(a) and (c) are timed on ``--slow-rounds`` rounds (default 2; the fastest counts) with
``--slow-threads`` torch threads (default 1: a per-client loop of tiny operations gains nothing
from a second thread and loses a lot when another process shares the cores). The speedups
are therefore conservative: fastest slow round over median batched round.

    python benchmarks/engine_speed.py [--rounds 20] [--noise-rounds 5] [--slow-rounds 1] [--threads 1] [--json-only]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedlib.data import load_interactions
from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import (BatchedExecutor, FederatedConfig, SequentialExecutor, UploadNoise, fedmf_method,
                           ParameterAveraging, make_round_plan, round_generator)
from fedlib.models import FedMF

FLOPS_PER_SECOND = 10e9  # the "arithmetic floor" reference speed


def _data_root() -> Path:
    """``$FEDLIB_DATA``, else ``../shared/data`` beside the checkout (the CI layout)."""
    return Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def load_ml100k_pairs():
    """All ML-100K ratings as implicit positives: ``(Pairs, num_items)`` with dense 0-based ids."""
    frame = load_interactions("ml-100k", root=_data_root()).frame
    _, users = np.unique(frame["user"].to_numpy(), return_inverse=True)
    items_ids, items = np.unique(frame["item"].to_numpy(), return_inverse=True)
    return Pairs.from_arrays(users, items, int(users.max()) + 1), int(items_ids.size)


# -- (c) the per-client loop of the public reference implementations --------------------------
class _ReferenceMF(nn.Module):
    def __init__(self, item_table: torch.Tensor, dim: int):
        super().__init__()
        self.item_emb = nn.Embedding(item_table.shape[0], dim)
        self.item_emb.weight.data.copy_(item_table)
        self.user_emb = nn.Parameter(torch.zeros(1, dim))

    def forward(self, items):
        return (self.item_emb(items) * self.user_emb).sum(-1)


def reference_loop_round(item_table, user_table, plan, lr):
    """One round as the reference code does it; returns the new (item_table, user_table)."""
    num_items, dim = item_table.shape
    server_model = _ReferenceMF(item_table, dim)
    user_table = user_table.clone()
    uploads = []
    loss_fn = nn.BCEWithLogitsLoss()
    for c, user in enumerate(plan.clients.tolist()):
        model = copy.deepcopy(server_model)  # download: a full copy of the model
        model.user_emb.data.copy_(user_table[user:user + 1])
        optimizer = torch.optim.SGD([{"params": [model.user_emb], "lr": lr},
                                     {"params": model.item_emb.parameters(), "lr": lr * num_items}])
        examples = plan.client_examples(c)
        dataset = TensorDataset(torch.as_tensor(plan.items[examples]), torch.as_tensor(plan.labels[examples]))
        # The plan already holds the shuffled order, so the loader only cuts it into batches.
        for items, labels in DataLoader(dataset, batch_size=plan.batch_size, shuffle=False):
            optimizer.zero_grad()
            loss = loss_fn(model(items), labels)
            loss.backward()
            optimizer.step()
        uploads.append(copy.deepcopy(model.item_emb.weight.data))  # upload the full table
        user_table[user] = model.user_emb.data[0]
    return torch.stack(uploads).mean(0), user_table


def flop_floor(plan, dim) -> float:
    """Seconds for the round's arithmetic at 10 GFLOP/s: per example a dot product (2d), the
    two gradient contributions (2d each) and their SGD updates (2d), about 10 scalar ops."""
    examples = plan.items.size
    return examples * (8 * dim + 10) / FLOPS_PER_SECOND


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the batched executor to time")
    parser.add_argument("--slow-rounds", type=int, default=2, help="rounds of (a) and (c) to time (the fastest counts)")
    parser.add_argument("--noise-rounds", type=int, default=5,
                        help="rounds of (b) with upload noise to time per support (the median counts)")
    parser.add_argument("--slow-threads", type=int, default=1,
                        help="torch threads for (a) and (c): their many tiny operations run fastest on one")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    train, num_items = load_ml100k_pairs()
    model = FedMF(train.num_users, num_items, dim=args.dim)
    method = fedmf_method(model, lr=args.lr)
    config = FederatedConfig(rounds=args.rounds, seed=args.seed, num_negatives=4, batch_size=512, dtype="float32")
    sampler = NegativeSampler(train, num_items)

    def plan_for(t):
        return make_round_plan(train, sampler, round_generator(args.seed, t), round_index=t,
                               num_negatives=config.num_negatives, batch_size=config.batch_size)

    def batched_round(state, t, executor, round_method=method):
        plan = plan_for(t)  # part of the round
        weights = round_method.aggregation.client_weights(plan.num_examples)
        result = executor.local_updates(round_method, state.global_state, state.private_state, plan, weights)
        state.global_state = round_method.aggregation.apply(state.global_state, result.update)

    # (b) batched: warm-up round, then time `rounds` consecutive rounds.
    batched = BatchedExecutor()
    state = ParameterAveraging(method, None, config).init(config.seed)
    batched_round(state, 0, batched)
    round_times = []
    for t in range(1, args.rounds + 1):
        start = time.perf_counter()
        batched_round(state, t, batched)
        round_times.append(time.perf_counter() - start)
    # The median is robust to other processes briefly taking a core of this 2-core machine.
    batched_s = float(np.median(round_times))
    plan_times = []
    for t in range(3):
        start = time.perf_counter()
        plan_for(t)
        plan_times.append(time.perf_counter() - start)
    plan_s = float(np.median(plan_times))
    noisy_s = {}
    next_round = args.rounds + 1
    for support in ("touched", "full"):
        noisy_method = dataclasses.replace(method, upload_noise=UploadNoise(0.1, support=support))
        batched_round(state, next_round, batched, noisy_method)  # warm-up
        noisy_times = []
        for t in range(next_round + 1, next_round + 1 + args.noise_rounds):
            start = time.perf_counter()
            batched_round(state, t, batched, noisy_method)
            noisy_times.append(time.perf_counter() - start)
        next_round += 1 + args.noise_rounds
        noisy_s[support] = float(np.median(noisy_times))

    # Agreement and the slow implementations, from one common state and plan per round.
    sequential_times, reference_times, max_diff = [], [], 0.0
    batched_threads = torch.get_num_threads()
    base = ParameterAveraging(method, None, config).init(config.seed)
    for t in range(args.slow_rounds):
        plan = plan_for(t)
        weights = method.aggregation.client_weights(plan.num_examples)
        item0, user0 = base.global_state["item_emb"].clone(), base.private_state["user_emb"].clone()

        torch.set_num_threads(args.slow_threads)
        seq_private = {"user_emb": user0.clone()}
        start = time.perf_counter()
        seq = SequentialExecutor().local_updates(method, {"item_emb": item0}, seq_private, plan, weights)
        sequential_times.append(time.perf_counter() - start)
        seq_items = item0 + seq.update["item_emb"]

        start = time.perf_counter()
        ref_items, ref_users = reference_loop_round(item0, user0, plan, args.lr)
        reference_times.append(time.perf_counter() - start)
        torch.set_num_threads(batched_threads)

        bat_private = {"user_emb": user0.clone()}
        bat = batched.local_updates(method, {"item_emb": item0}, bat_private, plan, weights)
        bat_items = item0 + bat.update["item_emb"]
        for a, b in ((bat_items, seq_items), (bat_items, ref_items),
                     (bat_private["user_emb"], seq_private["user_emb"]), (bat_private["user_emb"], ref_users)):
            max_diff = max(max_diff, float((a - b).abs().max()))
        base.global_state, base.private_state = {"item_emb": bat_items}, bat_private
    # Conservative ratios: the fastest slow round against the median batched round.
    sequential_s, reference_s = min(sequential_times), min(reference_times)

    floor = flop_floor(plan_for(0), args.dim)
    result = {
        "dataset": "ml-100k (all 100k ratings as train)",
        "clients_per_round": int(train.active_users().size),
        "examples_per_round": int(plan_for(0).items.size),
        "dtype": "float32",
        "torch_threads": batched_threads,
        "slow_loop_threads": args.slow_threads,
        "batched_s_per_round": round(batched_s, 4),
        "batched_s_per_round_min": round(min(round_times), 4),
        "batched_plan_s": round(plan_s, 4),
        "batched_noise_touched_s_per_round": round(noisy_s["touched"], 3),
        "batched_noise_full_s_per_round": round(noisy_s["full"], 3),
        "noise_touched_vs_noiseless": round(noisy_s["touched"] / batched_s, 2),
        "noise_full_vs_noiseless": round(noisy_s["full"] / batched_s, 2),
        "noise_rounds_timed": args.noise_rounds,
        "sequential_s_per_round": round(sequential_s, 3),
        "reference_loop_s_per_round": round(reference_s, 3),
        "speedup_vs_sequential": round(sequential_s / batched_s, 1),
        "speedup_vs_reference_loop": round(reference_s / batched_s, 1),
        "max_abs_diff": float(f"{max_diff:.3g}"),
        "flop_floor_s_per_round": round(floor, 4),
        "rounds_timed": args.rounds,
        "slow_rounds_timed": args.slow_rounds,
        "load_average_1min_at_start": round(load_before, 2),
    }
    if not args.json_only:
        print(f"FedMF round on ML-100K: {result['clients_per_round']} clients, {result['examples_per_round']:,} examples, "
              f"d={args.dim}, batch 512, float32, {result['torch_threads']} threads")
        print(f"{'implementation':<42}{'s / round':>12}{'vs batched':>12}")
        print(f"{'(b) batched executor (incl. round plan)':<42}{batched_s:>12.4f}{1.0:>12.1f}   "
              f"(median of {args.rounds}; min {min(round_times):.4f})")
        print(f"{'    of which round plan':<42}{plan_s:>12.4f}")
        for support in ("touched", "full"):
            label = f"(b) with Laplace(0, 0.1) noise, {support}"
            print(f"{label:<42}{noisy_s[support]:>12.3f}{noisy_s[support] / batched_s:>12.1f}   "
                  f"(median of {args.noise_rounds})")
        print(f"{'(a) sequential executor':<42}{sequential_s:>12.3f}{sequential_s / batched_s:>12.1f}   "
              f"(fastest of {args.slow_rounds}, {args.slow_threads} thread(s))")
        print(f"{'(c) reference-style per-client loop':<42}{reference_s:>12.3f}{reference_s / batched_s:>12.1f}   "
              f"(fastest of {args.slow_rounds}, {args.slow_threads} thread(s))")
        print(f"{'arithmetic floor at 10 GFLOP/s':<42}{floor:>12.4f}")
        print(f"1-minute load average at start: {load_before:.2f} (other processes share the cores)")
        print(f"max |difference| between implementations after {args.slow_rounds} round(s): {max_diff:.3g}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
