"""What does keeping freed memory (:func:`fedlib.device.keep_freed_memory`) save on a training step?

FedPCL-CDR (like GA-CDR, CL-DTCDR and the LightGCN baselines) propagates every node of its
domain's graph three times per mini-batch and back again, and each product allocates a few-MB
output. This benchmark trains FedPCL-CDR local epochs on the first domain of ``--task``, one
thread, in a fresh process per allocator setting:

* ``default``: glibc's own thresholds (``FEDLIB_KEEP_FREED_MEMORY=0``): big blocks are mapped
  and unmapped around every use, so each step page-faults its memory in again;
* ``keep``: what fedlib applies at import (:data:`fedlib.device.ALLOCATOR_SETTINGS`).

It also times one CSR product (``Â X``, the propagation's kernel) on the same graph. Both
settings must end with the same parameters, bit for bit (a checksum of the trained parameters
is compared). Prints a table, then one JSON line (the last line).

    python benchmarks/allocator.py [--task Phone-Sport] [--epochs 3] [--json-only]

``--task synthetic`` needs no data (its graph is small, so there is little to save).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, Optional, Sequence

SETTINGS = ("default", "keep")


def measure(task: str, epochs: int) -> Dict[str, float]:
    """In this process: seconds of each local epoch, of one CSR product, and a parameter checksum."""
    import numpy as np
    import torch

    import fedlib.papers.fedpcl_cdr.experiment as experiment
    import fedlib.papers.fedpcl_cdr.method as method
    from fedlib.data.sampling import NegativeSampler

    torch.set_num_threads(1)
    split, _ = experiment.load_task(task, None, 99, 0)
    part = split[split.domains[0]]
    config = method.FedPCLConfig()
    model = method.DomainModel(part, config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    domain = method._Domain(split.domains[0], part, model, optimizer, NegativeSampler(part.train, part.num_items))
    rng = np.random.default_rng(0)
    epoch_seconds = []
    for _ in range(epochs):
        started = time.perf_counter()
        method._local_update(domain, config, rng, torch.device("cpu"))
        epoch_seconds.append(time.perf_counter() - started)
    dense = torch.randn(model.adjacency.shape[0], config.dim, generator=torch.Generator().manual_seed(0))
    product_seconds = []
    for _ in range(21):
        started = time.perf_counter()
        model.adjacency @ dense
        product_seconds.append(time.perf_counter() - started)
    checksum = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
    return {"epoch_s": statistics.median(epoch_seconds), "product_ms": 1000 * statistics.median(product_seconds[1:]),
            "checksum": checksum, "nodes": int(model.adjacency.shape[0]), "nonzeros": int(model.adjacency._nnz()),
            "steps": int(np.ceil(len(part.train) / config.batch_size))}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="Phone-Sport", help="a FedPCL-CDR task (needs FEDLIB_DATA) or synthetic")
    parser.add_argument("--epochs", type=int, default=3, help="local epochs per setting (the median is reported)")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.child:  # one setting, in the process the parent started with its environment
        print(json.dumps(measure(args.task, args.epochs)))
        return {}
    rows = {}
    for allocator in SETTINGS:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDLIB_KEEP_FREED_MEMORY": "1" if allocator == "keep" else "0"}
        done = subprocess.run([sys.executable, __file__, "--task", args.task, "--epochs", str(args.epochs), "--child"],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {allocator} run failed:\n{done.stderr[-2000:]}")
        rows[allocator] = json.loads(done.stdout.strip().splitlines()[-1])
    checksums = {row["checksum"] for row in rows.values()}
    first = next(iter(rows.values()))
    result: Dict[str, object] = {"task": args.task, "nodes": first["nodes"], "nonzeros": first["nonzeros"],
                                 "steps_per_epoch": first["steps"], "same_parameters": len(checksums) == 1}
    for name, row in rows.items():
        result[f"{name}/epoch_s"], result[f"{name}/product_ms"] = row["epoch_s"], row["product_ms"]
    result["epoch_speedup"] = rows["default"]["epoch_s"] / rows["keep"]["epoch_s"]
    if not args.json_only:
        print(f"{args.task}: first domain, {first['nodes']:,} nodes, {first['nonzeros']:,} non-zeros, "
              f"{first['steps']} steps per local epoch, one thread; median of {args.epochs} epochs")
        print(f"  {'allocator':<10} {'epoch (s)':>10} {'CSR product (ms)':>17}")
        for name, row in rows.items():
            print(f"  {name:<10} {row['epoch_s']:10.2f} {row['product_ms']:17.2f}")
        print(f"  same trained parameters in both settings: {result['same_parameters']}")
    print(json.dumps(result))
    if not result["same_parameters"]:
        raise SystemExit(f"the settings trained different parameters (checksums {sorted(checksums)})")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
