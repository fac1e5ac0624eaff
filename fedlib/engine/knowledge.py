"""Global knowledge: the server's unweighted mean of the clients' personal item tables.

A method whose clients each keep a personal item table ``P_u (I, d)`` (never aggregated by
the engine) can still share what they learned through the mean of the uploaded tables,
``P_g = 1/|S| Σ_{u ∈ S} P_u``. FedRKG guides every table toward it
(:mod:`fedlib.papers.fedrkg.guidance`, §4.2) and CoFedRec clusters its items on it
(:mod:`fedlib.baselines.single_domain.cofedrec`); both read the participants of the previous round's plan
(:func:`fedlib.engine.plan.guidance_participants`). It lives here, below both, so that
neither imports the other.
"""
from __future__ import annotations

import torch

__all__ = ["global_knowledge", "check_user_ids"]


def check_user_ids(users, num_users: int, what: str = "users") -> torch.Tensor:
    """``users`` as a 1-D ``int64`` tensor of ids in ``[0, num_users)``; a clear error otherwise."""
    users = torch.as_tensor(users, dtype=torch.int64)
    if users.dim() != 1:
        raise ValueError(f"{what} must be a 1-D tensor of user ids, got shape {tuple(users.shape)}")
    if users.numel() and (int(users.min()) < 0 or int(users.max()) >= num_users):
        raise ValueError(f"{what} must be user ids in [0, {num_users}), got ids from {int(users.min())} "
                         f"to {int(users.max())}")
    return users


def global_knowledge(personal_tables: torch.Tensor, participants=None, chunk_size: int = 256) -> torch.Tensor:
    """``P_g = 1/|S| Σ_{u ∈ S} P_u``: the server's unweighted mean of the uploaded tables (FedRKG §4.2).

    Unweighted, as FedRKG's code's ``aggregate_item_emb`` (every participant counts once,
    whatever its number of interactions).

    Args:
        personal_tables: ``(U, I, d)`` every user's table.
        participants: ``(S,)`` distinct user ids that upload (``None`` = every user).
        chunk_size: users summed at a time, so no ``(S, I, d)`` copy is made (ML-1M's tables
            alone are 2.9 GB).

    Returns:
        ``(I, d)``.
    """
    if personal_tables.dim() != 3:
        raise ValueError(f"personal tables must be (U, I, d), got shape {tuple(personal_tables.shape)}")
    num_users = personal_tables.shape[0]
    if participants is None:
        participants = torch.arange(num_users)
    idx = check_user_ids(participants, num_users, "participants").to(personal_tables.device)
    if idx.numel() == 0:
        raise ValueError("participants is empty: P_g needs at least one uploaded table (pass None for every user)")
    if torch.unique(idx).numel() != idx.numel():
        raise ValueError("participants contains duplicate user ids: each participant uploads its table once")
    total = torch.zeros(personal_tables.shape[1:], dtype=personal_tables.dtype, device=personal_tables.device)
    for start in range(0, idx.numel(), max(1, int(chunk_size))):
        chunk = idx[start:start + chunk_size]
        first, last = int(chunk[0]), int(chunk[-1])
        consecutive = last - first + 1 == chunk.numel() and bool((chunk[1:] > chunk[:-1]).all())
        if consecutive:  # the same rows in the same order: a view instead of a gathered copy (bit-identical sum)
            total += personal_tables[first:last + 1].sum(0)
        else:
            total += personal_tables[chunk].sum(0)
    return total / idx.numel()
