"""How long does one LightGCN propagation take, forward and backward? COO vs symmetric CSR.

Every training step of a server-side or centralised LightGCN (FedKDRec's LightGCN backbone,
FedPCL-CDR, GA-CDR, CL-DTCDR) propagates the embeddings of all ``U + I`` nodes through the
normalised adjacency ``Â`` three times and back-propagates through it. Three paths, each from
the same embeddings, with the same loss:

* ``coo``: ``torch.sparse.mm`` on the coalesced COO matrix (its backward builds ``Âᵀ`` at every
  call: a transpose and a re-sort of the indices);
* ``csr``: ``torch.sparse.mm`` on the CSR matrix (its backward still transposes);
* ``symmetric``: :func:`fedlib.models.lightgcn.symmetric_spmm`, whose backward is ``Â G``
  because ``Â`` is symmetric (fedlib's default on these graphs).

The graph is ML-100K's training graph (leave-one-out, FedKDRec's protocol) or, with
``--dataset synthetic``, random interactions. Prints a table, then one JSON line (the last
line): the median over ``--repeats`` timed repetitions (after one warm-up), and the largest
difference of the outputs and the gradients from the ``coo`` path.

    python benchmarks/graph_propagation.py [--dataset ML-100K] [--dim 32] [--layers 3] [--repeats 20] [--json-only]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from fedlib.data.splits import Pairs
from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency

PATHS = ("coo", "csr", "symmetric")


def _graph(dataset: str):
    """``(pairs, num_users, num_items)`` of the benchmark graph."""
    if dataset == "synthetic":
        rng = np.random.default_rng(0)
        num_users, num_items = 300, 500
        users = rng.integers(0, num_users, 6000)
        return Pairs.from_arrays(users, rng.integers(0, num_items, 6000), num_users), num_users, num_items
    from fedlib.papers.fedkdrec.experiment import load_split

    split = load_split(dataset)
    return split.train, split.num_users, split.num_items


def time_path(adjacency: torch.Tensor, symmetric: bool, user_emb: torch.Tensor, item_emb: torch.Tensor,
              weights: torch.Tensor, layers: int, repeats: int):
    """Median seconds of one forward + backward, and the last outputs and gradients."""
    seconds = []
    for repeat in range(repeats + 1):
        users, items = user_emb.detach().requires_grad_(), item_emb.detach().requires_grad_()
        started = time.perf_counter()
        out_users, out_items = lightgcn_propagate(adjacency, users, items, layers, symmetric=symmetric)
        out = torch.cat([out_users, out_items])  # (U + I, d)
        (out * weights).sum().backward()
        if repeat:  # the first is a warm-up
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), out.detach(), users.grad, items.grad


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="ML-100K", help="ML-100K (needs FEDLIB_DATA) or synthetic")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    for name in ("dim", "layers", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    pairs, num_users, num_items = _graph(args.dataset)
    coo = normalized_adjacency(pairs, num_users, num_items)
    with warnings.catch_warnings():  # torch calls its CSR support "beta"
        warnings.simplefilter("ignore", UserWarning)
        csr = coo.to_sparse_csr()
    g = torch.Generator().manual_seed(0)
    user_emb = 0.1 * torch.randn(num_users, args.dim, generator=g)
    item_emb = 0.1 * torch.randn(num_items, args.dim, generator=g)
    weights = torch.randn(num_users + num_items, args.dim, generator=g)  # a loss that weighs every output
    runs = {path: time_path(coo if path == "coo" else csr, path == "symmetric", user_emb, item_emb, weights,
                            args.layers, args.repeats) for path in PATHS}
    reference = runs["coo"]
    result: Dict[str, float] = {"dataset": args.dataset, "nonzeros": int(coo._nnz()), "dim": args.dim,
                                "layers": args.layers, "threads": torch.get_num_threads()}
    for path, run in runs.items():
        result[f"{path}_ms"] = 1000 * run[0]
        result[f"{path}_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(run[1:], reference[1:]))
    result["symmetric_speedup_vs_coo"] = result["coo_ms"] / result["symmetric_ms"]
    if not args.json_only:
        print(f"{args.dataset}: {result['nonzeros']:,} non-zeros, d = {args.dim}, {args.layers} layers, "
              f"{result['threads']} thread(s); forward + backward, median of {args.repeats}")
        for path in PATHS:
            print(f"  {path:<10} {result[f'{path}_ms']:8.2f} ms   max |diff| vs coo {result[f'{path}_max_diff']:.1e}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
