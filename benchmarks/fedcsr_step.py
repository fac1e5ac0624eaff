"""How long is one FedCSR training step on a platform of Food-Kitchen? And what makes it so?

One step = forward, backward and Adam on one mini-batch of 256 training sequences (L = 15) of
the largest platform, with the frozen global model for MCL, at the paper profile's settings
(n = 64 by default). Variants, each from the same initial model and the same batches:

* ``full graph``: the graph layer propagates the whole item table through the platform's
  transition graph every step (then indexes the batch's rows), as a direct implementation of
  Eq. 1 does;
* ``batch rows``: :func:`fedlib.methods.fedcsr.propagate_rows` mixes only the rows the batch
  asks for (same values up to the order of float sums; the model's default);
* each with the full softmax over a domain's items (Eqs. 16-17, heads evaluated at target
  positions only) or the sampled softmax over the target plus ``--negatives`` shared uniform
  negatives (the paper-profile grid's stated reduction).

Prints a table, then one JSON line (the last line). The median step over ``--steps`` timed steps
(after one warm-up step) is reported, robust to other processes sharing the cores.

    python benchmarks/fedcsr_step.py [--dataset Food-Kitchen] [--dim 64] [--steps 8] [--negatives 1000] [--json-only]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, Optional

import numpy as np
import torch

from fedlib.experiments import fedcsr as experiments
from fedlib.methods import fedcsr as model_module
from fedlib.methods.fedcsr_train import platform_graphs


def _full_graph_rows(graph: torch.Tensor, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The direct form: propagate every item, then index the batch's rows."""
    return model_module.propagate(graph, table)[ids]


def time_steps(split, graphs, *, dim: int, negatives: Optional[int], full_graph: bool, steps: int,
               batch_size: int = 256, seed: int = 0) -> Dict[str, float]:
    """Median seconds per step and the last loss of one variant (see the module docstring)."""
    platform = int(np.argmax([len(rows) for rows in split.platforms]))
    rows = np.asarray(split.platforms[platform])
    na, nb = split.num_items_a, split.num_items_b
    original = model_module.propagate_rows
    if full_graph:
        model_module.propagate_rows = _full_graph_rows
    try:
        torch.manual_seed(seed)
        model = model_module.FedCSRModel(na, nb, model_module.FedCSRConfig(dim=dim, sampled_negatives=negatives),
                                         graphs[platform])
        target = model_module.frozen_copy(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(seed)
        order = rows[rng.permutation(rows.size)]
        seconds, loss = [], float("nan")
        for step in range(steps + 1):                           # step 0 warms up
            chosen = order[(step * batch_size) % max(rows.size - batch_size, 1):][:batch_size]
            batch = model_module.make_batch(split.train, na, nb, model.config.maxlen, rows=chosen)
            started = time.perf_counter()
            value, _ = model_module.fedcsr_loss(model, batch, global_model=target, rng=rng)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            if step:
                seconds.append(time.perf_counter() - started)
            loss = float(value.detach())
    finally:
        model_module.propagate_rows = original
    return {"s_per_step": statistics.median(seconds), "last_loss": loss}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Food-Kitchen", choices=[*experiments.DATASETS, "synthetic"])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--negatives", type=int, default=1000, help="sampled-softmax negatives (paper-profile grid)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    torch.set_num_threads(args.threads)
    # Evaluation candidates play no part in a training step; the synthetic data are too small for 999.
    split = experiments.load_split(args.dataset, **({"num_negatives": 9} if args.dataset == "synthetic" else {}))
    graphs = platform_graphs(split)
    result = {"dataset": args.dataset, "dim": args.dim, "steps": args.steps, "threads": args.threads,
              "items_a": split.num_items_a, "items_b": split.num_items_b}
    rows = []
    for negatives in (args.negatives, None):
        for full_graph in (True, False):
            timing = time_steps(split, graphs, dim=args.dim, negatives=negatives, full_graph=full_graph,
                                steps=args.steps)
            key = f"{'full_graph' if full_graph else 'batch_rows'}_{'sampled' if negatives else 'full_softmax'}"
            result[f"{key}_s_per_step"] = timing["s_per_step"]
            result[f"{key}_last_loss"] = timing["last_loss"]
            rows.append((("full graph" if full_graph else "batch rows"),
                         (f"sampled ({negatives})" if negatives else "full softmax"), timing["s_per_step"],
                         timing["last_loss"]))
    result["graph_layer_speedup_sampled"] = (result["full_graph_sampled_s_per_step"]
                                             / result["batch_rows_sampled_s_per_step"])
    if not args.json_only:
        print(f"FedCSR step on {args.dataset} (largest platform), n = {args.dim}, batch 256, {args.threads} thread(s)")
        print(f"{'graph layer':<12} {'loss':<16} {'s/step':>8} {'last loss':>10}")
        for graph_layer, loss, seconds, last in rows:
            print(f"{graph_layer:<12} {loss:<16} {seconds:8.3f} {last:10.4f}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
