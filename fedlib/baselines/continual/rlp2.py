r"""RLP2 (ReLoop2) as a federated continual baseline: a per-user error memory and error compensation.

References:
    Zhu, Cai, Huang, Dong, Tang, Zhang. "ReLoop2: Building Self-Adaptive Recommendation Models
    via Responsive Error Compensation Loop." KDD 2023.
    Lim, Kweon, Kim, Kim, Choi, Kim, Yu. "Federated Continual Recommendation." CIKM 2025
    (F3CRec), §5.1: RLP2 is "a replay-based method with an error memory that stores
    mispredictions for self-correction, applied in FedRec with user-wise memory due to
    privacy constraints". The authors' public code (https://github.com/Jaehyung-Lim/F3CRec-CIKM-25)
    does not contain it, so everything below the paper's one sentence is a documented
    reconstruction.

Mechanism. Every user ``u`` keeps, on its own device, a ring buffer of at most ``M`` entries
``(k, r)``: the hidden representation ``k ∈ R^d`` of a training example ``(u, i, y)`` the
model got wrong and its residual ``r`` in probability space::

    p_ui   = σ(s_ui)                                  backbone prediction (s = logit)
    r_ui   = y_ui − p_ui                              residual, written when |r_ui| > τ
    h_ui   = (∂s_ui / ∂q_i) ⊙ q_i                      hidden representation (the key)

At inference, for every candidate item ``i`` of user ``u`` (query ``h_ui``)::

    c_j    = cos(h_ui, k_j)                           j over the filled slots of u's memory
    N_ui   = the top_k slots by c_j
    w_j    = softmax_{j ∈ N_ui}(c_j / T)
    ê_ui   = Σ_{j ∈ N_ui} w_j r_j                      (0 when u's memory is empty)
    ŷ'_ui  = p_ui + α ê_ui                            the score ranked by the evaluator

Assumptions and simplifications (none of these is specified by F3CRec; defaults are chosen,
not taken from either paper):

1. **Key rule (one rule for every backbone).** ``h_ui = (∂s_ui/∂q_i) ⊙ q_i``: the
   per-dimension contribution of the item row ``q_i`` (the backbone's first ``public_rows``
   table, as the client holds it) to the logit ("gradient × input"). It is computed with
   autograd, so it needs no per-backbone code, and it equals the hidden representation
   before the output layer where one exists: FedMF ``p_u ⊙ q_i`` (the GMF hidden vector),
   PFedRec ``w_u ⊙ q_i``, FedNCF (F3CRec's variant, head on ``[p_u; q_i]``)
   ``w_u^{item} ⊙ q_i`` (the user half of that head is constant within one user's memory
   and would not change any similarity). The same rule gives the queries at inference,
   with the global item table and the user's current private parameters. Keys are stored
   as computed when written (ReLoop2's memory also keeps stale representations).
2. **Exact kNN instead of LSH.** ReLoop2 retrieves neighbours with locality-sensitive
   hashing; with ``M ≤ 100`` entries per user an exact cosine top-k search is cheap and LSH
   would only approximate it.
3. **User-wise memory.** A user's memory holds only that user's examples and never leaves
   the client (nothing is uploaded or aggregated); inference for user ``u`` reads only row
   ``u``. The simulation stores all users' memories stacked ``(U, M, ·)``.
4. **What is written, and when.** The memory is filled during local training, from the
   backbone's prediction on each real training example (positives and sampled negatives)
   in every local step of every round, when ``|r| > τ`` (``τ = 0.5``: a misclassification at
   threshold 0.5). An example already in the user's memory (same user, same item) overwrites
   its own slot instead of taking a new one, so repeated rounds (and PFedRec's second update
   step on the same batch) refresh entries instead of flooding the buffer; the cost per step
   is one extra forward/backward over the batch. New entries are appended in batch order
   at the user's write pointer; the buffer wraps and overwrites its oldest slots (FIFO).
   Within one call, "already in memory" refers to the memory before the call, and entries
   whose error has dropped below ``τ`` are not removed (they age out of the ring).
   ReLoop2 writes the errors made on freshly arrived data; here block ``t``'s training data
   is the fresh data of the continual stream. Unlike ReLoop2's CTR logs, the negatives here
   are sampled unobserved items, so "over-predicted negative" entries may well be items the
   user would like.
5. **Residual in probability space, added to the probability.** ``r = y − σ(s)`` and the
   returned score is ``σ(s) + α ê`` (only the ranking matters for Recall/NDCG).
6. **Block 0** trains with the plain backbone loss and still writes the memory, so that
   block 1 starts with the block-0 errors; its evaluation is uncompensated (block 0 is the
   same plain model for every method; for FedMF it runs on the engine's autograd path instead of
   the analytic kernel, so it matches FT's block 0 up to float rounding). Blocks ``t ≥ 1``
   evaluate with compensation. When
   :func:`~fedlib.baselines.continual.continual.run_continual` reuses a ``base`` block 0, that block is
   not retrained and the memory starts empty in block 1.
7. **Memory follows model selection.** The engine restores the best-validation state for
   the test and for the next block; the memory is restored to its content at that round
   (a snapshot taken when a round becomes the best), so the test and the next block see the
   memory that went with the selected parameters.
8. **Growth.** The memory persists across blocks (that is what makes RLP2 continual) and is
   padded with empty rows when new users arrive.
9. **Defaults**: ``M = 50``, ``τ = 0.5``, ``α = 0.5``, ``top_k = 5``, ``T = 0.1``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

import torch

from fedlib.engine import FederatedMethod, LocalBatch, bce_client_loss
from fedlib.baselines.continual.continual import BlockContext, ContinualMethod
from fedlib.models.base import FederatedModel

__all__ = ["hidden_representations", "ErrorMemory", "error_compensation", "ErrorMemoryLoss",
           "ErrorCompensatedModel", "RLP2"]

#: Bytes allowed for the ``(n, I, M)`` similarity tensor (and its companions) per user chunk.
_INFERENCE_BUDGET = 256 * 2 ** 20


# ======================================================================================
# Keys: the hidden representation of (user, item)
# ======================================================================================
def _key_table(model: FederatedModel) -> str:
    names = model.names("public_rows")
    if not names:
        raise ValueError("RLP2 keys need an item table (a public_rows parameter)")
    return names[0]


def hidden_representations(model: FederatedModel, params: Mapping[str, torch.Tensor],
                           rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Logits and keys ``h = (∂s/∂q) ⊙ q`` of ``C`` clients' examples (assumption 1).

    Every example gets its own copy of its row(s), so one backward pass gives each example's
    own gradient even when two examples share an item. Runs on detached parameters: the
    caller's graph is untouched.

    Args:
        model: the backbone (``logits(params, rows)`` convention of :mod:`fedlib.models.base`).
        params: dense parameters ``(C, ...)``; row tables ``(R, ...)`` indexed by ``rows``.
        rows: ``(C, B) int64``.

    Returns:
        ``(logits (C, B), keys (C, B, d))``, both detached.
    """
    num_clients, num_batch = rows.shape
    key_name = _key_table(model)
    flat_rows = torch.arange(num_clients * num_batch, device=rows.device).view(num_clients, num_batch)
    with torch.enable_grad():
        local = {}
        for name, tensor in params.items():
            tensor = tensor.detach()
            if name in model.row_names:
                tensor = tensor[rows].reshape(num_clients * num_batch, *tensor.shape[1:])
            local[name] = tensor
        query = local[key_name].requires_grad_(True)  # (C·B, d)
        logits = model.logits(local, flat_rows)  # (C, B)
        (grad,) = torch.autograd.grad(logits.sum(), query)
    keys = (grad * query.detach()).view(num_clients, num_batch, -1)
    return logits.detach(), keys


def _user_params(model: FederatedModel, global_state, private_state, users: torch.Tensor):
    """Per-user parameters over every item: ``(params, rows (n, I))`` for :func:`hidden_representations`."""
    n, num_items = users.numel(), model.num_items
    params = {}
    for name, kind in model.param_kinds.items():
        if kind == "private_dense":
            params[name] = private_state[name][users]  # (n, ...)
        elif kind == "public_dense":
            params[name] = global_state[name].unsqueeze(0).expand(n, *global_state[name].shape)
        elif kind == "public_rows":
            params[name] = global_state[name]  # (I, d), indexed by item id
        else:  # private_rows: user-major flat table, row u·I + i
            table = private_state[name][users]
            params[name] = table.reshape(n * num_items, *table.shape[2:])
    rows = torch.arange(num_items, device=users.device).unsqueeze(0).expand(n, -1)  # (n, I)
    if any(kind == "private_rows" for kind in model.param_kinds.values()):
        if any(kind == "public_rows" for kind in model.param_kinds.values()):
            raise NotImplementedError("RLP2 queries for models mixing public and private row tables")
        rows = rows + (torch.arange(n, device=users.device) * num_items).unsqueeze(1)
    return params, rows


# ======================================================================================
# The per-user error memory
# ======================================================================================
class ErrorMemory:
    """Ring buffers of ``(key, residual)`` pairs, one per user, stacked.

    Attributes (``None`` until the first write, which fixes ``d``, device and dtype):
        keys: ``(U, M, d)`` hidden representations.
        residuals: ``(U, M)`` ``y − σ(s)`` of the stored examples.
        items: ``(U, M) int64`` item of each slot (``−1`` = empty), to find an example again.
        filled: ``(U, M) bool`` slot holds an entry.
        pointer: ``(U,) int64`` next slot to write (the oldest entry once the ring is full).
    """

    def __init__(self, capacity: int = 50, num_users: int = 0):
        if capacity < 1:
            raise ValueError("memory capacity must be >= 1")
        self.capacity = int(capacity)
        self.num_users = int(num_users)
        self.keys: Optional[torch.Tensor] = None
        self.residuals: Optional[torch.Tensor] = None
        self.items: Optional[torch.Tensor] = None
        self.filled: Optional[torch.Tensor] = None
        self.pointer: Optional[torch.Tensor] = None

    # -- allocation and growth -------------------------------------------------------
    @property
    def allocated(self) -> bool:
        return self.keys is not None

    def _allocate(self, dim: int, device, dtype) -> None:
        u, m = self.num_users, self.capacity
        self.keys = torch.zeros(u, m, dim, device=device, dtype=dtype)
        self.residuals = torch.zeros(u, m, device=device, dtype=dtype)
        self.items = torch.full((u, m), -1, dtype=torch.int64, device=device)
        self.filled = torch.zeros(u, m, dtype=torch.bool, device=device)
        self.pointer = torch.zeros(u, dtype=torch.int64, device=device)

    def grow(self, num_users: int) -> None:
        """Pad with empty rows up to ``num_users`` users (new users of a block)."""
        extra = int(num_users) - self.num_users
        if extra <= 0:
            return
        self.num_users = int(num_users)
        if not self.allocated:
            return
        m = self.capacity
        self.keys = torch.cat([self.keys, self.keys.new_zeros(extra, m, self.keys.shape[2])])
        self.residuals = torch.cat([self.residuals, self.residuals.new_zeros(extra, m)])
        self.items = torch.cat([self.items, self.items.new_full((extra, m), -1)])
        self.filled = torch.cat([self.filled, self.filled.new_zeros(extra, m)])
        self.pointer = torch.cat([self.pointer, self.pointer.new_zeros(extra)])

    def reset(self, num_users: int = 0) -> None:
        self.__init__(self.capacity, num_users)

    # -- snapshots (model selection, assumption 7) -------------------------------------
    def snapshot(self) -> Dict[str, torch.Tensor]:
        if not self.allocated:
            return {}
        return {name: getattr(self, name).clone() for name in ("keys", "residuals", "items", "filled", "pointer")}

    def load(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """Restore a :meth:`snapshot` (rows of users added since then stay empty)."""
        num_users = self.num_users
        if not snapshot:
            self.reset(num_users)
            return
        for name, tensor in snapshot.items():
            setattr(self, name, tensor.clone())
        self.num_users = int(snapshot["keys"].shape[0])
        self.grow(num_users)

    # -- writing -------------------------------------------------------------------------
    def write(self, users: torch.Tensor, items: torch.Tensor, keys: torch.Tensor, residuals: torch.Tensor,
              select: torch.Tensor) -> None:
        """Write the selected examples of ``C`` clients, in batch order (assumption 4).

        Args:
            users: ``(C,) int64`` user of each client row.
            items: ``(C, B) int64`` item of each example.
            keys: ``(C, B, d)`` hidden representations.
            residuals: ``(C, B)`` ``y − σ(s)``.
            select: ``(C, B) bool`` examples to write.

        Semantics: duplicates of one ``(user, item)`` within the call collapse to one entry
        placed at the first occurrence with the values of the last; an entry whose
        ``(user, item)`` is already stored overwrites that slot; the remaining new entries
        take slots ``pointer, pointer + 1, ... (mod M)`` in batch order (only the last ``M``
        survive when more arrive), after the in-place updates.
        """
        c_idx, b_idx = select.nonzero(as_tuple=True)  # row-major: client, then batch order
        if c_idx.numel() == 0:
            return
        if not self.allocated:
            self._allocate(keys.shape[-1], keys.device, keys.dtype)
        if int(users.max()) >= self.num_users:
            raise IndexError(f"user {int(users.max())} beyond the memory's {self.num_users} users")
        m = self.capacity
        user = users[c_idx]
        item = items[c_idx, b_idx]
        key = keys[c_idx, b_idx].to(self.keys.dtype)
        residual = residuals[c_idx, b_idx].to(self.residuals.dtype)

        # Collapse duplicates: slot order by the first occurrence, values from the last.
        span = int(item.max()) + 1
        code = c_idx * span + item
        unique, inverse = torch.unique(code, return_inverse=True)
        position = torch.arange(code.numel(), device=code.device)
        first = torch.full((unique.numel(),), code.numel(), dtype=torch.int64, device=code.device)
        first = first.scatter_reduce(0, inverse, position, "amin")
        last = torch.full_like(first, -1).scatter_reduce(0, inverse, position, "amax")
        order = torch.argsort(first)  # back to batch order: grouped by client, then position
        first, last = first[order], last[order]
        user, item, key, residual = user[first], item[first], key[last], residual[last]

        # 1. (user, item) already stored: refresh its slot.
        hit = self.items[user] == item.unsqueeze(1)  # (N, M)
        stored = hit.any(1)
        if bool(stored.any()):
            slot = hit[stored].to(torch.int64).argmax(1)
            self.keys[user[stored], slot] = key[stored]
            self.residuals[user[stored], slot] = residual[stored]

        # 2. New entries: consecutive slots from each user's pointer, ring wrap-around.
        new = ~stored
        if not bool(new.any()):
            return
        user, item, key, residual = user[new], item[new], key[new], residual[new]
        owners, counts = torch.unique_consecutive(user, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(user.numel(), device=user.device) - torch.repeat_interleave(starts, counts)
        # Only the last M new entries of a user survive (the earlier ones would be overwritten);
        # dropping them keeps the scatter's target slots unique, since index_put with repeated
        # indices has no defined winner on CUDA.
        keep = rank >= torch.repeat_interleave(counts, counts) - m
        slot = (self.pointer[user] + rank) % m
        user, slot = user[keep], slot[keep]
        self.keys[user, slot] = key[keep]
        self.residuals[user, slot] = residual[keep]
        self.items[user, slot] = item[keep]
        self.filled[user, slot] = True
        self.pointer[owners] = (self.pointer[owners] + counts) % m


# ======================================================================================
# Error compensation
# ======================================================================================
def error_compensation(queries: torch.Tensor, keys: torch.Tensor, residuals: torch.Tensor, filled: torch.Tensor,
                       top_k: int, temperature: float) -> torch.Tensor:
    """``ê`` of ``n`` users for ``I`` queries each from their own memories.

    Args:
        queries: ``(n, I, d)`` hidden representations ``h_ui``.
        keys: ``(n, M, d)``, residuals ``(n, M)``, filled ``(n, M) bool``: the users' memories.
        top_k: neighbours retrieved per query (capped at ``M``).
        temperature: ``T`` of the softmax over cosine similarities.

    Returns:
        ``(n, I)`` ``Σ_{j ∈ top_k} softmax(c_j / T) r_j``; 0 for users with an empty memory.
    """
    eps = 1e-12
    q = queries / queries.norm(dim=-1, keepdim=True).clamp_min(eps)
    k = keys / keys.norm(dim=-1, keepdim=True).clamp_min(eps)
    sim = torch.einsum("nid,nmd->nim", q, k)  # (n, I, M) cosine similarities
    sim = sim.masked_fill(~filled.unsqueeze(1), float("-inf"))
    top, slot = torch.topk(sim, min(int(top_k), sim.shape[-1]), dim=-1)  # (n, I, k)
    # Users with fewer than k entries: the empty slots sit at −inf and get weight 0; users
    # with none get an all −inf row, whose weights are set to 0 (ê = 0).
    weights = torch.softmax(top / float(temperature), dim=-1).nan_to_num(0.0)
    gathered = torch.gather(residuals.unsqueeze(1).expand(-1, sim.shape[1], -1), 2, slot)  # (n, I, k)
    return (weights * gathered).sum(-1)


class ErrorCompensatedModel(FederatedModel):
    """The backbone with ReLoop2's error compensation at scoring time.

    Training is untouched: ``param_kinds``, initialisers and :meth:`logits` are the backbone's.
    :meth:`score_users` returns ``σ(s_ui) + α ê_ui`` (see the module docstring).

    Args:
        backbone: the block's model.
        memory: the shared :class:`ErrorMemory`.
        alpha, top_k, temperature: ``α``, neighbours, softmax temperature ``T``.
        snapshot_for: ``(global_state, private_state) -> memory snapshot or None``: the memory
            that goes with a restored best state (assumption 7); ``None`` = the live memory.
    """

    def __init__(self, backbone: FederatedModel, memory: ErrorMemory, alpha: float = 0.5, top_k: int = 5,
                 temperature: float = 0.1, snapshot_for=None):
        self.backbone, self.memory = backbone, memory
        self.alpha, self.top_k, self.temperature = float(alpha), int(top_k), float(temperature)
        self.snapshot_for = snapshot_for
        self.num_users, self.num_items = backbone.num_users, backbone.num_items

    @property
    def param_kinds(self):
        return self.backbone.param_kinds

    def __getattr__(self, name):  # anything else the engine or a method reads (update_steps, dim, ...)
        if name == "backbone":
            raise AttributeError(name)
        return getattr(self.backbone, name)

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        return self.backbone.init_global(generator, dtype=dtype, device=device)

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        return self.backbone.init_private(generator, dtype=dtype, device=device)

    def logits(self, params, rows):
        return self.backbone.logits(params, rows)

    def _memory_tensors(self, global_state, private_state):
        snapshot = self.snapshot_for(global_state, private_state) if self.snapshot_for is not None else None
        if snapshot is not None:
            return (snapshot["keys"], snapshot["residuals"], snapshot["filled"]) if snapshot else None
        if not self.memory.allocated:
            return None
        return self.memory.keys, self.memory.residuals, self.memory.filled

    def score_users(self, global_state, private_state, users: torch.Tensor) -> torch.Tensor:
        """``(n, I)`` ``σ(s_ui) + α ê_ui`` for ``users`` ``(n,)``."""
        scores = torch.sigmoid(self.backbone.score_users(global_state, private_state, users))  # (n, I)
        tensors = self._memory_tensors(global_state, private_state)
        if tensors is None or self.alpha == 0.0:
            return scores
        keys, residuals, filled = tensors
        known = users < filled.shape[0]
        has = torch.zeros_like(known)
        has[known] = filled[users[known]].any(1)
        positions = has.nonzero().squeeze(1)
        if positions.numel() == 0:
            return scores
        m, d = keys.shape[1], keys.shape[2]
        per_user = self.num_items * (m + 3 * d) * scores.element_size()
        chunk = max(1, _INFERENCE_BUDGET // per_user)
        for start in range(0, positions.numel(), chunk):
            pos = positions[start:start + chunk]
            block = users[pos]
            params, rows = _user_params(self.backbone, global_state, private_state, block)
            _, queries = hidden_representations(self.backbone, params, rows)  # (n, I, d)
            e_hat = error_compensation(queries, keys[block], residuals[block], filled[block], self.top_k,
                                       self.temperature)
            scores[pos] = scores[pos] + self.alpha * e_hat.to(scores.dtype)
        return scores


# ======================================================================================
# The client loss that writes the memory
# ======================================================================================
class ErrorMemoryLoss:
    """The backbone's loss, plus (without gradient) writing mispredictions to the memory.

    ``base_loss`` gives the returned ``(C,)`` loss unchanged; as a side effect every real
    training example (``mask > 0``, label 0/1) with ``|y − σ(s)| > threshold`` is written to
    its user's memory with key :func:`hidden_representations` (assumption 4). Both engine
    executors call the loss on the same per-user sequence of batches, so they fill the same
    memory.

    Args:
        memory: the :class:`ErrorMemory` to fill.
        threshold: ``τ``.
        base_loss: the backbone's client loss (default BCE with logits).
    """

    def __init__(self, memory: ErrorMemory, threshold: float = 0.5, base_loss=None):
        self.memory, self.threshold = memory, float(threshold)
        self.base_loss = base_loss if base_loss is not None else bce_client_loss

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        loss = self.base_loss(model, params, batch)  # (C,)
        with torch.no_grad():
            logits, keys = hidden_representations(model, params, batch.rows)  # (C, B), (C, B, d)
            residuals = batch.labels - torch.sigmoid(logits)
            # labels < 0 mark extra rows some losses add to the plan; they are not examples
            select = (batch.mask > 0) & (batch.labels >= 0) & (residuals.abs() > self.threshold)
            self.memory.write(batch.clients, batch.items, keys, residuals, select)
        return loss


# ======================================================================================
# The continual method
# ======================================================================================
def _same_state(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


@dataclass
class RLP2(ContinualMethod):
    """RLP2 (F3CRec §5.1): per-user error memory written in training, error compensation in scoring.

    Attributes:
        memory_size: ``M``, slots per user.
        error_threshold: ``τ``, write when ``|y − σ(s)| > τ``.
        alpha: ``α``, weight of the compensation.
        top_k: neighbours retrieved per query.
        temperature: ``T`` of the softmax over cosine similarities.
        name: label in results.

    The memory (:attr:`memory`) lives in the method object across blocks; a new run
    (block 0, or a block that does not follow the last one seen) starts from an empty one.
    """

    memory_size: int = 50
    error_threshold: float = 0.5
    alpha: float = 0.5
    top_k: int = 5
    temperature: float = 0.1
    name: str = "RLP2"
    memory: ErrorMemory = field(init=False, repr=False)

    def __post_init__(self):
        if self.top_k < 1 or self.temperature <= 0:
            raise ValueError("top_k must be >= 1 and temperature > 0")
        self.memory = ErrorMemory(self.memory_size)
        self._last_block: Optional[int] = None
        self._best: Optional[tuple] = None  # (global refs, private refs, memory snapshot)

    # -- model selection: keep the memory of the best round ----------------------------
    def _snapshot_for(self, global_state, private_state):
        if self._best is None:
            return None
        best_global, best_private, snapshot = self._best
        if _same_state(global_state, best_global) and _same_state(private_state, best_private):
            return snapshot
        return None

    def _before_round(self, inner):
        def hook(run, round_index, plan):
            # Round ``round_index`` starts right after the evaluation of the previous round;
            # if that round became the best, the memory now is the memory that went with it.
            if run.best_round is not None and run.best_round == round_index and run.best_state is not None:
                self._best = (run.best_state.global_state, run.best_state.private_state, self.memory.snapshot())
            if inner is not None:
                inner(run, round_index, plan)
        return hook

    # -- hooks ---------------------------------------------------------------------------
    def make_method(self, ctx: BlockContext) -> FederatedMethod:
        base = ctx.base_method
        if ctx.index == 0 or self._last_block != ctx.index - 1:
            self.memory.reset(ctx.split.num_users)
        self._last_block, self._best = ctx.index, None
        self.memory.grow(ctx.split.num_users)
        loss = ErrorMemoryLoss(self.memory, self.error_threshold, base_loss=base.client_loss)
        model = ctx.model
        if ctx.index > 0:
            model = ErrorCompensatedModel(ctx.model, self.memory, self.alpha, self.top_k, self.temperature,
                                          snapshot_for=self._snapshot_for)
        return dataclasses.replace(base, client_loss=loss, model=model, before_round=self._before_round(base.before_round),
                                   name=f"{base.name}+{self.name}")

    def after_block(self, ctx: BlockContext, global_state, private_state) -> Dict[str, object]:
        """Carry the memory of the selected state into the next block."""
        snapshot = self._snapshot_for(global_state, private_state)
        if snapshot is not None:
            self.memory.load(snapshot)
        self._best = None
        return {}
