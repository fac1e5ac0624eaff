"""Server aggregation (FedAvg and its variants) and server-side mixing hooks.

FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629) replaces every public tensor by a
weighted mean of the clients' uploaded copies. Writing each upload as the downloaded global
tensor plus a delta, ``θ' = Σ_c w_c θ_c = θ + Σ_c w_c Δ_c`` when ``Σ_c w_c = 1``: rows a client
did not touch contribute a zero delta. The executors therefore accumulate
``Σ_c w_c Δ_c`` as uploads arrive (scatter-added into the table for row parameters), and
:meth:`Aggregation.apply` adds it to the global state.

Which weighting each paper uses (in its public code; citations in ``docs/papers.md``):

==============  ==========================================================================
paper           aggregation
==============  ==========================================================================
F3CRec          uniform mean of the **full** item tables uploaded by all participants
                (``weighting="uniform"``), then the item-wise temporal mean with the
                previous block's table (a ``server_mix`` hook)
FedRKG          nothing in normal rounds; every 100 rounds the unweighted mean of the
                participants' personal tables becomes the guidance ``P_g``
PFedRec         uniform mean of the participants' item tables
FedNCF          FedAvg of item embeddings + MLP, weighted by sample count in the original
                FedAvg (``weighting="num_examples"``)
FedCSR          weighted FedAvg of all weights by data size (``"num_examples"``)
FedPCL-CDR      no parameter averaging (prototypes); FedKDRec/PTF: prediction transfer
==============  ==========================================================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Mapping

import numpy as np
import torch

__all__ = ["Aggregation", "client_weights", "fedavg", "ServerMixFn", "interpolate_with_previous"]

WEIGHTINGS = ("uniform", "num_examples")


def client_weights(num_examples: np.ndarray, weighting: str = "uniform") -> np.ndarray:
    """``(C,) float64`` aggregation weights summing to 1.

    ``"uniform"``: ``1 / C`` (every participant counts once). ``"num_examples"``:
    ``n_c / Σ n`` (FedAvg proper, weighted by local sample count).
    """
    num_examples = np.asarray(num_examples, dtype=np.float64)
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if num_examples.size == 0:
        return num_examples
    if weighting == "uniform":
        return np.full(num_examples.size, 1.0 / num_examples.size)
    total = num_examples.sum()
    if total <= 0:
        raise ValueError("num_examples weighting needs at least one example")
    return num_examples / total


def fedavg(global_state: Mapping[str, torch.Tensor], client_deltas: Mapping[str, torch.Tensor], weights) -> Dict[str, torch.Tensor]:
    """Reference FedAvg on explicit per-client deltas: ``θ + Σ_c w_c Δ_c``.

    ``client_deltas[name]`` is ``(C, *shape)``; ``weights`` is ``(C,)``. The executors compute
    the same sum incrementally instead of materialising ``(C, num_items, d)``.
    """
    out = {}
    for name, theta in global_state.items():
        w = torch.as_tensor(np.asarray(weights), dtype=theta.dtype, device=theta.device)
        out[name] = theta + torch.tensordot(w, client_deltas[name].to(theta.dtype), dims=1)
    return out


ServerMixFn = Callable[[Mapping[str, torch.Tensor], Dict[str, torch.Tensor], int], Dict[str, torch.Tensor]]
"""``(previous_global, aggregated_global, round_index) -> new_global``: mixing the freshly
aggregated state with earlier global state on the server (F3CRec's item-wise temporal mean,
FedRKG's guidance). Must not modify ``previous_global``."""


def interpolate_with_previous(anchor: Mapping[str, torch.Tensor], beta: float) -> ServerMixFn:
    """Simplest mixing hook: ``θ ← (1 − β) θ' + β θ_anchor`` for every tensor in ``anchor``.

    (F3CRec replaces the constant β by an item-wise ``γ_i``; that hook lives with the method.)
    """
    def mix(previous, aggregated, round_index):
        return {k: ((1 - beta) * v + beta * anchor[k]) if k in anchor else v for k, v in aggregated.items()}
    return mix


@dataclass(frozen=True)
class Aggregation:
    """How the server combines uploads: the weighting of FedAvg.

    Attributes:
        weighting: ``"uniform"`` (F3CRec, PFedRec) or ``"num_examples"`` (FedAvg proper).
    """

    weighting: str = "uniform"

    def client_weights(self, num_examples: np.ndarray) -> np.ndarray:
        return client_weights(num_examples, self.weighting)

    def apply(self, global_state: Mapping[str, torch.Tensor], weighted_update: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``θ + Σ_c w_c Δ_c`` for every public tensor (a new dict; inputs untouched)."""
        return {name: theta + weighted_update[name] if name in weighted_update else theta.clone()
                for name, theta in global_state.items()}
