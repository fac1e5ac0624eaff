"""The contract between a backbone and the federated engine.

A federated backbone says, for every parameter, **who holds it** and **how it is indexed**
(:data:`PARAM_KINDS`), and computes logits for many clients at once. The engine never
needs to know more than that to simulate clients, so one backbone definition serves the
readable sequential executor (one client, ``C = 1``) and the batched executor (``C``
clients at once) alike.

Parameter kinds:

* ``"public_rows"``  item-indexed table held by the server, e.g. the item embeddings
  ``(num_items, d)``. A client downloads it, changes the rows it trains on, and uploads the
  difference.
* ``"public_dense"`` any other public tensor, e.g. a shared MLP (FedNCF). Every client
  trains its own copy.
* ``"private_dense"`` one tensor per user, stored stacked ``(num_users, ...)``, e.g. the
  user vector ``p_u`` (FedMF) or a private score head (PFedRec). Never uploaded.
* ``"private_rows"`` one item-indexed table per user, stored ``(num_users, num_items, d)``,
  e.g. FedRKG's personal item table. Never uploaded (except by methods that say so).

What :meth:`FederatedModel.logits` receives (``params``):

* dense parameters (public and private) with a leading client axis: ``(C, ...)``;
* row parameters as a table ``(R, d)`` that ``rows`` indexes: the full table in the
  sequential executor (``R = num_items``, ``rows`` = item ids), or the stacked local copies of
  the rows the ``C`` clients touch in the batched executor (``rows`` = local row ids). All row
  parameters of a model share the same ``rows`` index.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Sequence

import torch

__all__ = [
    "PARAM_KINDS",
    "GlobalState",
    "PrivateState",
    "FederatedModel",
    "normal_",
    "uniform_",
    "torch_linear_init",
    "per_user_mlp_init",
]

PARAM_KINDS = ("public_rows", "public_dense", "private_rows", "private_dense")

GlobalState = Dict[str, torch.Tensor]
"""Public parameters, the server's copy: name -> tensor (``(num_items, d)`` for row tables)."""

PrivateState = Dict[str, torch.Tensor]
"""Private parameters of every user, stacked: name -> ``(num_users, ...)`` tensor."""


class FederatedModel:
    """Base class of federated backbones (see the module docstring for the conventions).

    Subclasses set :attr:`param_kinds` and implement :meth:`init_global`,
    :meth:`init_private`, :meth:`logits` and :meth:`score_users`.
    """

    #: name -> one of :data:`PARAM_KINDS`
    param_kinds: Mapping[str, str] = {}
    num_users: int
    num_items: int

    # -- parameter roles ------------------------------------------------------------
    def names(self, *kinds: str) -> tuple:
        """Parameter names of the given kinds, in declaration order."""
        return tuple(n for n, k in self.param_kinds.items() if k in kinds)

    @property
    def row_names(self) -> tuple:
        return self.names("public_rows", "private_rows")

    @property
    def public_names(self) -> tuple:
        return self.names("public_rows", "public_dense")

    @property
    def private_names(self) -> tuple:
        return self.names("private_rows", "private_dense")

    # -- to implement ------------------------------------------------------------------
    def init_global(self, generator: torch.Generator, dtype=torch.float32, device="cpu") -> GlobalState:
        raise NotImplementedError

    def init_private(self, generator: torch.Generator, dtype=torch.float32, device="cpu") -> PrivateState:
        raise NotImplementedError

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """``(C, B)`` logits of ``C`` clients for ``B`` examples each (``rows``: ``(C, B)``)."""
        raise NotImplementedError

    def score_users(self, global_state: GlobalState, private_state: PrivateState, users: torch.Tensor) -> torch.Tensor:
        """``(n, num_items)`` logits of every item for ``users`` (``(n,)`` ids), for evaluation."""
        raise NotImplementedError


# -- initialisers (explicit generator, no global RNG) ------------------------------------
def consecutive_runs(users: torch.Tensor):
    """``[(position, first_user, length), ...]``: the runs of consecutive ids in ``users`` ``(n,)``.

    Evaluation scores users in ascending chunks, so ``table.narrow(0, first, length)`` can
    read a run of per-user rows as a view instead of an ``(n, I, d)`` gathered copy.
    """
    ids = users.detach().to("cpu", torch.int64)
    if ids.numel() == 0:
        return []
    breaks = (torch.nonzero(ids[1:] != ids[:-1] + 1).flatten() + 1).tolist()
    starts = [0] + breaks
    ends = breaks + [ids.numel()]
    return [(a, int(ids[a]), b - a) for a, b in zip(starts, ends)]


def normal_(shape: Sequence[int], std: float, generator: torch.Generator, dtype, device) -> torch.Tensor:
    """``N(0, std²)`` tensor drawn on the CPU from ``generator`` (same numbers on any device)."""
    out = torch.empty(tuple(shape), dtype=torch.float64).normal_(0.0, std, generator=generator)
    return out.to(dtype=dtype, device=device)


def uniform_(shape: Sequence[int], bound: float, generator: torch.Generator, dtype, device) -> torch.Tensor:
    """``U(-bound, bound)`` tensor drawn on the CPU from ``generator``."""
    out = torch.empty(tuple(shape), dtype=torch.float64).uniform_(-bound, bound, generator=generator)
    return out.to(dtype=dtype, device=device)


def torch_linear_init(fan_in: int, fan_out: int, generator, dtype, device):
    """``nn.Linear``'s default init: weight and bias ``U(±1/sqrt(fan_in))``. Returns ``(W (out,in), b (out,))``."""
    bound = 1.0 / math.sqrt(fan_in)
    return (
        uniform_((fan_out, fan_in), bound, generator, dtype, device),
        uniform_((fan_out,), bound, generator, dtype, device),
    )


def per_user_mlp_init(num_users: int, fan_in: int, hidden: Sequence[int], generator, dtype, device
                      ) -> Dict[str, torch.Tensor]:
    """An MLP tower with a one-logit head, ``nn.Linear``-initialised once and copied to every user.

    Layers are drawn in order (``mlp0``, ``mlp1``, ..., then the head) from ``generator``, so
    a model that draws its tables first and then calls this keeps its initial values.

    Returns:
        ``mlp<k>_w (U, out, in)``, ``mlp<k>_b (U, out)`` for each hidden width, ``head_w (U, h)``
        and ``head_b (U,)``, where ``h`` is the last hidden width (``fan_in`` without hidden layers).
    """
    out: Dict[str, torch.Tensor] = {}
    for k, width in enumerate(hidden):
        weight, bias = torch_linear_init(fan_in, width, generator, dtype, device)
        out[f"mlp{k}_w"] = weight.unsqueeze(0).repeat(num_users, 1, 1)  # (U, out, in)
        out[f"mlp{k}_b"] = bias.unsqueeze(0).repeat(num_users, 1)  # (U, out)
        fan_in = width
    weight, bias = torch_linear_init(fan_in, 1, generator, dtype, device)
    out["head_w"] = weight[0].expand(num_users, -1).clone()  # (U, h)
    out["head_b"] = bias.expand(num_users).clone()  # (U,)
    return out
