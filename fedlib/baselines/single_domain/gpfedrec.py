r"""GPFedRec: a server-side user-relation graph turns uploaded item tables into personalised ones.

Reference:
    Zhang, Long, Zhou, Zhang, Yan, Yang. "GPFedRec: Graph-Guided Personalization for
    Federated Recommendation." KDD 2024. arXiv:2305.07866. Public code ``Zhangcx19/GPFedRec``
    (``engine.py``, ``utils.py``, ``mlp.py``, ``train.py``). FedRKG (Lim et al.,
    arXiv:2511.12959, Table 1, Appendix
    C.2) runs it as a single-knowledge baseline with a 4-layer MLP ``64 → 32 → 16 → 8 → 1``
    and "neighborhood similarity threshold 0.5" (most plausibly the code's
    ``--neighborhood_threshold``, the multiplier of the mean below: ``threshold_scale=0.5``).

Notation: ``U`` users, ``I`` items, ``d`` dimensions; ``q_u (I, d)`` the item table user
``u`` trained locally and uploads, ``x_u = vec(q_u) ∈ R^{I·d}``; ``S`` the participants::

    S_uv  = cos(x_u, x_v) = x_uᵀ x_v / (‖x_u‖ ‖x_v‖)                    user-relation graph
    τ     = κ · mean_{u, v} S_uv          κ = threshold_scale (1.0); all |S|² entries, diagonal included
    N(u)  = {v : S_uv > τ}                  neighbours; u is its own neighbour when S_uu = 1 > τ
    A_uv  = 1/|N(u)| for v ∈ N(u), else 0   and A_uu = 1 if N(u) = ∅ (every row of A sums to 1)
    r_u   = Σ_v (A^L)_uv q_v              L = layers (1)                personalised table (1-layer GCN)
    q_g   = 1/|S| Σ_u r_u                                               global table (degree-weighted mean)

Client ``u`` in the next round: downloads ``q_g`` as its starting item table, keeps its private
user vector and MLP, and minimises::

    L_u   = BCE(ŷ, y) + reg · ‖q_u − r_u‖²_F / (I · d)                  reg = 1.0
    ŷ_ui  = σ(MLP_u([p_u ; q_u[i]]))                                    ReLU MLP 2d → 32 → 16 → 8 → 1

Evaluation scores with each user's locally trained ``q_u`` (as the code does).

**The code's similarity is a distance.** ``utils.py`` builds the graph with sklearn's
``pairwise_distances(metric='cosine')``, which returns ``1 − cos`` (clipped to ``[0, 2]``,
zero diagonal), and then treats it as a similarity: users whose distance is *above* the mean
become neighbours, i.e. each user averages the tables of the users **least** similar to it,
and never its own. ``similarity="cosine"`` (default) implements the paper's description;
``similarity="cosine_distance_as_in_code"`` reproduces the code.

Learning rates of the code: MLP ``lr`` (0.1), user vector ``lr · lr_eta / client_fraction − lr``,
item table ``lr · I · lr_eta − lr`` (``lr_eta`` 80), all stepped together on one loss;
batch 256, one local epoch, every user every round.

How it maps onto the engine (gaps and workarounds):

* **Uploads.** The server needs every participant's own table, not only their mean, which
  is all the engine's aggregation returns. So ``q_u`` is a ``private_rows`` table
  (``item_emb``, ``(U, I, d)``) that *is* the client's local copy, and the server step runs
  in the ``before_round`` hook (:class:`GraphGuidedServer`): at the start of round ``t`` it
  reads the tables trained in round ``t − 1``, builds the graph, writes ``r_u`` and
  broadcasts ``q_g`` into every client's table (the download). Participants of ``t − 1`` are
  the users whose table differs from the previous broadcast, so users without training data
  never enter the graph. The communication ledger sees no public tensor: it counts nothing
  for GPFedRec (each participant really uploads ``I × d`` numbers and downloads ``q_g`` and ``r_u``).
* **The personalised table** ``r_u`` must reach the loss row by row, and the engine has no
  kind for a per-user buffer: it is a second ``private_rows`` table (``target_item_emb``)
  with learning rate 0 that no update step trains.
* **A whole-table regulariser.** A client loss only sees the rows of its current batch.
  ``reg_rows="table"`` (default, as the code) adds every item to every local step as a
  *context* example (label :data:`CONTEXT_LABEL`, no BCE) through the project's
  :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor`, so the regulariser is exactly
  the code's ``MSE`` over the whole table. Cost: every client touches all ``I`` rows in every
  step (what the code does too); use ``BatchedExecutor(chunk_size=...)`` to bound memory.
  :class:`GPFedRecExecutor` gives the same updates with the regulariser in closed form (one
  elementwise pull per step, autograd on the batch rows only); the FedRKG grid runs it.
  ``reg_rows="batch"`` regularises only the distinct rows of the batch (the same gradient on
  those rows, none elsewhere): cheaper, but rows a client never trains on stay at ``q_g``.
* **Client sampling.** The code indexes its arrays by user id and only runs with every user
  every round. Here sampled-out users are left out of the graph; their table is still reset
  to the broadcast ``q_g``, so they are evaluated with ``q_g`` instead of their last table.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.engine.method import FederatedMethod, LocalBatch, chain_hooks
from fedlib.engine.plan import RoundPlan
from fedlib.models.base import FederatedModel, normal_, per_user_mlp_init
from fedlib.baselines.single_domain.gpfedrec_graph import (  # the server's graph; re-exported as part of this module
    SIMILARITIES, _check_choice, _check_chunk, flatten_tables, user_similarity, neighbour_weights, message_passing,
    GraphAggregate, CERTIFICATE_MARGIN, AngleBound, angle_bound, complete_graph_threshold, rows_equal,
    graph_personalise, graph_personalise_reference,
)

__all__ = [
    "SIMILARITIES", "REG_ROWS", "CONTEXT_LABEL", "BROADCAST_KEY", "GRAPH_STATS_KEY", "GRAPH_LOG_KEY",
    "flatten_tables", "user_similarity", "neighbour_weights", "message_passing", "GraphAggregate",
    "graph_personalise", "graph_personalise_reference", "complete_graph_threshold", "angle_bound", "AngleBound",
    "CERTIFICATE_MARGIN", "rows_equal", "first_occurrence", "graph_regulariser",
    "add_table_context", "GPFedRecModel", "GPFedRecLoss", "GraphGuidedServer", "gpfedrec_method",
    "GPFedRecExecutor",
]

#: Rows the regulariser covers: the whole table (code) or the batch's distinct rows.
REG_ROWS = ("table", "batch")
#: Label of a context example (a row added so the loss can regularise it; no BCE term).
CONTEXT_LABEL = -1.0
#: ``AveragingState.extra`` key of the last broadcast global table ``q_g`` ``(I, d)``.
BROADCAST_KEY = "gpfedrec_broadcast"
#: ``AveragingState.extra`` key of the last graph's summary (threshold, neighbours, participants).
GRAPH_STATS_KEY = "gpfedrec_graph"
#: ``AveragingState.extra`` key of every round's graph summary (a list, one entry per server step).
GRAPH_LOG_KEY = "gpfedrec_graph_log"


# ======================================================================================
# Client: the regulariser toward the personalised table
# ======================================================================================
def first_occurrence(items: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(C, B) bool``: True at the first real occurrence of each item in a client's batch.

    Used to count every row once, whatever the executor: in the batched executor's one-batch
    path a repeated item has one row slot per occurrence, elsewhere one per (client, item).
    """
    if items.shape != mask.shape:
        raise ValueError(f"items {tuple(items.shape)} and mask {tuple(mask.shape)} must both be (C, B)")
    key = torch.where(mask > 0, items, torch.full_like(items, -1))  # padding sorts first, as -1
    ordered, order = torch.sort(key, dim=1, stable=True)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first &= ordered >= 0
    return torch.zeros_like(first).scatter_(1, order, first)


def graph_regulariser(table_rows: torch.Tensor, target_rows: torch.Tensor, items: torch.Tensor, mask: torch.Tensor,
                      num_items: int) -> torch.Tensor:
    """``Σ_{distinct i in the batch} ‖q_u[i] − r_u[i]‖² / (I · d)`` per client: ``(C,)``.

    When the batch holds every item (``reg_rows="table"``) this is the code's
    ``MSELoss(q_u, r_u)`` over the whole table; otherwise it is that loss restricted to the
    batch's rows, with the same gradient ``2 (q_u[i] − r_u[i]) / (I d)`` on each of them.

    Args:
        table_rows: ``(C, B, d)`` the client's current rows ``q_u[i_b]``.
        target_rows: ``(C, B, d)`` the personalised rows ``r_u[i_b]`` (constants).
        items: ``(C, B)`` item ids (to count each row once).
        mask: ``(C, B)`` 1 for real entries.
        num_items: ``I``.
    """
    if table_rows.shape != target_rows.shape:
        raise ValueError(f"item rows {tuple(table_rows.shape)} and personalised rows {tuple(target_rows.shape)} "
                         "differ: gather both tables with the same (C, B) index (batch.rows)")
    if table_rows.dim() != 3 or table_rows.shape[:2] != items.shape:
        raise ValueError(f"rows must be (C, B, d) with (C, B) = items.shape {tuple(items.shape)}, "
                         f"got {tuple(table_rows.shape)}")
    present = first_occurrence(items, mask).to(table_rows.dtype)  # (C, B)
    squared = (table_rows - target_rows.detach()).pow(2).sum(-1)  # (C, B)
    return (squared * present).sum(1) / (int(num_items) * table_rows.shape[-1])


def add_table_context(plan: RoundPlan, num_items: int, full_table: Optional[np.ndarray] = None) -> RoundPlan:
    """Add context examples so that the regulariser covers every row a client's step can move.

    Context examples carry :data:`CONTEXT_LABEL`; the loss gives them no BCE term, but they
    make rows of the client's table visible (and trainable) in a step. Real examples come
    first within a step, in their planned order. ``num_examples`` (aggregation weights) is
    unchanged.

    * A client with ``full_table[c]`` True (default: every client) gets every item in every
      step: the regulariser is the code's ``MSE`` over the whole table.
    * A client with ``full_table[c]`` False starts the round with ``q_u = r_u`` on every row
      (see :meth:`GPFedRecLoss.prepare_round`). A row with ``q_u[i] = r_u[i]`` that no BCE
      term touches has zero gradient and stays put, so in step ``k`` the rows that can differ
      from ``r_u`` are the ones its steps ``< k`` trained: those become its context. Same
      updates as the whole table, at ``Σ_k`` (rows seen before step ``k``) instead of ``k·I``.

    Size: ``I`` extra examples per step of a full-table client.
    """
    num_clients = plan.num_clients
    if full_table is None:
        full_table = np.ones(num_clients, dtype=bool)
    full_table = np.asarray(full_table, dtype=bool)
    if full_table.shape != (num_clients,):
        raise ValueError(f"full_table must hold one flag per plan client ({num_clients}), got shape {full_table.shape}")
    example_pos = plan.example_positions()  # (E,)
    # whole-table clients: every item in every step
    full_pos = np.repeat(np.arange(num_clients, dtype=np.int64)[full_table], plan.num_steps[full_table])
    # the step index within each client: position in its run of repeats
    full_steps = plan.num_steps[full_table]
    run_start = np.repeat(np.cumsum(full_steps) - full_steps, full_steps)
    full_step = np.arange(full_pos.size, dtype=np.int64) - run_start
    ctx_pos = [np.repeat(full_pos, num_items)]
    ctx_step = [np.repeat(full_step, num_items)]
    ctx_items = [np.tile(np.arange(num_items, dtype=np.int64), full_pos.size)]
    # equal-start clients with more than one step: the rows their earlier steps touched
    for position in np.flatnonzero(~full_table & (plan.num_steps > 1)):
        lo, hi = plan.example_indptr[position], plan.example_indptr[position + 1]
        items, steps = plan.items[lo:hi], plan.steps[lo:hi]
        for step in range(1, int(plan.num_steps[position])):
            seen = np.unique(items[steps < step])
            ctx_pos.append(np.full(seen.size, position, dtype=np.int64))
            ctx_step.append(np.full(seen.size, step, dtype=np.int64))
            ctx_items.append(seen)
    ctx_pos, ctx_step, ctx_items = np.concatenate(ctx_pos), np.concatenate(ctx_step), np.concatenate(ctx_items)
    pos = np.concatenate([example_pos, ctx_pos])
    step = np.concatenate([plan.steps, ctx_step])
    kind = np.concatenate([np.zeros(plan.items.size, dtype=np.int64), np.ones(ctx_pos.size, dtype=np.int64)])
    items = np.concatenate([plan.items, ctx_items])
    labels = np.concatenate([plan.labels.astype(np.float32), np.full(ctx_pos.size, CONTEXT_LABEL, dtype=np.float32)])
    order = np.lexsort((np.arange(pos.size), kind, step, pos))  # client, step, real first, planned order
    indptr = np.zeros(num_clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(pos, minlength=num_clients), out=indptr[1:])
    return RoundPlan(
        round_index=plan.round_index, clients=plan.clients, example_indptr=indptr, items=items[order],
        labels=labels[order], steps=step[order], num_steps=plan.num_steps, num_examples=plan.num_examples,
        batch_size=plan.batch_size, local_epochs=plan.local_epochs, noise_key=plan.noise_key,
    )


# ======================================================================================
# Backbone, loss, server hook, method
# ======================================================================================
class GPFedRecModel(FederatedModel):
    """GPFedRec's client model: personal item table, private user vector, private ReLU MLP.

    ``ŷ_ui = head(ReLU(… ReLU(W_0 [p_u ; q_u[i]] + b_0) …))``; the first layer is applied as
    ``W_0 = [W_p, W_q]`` on the two halves, which equals the concatenation.

    Args:
        num_users, num_items, dim: ``U``, ``I``, ``d``.
        hidden: hidden layer sizes after the ``2d`` input (code and FedRKG: ``(32, 16, 8)``,
            i.e. ``64 → 32 → 16 → 8 → 1`` at ``d = 32``); ``()`` = a linear head on ``[p_u ; q_u[i]]``.
        init_std: std of the ``N(0, std²)`` item table and user vector (``nn.Embedding``: 1).

    Parameters (``param_kinds``): ``item_emb`` private rows ``(U, I, d)`` (``q_u``, uploaded
    to the server by :class:`GraphGuidedServer`); ``target_item_emb`` private rows
    ``(U, I, d)`` (``r_u``, written by the server, never trained); ``user_emb`` ``(U, d)``;
    ``mlp{k}_w (U, out, in)``, ``mlp{k}_b (U, out)``; ``head_w (U, h)``, ``head_b (U,)``, all
    private dense. Every client starts from one shared draw (copies of one model).
    """

    table = "item_emb"
    target = "target_item_emb"

    def __init__(self, num_users: int, num_items: int, dim: int = 32, hidden: Sequence[int] = (32, 16, 8),
                 init_std: float = 1.0):
        self.num_users, self.num_items, self.dim = int(num_users), int(num_items), int(dim)
        self.hidden = tuple(int(h) for h in hidden)
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be >= 1, got {tuple(hidden)}")
        self.init_std = float(init_std)
        kinds = {self.table: "private_rows", self.target: "private_rows", "user_emb": "private_dense"}
        for k in range(len(self.hidden)):
            kinds[f"mlp{k}_w"] = kinds[f"mlp{k}_b"] = "private_dense"
        kinds["head_w"] = kinds["head_b"] = "private_dense"
        self.param_kinds = kinds

    @property
    def update_steps(self) -> Tuple[Tuple[str, ...], ...]:
        """One step on everything but the personalised table (the code's three optimisers, one loss)."""
        return (tuple(name for name in self.param_kinds if name != self.target),)

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        return {}

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        users, dim = self.num_users, self.dim
        table = normal_((self.num_items, dim), self.init_std, generator, dtype, device)  # (I, d)
        user = normal_((dim,), self.init_std, generator, dtype, device)  # (d,)
        out = {
            self.table: table.unsqueeze(0).repeat(users, 1, 1),  # (U, I, d)
            self.target: table.unsqueeze(0).repeat(users, 1, 1),  # (U, I, d): round 0 target = the init
            "user_emb": user.expand(users, -1).clone(),  # (U, d)
        }
        out.update(per_user_mlp_init(users, 2 * dim, self.hidden, generator, dtype, device))  # input [user; item]
        return out

    def _forward(self, params: Mapping[str, torch.Tensor], items: torch.Tensor) -> torch.Tensor:
        """``(C, B)`` logits from item rows ``(C, B, d)`` and per-client dense parameters ``(C, ...)``."""
        dim = self.dim
        user = params["user_emb"]  # (C, d)
        if not self.hidden:
            w = params["head_w"]  # (C, 2d)
            return (torch.einsum("cbd,cd->cb", items, w[:, dim:]) + (user * w[:, :dim]).sum(1)[:, None]
                    + params["head_b"][:, None])
        w0 = params["mlp0_w"]  # (C, h0, 2d)
        from_user = torch.einsum("cd,chd->ch", user, w0[:, :, :dim]) + params["mlp0_b"]  # (C, h0)
        h = F.relu(torch.einsum("cbd,chd->cbh", items, w0[:, :, dim:]) + from_user[:, None, :])  # (C, B, h0)
        for k in range(1, len(self.hidden)):
            h = F.relu(torch.einsum("cbi,coi->cbo", h, params[f"mlp{k}_w"]) + params[f"mlp{k}_b"][:, None, :])
        return torch.einsum("cbh,ch->cb", h, params["head_w"]) + params["head_b"][:, None]  # (C, B)

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        return self._forward(params, params[self.table][rows])  # (C, B)

    def score_users(self, global_state, private_state, users):
        params = {name: private_state[name][users] for name, kind in self.param_kinds.items()
                  if kind == "private_dense"}
        return self._forward(params, private_state[self.table][users])  # (n, I)


class GPFedRecLoss:
    """GPFedRec's client loss ``BCE + reg · ‖q_u − r_u‖²/(I d)`` (a ``ClientLossFn``).

    Args:
        reg: ``>= 0`` (the code's ``--reg``, 1.0).
        reg_rows: ``"table"`` (default): the whole table, which needs the round plan augmented
            with context rows: run with
            ``PlanAugmentingExecutor(BatchedExecutor())`` (or around a ``SequentialExecutor``),
            which calls :meth:`prepare_round`. ``"batch"``: the batch's distinct rows only.
        skip_equal_rows: with ``"table"``, give the whole table only to clients that start the
            round with ``q_u ≠ r_u`` somewhere; the rest get the rows their earlier steps moved
            (:func:`add_table_context`). Same updates under SGD (a row with zero gradient stays
            put), far fewer rows when the graph is complete. ``False``: every client, every row.
    """

    def __init__(self, reg: float = 1.0, reg_rows: str = "table", skip_equal_rows: bool = True):
        reg_value = float(reg)
        if not math.isfinite(reg_value) or reg_value < 0:
            raise ValueError(f"reg must be a finite number >= 0 (weight of the pull toward the personalised table), "
                             f"got {reg!r}")
        _check_choice("reg_rows", reg_rows, REG_ROWS)
        self.reg, self.reg_rows, self.skip_equal_rows = reg_value, reg_rows, bool(skip_equal_rows)
        self._full_users: Optional[torch.Tensor] = None  # set by prepare_round

    # -- PlanAugmentingExecutor protocol --------------------------------------------------------
    def prepare_round(self, plan: RoundPlan, global_state, private_state) -> RoundPlan:
        """With ``reg_rows="table"``: :func:`add_table_context`; else the plan unchanged.

        With ``skip_equal_rows`` only clients whose table differs from their personalised
        table somewhere get the whole table; the others (every client, when the server's graph
        is complete and ``r_u`` equals the download) get only the rows they already moved.
        """
        self._full_users = None
        if self.reg_rows != "table":
            return plan
        table = private_state.get(GPFedRecModel.table)
        target = private_state.get(GPFedRecModel.target)
        if table is None or target is None:
            raise ValueError(f"GPFedRecLoss expects the private tables {GPFedRecModel.table!r} and "
                             f"{GPFedRecModel.target!r}; got {sorted(private_state)}")
        full = np.ones(plan.num_clients, dtype=bool)
        if self.skip_equal_rows:
            full = ~rows_equal(table, target, plan.clients).cpu().numpy()
        self._full_users = torch.as_tensor(plan.clients[full], dtype=torch.int64)
        return add_table_context(plan, int(table.shape[1]), full)

    def finish_round(self) -> None:
        """Forget the round's whole-table clients."""
        self._full_users = None

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        table, target = getattr(model, "table", "item_emb"), getattr(model, "target", "target_item_emb")
        real = batch.mask * (batch.labels >= 0).to(batch.mask.dtype)  # (C, B) context rows excluded
        # Context rows carry no BCE term, so the MLP runs only up to the last column that holds a
        # real example (add_table_context puts them first): with the whole table as context this
        # skips ~I of the ~I + B rows per step. At least one column keeps every parameter in the graph.
        seen = real.sum(0) > 0  # (B,)
        width = max(1, int(torch.nonzero(seen).max()) + 1 if bool(seen.any()) else 1)
        logits = model.logits(params, batch.rows[:, :width])  # (C, width)
        targets = batch.labels[:, :width].clamp(min=0.0)
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")  # (C, width)
        real = real[:, :width]
        bce = (losses * real).sum(1) / real.sum(1).clamp(min=1)  # (C,)
        if self.reg == 0.0:
            return bce
        rows, personal = params[table][batch.rows], params[target][batch.rows]  # (C, B, d)
        if self.reg_rows == "table":
            distinct = first_occurrence(batch.items, batch.mask).sum(1)  # (C,)
            whole = (torch.ones_like(distinct, dtype=torch.bool) if self._full_users is None
                     else torch.isin(batch.clients, self._full_users.to(batch.clients.device)))
            if bool((distinct[whole] != model.num_items).any()):
                raise ValueError(
                    f"reg_rows='table' needs every item in every local batch (got {int(distinct[whole].min())} of "
                    f"{model.num_items}): run with fedlib.baselines.continual.continual.PlanAugmentingExecutor(BatchedExecutor()), "
                    "which adds them as context rows, or use reg_rows='batch'")
        return bce + self.reg * graph_regulariser(rows, personal, batch.items, batch.mask, model.num_items)

    def __repr__(self) -> str:
        return f"GPFedRecLoss(reg={self.reg}, reg_rows={self.reg_rows!r})"


class GraphGuidedServer:
    """GPFedRec's server as a ``before_round(run, t, plan)`` hook (see the module docstring).

    Round 0: records the shared initial table as the first broadcast. Round ``t >= 1``: the
    participants of round ``t − 1`` (tables that differ from the last broadcast) upload their
    tables; :func:`graph_personalise` gives ``r_u`` (written to ``target_item_emb``) and
    ``q_g`` (written into every user's ``item_emb``: the download). A summary of the graph goes
    to ``run.state.extra[GRAPH_STATS_KEY]`` and is appended to ``run.state.extra[GRAPH_LOG_KEY]``.

    Args:
        similarity, threshold_scale, layers, chunk_size: see :func:`graph_personalise`.
        table, target: parameter names of ``q_u`` and ``r_u``.
    """

    def __init__(self, similarity: str = "cosine", threshold_scale: float = 1.0, layers: int = 1,
                 chunk_size: int = 1024, table: str = "item_emb", target: str = "target_item_emb"):
        _check_choice("similarity", similarity, SIMILARITIES)
        if not math.isfinite(float(threshold_scale)):
            raise ValueError(f"threshold_scale must be a finite number, got {threshold_scale!r}")
        if int(layers) < 1:
            raise ValueError(f"layers must be >= 1, got {layers!r}")
        self.similarity, self.threshold_scale, self.layers = similarity, float(threshold_scale), int(layers)
        self.chunk_size, self.table, self.target = _check_chunk(chunk_size), table, target

    def __call__(self, run, round_index: int, plan) -> None:
        state = run.state  # the trainer's live run: its AveragingState is changed in place
        tables = state.private_state[self.table]  # (U, I, d)
        broadcast = state.extra.get(BROADCAST_KEY)
        if round_index == 0:
            state.extra[BROADCAST_KEY] = tables[0].detach().clone()  # every client starts from one table
            return
        with torch.no_grad():
            if broadcast is None:  # a state without our record: everyone counts as a participant
                participants = torch.ones(tables.shape[0], dtype=torch.bool, device=tables.device)
            else:
                participants = ~rows_equal(tables, broadcast.to(tables.device))  # (U,)
            index = torch.nonzero(participants).flatten()
            if index.numel() == 0:
                return
            uploads = tables if index.numel() == tables.shape[0] else tables[index]  # (S, I, d)
            agg = graph_personalise(uploads, self.similarity, self.threshold_scale, self.layers, self.chunk_size)
            state.private_state[self.target][index] = agg.personal.to(tables.dtype)
            tables.copy_(agg.global_table.to(tables.dtype).expand_as(tables))  # the download of round t
            state.extra[BROADCAST_KEY] = agg.global_table.detach().clone()
            degree = (agg.weights > 0).sum(1)
            state.extra[GRAPH_STATS_KEY] = {
                "round": int(round_index), "participants": int(index.numel()), "threshold": agg.threshold,
                "mean_neighbours": float(degree.to(torch.float64).mean()),
                "self_included": float(torch.diagonal(agg.weights).gt(0).to(torch.float64).mean()),
                "certified_complete": bool(agg.certified_complete),
                "similarity_rows": int(index.numel()) if agg.wide_users is None else agg.wide_users,
                "min_neighbours": int(degree.min()),
                "complete": bool((degree == index.numel()).all()),
            }
            state.extra.setdefault(GRAPH_LOG_KEY, []).append(dict(state.extra[GRAPH_STATS_KEY]))


def gpfedrec_method(model: GPFedRecModel, lr: float = 0.1, lr_eta: float = 80.0, client_fraction: float = 1.0,
                    reg: float = 1.0, reg_rows: str = "table", similarity: str = "cosine",
                    threshold_scale: float = 1.0, layers: int = 1, chunk_size: int = 1024,
                    **kwargs) -> FederatedMethod:
    """GPFedRec with the public code's learning rates, loss and server step.

    Args:
        model: a :class:`GPFedRecModel`.
        lr: MLP and head learning rate (0.1).
        lr_eta: item-table multiplier (80): items ``lr · I · lr_eta − lr``, user vector
            ``lr · lr_eta / client_fraction − lr``.
        client_fraction: the code's ``clients_sample_ratio`` (1.0), used in the user lr only.
        reg, reg_rows: see :class:`GPFedRecLoss`. With ``reg_rows="table"`` run the method with
            ``PlanAugmentingExecutor(BatchedExecutor(chunk_size=...))``.
        similarity, threshold_scale, layers, chunk_size: see :class:`GraphGuidedServer`.
        **kwargs: other :class:`~fedlib.engine.FederatedMethod` fields; a ``before_round``
            given here runs after the server step.
    """
    if not isinstance(model, GPFedRecModel):
        raise ValueError(f"gpfedrec_method needs a GPFedRecModel, got {type(model).__name__}")
    for name, value in (("lr", lr), ("lr_eta", lr_eta)):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not 0 < float(client_fraction) <= 1:
        raise ValueError(f"client_fraction must be in (0, 1] (share of users per round), got {client_fraction!r}")
    if "client_loss" in kwargs:
        raise ValueError("gpfedrec_method builds its own client_loss (GPFedRecLoss); pass reg/reg_rows instead")
    lr = float(lr)
    rates = {}
    for name in model.param_kinds:
        if name == model.target:
            rates[name] = 0.0
        elif name == model.table:
            rates[name] = lr * model.num_items * float(lr_eta) - lr
        elif name == "user_emb":
            rates[name] = lr / float(client_fraction) * float(lr_eta) - lr
        else:
            rates[name] = lr
    negative = sorted(name for name, rate in rates.items() if rate < 0)
    if negative:
        raise ValueError(f"the code's learning-rate recipe gives negative rates for {negative} (lr={lr}, "
                         f"lr_eta={lr_eta}, client_fraction={client_fraction}): use lr_eta >= client_fraction so that "
                         "lr · lr_eta / client_fraction − lr >= 0")
    server = GraphGuidedServer(similarity, threshold_scale, layers, chunk_size, model.table, model.target)
    hook = chain_hooks(server, kwargs.pop("before_round", None))
    kwargs.setdefault("name", "GPFedRec")
    return FederatedMethod(model, rates, update_steps=model.update_steps, client_loss=GPFedRecLoss(reg, reg_rows),
                           before_round=hook, **kwargs)


# ======================================================================================
# Executor: the whole-table regulariser in closed form
# ======================================================================================
def _pull_toward(tables: torch.Tensor, targets: torch.Tensor, pull: Optional[float],
                 gap_buffer: torch.Tensor) -> torch.Tensor:
    """``‖q_c − r_c‖_F`` per client ``(C,)``, then (unless ``pull`` is None) ``q_c ← q_c − pull · (q_c − r_c)``.

    Why one client at a time: the gap ``q_c − r_c`` of one client (``I·d`` floats, ~1.6 MB on
    LastFM-2K) stays in cache between its three uses, so each step reads ``q`` and ``r`` and
    writes ``q`` once instead of also writing and twice re-reading a ``(C, I, d)`` temporary
    (4-5× less CPU time). The operations and their order per element are those of the
    whole-chunk form, so the results are the same bits.

    Args:
        tables: ``(C, R, d)`` the local copies ``q`` (changed in place).
        targets: ``(C, R, d)`` the personalised rows ``r``.
        pull: ``η c`` of one step, or None (the table does not train: norms only).
        gap_buffer: ``(1, R, d)`` scratch.
    """
    norms = tables.new_empty(tables.shape[0])
    for client in range(tables.shape[0]):
        gap = torch.sub(tables[client:client + 1], targets[client:client + 1], out=gap_buffer)  # (1, R, d)
        norms[client:client + 1] = torch.linalg.vector_norm(gap, dim=(1, 2))
        if pull is not None:
            tables[client:client + 1].sub_(gap, alpha=pull)
    return norms


class GPFedRecExecutor:
    r"""GPFedRec's local updates with the whole-table regulariser applied in closed form.

    The reference path, ``PlanAugmentingExecutor(BatchedExecutor())``, adds every item to every
    local step as a context example, so each step gathers, differentiates and scatters all
    ``I`` rows of every client: ~70 % of a LastFM-2K round (1,269 clients × 12,322 rows × 3
    steps), ~116 s per round on one thread. The regulariser's gradient needs none of that
    machinery. For every row ``i`` of client ``u``'s table, one SGD step of rate ``η`` on
    ``BCE + reg · ‖q_u − r_u‖²_F / (I d)`` is::

        q_u[i] ← q_u[i] − η c (q_u[i] − r_u[i]) − η ∂BCE/∂q_u[i]        c = 2 reg / (I d)

    and the BCE term is zero outside the batch. So a step is one elementwise pull of the whole
    ``(C, I, d)`` chunk toward ``r`` plus an autograd step on the batch's rows only, both taken
    at the pre-step values (the same update; the float sums are ordered differently, tests
    compare the two paths). The MLP, head and user vector see only the BCE, as before.

    A client that starts the round with ``q_u = r_u`` (every client while the graph is
    complete) has a zero pull on every row its steps never touch, so it works on the rows it
    touches in the round only, as :meth:`GPFedRecLoss.prepare_round` does for the reference
    path; the other clients work on the whole table.

    Anything the closed form does not cover (clipping, gradient or upload noise, Adam, other
    update groups, a trained target table, per-client upload inspection,
    ``reg_rows="batch"``) runs the reference path.

    Args:
        chunk_size: clients per chunk (memory: two ``(chunk, I, d)`` tables, ``q`` and ``r``; LastFM-2K
            at 128 clients: ~400 MB).
    """

    name = "gpfedrec-closed-form"

    def __init__(self, chunk_size: int = 128):
        from fedlib.engine.executors import BatchedExecutor
        from fedlib.baselines.continual.continual import PlanAugmentingExecutor

        self.chunk_size = _check_chunk(chunk_size)
        self.reference = PlanAugmentingExecutor(BatchedExecutor())

    @staticmethod
    def applies(method: FederatedMethod, return_client_updates: bool = False) -> bool:
        """Whether :meth:`local_updates` takes the closed-form path."""
        model, loss = method.model, method.client_loss
        return (isinstance(model, GPFedRecModel) and isinstance(loss, GPFedRecLoss) and loss.reg_rows == "table"
                and len(method.steps) == 1 and model.target not in method.steps[0]
                and method.grad_clip_norm is None and getattr(method, "step_clip_norm", None) is None
                and method.gradient_noise is None and not method.adds_upload_noise
                and not method.optimizer.is_adam and not return_client_updates)

    @torch.enable_grad()
    def local_updates(self, method: FederatedMethod, global_state, private_state, plan: RoundPlan, weights, *,
                      return_client_updates: bool = False, **kwargs):
        from fedlib.engine.executors import LocalUpdateResult

        if not self.applies(method, return_client_updates):
            return self.reference.local_updates(method, global_state, private_state, plan, weights,
                                                return_client_updates=return_client_updates, **kwargs)
        model, loss = method.model, method.client_loss
        table = private_state[model.table]  # (U, I, d)
        losses = torch.zeros(plan.num_clients, dtype=table.dtype, device=table.device)
        rates = {name: method.lr(name, plan.round_index) for name in method.steps[0]}
        equal = rows_equal(table, private_state[model.target], plan.clients).cpu().numpy()  # (C,) q_u = r_u
        for whole_table, group in ((True, np.flatnonzero(~equal)), (False, np.flatnonzero(equal))):
            for start in range(0, group.size, self.chunk_size):
                self._chunk(model, loss, private_state, plan, group[start:start + self.chunk_size], rates, losses,
                            whole_table)
        return LocalUpdateResult({}, losses, None)

    @staticmethod
    def _chunk(model: GPFedRecModel, loss: GPFedRecLoss, private_state, plan: RoundPlan, positions: np.ndarray,
               rates: Mapping[str, float], losses: torch.Tensor, whole_table: bool = True) -> None:
        """One chunk's local steps; ``whole_table=False`` for clients that start with ``q_u = r_u``."""
        from fedlib.engine.batched import _padded_batch  # the engine's (C_s, B_s) padding of one step

        table, target = private_state[model.table], private_state[model.target]
        device, dtype = table.device, table.dtype
        num_items, dim = table.shape[1], table.shape[2]
        # Clients by decreasing number of steps: the ones still stepping at step s are a prefix.
        order = positions[np.argsort(-plan.num_steps[positions], kind="stable")]
        sub = plan.subset(order)
        users = torch.as_tensor(sub.clients, dtype=torch.int64, device=device)
        counts = np.diff(sub.example_indptr)
        ex_client = np.repeat(np.arange(sub.num_clients), counts)  # (E,)
        # Row slots of each client's local copy: its whole table (slot = item), or the rows its
        # round touches (slot_items (C, R), padded with item 0 where slot_valid is False; ex_slot (E,)).
        if whole_table:
            ex_slot = sub.items
        else:
            keys, ex_key = np.unique(ex_client * num_items + sub.items, return_inverse=True)
            key_client = keys // num_items
            first_key = np.searchsorted(key_client, np.arange(sub.num_clients))  # (C,)
            key_slot = np.arange(keys.size) - first_key[key_client]
            width = int(key_slot.max(initial=-1)) + 1
            slot_items = torch.zeros(sub.num_clients, width, dtype=torch.int64, device=device)
            slot_valid = torch.zeros(sub.num_clients, width, dtype=torch.bool, device=device)
            at = (torch.as_tensor(key_client, device=device), torch.as_tensor(key_slot, device=device))
            slot_items[at] = torch.as_tensor(keys % num_items, device=device)
            slot_valid[at] = True
            ex_slot = key_slot[ex_key.reshape(-1)]
        if whole_table:  # (C, I, d) the local copies and the personalised rows (constants): copies
            q, r = table.index_select(0, users), target.index_select(0, users)
        else:  # (C, R, d) gathers of the touched rows
            user_rows = users[:, None].expand_as(slot_items)  # (C, R)
            q, r = table[user_rows, slot_items], target[user_rows, slot_items]
        gap_buffer = q.new_empty((1,) + tuple(q.shape[1:]))  # one client's q − r, reused (stays in cache)
        dense = {name: private_state[name][users] for name in rates if name != model.table}  # (C, ...)
        pull = rates.get(model.table, 0.0) * 2.0 * loss.reg / (num_items * dim)  # η c
        num_steps = int(sub.num_steps.max(initial=0))
        steps_per_client = torch.as_tensor(sub.num_steps, dtype=dtype, device=device)  # (C,)
        chunk_losses = torch.zeros(sub.num_clients, dtype=dtype, device=device)
        for step in range(num_steps):
            active = int((sub.num_steps > step).sum())
            take = np.flatnonzero(sub.steps == step)  # sorted by client, then planned order
            batch = _padded_batch(torch.as_tensor(ex_client[take], device=device),
                                  torch.as_tensor(ex_slot[take], device=device),
                                  torch.as_tensor(sub.items[take], device=device),
                                  torch.as_tensor(sub.labels[take], dtype=dtype, device=device), active, users, dtype)
            slots, labels, mask = batch.rows, batch.labels, batch.mask  # (C_s, B_s); rows index q's slots
            width = slots.shape[1]
            clients = torch.arange(active, device=device)[:, None].expand(active, width)  # (C_s, B_s)
            rows = q[clients, slots].detach().requires_grad_(model.table in rates)  # (C_s, B_s, d)
            leaves = {name: tensor[:active].detach().requires_grad_(True) for name, tensor in dense.items()}
            logits = model._forward(leaves, rows)  # (C_s, B_s)
            per_example = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
            bce = (per_example * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (C_s,)
            wrt = list(leaves.values()) + ([rows] if rows.requires_grad else [])
            grads = torch.autograd.grad(bce.sum(), wrt)
            with torch.no_grad():
                # ‖q − r‖ at the pre-step values, and q ← q − η c (q − r) if the table trains
                gap_norms = _pull_toward(q[:active], r[:active], pull if rows.requires_grad else None, gap_buffer)
                client_loss = bce + loss.reg * gap_norms.pow(2) / (num_items * dim)
                chunk_losses[:active] += client_loss / steps_per_client[:active]
                for (name, tensor), grad in zip(leaves.items(), grads):
                    dense[name][:active] -= rates[name] * grad
                if rows.requires_grad:
                    q.index_put_((clients, slots), grads[-1] * -rates[model.table], accumulate=True)
        with torch.no_grad():
            if whole_table:
                table.index_copy_(0, users, q)
            else:
                table[user_rows[slot_valid], slot_items[slot_valid]] = q[slot_valid]
            for name, tensor in dense.items():
                private_state[name][users] = tensor
            losses[torch.as_tensor(order, device=device)] = chunk_losses
