# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Federated recommendation from scratch
#
# The first lesson of the course. It has no paper of its own: it builds the simplest federated
# recommender and the tools every later lesson uses, from these sources:
#
# * **FedMF**: Chai, Wang, Chen, Yang. *Secure Federated Matrix Factorization.* IEEE Intelligent
#   Systems 36(5), 2021. [arXiv:1906.05108](https://arxiv.org/abs/1906.05108); code:
#   <https://github.com/Di-Chai/FedMF>. (Chai et al. factorise explicit ratings with a squared
#   loss; we use the implicit-feedback form with sampled negatives below, as F3CRec and FedRKG do.)
# * **FedAvg**: McMahan, Moore, Ramage, Hampson, Agüera y Arcas. *Communication-Efficient Learning
#   of Deep Networks from Decentralized Data.* AISTATS 2017. [arXiv:1602.05629](https://arxiv.org/abs/1602.05629).
# * **BCE with sampled negatives** for implicit feedback: He, Liao, Zhang, Nie, Hu, Chua. *Neural
#   Collaborative Filtering.* WWW 2017. [arXiv:1708.05031](https://arxiv.org/abs/1708.05031).
# * **The upload attack and Laplace noise** (§5.6): Lim, Kweon, Kim, Kim, Choi, Kim, Yu. *Federated
#   Continual Recommendation* (F3CRec). CIKM 2025. [arXiv:2508.04792](https://arxiv.org/abs/2508.04792);
#   code: <https://github.com/Jaehyung-Lim/F3CRec-CIKM-25>.
# * **Data**: Harper, Konstan. *The MovieLens Datasets: History and Context.* ACM TiiS 5(4), 2015.
#   [doi:10.1145/2827872](https://doi.org/10.1145/2827872).
#
# **Learning objectives**
#
# 1. Say who holds what in federated recommendation (private user vectors and interactions,
#    a public item table) and what one round sends each way.
# 2. Write FedMF's local training and FedAvg in plain PyTorch, and check them against the library.
# 3. Compare FedMF with centralised MF, local-only training and a popularity baseline, and
#    explain the gap between them.
# 4. Show what an honest-but-curious server infers from an upload, and what Laplace noise costs.
# 5. Recognise an evaluation leak: a negative sampler that knows the test items.
#
# **Prerequisites**: Python, PyTorch tensors and autograd, matrix factorisation for
# recommendation, stochastic gradient descent; no earlier lesson.
#
# **Time** (2-core CPU, nothing else running): `smoke` under a minute (synthetic data);
# `quick` (the default) about 6 minutes, no cell much over a minute; `paper` (longer training)
# about 20-25 minutes.
#
# **Glossary**
#
# | term | meaning |
# |---|---|
# | MF, FedMF | matrix factorisation; its federated form (user vectors private, item table shared) |
# | FedAvg | federated averaging: the server replaces the shared table by the mean of the uploaded copies |
# | BCE | binary cross-entropy (here with logits) |
# | SGD | stochastic gradient descent |
# | ML-100K | MovieLens-100K: 100,000 ratings, 943 users, 1,682 movies |
# | $U$, $I$, $d$, $C$ | numbers of users, items, embedding dimensions, clients in a round |
# | $k$ | sampled negatives per positive; $n^+$: a client's positives |
# | $\lambda$ | scale of the Laplace noise added to uploads; sd: standard deviation |
# | $\eta$ | learning rate (user vectors $\eta$, item rows $\eta \cdot I$) |
# | Recall@K, NDCG@K | share of test items in the top K; the same discounted by rank (normalised discounted cumulative gain) |
# | HR@10 | hit ratio: whether the test item is in the top 10 (here among 1 + 99 sampled candidates) |
# | 1 + 99 | ranking the test item against 99 sampled non-interacted items instead of all items |
# | DP, LDP | differential privacy; local DP (each client randomises what it sends) |
# | kB, MB | $10^3$, $10^6$ bytes |
# | F3CRec, FedRKG, FedKDRec, NCF | papers and methods of this course (lessons 01-05) or cited above |

# %%
import fedlib.notebook as fnb

fnb.start("00_fedrec_from_scratch")  # provenance: git revision, versions, device, profile, start time

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from fedlib.data import load_interactions
from fedlib.data.candidates import candidates_for
from fedlib.data.protocols import build_split
from fedlib.data.sampling import NegativeSampler
from fedlib.data.synthetic import drifting_stream
from fedlib.device import default_device
from fedlib.metrics import candidate_set_metrics, mean_over_users
from fedlib.notebook.progress import RoundProgress
from fedlib.reporting import append_run, save_figure, use_style

PAPER = "intro"  # results/intro/, figures/intro/
device = default_device()
use_style()

# %%
from fedlib.engine import (BatchedExecutor, ClientRowUpdates, FederatedConfig, FederatedMethod, LocalBatch,
                           RankingEvaluator, SequentialExecutor, UploadNoise, bce_client_loss, client_upload_noise,
                           ParameterAveraging, fedavg, fedmf_method, make_round_plan, personal_table_method,
                           round_generator, run_federated, union_pairs)
from fedlib.engine.communication import CommunicationLedger, analytic_model_bytes, format_bytes
from fedlib.experiments.intro import attack_one_round, train_centralised_selected
from fedlib.audits.inference_attack import sign_attack
from fedlib.models import MF, FedMF, ItemPopularity, PersonalItemTableModel

# %% [markdown]
# Every setting of every profile. `smoke` runs on a small synthetic dataset in seconds (it
# exists for the tests), `quick` is the default on MovieLens-100K, and `paper` trains longer.
# This table does not depend on the profile being run.

# %% tags=["nbval-check-output"]
print(fnb.settings_frame("00_fedrec_from_scratch").to_string())

# %% [markdown]
# ## 1. The problem and the setting
#
# In federated recommendation every **user is a client**: a phone or a browser holding that
# user's interaction history. A server coordinates training but must never see the
# interactions. For matrix factorisation the parameters split naturally:
#
# | | lives on | shared? | shape |
# |---|---|---|---|
# | interactions of user $u$ | client $u$ | never | a list of item ids |
# | user vector $p_u$ | client $u$ | never (private) | $d$ |
# | item table $Q$ | server, copied to clients | yes (public) | $I \times d$ |
#
# One **round** (Algorithm 1 of almost every federated recommendation paper):
#
# 1. the server samples clients and sends them the item table $Q$ (download: $I \times d$ numbers);
# 2. each client trains $p_u$ and its copy $Q_u$ on its own interactions (local SGD);
# 3. each client uploads $Q_u$ (or only its changed rows);
# 4. the server aggregates the uploads into a new $Q$ (FedAvg);
# 5. from time to time, the model is evaluated.
#
# **What the server may see**: every upload $Q_u$, and the table it sent. It never sees
# $p_u$ or the interactions, but §3.5 shows that $Q_u - Q$ says a lot about them.
#
# **Data and protocol.** MovieLens-100K, every rating counted as a positive interaction
# (implicit feedback). **Leave-one-out**: each user's latest interaction is the test item, the
# second latest the validation item, the rest is training data (`fedlib.data.protocols`,
# FedKDRec's split). Evaluation ranks **all** items for every user, with the user's training
# items (and, for test, the validation item) masked, and reports Recall@K and NDCG@K; with one
# target per user Recall@K is the hit rate. For comparison we also report HR@10 against
# **1 + 99 sampled candidates**, the protocol many papers use; it gives much larger numbers for
# the same model. The published statistics of the dataset stand beside ours:

# %% tags=["nbval-check-output"]
raw = load_interactions("ml-100k")
real_split = build_split("fedkdrec", "ml-100k", seed=settings.seed)
per_user = raw.frame.groupby("user").size()
ours = {"users": raw.frame["user"].nunique(), "items": raw.frame["item"].nunique(), "interactions": len(raw.frame),
        "interactions per user (min)": per_user.min(), "interactions per user (median)": int(per_user.median()),
        "sparsity (%)": round(100 * (1 - len(raw.frame) / (943 * 1682)), 2),
        "train / valid / test": f"{len(real_split.train)} / {len(real_split.valid)} / {len(real_split.test)}"}
published = {"users": 943, "items": 1682, "interactions": 100000, "interactions per user (min)": 20,
             "interactions per user (median)": "—", "sparsity (%)": 93.7, "train / valid / test": "—"}
print(pd.DataFrame({"published (Harper & Konstan 2015)": published, "ours": ours}).to_string())
print("status:", raw.status)

# %% [markdown]
# The data trained on below: MovieLens-100K at `quick` and `paper`; at `smoke`, a small
# synthetic dataset with clustered tastes (the first block of `fedlib.data.synthetic`'s
# drifting stream), just large enough to exercise every code path.

# %%
if settings.dataset == "ml-100k":
    split = real_split
elif settings.dataset == "synthetic":
    split = drifting_stream(num_users=150, num_items=240, interactions_per_user=40, drift=0.0, seed=settings.seed)[0]
else:
    raise ValueError(f"unknown dataset {settings.dataset!r} in the profile; use 'ml-100k' or 'synthetic'")
num_users, num_items = split.num_users, split.num_items
sampler = NegativeSampler(split.train, num_items)  # negatives among the items a user has not trained on
test_candidates = candidates_for(split.test, [split.train, split.valid, split.test], num_items=num_items,
                                 num_negatives=99, seed=settings.seed)
evaluator = RankingEvaluator(split.train, split.valid, split.test, ks=settings.ks)
print(f"{split.name}: {num_users} users (clients), {num_items} items, {len(split.train)} training interactions")


def evaluate(model, global_state, private_state, name):
    """Full-ranking test metrics plus HR@10 / NDCG@10 on 1 + 99 sampled candidates."""
    metrics = evaluator(model, global_state, private_state, "test")
    with torch.no_grad():
        sampled = candidate_set_metrics(lambda users: model.score_users(global_state, private_state, users),
                                        split.test.users, test_candidates, ks=(10,))
    metrics.update({f"sampled {k}": float(v) for k, v in mean_over_users(sampled).items() if k != "MRR"})
    return {"method": name, **metrics}

# %% [markdown]
# ## 2. The method from its equations
#
# Each equation below is followed by the fedlib code that implements it (displayed from the
# module that runs) and a small check you can edit.
#
# **Score and local loss.** The score of item $i$ for user $u$ is the dot product of their
# vectors. Client $u$ pairs each training positive with $k$ items drawn uniformly among the items
# it has *not* interacted with in training (negatives, label 0), and minimises the binary
# cross-entropy over a mini-batch $B$ (NCF's log loss):
#
# $$\hat y_{ui} = \sigma(s_{ui}),\quad s_{ui} = p_u^\top q_i, \qquad
# L_u(B) = -\frac{1}{|B|}\sum_{(i,y)\in B}\big[y\log\hat y_{ui} + (1-y)\log(1-\hat y_{ui})\big] \tag{1}$$
#
# `FedMF.logits` computes $s_{ui}$ for a batch of clients at once, `bce_client_loss` the mean loss.

# %%
fnb.show_source(FedMF.logits)

# %%
fnb.show_source(bce_client_loss)

# %% [markdown]
# *Check (edit the numbers):* a toy client with $d = 3$, four items and a batch of one positive
# and two negatives; the library's loss equals Eq. (1) computed by hand.

# %%
p_toy = torch.tensor([0.5, -1.0, 2.0])                                    # p_u, (d,)
Q_toy = torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, -1.0], [0.0, 0.5, 0.5], [-0.3, 0.2, 0.1]])  # Q, (I, d)
toy_items, toy_labels = torch.tensor([2, 0, 3]), torch.tensor([1.0, 0.0, 0.0])  # item 2 positive
y_hat = torch.sigmoid(Q_toy[toy_items] @ p_toy)
by_hand = -(toy_labels * torch.log(y_hat) + (1 - toy_labels) * torch.log(1 - y_hat)).mean()
toy_batch = LocalBatch(clients=torch.tensor([0]), rows=toy_items[None], items=toy_items[None],
                       labels=toy_labels[None], mask=torch.ones(1, 3))
library_loss = bce_client_loss(FedMF(1, 4, dim=3), {"user_emb": p_toy[None], "item_emb": Q_toy}, toy_batch)
print(f"Eq. (1) by hand: {float(by_hand):.6f}   bce_client_loss: {float(library_loss[0]):.6f}")
assert torch.allclose(by_hand, library_loss[0])

# %% [markdown]
# **Gradients and local SGD.** With $g_{ui} = \hat y_{ui} - y_{ui}$ the gradients of Eq. (1) are
#
# $$\nabla_{p_u} L_u = \frac{1}{|B|}\sum_{(i,y)\in B} g_{ui}\, q_i, \qquad
# \nabla_{q_i} L_u = \frac{1}{|B|}\sum_{(j,y)\in B,\; j = i} g_{uj}\, p_u \tag{2a}$$
#
# so only the rows of items in the batch get a gradient. Each client takes SGD steps on its
# own copy of the table, with the item learning rate scaled by the number of items (F3CRec's
# code; why is explained after Eq. 3):
#
# $$p_u \leftarrow p_u - \eta\, \nabla_{p_u} L_u, \qquad q_i \leftarrow q_i - \eta I\, \nabla_{q_i} L_u \tag{2b}$$
#
# The reference client loop of the library (`SequentialExecutor`) does exactly this with autograd
# (the batched executor computes the same numbers for all clients at once; the test
# `tests/test_engine_equivalence.py` ties the two):

# %%
fnb.show_source(SequentialExecutor.local_updates, start="for step in range(num_steps):",
                end="tensor -= method.lr(name, plan.round_index) * tensor.grad")

# %% [markdown]
# *Check:* autograd's gradients on the toy client equal Eq. (2a); the row of item 1, which is
# not in the batch, gets a zero gradient.

# %%
p_leaf, Q_leaf = p_toy.clone().requires_grad_(True), Q_toy.clone().requires_grad_(True)
loss = torch.nn.functional.binary_cross_entropy_with_logits(Q_leaf[toy_items] @ p_leaf, toy_labels)
grad_Q, grad_p = torch.autograd.grad(loss, (Q_leaf, p_leaf))
g = y_hat - toy_labels                                                   # (B,)
formula_p = (g[:, None] * Q_toy[toy_items]).mean(0)                      # (d,)
formula_Q = torch.zeros_like(Q_toy).index_add_(0, toy_items, g[:, None] * p_toy / len(toy_items))
print("grad p_u  autograd:", grad_p.numpy().round(4), " Eq. (2a):", formula_p.numpy().round(4))
print("grad Q    rows with a non-zero gradient:", torch.nonzero(grad_Q.abs().sum(1)).flatten().tolist())
assert torch.allclose(grad_p, formula_p) and torch.allclose(grad_Q, formula_Q)

# %% [markdown]
# **FedAvg for an embedding table** (McMahan et al. 2017). The server replaces the table by
# the weighted mean of the uploaded copies; writing each copy as $Q_u = Q + \Delta_u$,
#
# $$Q \leftarrow \sum_{u \in C} w_u Q_u = Q + \sum_{u\in C} w_u \Delta_u, \qquad w_u = \tfrac{1}{|C|}\ \text{(uniform, as in F3CRec)} \tag{3}$$
#
# Row $i$ changes only in the uploads of the $n_i$ clients that trained on item $i$; the other
# $|C| - n_i$ uploads contribute $\Delta_u[i] = 0$. So the effective step on row $i$ is
# $\eta_q\, n_i / |C|$: tiny for all but the most popular items. This is why the item learning
# rate in Eq. (2b) is scaled by $I$ (exercise 1 removes the scaling).

# %%
fnb.show_source(fedavg)

# %% [markdown]
# *Check:* one round of local updates with the plain sequential executor for 50 clients; we keep
# every client's upload, rebuild each client's full table $Q_u$, and compare three things:
# the mean of the uploaded tables, `fedavg` on the explicit deltas, and what the executor
# accumulated on the fly.

# %%
fedmf = FedMF(num_users, num_items, dim=settings.dim)
fedmf_plain = fedmf_method(fedmf, lr=settings.fedmf_lr)  # user lr = η, item lr = η·I
probe_state = ParameterAveraging(fedmf_plain, None, FederatedConfig(rounds=0), device="cpu").init(settings.seed)
probe_plan = make_round_plan(split.train, sampler, round_generator(settings.seed, 0), num_negatives=settings.num_negatives,
                             batch_size=settings.batch_size, clients_per_round=min(50, num_users))
probe_weights = fedmf_plain.aggregation.client_weights(probe_plan.num_examples)  # 1/C each
probe = SequentialExecutor().local_updates(fedmf_plain, probe_state.global_state, probe_state.private_state, probe_plan,
                                           probe_weights, return_client_updates=True)
uploads = probe.client_updates["item_emb"]  # every (client, row, change) the clients upload
Q = probe_state.global_state["item_emb"]
client_deltas = torch.zeros(probe_plan.num_clients, num_items, settings.dim)  # Δ_u, (C, I, d)
client_deltas[np.searchsorted(probe_plan.clients, uploads.clients.numpy()), uploads.rows] = uploads.delta
mean_of_uploaded_tables = (Q + client_deltas).mean(0)
reference = fedavg({"item_emb": Q}, {"item_emb": client_deltas}, probe_weights)["item_emb"]
executor_aggregate = Q + probe.update["item_emb"]
fedavg_diff = float((mean_of_uploaded_tables - executor_aggregate).abs().max())
print(f"max |mean of uploaded tables - executor| = {fedavg_diff:.1e}; "
      f"max |fedavg - executor| = {float((reference - executor_aggregate).abs().max()):.1e}")
touched_per_row = np.bincount(uploads.rows.numpy(), minlength=num_items)
print(f"rows touched by no client this round: {(touched_per_row == 0).mean():.0%}; median clients per touched row: "
      f"{int(np.median(touched_per_row[touched_per_row > 0]))} of {probe_plan.num_clients}")
fnb.record("fedavg_identity_max_abs_diff", fedavg_diff)

# %% [markdown]
# **Laplace noise on uploads** (F3CRec §5.6). Each client perturbs every entry of the table
# it uploads:
#
# $$\tilde Q_u = Q_u + E_u, \qquad (E_u)_{ik} \sim \mathrm{Laplace}(0, \lambda)\ \text{i.i.d.}, \qquad \operatorname{sd}\big((E_u)_{ik}\big) = \sqrt2\,\lambda \tag{4}$$
#
# With `support="full"` every row gets noise, also the rows the client never touched. The
# server averages $|C|$ independent noises, so the aggregate carries noise of standard
# deviation $\sqrt2\,\lambda/\sqrt{|C|}$ per entry and round.
#
# The library draws the noise of all clients of a round at once. Entry $(i, k)$ of client $u$'s
# noise is a pure function of (seed, round, client, tensor, position $i\cdot d + k$): a
# *counter-based* generator hashes that key into 32 random bits, the lowest bit gives the
# sign and the others a uniform $v$, and $-\lambda \ln v$ is the magnitude. So a client's
# noise does not depend on which other clients train with it or on the order in which they
# are simulated, and row $i$ gets the same noise whether the client noises only its touched
# rows or the full table.

# %%
from fedlib.engine.uploads import upload_noise_rows

fnb.show_source(upload_noise_rows, start="scale = method.upload_noise.scale", end="return out")

# %% [markdown]
# *Check:* draw the noise of 50 clients at $\lambda = 0.1$ and compare its spread, and the spread of
# its mean over the clients, with the formulas.

# %%
noise_scale_check = 0.1
noisy_fedmf = fedmf_method(fedmf, lr=settings.fedmf_lr, upload_noise=UploadNoise(scale=noise_scale_check, support="full"))
client_noises = torch.stack([client_upload_noise(noisy_fedmf, probe_state.global_state, user, noise_key=7,
                                                 touched_items=torch.arange(0))["item_emb"] for user in range(50)])
print(f"one client: sd {float(client_noises.std()):.4f} (formula √2·λ = {np.sqrt(2) * noise_scale_check:.4f}); "
      f"mean of 50: sd {float(client_noises.mean(0).std()):.4f} (formula {np.sqrt(2 / 50) * noise_scale_check:.4f})")
assert abs(float(client_noises.std()) / (np.sqrt(2) * noise_scale_check) - 1) < 0.05

# %% [markdown]
# **What a single upload reveals.** After one local step in which item $i$ appears once in a
# batch $B$, Eq. (2) gives its row change
#
# $$\Delta q_i = -\eta I\, \frac{\sigma(p_u^\top q_i) - y_{ui}}{|B|}\; p_u \tag{5}$$
#
# a positive multiple of $p_u$ for a positive ($y = 1$) and a negative multiple for a negative:
# all changed rows lie on one line, positives on one side. The server knows neither $p_u$ nor
# which side is which, but it can find the line (the top singular vector of the client's
# changes), split the rows by the sign of their projection, and guess the **smaller** side
# (one positive per $k$ negatives): the **sign attack** of `fedlib.audits.inference_attack`
# (our own illustration of Eq. 5, not an attack from the papers).

# %%
fnb.show_source(sign_attack, start="kept = torch.linalg.vector_norm", end="scores = projection")

# %% [markdown]
# *Check:* one toy client with 3 positives and 12 negatives; its changes are built from Eq. (5)
# and attacked. Edit `num_toy_negatives` to 2 and the positives are no longer the minority.

# %%
toy = torch.Generator().manual_seed(0)
num_toy_positives, num_toy_negatives, toy_dim = 3, 12, 8
p_u = torch.randn(toy_dim, generator=toy)
toy_rows = torch.randperm(100, generator=toy)[: num_toy_positives + num_toy_negatives]
toy_y = torch.cat([torch.ones(num_toy_positives), torch.zeros(num_toy_negatives)])
q_rows = 0.1 * torch.randn(len(toy_rows), toy_dim, generator=toy)
delta = -(torch.sigmoid(q_rows @ p_u) - toy_y)[:, None] * p_u / len(toy_rows)  # Eq. (5), η·I = 1
guesses = sign_attack(ClientRowUpdates(torch.zeros_like(toy_rows), toy_rows, delta))
print("guessed positive:", guesses.guessed.int().tolist())
print("true positive:   ", toy_y.int().tolist())

# %% [markdown]
# ## 3. Train it live
#
# ### 3.1 FedMF from scratch, in plain PyTorch
#
# Equations (1)-(3) are all FedMF needs. The function below is the whole algorithm: every
# client downloads a copy of the item table, trains it and its private user vector with BCE on
# its positives and sampled negatives for a few SGD steps, and uploads the copy; the server
# averages the copies. The only thing it borrows from the library is the **round plan**: which
# clients take part, which negatives each positive gets and in which order the examples are
# visited. `run_federated` draws that plan from a generator seeded by `(seed, round)`; using
# the same plan makes the comparison with the library exact. This is where the negatives come
# from (`make_round_plan`; `sampler.sample` draws uniformly among a user's non-training items):

# %%
fnb.show_source(make_round_plan, start="num_pos = indptr[clients + 1]", end="num_examples = num_pos * per_pos")

# %%
def fedmf_from_scratch(train, item_table, user_table, rounds, *, lr, seed, num_negatives, batch_size):
    """FedMF in plain PyTorch. item_table (I, d) public, user_table (U, d) private; returns both after training."""
    item_table, user_table = item_table.clone(), user_table.clone()
    num_items = item_table.shape[0]
    sampler = NegativeSampler(train, num_items)
    for t in range(rounds):
        plan = make_round_plan(train, sampler, round_generator(seed, t), round_index=t,
                               num_negatives=num_negatives, batch_size=batch_size)  # clients, negatives, order
        uploaded_sum = torch.zeros_like(item_table)
        for c, user in enumerate(plan.clients):
            q = item_table.clone().requires_grad_(True)          # download: the client's copy of Q
            p = user_table[user].clone().requires_grad_(True)    # its private user vector
            mine = plan.client_examples(c)
            items, labels = torch.as_tensor(plan.items[mine]), torch.as_tensor(plan.labels[mine], dtype=q.dtype)
            for step in range(plan.num_steps[c]):                # local SGD, Eq. (1)-(2)
                batch = torch.as_tensor(plan.steps[mine] == step)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(q[items[batch]] @ p, labels[batch])
                grad_q, grad_p = torch.autograd.grad(loss, (q, p))
                with torch.no_grad():
                    q -= lr * num_items * grad_q
                    p -= lr * grad_p
            user_table[user] = p.detach()                        # stays on the client
            uploaded_sum += q.detach()                           # upload the trained copy
        item_table = uploaded_sum / plan.num_clients             # FedAvg, Eq. (3)
    return item_table, user_table


# %% [markdown]
# Run it for `scratch_rounds` rounds with every user taking part, then run the library's
# `run_federated` (batched executor) from the same initial tables with the same seed and
# settings, in float64 so that the only differences are rounding.

# %%
scratch_config = FederatedConfig(rounds=settings.scratch_rounds, seed=settings.seed, num_negatives=settings.num_negatives,
                                 batch_size=settings.batch_size, test_at_end=False, dtype="float64")
# the random initial tables, as run_federated draws them (the algorithm's init from the seed)
start = ParameterAveraging(fedmf_plain, None, scratch_config, device="cpu").init(settings.seed)
t0 = time.perf_counter()
scratch_items, scratch_users = fedmf_from_scratch(split.train, start.global_state["item_emb"], start.private_state["user_emb"],
                                                  settings.scratch_rounds, lr=settings.fedmf_lr, seed=settings.seed,
                                                  num_negatives=settings.num_negatives, batch_size=settings.batch_size)
scratch_seconds = time.perf_counter() - t0
t0 = time.perf_counter()
library = run_federated(fedmf_plain, split.train, scratch_config, device="cpu").state  # the state after the last round
library_seconds = time.perf_counter() - t0
scratch_diff = {"item table": float((scratch_items - library.global_state["item_emb"]).abs().max()),
                "user vectors": float((scratch_users - library.private_state["user_emb"]).abs().max()),
                "item table moved by": float((scratch_items - start.global_state["item_emb"]).abs().max())}
scratch_metrics = evaluator(fedmf, {"item_emb": scratch_items}, {"user_emb": scratch_users}, "test")
library_metrics = evaluator(fedmf, library.global_state, library.private_state, "test")
fnb.show(pd.DataFrame({"from scratch": scratch_metrics, "run_federated": library_metrics}).T.rename_axis("run"),
         f"Test metrics after {settings.scratch_rounds} rounds", decimals=5)
print(f"max |from scratch - run_federated|: item table {scratch_diff['item table']:.1e}, user vectors "
      f"{scratch_diff['user vectors']:.1e} (the item table moved by up to {scratch_diff['item table moved by']:.1e})")
print(f"time: from scratch {scratch_seconds:.1f} s, run_federated {library_seconds:.1f} s")
fnb.record("scratch_vs_library", {**scratch_diff, "metrics max abs diff": max(
    abs(scratch_metrics[k] - library_metrics[k]) for k in scratch_metrics)})

# %% [markdown]
# Same tables to rounding, same metrics. From here on we use the library: it is the same
# algorithm, but it runs all clients of a round together (§3.3), evaluates, selects on
# validation, counts bytes and adds noise.
#
# ### 3.2 FedMF against its two extremes
#
# * **Most popular**: scores items by their number of training interactions, for everybody.
#   The floor a personalised model must clear.
# * **Centralised MF**: the same model, loss and negatives, trained with SGD on the pooled
#   data of all users (what a company with all the data would do).
# * **FedMF**: every user takes part in every round; the item table is averaged by the server.
# * **Local-only**: every client trains its own item table and a private head on its own
#   data and never communicates (`PersonalItemTableModel` with no aggregation): maximal
#   privacy, but each client sees only its own few dozen items.
#
# Model selection is on validation NDCG@20 (evaluated every `eval_every` rounds, early
# stopping after `patience` evaluations without improvement); test metrics are reported once,
# for the selected state. Each run is logged to `results/intro/<profile>/runs.jsonl`.

# %%
results, curves, wall = [], {}, {}
runs_meta = dict(dataset=settings.dataset, split=split.name, dim=settings.dim, negatives=settings.num_negatives)


def log_run(name, config, metrics, seconds):
    """Keep the run for the results table and its provenance (results/intro/<profile>/runs.jsonl)."""
    wall[name] = seconds
    results.append(metrics)
    append_run(PAPER, settings.profile, {"method": name, **runs_meta, **config}, settings.seed,
               {k: v for k, v in metrics.items() if k != "method"}, seconds)


def train_federated(method, rounds, name, *, sampler_=None, clients_per_round=None):
    """run_federated with validation selection and a progress bar; returns (run, test metrics, seconds)."""
    config = FederatedConfig(rounds=rounds, seed=settings.seed, num_negatives=settings.num_negatives,
                             batch_size=settings.batch_size, eval_every=settings.eval_every, patience=settings.patience,
                             selection_metric="NDCG@20", clients_per_round=clients_per_round)
    t0 = time.perf_counter()
    with RoundProgress(rounds, name, metric="NDCG@20") as progress:
        run = run_federated(method, split.train, config, sampler=sampler_, evaluator=evaluator, device=device,
                            on_round_end=progress)
    curves[name] = pd.DataFrame(run.history)
    best = run.best_state  # the state of the best validation round
    metrics = evaluate(method.model, best.global_state, best.private_state, name)
    return run, metrics, time.perf_counter() - t0

# %%
popularity = ItemPopularity(split.train, num_items)
t0 = time.perf_counter()
log_run("Most popular", {}, evaluate(popularity, popularity.global_state(), {}, "Most popular"), time.perf_counter() - t0)

central = MF(num_users, num_items, dim=settings.dim, generator=torch.Generator().manual_seed(settings.seed))
t0 = time.perf_counter()
central_global, central_private, central_history = train_centralised_selected(
    central, split.train, num_items, lambda g, p: evaluator(fedmf, g, p, "valid")["NDCG@20"],
    epochs=settings.central_epochs, lr=settings.central_lr, batch_size=settings.batch_size,
    num_negatives=settings.num_negatives, seed=settings.seed, eval_every=settings.eval_every,
    patience=settings.patience, sampler=sampler)
curves["Centralised MF (epochs)"] = central_history.rename(columns={"valid/score": "valid/NDCG@20"})
log_run("Centralised MF", {"lr": settings.central_lr, "epochs": settings.central_epochs},
        evaluate(fedmf, central_global, central_private, "Centralised MF"), time.perf_counter() - t0)

# %%
fedmf_run, fedmf_metrics, seconds = train_federated(fedmf_plain, settings.fedmf_rounds, "FedMF")
log_run("FedMF", {"rounds": settings.fedmf_rounds, "lr": dict(fedmf_plain.learning_rates),
                  "best_round": fedmf_run.best_round}, fedmf_metrics, seconds)
print(f"FedMF: best validation NDCG@20 at round {fedmf_run.best_round}, {seconds:.1f} s")

# %%
local_model = PersonalItemTableModel(num_users, num_items, dim=settings.dim)
local_method = personal_table_method(local_model, lr=settings.local_lr)
local_run, local_metrics, seconds = train_federated(local_method, settings.local_rounds, "Local-only")
log_run("Local-only", {"rounds": settings.local_rounds, "lr": dict(local_method.learning_rates),
                       "best_round": local_run.best_round}, local_metrics, seconds)
print(f"Local-only: best validation NDCG@20 at round {local_run.best_round}, {seconds:.1f} s")

# %%
results_table = pd.DataFrame(results).set_index("method")
results_table["wall time (s)"] = [wall[m] for m in results_table.index]
fnb.show(results_table, "Test metrics (full ranking; 'sampled': 1 + 99 candidates) and training time", decimals=4)
fnb.record("test_metrics", results_table.drop(columns="wall time (s)").reset_index())
fnb.record("fedmf_first_loss", float(curves["FedMF"]["train_loss"].iloc[0]))
fnb.record("fedmf_last_loss", float(curves["FedMF"]["train_loss"].iloc[-1]))

# %%
fig, (ax_loss, ax_ndcg) = plt.subplots(1, 2, figsize=(11, 3.8))
for name, curve in curves.items():
    ax_loss.plot(curve["round"], curve["train_loss"], label=name)
    evaluated = curve.dropna(subset=["valid/NDCG@20"])
    ax_ndcg.plot(evaluated["round"], evaluated["valid/NDCG@20"], marker="o", ms=3, label=name)
ax_ndcg.axhline(results_table.loc["Most popular", "NDCG@20"], color="grey", ls="--", label="Most popular (test)")
ax_loss.set(xlabel="round (epoch for centralised MF)", ylabel="training loss (BCE)", title="Local training loss")
ax_ndcg.set(xlabel="round (epoch for centralised MF)", ylabel="validation NDCG@20", title="Validation NDCG@20")
ax_ndcg.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, PAPER, "convergence_central_fedmf_local", settings.profile)
plt.show()

# %% [markdown]
# **Reading the results** (quick profile, MovieLens-100K; the numbers are in the table above and
# `tests/test_notebook_00.py` checks these statements on the records). FedMF is on par with
# centralised MF (here slightly above it): with every user in every round and the item learning
# rate scaled as in Eq. (2b), averaging the clients' copies behaves like centralised SGD (neither
# model was tuned beyond one learning rate, so a small gap in either direction means little).
# Both are well above popularity. Local-only ranks near chance level: a client that never
# communicates knows nothing about the items it has not seen. The value of federation is the
# gap between those rows, obtained without moving any interaction off a client. The sampled
# 1 + 99 numbers are several times larger than the full-ranking ones for the same models:
# numbers from the two protocols cannot be compared.
#
# ### 3.3 Simulating many clients: batched vs sequential
#
# A client here is tiny: a user vector and a few hundred item rows. Looping over clients in
# Python, as `fedmf_from_scratch` and the papers' public code do, costs a lot per round.
# `fedlib`'s `BatchedExecutor` runs the local updates of all clients of a round together with
# batched tensor operations; every client still takes its own sequential SGD steps on its own
# copy, so the result equals the plain loop to float rounding (both follow the same round plan).

# %%
def time_rounds(executor, rounds):
    config = FederatedConfig(rounds=rounds, seed=settings.seed, num_negatives=settings.num_negatives,
                             batch_size=settings.batch_size, test_at_end=False)
    t0 = time.perf_counter()
    state = run_federated(fedmf_plain, split.train, config, executor=executor, device=device).state
    return state, (time.perf_counter() - t0) / rounds


batched_state, batched_s = time_rounds(BatchedExecutor(), settings.timing_rounds)
sequential_state, sequential_s = time_rounds(SequentialExecutor(), settings.timing_rounds)
max_diff = max(float((batched_state.global_state["item_emb"] - sequential_state.global_state["item_emb"]).abs().max()),
               float((batched_state.private_state["user_emb"] - sequential_state.private_state["user_emb"]).abs().max()))
print(f"seconds per round: sequential {sequential_s:.3f}, batched {batched_s:.3f}, from scratch (§3.1, float64) "
      f"{scratch_seconds / settings.scratch_rounds:.3f}; speed-up of batched over sequential {sequential_s / batched_s:.0f}x")
print(f"max |batched - sequential| after {settings.timing_rounds} rounds (float32): {max_diff:.1e}")
fnb.record("executor_max_abs_diff", max_diff)
fnb.record("seconds_per_round", {"batched": batched_s, "sequential": sequential_s})

# %% [markdown]
# ### 3.4 Communication per round
#
# What moves over the network, measured by `fedlib.engine.communication.CommunicationLedger`
# during one round: each client downloads the item table and uploads either its full table (as
# F3CRec's code does) or only the rows it changed plus their indices. Bytes are float32 values
# (and int64 indices); MB here means $10^6$ bytes.

# %%
comm = []
for mode in ("full", "rows"):
    ledger = CommunicationLedger()
    method = fedmf_method(fedmf, lr=settings.fedmf_lr, upload_mode=mode)
    run_federated(method, split.train, FederatedConfig(rounds=1, seed=settings.seed, num_negatives=settings.num_negatives,
                                                       batch_size=settings.batch_size, test_at_end=False), ledger=ledger)
    per_round = ledger.per_round()  # one row per (round, direction)
    for direction in ("download", "upload"):
        row = per_round[per_round["direction"] == direction].iloc[0]
        comm.append({"upload mode": mode, "direction": direction, "bytes per client": row["mean_bytes_per_client"],
                     "per client": format_bytes(row["mean_bytes_per_client"], convention="decimal"),
                     "whole round": format_bytes(row["mean_bytes_per_client"] * row["clients"], convention="decimal")})
comm_table = pd.DataFrame(comm)
fnb.show(comm_table, "Bytes per round, measured by the ledger", decimals=0)
print(f"analytic size of the item table: {format_bytes(analytic_model_bytes(num_items * settings.dim), convention='decimal')}"
      " (I x d float32)")
fnb.record("bytes_per_client", comm_table[["upload mode", "direction", "bytes per client"]])

# %% [markdown]
# ### 3.5 What the server can infer from an upload, and what noise costs
#
# The server is *honest but curious*: it follows the protocol, but looks at what it receives.
# F3CRec §5.6 points out the simplest leak: comparing the table it sent, $Q$, with the table a
# client returns, $Q_u$, the server sees which rows changed. Those are the client's training
# positives plus its sampled negatives, so guessing "every changed row is a positive" has
# precision about $n^+/(n^+ + n^-) = 1/(1+k)$, and recall 1. The **sign attack** of Eq. (5) uses
# the direction of the changes as well.
#
# The defence F3CRec evaluates is Eq. (4), Laplace noise on every entry of the upload: untouched
# rows change too, and the signal in the touched rows is blurred. (As F3CRec says, this is not a
# formal local-DP guarantee: nothing bounds how much one interaction changes an upload.) We
# attack one round of uploads from the trained FedMF, for `attack_clients` clients, at each
# noise scale $\lambda$. A server that knows the noise is there can also ignore rows whose
# change is no larger than noise alone would produce ("above noise": rows with
# $\lVert\Delta q_i\rVert > 3\sqrt{d}\,\lambda$, since a $d$-dimensional Laplace vector has norm
# about $\sqrt{2d}\,\lambda$).

# %%
def attack_at(scale, support="full", **options):
    """One round of uploads from the trained FedMF, with Laplace(scale) noise, attacked four ways."""
    noise = UploadNoise(scale=scale, support=support) if scale > 0 else None
    method = fedmf_method(fedmf, lr=settings.fedmf_lr, upload_noise=noise)
    options = {"num_negatives": settings.num_negatives, **options}
    trained = fedmf_run.state  # the tables after FedMF's last round
    return attack_one_round(method, trained.global_state, trained.private_state, split.train, sampler,
                            clients_per_round=min(settings.attack_clients, num_users), seed=settings.seed,
                            batch_size=settings.batch_size, **options)


attack_table = pd.concat([attack_at(scale) for scale in settings.noise_scales], ignore_index=True)
fnb.show(attack_table.pivot(index="noise scale λ", columns="attack", values="precision"), "Attack precision", decimals=3)
fnb.show(attack_table.pivot(index="noise scale λ", columns="attack", values="recall"), "Attack recall", decimals=3)
positive_share = float(attack_table["positive share"].iloc[0])  # n+/I, averaged over the attacked clients
print(f"share of positives among all items, n+/I, averaged over the attacked clients: {positive_share:.3f}")
fnb.record("attack", attack_table[["noise scale λ", "attack", "precision", "recall"]])
fnb.record("attack_positive_share", positive_share)

# %% [markdown]
# Noise has a price: the server averages the noisy uploads, so the noise of $|C|$ clients
# averages down by $\sqrt{|C|}$ per round, but it accumulates over rounds. We retrain FedMF for
# `utility_rounds` rounds without noise and with noisy uploads at a few scales (the same number of
# rounds for every scale), and compare test NDCG@20. Drawing $I \times d$ Laplace numbers per
# client and round makes the noisy runs the slowest step of this lesson.

# %%
def utility_at(scale):
    """FedMF retrained for `utility_rounds` rounds with Laplace(scale) noise on its full uploads: one table row."""
    noise = UploadNoise(scale=scale, support="full") if scale > 0 else None
    method = fedmf_method(fedmf, lr=settings.fedmf_lr, upload_noise=noise)
    run, metrics, seconds = train_federated(method, settings.utility_rounds, f"FedMF, Laplace λ={scale}")
    log_run(f"FedMF, Laplace λ={scale}", {"rounds": settings.utility_rounds, "best_round": run.best_round},
            metrics, seconds)
    return {"noise scale λ": scale, "NDCG@20": metrics["NDCG@20"], "Recall@20": metrics["Recall@20"],
            "best round": run.best_round, "seconds": seconds}


utility = [utility_at(0.0)]  # the noise-free reference, trained for the same number of rounds
smaller_scale, larger_scale = settings.utility_noise_scales

# %%
utility.append(utility_at(smaller_scale))  # one noisy run per cell: each takes about a minute

# %%
utility.append(utility_at(larger_scale))
utility_table = pd.DataFrame(utility)
fnb.show(utility_table, f"FedMF after at most {settings.utility_rounds} rounds, with noisy uploads", decimals=4)
fnb.record("noise_utility", utility_table.drop(columns="seconds"))

# %%
fig, (ax_precision, ax_recall, ax_util) = plt.subplots(1, 3, figsize=(15, 3.9))
no_noise_x = settings.noise_scales[1] / 3  # where λ = 0 is drawn on the log axis
for attack_name, group in attack_table.groupby("attack", sort=False):
    x = group["noise scale λ"].replace(0.0, no_noise_x)
    ax_precision.plot(x, group["precision"], marker="o", label=attack_name)
    ax_recall.plot(x, group["recall"], marker="o", label=attack_name)
for ax, what in ((ax_precision, "precision"), (ax_recall, "recall")):
    ax.set(xscale="log", ylim=(-0.02, 1.02), xlabel="Laplace scale λ (leftmost point: no noise)", ylabel=what,
           title=f"Inference attack: {what}")
ax_precision.axhline(positive_share, color="grey", ls="--", lw=1, label="guess every item (n+/I)")
ax_precision.legend(fontsize=8)
ax_util.plot(utility_table["noise scale λ"], utility_table["NDCG@20"], marker="o", label="FedMF, noisy uploads")
ax_util.axhline(results_table.loc["Most popular", "NDCG@20"], color="grey", ls="--", lw=1, label="Most popular")
ax_util.set(ylim=(0, None), xlabel="Laplace scale λ", ylabel="test NDCG@20",
            title=f"Utility with noisy uploads ({settings.utility_rounds} rounds)")
ax_util.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, PAPER, "inference_attack_and_noise", settings.profile)
plt.show()

# %% [markdown]
# Without noise the sign attack finds the positives almost exactly, far better than the
# changed-rows guess. Full-support noise makes every row change, so the changed-rows attack
# degrades to guessing every item (precision $n^+/I$); a server that discards rows below the
# noise floor recovers part of the signal at small $\lambda$, and at large $\lambda$ both attacks
# lose most of it (their recall falls to about 0; the above-noise precisions there rest on the
# few rows left above the floor). The utility panel shows the other side: noise up to $\lambda = 1$ costs no
# measurable NDCG@20 after `utility_rounds` rounds (the server's average carries noise of sd
# $\sqrt2\,\lambda/\sqrt{|C|}$ per round, small next to the item-table updates), while
# $\lambda = 3$ costs a clear share and falls below popularity. The scale that makes the attacks
# weak is close to the scale at which utility starts to pay.
#
# ## 4. The audit: a negative sampler that knows the test set
#
# Several public federated-recommendation codebases sample training negatives among the items a
# user has never rated *anywhere*, including the validation and test items. It looks harmless,
# but it means the test item is never pushed down during training, while every other unseen
# item sometimes is. A model with a personal item table (local-only here, FedRKG in lesson 01)
# then learns to rank the test item first without any collaborative signal. `NegativeSampler`
# excludes only the training positives by default; the leaky behaviour exists only under the
# named audit option `exclude="all_rated"`. We retrain the local-only model with it.

# %%
leaky_sampler = NegativeSampler(split.train, num_items, exclude="all_rated",
                                all_rated=union_pairs(split.train, split.valid, split.test))
leaky_model = PersonalItemTableModel(num_users, num_items, dim=settings.dim)
leaky_state, leaky_metrics, seconds = train_federated(personal_table_method(leaky_model, lr=settings.local_lr),
                                                      settings.local_rounds, "Local-only, leaky sampler",
                                                      sampler_=leaky_sampler)
append_run(PAPER, settings.profile, {"method": "Local-only, leaky sampler", **runs_meta, "rounds": settings.local_rounds},
           settings.seed, {k: v for k, v in leaky_metrics.items() if k != "method"}, seconds)
audit = pd.DataFrame([{**local_metrics, "sampler": "train positives excluded (correct)"},
                      {**leaky_metrics, "sampler": "all rated items excluded (leaks valid/test)"}])
fnb.show(audit[["sampler", "Recall@10", "NDCG@10", "Recall@20", "NDCG@20"]], "Local-only, two negative samplers",
         decimals=4)
fnb.record("leak_audit", audit[["sampler", "Recall@20", "NDCG@20"]])

# %% [markdown]
# **What happened.** The model and the data are the same in both rows; only the negative
# sampler changed. With the correct sampler, local-only training is near chance. With the leaky
# one, every item the client has never rated is sometimes drawn as a negative and pushed down,
# except the validation and test items, which are never drawn: after enough rounds they are the
# only unseen items that were never pushed down, so the model ranks them at the top. The
# "accuracy" comes from the evaluation targets leaking into training, not from learning. The
# lesson for every paper that follows: check which items the negative sampler excludes before
# trusting a number, and prefer a model comparison under the correct sampler.
#
# **What this lesson checked on real data**, for the later lessons that rely on it:
#
# | claim | where | measured here |
# |---|---|---|
# | our plain-PyTorch FedMF equals `run_federated` | §3.1 | max difference printed there (float64) |
# | FedAvg of full tables = global + mean of deltas | §2, Eq. (3) | max difference printed there |
# | the batched executor equals the sequential loop | §3.3 | max difference printed there |
# | changed-row guessing has precision about $1/(1+k)$ (F3CRec §5.6) | §3.5 | "changed rows" at λ = 0 |
# | full-support Laplace noise hides which rows changed | §3.5 | changed-rows precision falls to $n^+/I$ |
# | a sampler that excludes valid/test items inflates a personal-table model | §4 | the audit table |
# %% [markdown]
# ## 5. Takeaways
#
# 1. In federated recommendation each user is a client: its interactions and user vector stay
#    on the device, and only the item table travels. FedMF is MF trained by local SGD on each
#    client's copy of the table plus FedAvg on the server, about 25 lines of PyTorch (§3.1),
#    equal to the library's `run_federated` to float rounding.
# 2. FedAvg on an embedding table averages many zero changes: a row moves only in the uploads
#    of clients that trained on it, so the item learning rate must be scaled (here by $I$) for
#    FedMF to keep pace with centralised MF.
# 3. Federation is worth the gap between local-only training (near chance) and FedMF (on par
#    with centralised MF), obtained without moving any interaction off a client.
# 4. An upload is not anonymous: the changed rows reveal the client's positives and negatives,
#    and their signs reveal the positives themselves. Laplace noise on the full upload (not only
#    the touched rows) hides which rows changed, at a utility cost that grows with $\lambda$; it is not a formal
#    privacy guarantee.
# 5. Evaluation details decide the numbers: full ranking vs 1 + 99 sampled candidates differ
#    several-fold, and a negative sampler that excludes the test items inflates a model with a
#    personal item table far above chance. Check both before comparing with any paper.
#
# ### Review questions
#
# 1. Which parameters of FedMF does the server see, and which never leave a client? Why can the
#    user vector stay private while the item table cannot?
# 2. Why does Eq. (2a) give a zero gradient to most rows of the item table, and what does that
#    imply for the size of an upload in the `rows` mode?
# 3. Show from Eq. (3) that averaging the full uploaded tables equals adding the mean of the
#    deltas to the global table. Why does the effective step on row $i$ scale with $n_i/|C|$?
# 4. What exactly does `fedmf_from_scratch` borrow from the library, and why is that enough to
#    make its result equal to `run_federated`'s?
# 5. Why is local-only training near chance level under full ranking, although each client
#    trains on its own data?
# 6. Why are the "sampled" 1 + 99 numbers several times larger than the full-ranking numbers of
#    the same model?
# 7. Without noise, what precision does the changed-rows attack reach with $k$ negatives per
#    positive, and why does the sign attack do much better after one local step?
# 8. Why does full-support Laplace noise drive the changed-rows precision down to $n^+/I$, and
#    how does a noise-aware server partly recover?
# 9. Why is Laplace noise on uploads, as used here, not a differential-privacy guarantee?
# 10. Explain in two sentences how excluding all rated items from the negatives leaks the test
#     item into training.
#
# ### Exercises
#
# Each exercise runs at `quick` as written (about a minute at most). Solutions are in the cells
# tagged `solution` (removed from the student copy).
#
# **Exercise 1 · The item learning rate.** `fedmf_method(fedmf, lr=η)` sets the item learning
# rate to $\eta \cdot I$ (Eq. 2b). Build `FederatedMethod(fedmf, {"user_emb": η, "item_emb": η})`
# instead (no scaling) and train both for `settings.exercise_rounds` rounds with
# `fedlib.experiments.intro.short_run`. *Expected:* without the scaling the item table barely
# moves (its relative change is orders of magnitude smaller) and validation NDCG@20 stays near its
# value before training, because each row's averaged update is diluted by all clients that did
# not touch it (Eq. 3).

# %% tags=["solution"]
from fedlib.experiments.intro import short_run

exercise_options = dict(rounds=settings.exercise_rounds, seed=settings.seed, num_negatives=settings.num_negatives,
                        batch_size=settings.batch_size)
unscaled = FederatedMethod(fedmf, {"user_emb": settings.fedmf_lr, "item_emb": settings.fedmf_lr}, name="FedMF, item lr = η")
exercise_1 = pd.DataFrame({"item lr = η·I (fedmf_method)": short_run(fedmf_plain, split.train, evaluator, **exercise_options),
                           "item lr = η": short_run(unscaled, split.train, evaluator, **exercise_options)}).T
fnb.show(exercise_1.rename_axis("method"), f"{settings.exercise_rounds} rounds", decimals=4)

# %% [markdown]
# **Exercise 2 · Sampling clients.** Pass `clients_per_round=num_users // 10` (10 % of the
# clients per round) to `short_run` (it sets `FederatedConfig(clients_per_round=...)`).
# *Expected:* each round is several times cheaper, but after the same number of rounds
# validation NDCG@20 is lower: each user vector is trained in only one round in ten, and each
# item row is averaged over fewer uploads.

# %% tags=["solution"]
exercise_2 = pd.DataFrame({"all clients": short_run(fedmf_plain, split.train, evaluator, **exercise_options),
                           "10 % of clients": short_run(fedmf_plain, split.train, evaluator,
                                                        clients_per_round=num_users // 10, **exercise_options)}).T
fnb.show(exercise_2.rename_axis("clients per round"), f"{settings.exercise_rounds} rounds", decimals=4)

# %% [markdown]
# **Exercise 3 · Noise on the touched rows only.** `UploadNoise(scale, support="touched")` adds
# noise only to the rows a client trained on, which is much cheaper than the full table. Compare
# `attack_at(0.3, support="touched")` with `attack_at(0.3)` (full support; both call
# `fedlib.experiments.intro.attack_one_round`). *Expected:* with touched-only noise the
# changed-rows precision stays at its noise-free value, about $1/(1+k)$, instead of falling to
# $n^+/I$: the set of changed rows is still visible, and the noise hides only which of them are
# the positives.

# %% tags=["solution"]
exercise_3 = pd.concat([attack_at(0.0).assign(support="none"), attack_at(0.3, support="touched").assign(support="touched"),
                        attack_at(0.3).assign(support="full")])
fnb.show(exercise_3.pivot(index="support", columns="attack", values="precision").loc[["none", "touched", "full"]],
         "Attack precision; λ = 0.3 for the noisy rows", decimals=3)

# %% [markdown]
# **Exercise 4 · Fewer negatives.** Attack uploads made with one negative per positive:
# `attack_at(0.0, num_negatives=1)`. *Expected:* the changed-rows precision rises towards
# $1/(1+k) = 1/2$; the sign attack loses its footing, because it guesses the *smaller* side and
# positives are no longer a clear minority.

# %% tags=["solution"]
exercise_4 = pd.concat([attack_at(0.0), attack_at(0.0, num_negatives=1)])
fnb.show(exercise_4.pivot(index="negatives", columns="attack", values="precision"), "Attack precision, no noise",
         decimals=3)

# %%
fnb.finish()  # wall time
