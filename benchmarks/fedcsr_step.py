"""How long is one FedCSR training step on a platform of Food-Kitchen? And what makes it so?

One step = forward, backward and Adam on one mini-batch of 256 training sequences (L = 15) of
the largest platform, with the frozen global model for MCL, at the paper profile's settings
(n = 64 by default). Variants, each from the same initial model and the same batches:

* ``full graph``: the graph layer propagates the whole item table through the platform's
  transition graph every step (then indexes the batch's rows), as a direct implementation of
  Eq. 1 does; every use of an item table or a prediction head indexes the parameter anew;
* ``rows, separate reads``: :func:`fedlib.baselines.sequential.sequences.propagate_rows` mixes only the rows the
  batch asks for, but still indexes the table four times per forward and each head twice per
  term of Eq. 17;
* ``rows, one read``: the model's default. Each item table and each head is gathered once per
  forward (:func:`~fedlib.baselines.sequential.sequences.propagate_rows`, :func:`~fedlib.baselines.sequential.sequences.sampled_head_losses`):
  every index into a parameter costs its backward a zero-filled gradient of the whole table;
* the sequence encoders' layout: ``packed`` (the model's default: per-token layers on the real
  tokens only, :class:`~fedlib.baselines.sequential.sequences.CausalSelfAttention`), ``padded`` (every layer on
  all B·L positions, ``nn.MultiheadAttention``: ``forward_reference``) and ``padded, torch
  dropout`` (also ``nn.Dropout``'s ``bernoulli_`` masks instead of :mod:`fedlib.models.dropout`);
* each with ``torch.optim.Adam`` as it comes or the fused Adam the trainer uses
  (:func:`fedlib.engine.optim.adam`);
* with the sampled softmax over the target plus ``--negatives`` shared uniform negatives (the
  paper-profile grid's stated reduction) and, for the default path, the full softmax over a
  domain's items (Eqs. 16-17, heads evaluated at target positions only).

Variants with the same encoder layout compute the same loss up to the order of float sums (the
last losses are printed); the layouts draw their dropout masks on different shapes, so their
losses differ by the draws (their equality with dropout off is a test of the model).
Prints a table, then one JSON line (the last line). The median step over ``--steps`` timed steps
(after one warm-up step) is reported, robust to other processes sharing the cores.

    python benchmarks/fedcsr_step.py [--dataset Food-Kitchen] [--dim 64] [--steps 8] [--negatives 1000] [--json-only]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.engine.optim import adam
from fedlib.baselines.sequential import sequences
from fedlib.baselines.sequential.sequence_training import platform_graphs
from fedlib.papers.fedcsr import experiment as experiments
from fedlib.papers.fedcsr import model as model_module

#: graph-layer variant -> does it propagate the whole table?, does it read each parameter once?
GRAPH_LAYERS = {"full graph": (True, False), "rows, separate reads": (False, False), "rows, one read": (False, True)}


def _full_graph_rows(graph: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, *, residual: bool = False,
                     sparse_grad: bool = False, scale: float = 1.0) -> torch.Tensor:
    """The direct form: propagate every item, then index the batch's rows (and add them).

    ``sparse_grad`` is accepted for the signature of ``propagate_rows`` and ignored (dense reads:
    this benchmark steps with plain ``zero_grad``); ``scale`` multiplies the result, as there.
    """
    mixed = sequences.propagate(graph, table)[ids]
    mixed = mixed + table[ids] if residual else mixed
    return mixed * scale if scale != 1.0 else mixed


def _rows_separate_reads(graph: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, *, residual: bool = False,
                         sparse_grad: bool = False, scale: float = 1.0) -> torch.Tensor:
    """Row-only propagation that indexes ``table`` at every use (own rows, neighbours, padding, residual)."""
    n = graph.shape[0]
    graph = graph if graph.is_coalesced() else graph.coalesce()
    edge_rows, edge_cols = graph.indices()
    row_start = torch.zeros(n + 1, dtype=torch.long)
    row_start[1:] = torch.bincount(edge_rows, minlength=n).cumsum(0)
    unique_ids, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    rows = unique_ids[unique_ids < n]
    first, degree = row_start[rows], row_start[rows + 1] - row_start[rows]
    owner = torch.repeat_interleave(torch.arange(rows.numel()), degree)
    edges = first[owner] + torch.arange(owner.numel()) - (degree.cumsum(0) - degree)[owner]
    messages = graph.values()[edges, None].to(table.dtype) * table[edge_cols[edges]]
    neighbours = torch.zeros(rows.numel(), table.shape[1], dtype=table.dtype).index_add(0, owner, messages)
    mixed = torch.cat([0.5 * (table[rows] + neighbours), table[unique_ids[rows.numel():]]])[inverse]
    mixed = mixed.view(*ids.shape, table.shape[1])
    mixed = mixed + table[ids] if residual else mixed
    return mixed * scale if scale != 1.0 else mixed


def _heads_separate_reads(head, terms, negatives=None, *, sparse_grad: bool = False):
    """Each term of Eq. 17 indexes the head's weight and bias for its targets and for the negatives."""
    losses = []
    for hidden, target, mask in terms:
        rows, tgt = hidden[mask], target[mask]
        if negatives is None:
            losses.append(F.cross_entropy(head(rows), tgt))
            continue
        pos = (rows * head.weight[tgt]).sum(-1) + head.bias[tgt]
        neg = (rows @ head.weight[negatives].T + head.bias[negatives]).masked_fill(
            negatives.unsqueeze(0) == tgt.unsqueeze(1), float("-inf"))
        losses.append(F.cross_entropy(torch.cat([pos.unsqueeze(1), neg], dim=1), torch.zeros_like(tgt)))
    return losses


#: encoder layout -> (padded forward?, torch's nn.Dropout?)
ENCODERS = {"packed": (False, False), "padded": (True, False), "padded, torch dropout": (True, True)}


def _padded_tokens(encoder: sequences.CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``forward_tokens`` through the padded form: the real tokens' features ``x`` (T, n) laid out on the
    (B, L) grid (zero rows at padding, as the zero padding rows of the item tables give), then
    ``forward_reference`` on every position → (B, L, n)."""
    (B, L), n = positions.shape, x.shape[1]
    token = (positions > 0).reshape(-1).nonzero().squeeze(1)               # (T,)
    return encoder.forward_reference(x.new_zeros(B * L, n).index_copy(0, token, x).view(B, L, n), positions)


@contextlib.contextmanager
def _encoder(name: str):
    """Build and run the model with the encoder layout ``name`` (restored on exit)."""
    padded, torch_dropout = ENCODERS[name]
    encoder_class = sequences.CausalSelfAttention
    saved = encoder_class.forward, encoder_class.forward_tokens, sequences.Dropout
    if padded:
        encoder_class.forward = encoder_class.forward_reference
        encoder_class.forward_tokens = _padded_tokens
    if torch_dropout:
        sequences.Dropout = torch.nn.Dropout
    try:
        yield
    finally:
        encoder_class.forward, encoder_class.forward_tokens, sequences.Dropout = saved


@contextlib.contextmanager
def _graph_layer(name: str):
    """Swap the model module's row functions for the variant ``name`` (restored on exit)."""
    full_graph, one_read = GRAPH_LAYERS[name]
    saved = sequences.propagate_rows, sequences.sampled_head_losses
    if full_graph:
        sequences.propagate_rows = _full_graph_rows
    elif not one_read:
        sequences.propagate_rows = _rows_separate_reads
    if not one_read:
        sequences.sampled_head_losses = _heads_separate_reads
    try:
        yield
    finally:
        sequences.propagate_rows, sequences.sampled_head_losses = saved


def time_steps(split, graphs, *, dim: int, negatives: Optional[int], graph_layer: str = "rows, one read",
               fused: bool = True, encoder: str = "packed", steps: int, batch_size: int = 256, seed: int = 0
               ) -> Dict[str, float]:
    """Median seconds per step and the last loss of one variant (see the module docstring)."""
    platform = int(np.argmax([len(rows) for rows in split.platforms]))
    rows = np.asarray(split.platforms[platform])
    na, nb = split.num_items_a, split.num_items_b
    with _graph_layer(graph_layer), _encoder(encoder):
        torch.manual_seed(seed)
        model = model_module.FedCSRModel(na, nb, model_module.FedCSRConfig(dim=dim, sampled_negatives=negatives),
                                         graphs[platform])
        target = model_module.frozen_copy(model)
        optimizer = adam(model.parameters(), lr=1e-3) if fused else torch.optim.Adam(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(seed)
        order = rows[rng.permutation(rows.size)]
        seconds, loss = [], float("nan")
        for step in range(steps + 1):                           # step 0 warms up
            chosen = order[(step * batch_size) % max(rows.size - batch_size, 1):][:batch_size]
            batch = sequences.make_batch(split.train, na, nb, model.config.maxlen, rows=chosen)
            started = time.perf_counter()
            value, _ = model_module.fedcsr_loss(model, batch, global_model=target, rng=rng)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            if step:
                seconds.append(time.perf_counter() - started)
            loss = float(value.detach())
    return {"s_per_step": statistics.median(seconds), "last_loss": loss}


#: (key, graph layer, fused Adam?, sampled softmax?, encoder layout) of every timed variant, slowest first
VARIANTS = (
    ("full_graph_sampled", "full graph", False, True, "padded, torch dropout"),
    ("separate_reads_sampled", "rows, separate reads", False, True, "padded, torch dropout"),
    ("one_read_sampled", "rows, one read", False, True, "padded, torch dropout"),
    ("padded_torch_dropout_sampled", "rows, one read", True, True, "padded, torch dropout"),
    ("padded_sampled", "rows, one read", True, True, "padded"),
    ("default_sampled", "rows, one read", True, True, "packed"),
    ("default_full_softmax", "rows, one read", True, False, "packed"),
)


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
    for key, graph_layer, fused, sampled, encoder in VARIANTS:
        negatives = args.negatives if sampled else None
        timing = time_steps(split, graphs, dim=args.dim, negatives=negatives, graph_layer=graph_layer, fused=fused,
                            encoder=encoder, steps=args.steps)
        result[f"{key}_s_per_step"] = timing["s_per_step"]
        result[f"{key}_last_loss"] = timing["last_loss"]
        rows.append((graph_layer, encoder, "fused" if fused else "default", f"sampled ({negatives})" if negatives
                     else "full softmax", timing["s_per_step"], timing["last_loss"]))
    result["speedup_over_full_graph"] = result["full_graph_sampled_s_per_step"] / result["default_sampled_s_per_step"]
    result["speedup_over_separate_reads"] = (result["separate_reads_sampled_s_per_step"]
                                             / result["default_sampled_s_per_step"])
    result["speedup_over_padded_torch_dropout"] = (result["padded_torch_dropout_sampled_s_per_step"]
                                                   / result["default_sampled_s_per_step"])
    if not args.json_only:
        print(f"FedCSR step on {args.dataset} (largest platform), n = {args.dim}, batch 256, {args.threads} thread(s)")
        print(f"{'graph layer and reads':<22} {'encoder':<22} {'Adam':<8} {'loss':<16} {'s/step':>8} {'last loss':>10}")
        for graph_layer, encoder, optimiser, loss, seconds, last in rows:
            print(f"{graph_layer:<22} {encoder:<22} {optimiser:<8} {loss:<16} {seconds:8.3f} {last:10.4f}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
