"""An 8-cell grid in this process and on a Dask LocalCluster of 2 one-thread workers: wall time of each.

The same eight real cells (F3CRec with the PFedRec backbone on ML-100K, eight unrecorded seeds,
about 30 s per cell on one core; the recorded ones took 27-67 s) are trained twice, each time from an empty
temporary results folder and cache, first in this process (one torch thread), then with
``cluster=Cluster(local_workers=2)``: what ``python -m fedlib grid ... --local-cluster 2`` does.
The cluster's wall time includes starting and closing it. The records of the two runs must
agree (the script checks it), so the speed-up is for the same work.

Run it on a quiet machine (nothing else on the cores): with other processes the two workers
compete with them, not with each other::

    python benchmarks/cluster_speed.py            # prints both wall times and a JSON line with "speedup"
    python benchmarks/cluster_speed.py --workers 4

Needs the cluster extra (``pip install -e ".[cluster]"``) and ML-100K in the data root.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def cells(seeds):
    """F3CRec with the PFedRec backbone on ML-100K, one cell per seed (these seeds have no record)."""
    from fedlib.papers.f3crec import experiment as f3crec

    return [f3crec.cell("ML-100K", "PFedRec", "F3CRec", seed=seed) for seed in seeds]


def timed_grid(root: Path, cluster) -> dict:
    """Train the cells into ``root/results`` with ``root/cache``; ``{"wall_s", "records"}``."""
    from fedlib.papers.f3crec import experiment as f3crec

    os.environ["FEDLIB_RESULTS_DIR"] = str(root / "results")
    grid_cells = cells(range(1000, 1008))
    started = time.perf_counter()
    # the smoke profile: the same cells and grid, records that may come from work in progress
    f3crec.run_grid(grid_cells, "smoke", cache_dir=root / "cache", progress=False, cluster=cluster)
    wall = time.perf_counter() - started
    lines = (root / "results" / "f3crec" / "smoke" / "runs.jsonl").read_text().splitlines()
    return {"wall_s": wall, "records": [json.loads(line) for line in lines]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    from fedlib.experiments.grid import Cluster

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        alone = timed_grid(scratch / "in_process", None)
        print(f"in this process:          {alone['wall_s']:.1f} s", flush=True)
        spread = timed_grid(scratch / "cluster", Cluster(local_workers=args.workers))
        print(f"LocalCluster of {args.workers} workers: {spread['wall_s']:.1f} s (start and close included)", flush=True)
    def comparable(record):  # the metrics without their timings ("seconds", "seconds/D1", ...)
        return record["config_hash"], {k: v for k, v in record["metrics"].items() if "seconds" not in k}

    same = sorted(map(comparable, alone["records"]), key=lambda r: r[0]) == \
        sorted(map(comparable, spread["records"]), key=lambda r: r[0])
    result = {"cells": len(alone["records"]), "workers": args.workers, "in_process_s": alone["wall_s"],
              "cluster_s": spread["wall_s"], "speedup": alone["wall_s"] / spread["wall_s"], "same_metrics": same,
              "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0]}
    print(f"speed-up {result['speedup']:.2f}x; the records agree: {same}")
    print(json.dumps(result))
    if not same:
        raise SystemExit("the cluster's records differ from this process's: the speed-up is not for the same work")
    return result


if __name__ == "__main__":
    main()
