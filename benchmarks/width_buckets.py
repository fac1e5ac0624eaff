"""How much does padding cost the batched executor? Plan-order chunks vs width-bucketed chunks.

In a local step every client of a chunk steps at once on a batch padded to ``(C_s, B_s)``,
``B_s`` being the widest client's batch. Under FedRAP's public-code local training (batch
2,048, 10 epochs: each client's whole data is one batch) a FilmTrust round pads every client
to the widest client's 1,210 examples, while the mean client has 157 (Amazon-Video: 1,375
against 75). ``BatchedExecutor(width_ratio=1.5)`` (the default) chunks clients whose batch
widths lie within a factor 1.5, so padding wastes at most 50 %.

Both executors run the **same round plan** from the **same state** (FedRAP at the FedRKG
grid's settings, every user, seed 0, float32, one thread unless ``--threads``); the median
round time of each is reported with the padded-example count and the largest difference of
the two uploads and private tables.

    python benchmarks/width_buckets.py [--dataset FilmTrust] [--rounds 3] [--json-only]

Prints a table, then one JSON line (the last line).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from fedlib.engine import BatchedExecutor, ParameterAveraging, make_round_plan, round_generator
from fedlib.engine.executors import client_batch_widths, width_bucketed_chunks
from fedlib.papers.fedrkg import experiment as X


def padded_examples(widths: np.ndarray, chunks) -> int:
    """Examples a step computes (padding included) when each chunk pads to its widest client."""
    return int(sum(widths[chunk].max() * chunk.size for chunk in chunks))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="FilmTrust", choices=["FilmTrust", "Amazon-Video", "LastFM-2K"])
    parser.add_argument("--sampler", default="leaky", choices=["leaky", "correct"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds timed per executor (the median counts)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    torch.set_num_threads(args.threads)

    config = X.fedrap_code_cells([args.dataset], [args.sampler])[0]
    split = X.load_split(args.dataset)
    sampler = X.make_sampler(split, config["sampler"])
    fed_config = X.federated_config(config)
    method, _ = X.make_federated(config, split, sampler, fed_config)
    state = ParameterAveraging(method, None, fed_config).init(fed_config.seed)
    weights = np.full(split.num_users, 1.0 / split.num_users)

    def plan_for(t):
        return make_round_plan(split.train, sampler, round_generator(fed_config.seed, t), round_index=t,
                               num_negatives=fed_config.num_negatives, batch_size=fed_config.batch_size,
                               local_epochs=fed_config.local_epochs)

    plain, bucketed = BatchedExecutor(width_ratio=None), BatchedExecutor()
    executors = {"plan order (width_ratio=None)": plain,
                 f"width buckets (width_ratio={bucketed.width_ratio})": bucketed}
    plans = [plan_for(t) for t in range(args.rounds)]
    widths = client_batch_widths(plans[0])
    # the chunks each executor forms on the generic path (FedRAP has no analytic kernel)
    chunk_lists = {name: [np.arange(start, min(start + plain.chunk_size, widths.size))
                          for start in range(0, widths.size, plain.chunk_size)] if executor is plain
                   else width_bucketed_chunks(widths, bucketed.chunk_size, bucketed.width_ratio)
                   for name, executor in executors.items()}
    seconds, outputs = {}, {}
    for name, executor in executors.items():
        times = []
        for plan in plans:
            private = {k: v.clone() for k, v in state.private_state.items()}
            started = time.perf_counter()
            result = executor.local_updates(method, state.global_state, private, plan, weights[plan.clients])
            times.append(time.perf_counter() - started)
        seconds[name] = statistics.median(times)
        outputs[name] = (result.update, private)
    names = list(executors)
    (update_a, private_a), (update_b, private_b) = outputs.values()
    difference = max([float((update_a[k] - update_b[k]).abs().max()) for k in update_a]
                     + [float((private_a[k] - private_b[k]).abs().max()) for k in private_a])
    record = {"dataset": args.dataset, "sampler": args.sampler, "clients": int(widths.size),
              "real_examples_per_step": int(widths.sum()),
              "padded_examples_per_step": {name: padded_examples(widths, chunks) for name, chunks in chunk_lists.items()},
              "chunks": {name: len(chunks) for name, chunks in chunk_lists.items()},
              "seconds_per_round": seconds, "speedup": seconds[names[0]] / seconds[names[1]],
              "max_abs_difference": difference, "threads": args.threads}
    if not args.json_only:
        print(f"FedRAP, code local training (10 epochs, batch 2,048), {args.dataset}, {args.sampler} sampler, "
              f"{widths.size} clients, {widths.sum():,} real examples per step")
        print(f"{'executor':36s} {'chunks':>6s} {'padded examples':>16s} {'s / round':>10s}")
        for name in executors:
            print(f"{name:36s} {record['chunks'][name]:6d} {record['padded_examples_per_step'][name]:16,d} "
                  f"{seconds[name]:10.2f}")
        print(f"speedup {record['speedup']:.1f}×, largest difference of uploads and private tables {difference:.1e}")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
