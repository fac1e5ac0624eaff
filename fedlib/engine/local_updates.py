"""What both executors share: the round's result type and the small helpers of a local update.

:class:`LocalUpdateResult` is what the server receives from one round of local updates,
whichever executor ran them (:mod:`fedlib.engine.executors` for the sequential reference,
:mod:`fedlib.engine.batched` for the batched one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import RoundPlan, round_noise_key
from fedlib.engine.uploads import ClientRowUpdates

__all__ = ["LocalUpdateResult", "MAX_CLIENT_UPDATE_VALUES"]


#: Default cap on the values returned by ``return_client_updates`` (2^28 values: 1 GiB in
#: float32). Full-support noise makes every client send every row: ``C × I × d`` values.
MAX_CLIENT_UPDATE_VALUES = 1 << 28


@dataclass
class LocalUpdateResult:
    """What the server receives from one round of local updates.

    Attributes:
        update: ``name -> Σ_c w_c (Δ_c + noise_c)`` for every public tensor (global shapes).
        client_losses: ``(C,)`` each client's local loss, averaged over its steps (before
            each step), in the order of ``plan.clients``.
        client_updates: with ``return_client_updates=True``, ``name ->``
            :class:`~fedlib.engine.uploads.ClientRowUpdates` for every ``public_rows``
            tensor: each client's own uploaded row changes (noise included); else ``None``.
    """

    update: Dict[str, torch.Tensor]
    client_losses: torch.Tensor
    client_updates: Optional[Dict[str, ClientRowUpdates]] = None


def _state_like(global_state, private_state):
    ref = next(iter({**global_state, **private_state}.values()))
    return ref.device, ref.dtype


def _zero_update(method: FederatedMethod, global_state) -> Dict[str, torch.Tensor]:
    return {name: torch.zeros_like(global_state[name]) for name in method.model.public_names}


def _check_client_update_size(method: FederatedMethod, global_state, plan: RoundPlan, limit: Optional[int]) -> None:
    """Refuse a ``return_client_updates`` request whose rows would not fit the cap."""
    if limit is None:
        return
    model = method.model
    every_row = {name: method.uploads_every_row(name) for name in model.names("public_rows")}
    full = any(every_row.values())
    touched = 0 if all(every_row.values()) else int(plan.touched_row_counts(model.num_items).sum())
    values = sum((plan.num_clients * model.num_items if all_rows else touched)
                 * (global_state[name].numel() // max(global_state[name].shape[0], 1))
                 for name, all_rows in every_row.items())
    if values > limit:
        why = f" (with full-support noise every client sends all {model.num_items} rows)" if full else ""
        raise ValueError(
            f"return_client_updates would hold {values:,} values, more than max_client_update_values={limit:,}"
            f"{why}. Inspect fewer clients (plan.subset(...) or clients_per_round) or raise the cap.")


def _noise_key(plan: RoundPlan, noise_seed: Optional[int]) -> int:
    """The round's upload-noise key: from ``(noise_seed, round)`` when a seed is given, else the plan's."""
    return plan.noise_key if noise_seed is None else round_noise_key(noise_seed, plan.round_index)


def _local_step_index(method: FederatedMethod, batch: int, group_index: int) -> int:
    """``k`` of the ``group_index``-th update step on the client's ``batch``-th batch (stream ``1 + k``)."""
    return batch * len(method.steps) + group_index
