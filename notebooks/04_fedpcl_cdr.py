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
# # 04 · FedPCL-CDR: cross-domain recommendation where only noisy cluster prototypes cross
#
# *FedPCL-CDR: A Federated Prototype-based Contrastive Learning Framework for
# Privacy-Preserving Cross-domain Recommendation* (paper: `shared/seeds/002`; code study:
# `shared/notes/FedPCL-CDR-reference.md`).
#
# Cross-domain recommendation (CDR) helps a sparse domain (say, a phone shop) with what users
# did in another (a sports shop). Most CDR models pool both domains' data. FedPCL-CDR keeps
# each domain's data and model at home. The **clients are domains**, two or three of them, and
# the only things that leave a domain each round are:
#
# * its **representative prototypes**: k-means runs over *all* its users' embeddings, and the
#   centroids of the clusters that hold at least one **overlapping user** (a person present in
#   every domain) are clipped, noised (Laplace, local differential privacy) and sent;
# * for each cluster, **which overlapping users** it holds (and how many users it has).
#
# The server links clusters of different domains that share overlapping users and sends back
# global and local prototypes. Each domain then pulls every user towards the prototypes of
# their cluster with two InfoNCE losses, a weak regulariser (α = 0.01) on top of a LightGCN +
# MLP recommender.
#
# This notebook builds each piece from its equations, trains FedPCL-CDR, its ablations and the
# ten baselines of Table 2, and regenerates Tables 1–5 and Figures 3–6. Our data have two
# domains per task and no review text (the paper's review datasets are not available), so every
# number of ours is on a labelled **substitute** task.

# %%
import fedlib.notebook as fnb

fnb.start("04_fedpcl_cdr")  # provenance: git revision, versions, device, profile, start time

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import math
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from fedlib.device import default_device
from fedlib.experiments import fedpcl_cdr as X
from fedlib.experiments import fedpcl_cdr_tables as T
from fedlib.methods import fedpcl_cdr as P
from fedlib.metrics.reconstruction import reconstruction_attack
from fedlib.models.review_text import review_leak_effect, synthetic_reviews
from fedlib.reporting import paper_vs_ours, read_runs, recorded_or_none, save_figure, use_style

PAPER = "fedpcl_cdr"
profile = settings.profile
device = default_device()
use_style()
torch.manual_seed(settings.seed)

tasks = list(settings.tasks)
if profile == "paper":  # and every other task whose files are under the data root (the grid's own choice)
    tasks = list(dict.fromkeys([*tasks, *X.available_tasks()]))
cell_kwargs = {"rounds": settings.rounds, "seed": settings.seed}
# each baseline's epochs: the common value, the slow ones fewer at `quick`, FedNCF counts rounds of 10 % of users
method_kwargs = {m: {"rounds": settings.baseline_rounds} for m in X.BASELINES}
method_kwargs.update({m: {"rounds": settings.slow_rounds} for m in settings.slow_baselines})
method_kwargs["FedNCF"] = {"rounds": settings.fedncf_rounds}
print(f"profile {profile!r} on {device}: tasks {tasks}, FedPCL-CDR {settings.rounds} rounds, "
      f"baselines {settings.baseline_rounds} epochs (slow ones {settings.slow_rounds}), FedNCF {settings.fedncf_rounds} rounds")

# %% [markdown]
# Every setting of every profile. `smoke` runs a small synthetic two-domain dataset (it exists
# for the tests and touches every code path); `quick` trains on the Phone-Sport substitute for
# a few epochs, every ablation and every baseline (the slow ones one epoch); `paper` runs the
# three substitute tasks with the paper's hyperparameters and every sweep. The recorded
# paper-profile results are shown next to the live ones at every profile. This table does not
# depend on the profile being run.

# %% tags=["nbval-check-output"]
print(fnb.settings_frame("04_fedpcl_cdr").to_string())

# %% [markdown]
# ## 1. Setting: who holds what
#
# | | lives on | leaves it? |
# |---|---|---|
# | interactions, review text of domain $i$ | domain $i$ | never |
# | LightGCN ID embeddings, review branch, MLP predictor | domain $i$ | never |
# | the prototypes of clusters **without** overlapping users | domain $i$ | never |
# | $K' \le K$ representative differential prototypes $\hat c_k^i = \mathrm{clip}(c_k^i, \beta) + \mathrm{Lap}(0, \eta)^d$, clusters holding an overlapping user (Eqs. 4–5) | domain $i$ → server | every round |
# | overlapping users of each cluster, $O_k^i$ (Eq. 6): one cluster label per overlapping user; the representative cluster ids are its distinct labels | domain $i$ → server | every round |
# | `cluster_sizes`: users per representative cluster (the code sends them; the 'avg' rule ignores them) | domain $i$ → server | every round |
# | global prototypes $g_k^i$ and local prototypes $l_k^{i,m}$ of the representative clusters | server → domain $i$ | every round |
#
# Algorithm 1 (`fedlib.methods.fedpcl_cdr.train_fedpcl_cdr`), per round:
#
# 1. each domain trains its model for one epoch on BCE (+ α·(L_glob + L_loc) once prototypes
#    exist), then clusters **all** its users with k-means, clips and noises the centroids, and
#    uploads the representative ones (`DomainUpload`) with the cluster labels of its
#    overlapping users;
# 2. the server links cluster $k$ of domain $i$ to every cluster, in every domain, that holds
#    one of its overlapping users; the global prototype is their mean (Eq. 13), the local
#    prototype from domain $m$ the linked cluster most similar to $\hat c_k^i$ (Eq. 14);
# 3. each domain receives its own $G^i$, $L^i$ and fills in its unsent clusters with its own
#    prototype (`complete_prototypes`). The public code uploads all $K$ prototypes, but its
#    server only echoes a non-representative one back to its own domain, so keeping it home
#    changes no training number; it only removes bytes and pairs from the attack of Table 5.
#
# **What the server learns beyond prototypes.** Eq. 6's sets $O_k^i$ are lists of user ids.
# Put side by side, they tell the server, for every overlapping user, which cluster they are in
# in *every* domain: an exact cross-domain profile of each shared person, with no noise at
# all. Here it is after a short run (`demo_rounds`) on the first task:

# %%
demo_task = tasks[0]
demo_split = X.load_split(demo_task)
demo_config = X.fedpcl_config(X.cell(demo_task, rounds=settings.demo_rounds, seed=settings.seed))
started = time.perf_counter()
demo = P.train_fedpcl_cdr(demo_split, demo_config, device=device, ks=X.KS)
print(f"{demo_task}: {settings.demo_rounds} rounds in {time.perf_counter() - started:.0f} s")
uploads = demo.artifacts["uploads"]
labels = np.stack([u.overlap_cluster.cpu().numpy() for u in uploads], 1)  # (n_o, domains)
patterns, counts = np.unique(labels, axis=0, return_counts=True)
k = demo_config.num_clusters
co = np.zeros((k, k), dtype=int)
np.add.at(co, (labels[:, 0], labels[:, 1]), 1)
server_view = pd.DataFrame(co, index=[f"{demo_split.domains[0]} c{i}" for i in range(k)],
                           columns=[f"{demo_split.domains[1]} c{j}" for j in range(k)])
print(f"{labels.shape[0]} overlapping users, {len(patterns)} distinct (cluster, cluster) profiles; "
      f"{int((counts == 1).sum())} users are alone in their profile")
fig, ax = plt.subplots(figsize=(5.2, 4.2))
im = ax.imshow(co, cmap="Blues")
ax.set_xlabel(f"cluster in {demo_split.domains[1]}")
ax.set_ylabel(f"cluster in {demo_split.domains[0]}")
ax.set_title("what the server reads from Eq. 6: overlapping users per cluster pair")
fig.colorbar(im, ax=ax)
save_figure(fig, PAPER, "server_view_co_membership", profile)
plt.show()
fnb.record("server_view", {"overlap_users": int(labels.shape[0]), "distinct_profiles": int(len(patterns)),
                           "singleton_profiles": int((counts == 1).sum())})

# %% [markdown]
# ## 2. Data and protocol
#
# The paper's four tasks use Amazon and Douban data with review text, built by its own
# preprocessing; neither is available. The data layer (`fedlib.data.protocols.fedpcl_cdr`)
# provides **two-domain substitutes** without review text:
#
# | our task | data | compared with | not available |
# |---|---|---|---|
# | Phone-Sport | DisenCDR's `phone_sport` pair | Task 1 (Phone, Sport) | — |
# | Elec-Cloth | DisenCDR's `electronic_cloth` pair | Task 2's Elec and Cloth rows | Task 2's Phone (the pairs are re-indexed, users cannot be aligned across three domains) |
# | Book-Music | GA-DTCDR's Douban Book and Music | Task 4's Book and Music rows | Douban Movie: Task 3 and Task 4's Movie rows |
#
# Two more paths are wired in and run as soon as their files are under the data root
# (`X.available_tasks()`; until then their rows read "needs download"):
#
# * **Movie-Music** (Task 3) and **Book-Movie-Music** (Task 4, three domains): GA-DTCDR's
#   Douban ratings once `douban-gadtcdr/douban_movie/ratings.dat` is placed by hand;
# * **FedPCL-CDR's original format** (`"<task> (original)"`, all four tasks): one CSV of
#   ratings with review text per domain, `fedpcl-cdr/<source>_<domain>/<domain>_review_data.csv`
#   (`build_original`). These runs switch the review branch on, with Doc2Vec vectors built from
#   training reviews only. A missing file's error names the file, the data root and the download.
#
# In the DisenCDR pairs **every user is in both domains** (the paper's Task 1 shares 655 of
# 5,730 Phone users), which makes prototype linking easy; Table 4 varies the share.
#
# **Protocol.** Per user and domain, one random interaction is the test item, one more random
# interaction the **validation** item (the paper has none: it selects on the test set, see §6),
# the rest is training data. Each held-out item is ranked against 99 items the user never
# interacted with in that domain (the code effectively uses 98); HR@10 and NDCG@10; ties count
# against the positive. Every method is selected on the mean validation HR@10 over domains.

# %%
records = read_runs(PAPER, profile)
T.statistics_records(profile, tasks, records)
records = read_runs(PAPER, profile)
stats_live = T.table1(records, profile, tasks)
stats_recorded = recorded_or_none(PAPER, "table1")
paper_vs_ours(stats_live if profile != "paper" else None, stats_recorded)

# %% [markdown]
# ## 3. The method from its equations
#
# ### Eqs. 1–2, 10: the local model
#
# `DomainModel`: LightGCN propagation $E_l = \hat A E_{l-1}$ of the ID embeddings (and, with
# review text, of frozen Doc2Vec review embeddings followed by a ReLU layer, added to the ID
# part), the layers combined, then an MLP predictor on $[e_u; e_v]$ with BCE (Eq. 10).
# **Layer combination**: the paper's text says the layers are concatenated; its code sums
# them. We sum (the paper's numbers come from the code); `layer_combine="concat"` is available.

# %%
part = demo_split[demo_split.domains[0]]
for combine in ("sum", "concat"):
    model = P.DomainModel(part, P.FedPCLConfig(layer_combine=combine))
    users, items = model.propagate()
    print(f"{combine:>6}: user representations {tuple(users.shape)}, items {tuple(items.shape)}, "
          f"predictor input {2 * model.representation_size}")

# %% [markdown]
# ### Eqs. 3–6: differential prototypes
#
# k-means over every user of the domain (scikit-learn), then $\hat c = c / \max(1, \|c\|/\beta)
# + \mathrm{Lap}(0, \eta)^d$ with β = 0.2, η = 0.1. The paper's budget is $\epsilon = 2\beta/\eta
# = 4$. That bound treats the L2 clipping radius as the L1 sensitivity; the Laplace mechanism
# needs the L1 sensitivity, which for a $d$-vector of L2 norm ≤ β is up to $2\beta\sqrt d$:
# the guarantee per released prototype and round is $2\beta\sqrt d/\eta$.

# %%
budget = P.privacy_budget(0.2, 0.1, 64)
print(f"paper's ε = 2β/η = {budget['paper_epsilon']:.0f};  Laplace mechanism on a 64-d vector: "
      f"ε = 2β√d/η = {budget['mechanism_epsilon']:.0f} per prototype and round")
upload = uploads[0]
clean = P.clip_to_norm(torch.stack([demo.models[demo_split.domains[0]].propagate()[0].detach()[
    demo.artifacts["assignments"][demo_split.domains[0]] == c].mean(0) for c in range(k)]), 0.2)
clean = clean[upload.cluster_ids]  # the representative clusters: the rows that were sent
print(f"{demo_split.domains[0]} sent {len(upload.cluster_ids)} of {k} prototypes (the clusters holding an overlapping user)")
noise_norm = (upload.prototypes - clean).norm(dim=1)
cosine = torch.nn.functional.cosine_similarity(upload.prototypes, clean, dim=1)
print(f"clipped centroid norm ≤ 0.2; Laplace noise norm: mean {noise_norm.mean():.2f} "
      f"(expected ≈ η·√(2d) = {0.1 * math.sqrt(128):.2f}); cos(noisy, clean) mean {cosine.mean():.2f}")
fnb.record("ldp_signal", {"noise_norm": float(noise_norm.mean()), "cosine": float(cosine.mean()),
                          "paper_epsilon": budget["paper_epsilon"], "mechanism_epsilon": budget["mechanism_epsilon"]})

# %% [markdown]
# The noise is about six times longer than the signal: the uploaded prototypes are close to
# random directions. (The clean centroids are recomputed as cluster means of the final model,
# which is the model the last upload was computed from; k-means centroids are those means up to
# its convergence tolerance.)
#
# ### Eqs. 12–14: the server
#
# A hand-made case (two domains, K = 3, four overlapping users): domain A's cluster 0 holds
# users 0 and 1, who sit in B's clusters 0 and 2. Its global prototype is the mean of A0, B0,
# B2; its local prototype from B is whichever of B0, B2 is closer in cosine to A0. A's cluster 2
# has no overlapping user: it is never sent, and A uses its own prototype for it. The
# vectorised server on what is sent, completed by each domain, agrees with the code's
# per-cluster loop on all prototypes:

# %%
toy_prototypes = [torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64),
                  torch.tensor([[0.0, 2.0], [1.0, 1.0], [3.0, 0.1]], dtype=torch.float64)]
toy_labels = [torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 1])]
toy = [P.DomainUpload.representative(p, l, torch.bincount(l, minlength=3)) for p, l in zip(toy_prototypes, toy_labels)]
print("clusters sent by A:", toy[0].cluster_ids.tolist(), " by B:", toy[1].cluster_ids.tolist())
fast = P.aggregate_prototypes(toy)
completed = [P.complete_prototypes(f, p, i) for i, (f, p) in enumerate(zip(fast, toy_prototypes))]
slow = P.aggregate_prototypes_reference(toy_prototypes, toy_labels)
print("A's global prototypes (clusters 0-1 from the server, 2 its own):\n", completed[0].global_prototypes.numpy().round(3))
print("A0's local prototypes (from A, from B):", fast[0].local_prototypes[0].numpy().round(3).tolist())
agree = all(torch.allclose(f.global_prototypes, s.global_prototypes) and torch.allclose(f.local_prototypes, s.local_prototypes)
            and torch.equal(f.local_mask, s.local_mask) for f, s in zip(completed, slow))
print("representative uploads + completion == the code's loop on all prototypes:", agree)
fnb.record("toy_server", {"global_A0": fast[0].global_prototypes[0].tolist(), "agree": bool(agree)})

# %% [markdown]
# ### Eqs. 7–9, 11: the prototype contrastive losses
#
# $L_{glob}$ is a softmax over the K global prototypes with the user's own cluster as the
# target; $L_{loc}$ averages, over the $M$ local prototypes of the user's cluster, an InfoNCE
# term against every local prototype of the other clusters. Both use cosine similarity / τ
# (τ = 0.2); $L = L_{prd} + \alpha(L_{glob} + L_{loc})$ with α = 0.01. **Reading chosen**: the
# paper's $-\frac1M\sum_m \log(\cdot)$; the code puts the M positives inside one log.

# %%
user = torch.tensor([[0.9, 0.1]], dtype=torch.float64)
protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
local = torch.stack([protos, protos * 0.9 + 0.05], 1)  # (K, M = 2, d)
mask = torch.ones(3, 2, dtype=torch.bool)
toy_losses = {f"cluster {c}": {"L_glob": float(P.global_prototype_loss(user, torch.tensor([c]), protos, 0.2)),
                               "L_loc": float(P.local_prototype_loss(user, torch.tensor([c]), local, mask, 0.2))}
              for c in range(3)}
print(pd.DataFrame(toy_losses).round(4).to_string())
fnb.record("toy_losses", toy_losses)

# %% [markdown]
# The user points at prototype 0: both losses are smallest when its cluster is 0.
#
# ### The choices the paper leaves open
#
# | question | our reading | where |
# |---|---|---|
# | layer combination | sum of $E_0..E_L$ (code); concat available | `FedPCLConfig.layer_combine` |
# | ID + review parts | element-wise sum (paper and code) | `DomainModel.propagate` |
# | predictor | 2D → 64 → 32 → 16 → 1, Linear → ReLU → BatchNorm (code) | `DomainModel` |
# | local epochs | one full epoch per round (Algorithm 1); the code trains one mini-batch | `batches_per_round` |
# | which users enter the CL terms | the user of each positive row of the batch | `_local_update` |
# | local loss | the paper's mean of per-positive InfoNCE terms | `local_prototype_loss` |
# | cluster without overlapping users | never sent (Eq. 4); its own prototype as global and only local prototype (code) | `complete_prototypes` |
# | cluster labels for the CL terms | from the previous round's k-means (code) | `_make_upload` |
# | Laplace parameter | scale b = η (numpy's parameter; the paper says standard deviation) | `differential_prototypes` |
# | model selection | validation HR@10 with patience 5 (paper: early stopping, on the test set in the code) | `SelectionTracker` |
# | review branch | off on the substitutes (no review text); on for the original format, Doc2Vec from training reviews only | `fedlib.models.review_text` |

# %% [markdown]
# ## 4. Training every component
#
# FedPCL-CDR with every Table-3 ablation ("w/o CL", no prototype term at all, is ours: it shows
# what the prototypes add), and the ten baselines of Table 2, each implemented from its own
# paper with the mechanism that defines it (module docstrings list every simplification):
#
# | baseline | kind | defining mechanism | module |
# |---|---|---|---|
# | NeuMF | single domain | GMF ⊕ MLP towers | `cdr_single_domain` |
# | LightGCN | single domain | linear graph propagation, BPR | `cdr_single_domain` |
# | FedNCF | single domain, federated over users | FedAvg of item embeddings and MLP | `cdr_single_domain` |
# | GA-DTCDR | centralised CDR | per-user element-wise attention over domains (graph embedding: truncated SVD for Node2vec) | `ga_cdr` |
# | GA-MTCDR-P | centralised CDR | GNN embedding + personalised alignment of sparse to rich domains | `ga_cdr` |
# | NMCDR | centralised CDR | intra- and inter-domain node matching | `nmcdr` |
# | CL-DTCDR | centralised CDR | intra-domain (graph views) and inter-domain contrastive learning | `cl_dtcdr` |
# | PriCDR | privacy-preserving | DP release of a JL-projected rating matrix | `pp_cdr` |
# | P2FCDR | privacy-preserving, federated | LDP on mapped user embeddings + gated fusion | `pp_cdr` |
# | P²DTR | privacy-preserving, federated | PSI for shared users + prototype FL | `pp_cdr` |
#
# The baselines' learning rate is chosen on validation (the paper: "carefully tuned") by the
# `tuning` part of the paper-profile grid: each baseline on Phone-Sport, seed 0, starting at
# 1e-3 and 1e-2. When the best rate is the largest or smallest one tried, the search adds the
# next rate beyond it (3e-2, 3e-4, ... up to 1e-1 and down to 1e-4), so no baseline is held
# at an untested edge of the grid. `X.selected_from_records` reads the winner of each finished
# search from the recorded runs and `X.SELECTED_LR` holds it (a test checks the two agree); a
# baseline whose search is unfinished runs at 1e-3, as printed below. FedPCL-CDR uses the paper's 1e-3. At `quick`
# every number below is an early-training snapshot; the recorded paper-profile runs are shown
# next to them in §5.

# %%
recorded_lr = X.selected_from_records(read_runs(PAPER, "paper"))
print("baseline learning rates:", {m: X.SELECTED_LR.get(m, f"{X.BASELINE_DEFAULT_LR:g} (tuning not recorded yet)")
                                   for m in X.BASELINES})
print("chosen by the recorded tuning runs:", recorded_lr or "none recorded yet")
# the recorded search itself (paper profile, Phone-Sport, seed 0): mean validation HR@10 (%) per rate
search = X.tuning_frame(read_runs(PAPER, "paper"))
print(search.assign(**{"valid_HR@10": 100 * search["valid_HR@10"]}).pivot(
    index="method", columns="lr", values="valid_HR@10").reindex(X.BASELINES).round(2).to_string())

if profile == "paper":  # the whole grid: every part of `python -m fedlib.experiments.fedpcl_cdr`
    main_cells = X.table2_cells(tasks)
    ablation_cells = X.ablation_cells(tasks)
    sweep_cells = X.privacy_cells() + X.sensitivity_cells(tasks[0])
    overlap_cells = X.overlap_cells()
    tuning_cells = X.tuning_cells()
    audit_cells = X.audit_cells(tasks[0]) if settings.code_audit else []
else:
    main_cells = [X.method_cell(t, m, cell_kwargs, method_kwargs) for t in tasks for m in ["FedPCL-CDR", *settings.baselines]]
    ablation_cells = [X.cell(t, variant=v, **cell_kwargs) for t in tasks for v in settings.variants]
    sweep_cells = ([X.cell(tasks[0], epsilon=e, **cell_kwargs) for e in settings.epsilons]
                   + [X.cell(tasks[0], alpha=a, **cell_kwargs) for a in settings.alphas]
                   + [X.cell(tasks[0], num_clusters=c, **cell_kwargs) for c in settings.cluster_counts])
    overlap_cells = [X.cell(tasks[0], overlap_ratio=r, **cell_kwargs) for r in settings.overlap_ratios]
    tuning_cells = []
    # the code's training (one mini-batch per round): stopped on validation with 98 and 99
    # negatives, and the code's own rule (stopped and selected on test) with 98
    code_training = dict(batches_per_round=1, rounds=10 * settings.rounds, patience=6, seed=settings.seed)
    audit_cells = ([X.cell(tasks[0], num_negatives=n, **code_training) for n in (98, 99)]
                   + [X.cell(tasks[0], num_negatives=98, selection="test", **code_training)]
                   if settings.code_audit else [])
all_cells = X.unique_cells(main_cells + ablation_cells + sweep_cells + overlap_cells + tuning_cells + audit_cells)
print(f"{len(all_cells)} distinct runs")
started = time.perf_counter()
results = {X.config_hash(r["config"]): r for r in X.run_cells(all_cells, profile, description="FedPCL-CDR grid")}
print(f"trained in {time.perf_counter() - started:.0f} s")


# %%
def run_row(config):
    m = results[X.config_hash(config)]["metrics"]
    domains = results[X.config_hash(config)]["extra"]["domains"]
    row = {"task": config["task"], "method": X.method_label(config)}
    for d in domains:
        row[f"{d} HR@10"] = m.get(f"{d}/test/HR@10")
        row[f"{d} NDCG@10"] = m.get(f"{d}/test/NDCG@10")
    row.update({"round": m.get("selected_round"), "seconds": m.get("seconds")})
    return row


main_frame = pd.DataFrame([run_row(c) for c in main_cells + [c for c in ablation_cells if c not in main_cells]])
print(main_frame.round(4).to_string(index=False))
fnb.record("main_runs", main_frame)

# %% [markdown]
# ## 5. Results
#
# Each table shows the paper's value, ours from this run (live) and ours from the recorded
# paper-profile grid, with deltas. Our rows are on the substitute tasks (see each row's note).

# %%
records = read_runs(PAPER, profile)
live = T.all_tables(records, profile, cell_kwargs, method_kwargs, tasks=tasks)
if profile == "paper":
    live = T.write_tables(profile, cell_kwargs, method_kwargs, tasks=tasks)
recorded = {table_id: recorded_or_none(PAPER, table_id.split("_")[0]) for table_id in live}
filled = {k: int(v["value_ours"].notna().sum()) for k, v in live.items()}
print("live cells with a value:", filled)
print("recorded paper-profile cells with a value:",
      {k: (int(v["value_ours"].notna().sum()) if v is not None else 0) for k, v in recorded.items()})
fnb.record("live_cells_with_value", filled)
paper_runs = read_runs(PAPER, "paper")
if paper_runs:
    hours = sum(r.wall_time_s for r in paper_runs) / 3600
    print(f"recorded paper-profile grid: {len(paper_runs)} runs, {hours:.2f} h of wall time (one CPU thread per run)")


def show(table_id, **filters):
    """paper | ours (live) | ours (recorded) for the rows matching ``filters``."""
    def keep(frame):
        if frame is None:
            return None
        mask = np.ones(len(frame), dtype=bool)
        for column, allowed in filters.items():
            allowed = allowed if isinstance(allowed, (list, tuple)) else [allowed]
            mask &= frame[column].astype(str).isin([str(a) for a in allowed]).to_numpy()
        return frame[mask]
    return paper_vs_ours(keep(live[table_id]) if profile != "paper" else None, keep(recorded.get(table_id)))


# %% [markdown]
# ### Table 2: every method (HR@10 and NDCG@10; Task 3 and the Movie rows need a download)

# %%
show("table2_main", stat="score")

# %% [markdown]
# `Imp`: FedPCL-CDR minus the best baseline, in percentage points (the paper's convention).

# %%
show("table2_main", stat="Imp (vs best baseline)")

# %% [markdown]
# ### Table 3: ablations

# %%
show("table3_ablation")

# %% [markdown]
# ### Table 4: share of overlapping users (Phone-Sport)

# %%
show("table4_overlap_ratio")

# %% [markdown]
# ### Table 5: reconstruction attack on what is transmitted
#
# An attacker MLP is trained on half of the (message, true embedding) pairs and scored on the
# other half (`fedlib.metrics.reconstruction`). The paper does not describe its attacker or
# the scale of its embeddings, so the raw MSE is not comparable across models (it scales with
# each model's embedding norm); the **normalised MSE** (1 = the messages say nothing beyond the
# average user, 0 = exact inversion) is the comparable number.

# %%
show("table5_privacy_mse")

# %% [markdown]
# ### Figures 3–5: privacy budget ε, α and K

# %%
sweeps = T.sweep_frame(read_runs(PAPER, profile), cell_kwargs, tasks_privacy=tasks, task_sensitivity=tasks[0])
recorded_sweeps = T.sweep_frame(paper_runs) if profile != "paper" and paper_runs else pd.DataFrame()
for parameter, figure in (("epsilon", "fig3_privacy_budget"), ("alpha", "fig4_alpha"), ("K", "fig5_clusters")):
    for frame, suffix in ((sweeps, ""), (recorded_sweeps, "_paper_profile")):
        fig = T.figure_sweeps(frame, parameter, figure + suffix, profile=profile) if len(frame) else None
        if fig is not None:
            plt.show()
fnb.record("sweep_points", int(len(sweeps)))

# %% [markdown]
# ### Figure 6: list length N (read from the main runs: one evaluation gives every N)

# %%
lengths = T.list_length_frame(read_runs(PAPER, profile), cell_kwargs, tasks=tasks)
recorded_lengths = (T.list_length_frame(paper_runs, tasks=tuple(X.TASKS)) if profile != "paper" and paper_runs
                    else pd.DataFrame())
for frame, suffix in ((lengths, ""), (recorded_lengths, "_paper_profile")):
    fig = T.figure_list_length(frame, "fig6_list_length" + suffix, profile=profile) if len(frame) else None
    if fig is not None:
        plt.show()
fnb.record("list_length_points", int(len(lengths)))

# %% [markdown]
# ### Convergence: validation HR@10 per round

# %%
curves = T.curve_frame(read_runs(PAPER, profile), main_cells)
fig = T.figure_curves(curves, "convergence", profile=profile)
if fig is not None:
    plt.show()

# %% [markdown]
# ## 6. Reproducibility audit
#
# ### Selecting the reported round on the test set
#
# The code evaluates on the test set after every round, stops after 6 rounds without a better
# mean test HR@10 and reports the best test round, with no validation set. Every run here
# records both: test scores at the best **validation** round (what we report) and at the best
# **test** round. The gap is the optimism of test-set selection. The code picks the round by
# the **mean** test HR@10 over domains, so that mean can only gain; a single domain's score may
# move either way.
#
# **These gaps are lower bounds.** Our runs stop when *validation* stops improving, so their
# best test round is the best among fewer rounds than the code would train (it keeps going as
# long as the *test* score rises). The audit cell with `selection="test"` below runs the code's
# whole rule; the column `test-selected is` of the audit table says which rows are which.

# %%
def mean_gaps(frame):
    """Per run: the domain-mean test HR@10 at the test-selected minus at the valid-selected round."""
    hr = frame[frame["metric"] == "HR@10"]
    return hr.groupby(["task", "method", "seed"])["gap"].mean()


gaps = T.selection_gap_frame(read_runs(PAPER, profile), main_cells + ablation_cells)
print(gaps.groupby(["method", "metric"])["gap"].mean().unstack().round(4).to_string())
run_gaps = mean_gaps(gaps)
print(f"domain-mean HR@10 gap per run: min {run_gaps.min():.4f}, mean {run_gaps.mean():.4f}, max {run_gaps.max():.4f}")
if profile != "paper" and paper_runs:
    recorded_gaps = T.selection_gap_frame(paper_runs, [X.method_cell(t, m) for t in X.TASKS for m in X.METHODS]
                                          + [X.cell(t, variant=v) for t in X.TASKS for v in P.VARIANTS])
    if len(recorded_gaps):
        print("recorded paper profile, domain-mean HR@10 gap per run:", mean_gaps(recorded_gaps).round(4).to_dict())
fnb.record("selection_gap", {"min_run_mean": float(run_gaps.min()), "mean_hr": float(run_gaps.mean()),
                             "min_domain": float(gaps["gap"].min())})

# %% [markdown]
# ### The code's training and evaluation: one mini-batch per round, 98 negatives
#
# The code trains a single 512-positive mini-batch per round ("epoch" means batch) and reads
# back 98 of the 99 stored negatives. All runs below use the code's training. The first two
# stop on validation and differ only in the number of negatives: their test-selected column is
# a **lower bound** on what the code reports. The third (`selection = test`) is the code's rule
# itself: it stops after 6 rounds without a better mean test HR@10 and reports the best test
# round (the code also resets its count on ties, which can only make it train longer).

# %%
code_rows = []
for config in audit_cells:
    m = results[X.config_hash(config)]["metrics"]
    domains = results[X.config_hash(config)]["extra"]["domains"]
    by_test = config.get("selection") == "test"
    code_rows.append({"negatives": config["num_negatives"], "batches/round": config["batches_per_round"],
                      "selection": config.get("selection", "valid"),
                      **{f"{d} HR@10": m[f"{d}/test/HR@10"] for d in domains},
                      **{f"{d} HR@10 (test-selected)": m[f"test_selected/{d}/test/HR@10"] for d in domains},
                      "test-selected is": T.CODE_RULE if by_test else T.LOWER_BOUND,
                      "rounds run": m.get("rounds_run")})
code_frame = pd.DataFrame(code_rows)
print(code_frame.round(4).to_string(index=False) if len(code_frame) else
      "not trained at this profile (code_audit = false); see the recorded paper profile")
if len(audit_cells):
    audit_gaps = T.selection_gap_frame(read_runs(PAPER, profile), audit_cells)
    print(audit_gaps[audit_gaps["metric"] == "HR@10"].round(4).to_string(index=False))
if profile != "paper" and paper_runs:
    recorded_audit = T.selection_gap_frame(paper_runs, X.audit_cells())
    if len(recorded_audit):
        print("recorded paper profile:\n", recorded_audit[recorded_audit["metric"] == "HR@10"].round(4).to_string(index=False))

# %% [markdown]
# ### The review leak
#
# The code builds each user's and each item's review document from **all** reviews before the
# split, so the held-out test review is inside both the user's and the test item's Doc2Vec
# vector. None of our substitute datasets has review text (the original-format path has, once
# its files are placed), so we measure the mechanism on synthetic reviews (each names its product and carries its writer's habits of speech) with a
# scorer that sees nothing but the review vectors: cosine(user, item).

# %%
from fedlib.data.synthetic import overlapping_domains

review_split = overlapping_domains(num_users=settings.review_demo_users, items_per_domain=300, overlap=0.5,
                                   seed=settings.seed)
review_domain = review_split[review_split.domains[0]]
leak = review_leak_effect(review_domain, synthetic_reviews(review_domain, seed=settings.seed), dim=16, epochs=20,
                          seed=settings.seed)
print(pd.Series(leak).round(4).to_string())
fnb.record("review_leak", leak)

# %% [markdown]
# ## 7. What we reproduce, what differs, and why
#
# | claim / number | paper | ours | why it differs |
# |---|---|---|---|
# | data | review datasets, partial user overlap (e.g. 655 of 5,730) | two-domain substitutes, no text, full overlap in the Amazon pairs | the paper's data are not public |
# | ε = 4 | 2β/η | 2β√d/η = 32 per prototype and round | L1 sensitivity of an L2-clipped vector |
# | selection | best test round | best validation round; the gap is measured above (a lower bound, except the `selection = test` audit cell) | test-set selection is optimistic |
# | what is sent | the paper: representative prototypes only; the code: all $K$ | representative only, the rest stays home | the code's server only echoes the others back, so training is identical |
# | prototypes | "protect" users | the noise is ~6× the clipped signal; the server still learns exact co-membership | §1, §3 |
# | FedPCL-CDR, Task 1 HR@10 | Phone 0.550, Sport 0.599, first of 11 | Phone-Sport substitute, seed 0: 0.407, 0.323, fifth of 11 (NeuMF first: 0.438, 0.351) | other data: every user shared, no review branch, our split; the paper's numbers also come from test-set selection |
# | FedPCL-CDR, Task 4 Book, Music HR@10 | 0.373, 0.342, first of 11 | Douban Book-Music substitute, seed 0: 0.459, 0.431, fourth of 11 (LightGCN first: 0.538, 0.524) | a two-domain substitute; the baselines were tuned on Phone-Sport and kept their rates |
# | FedPCL-CDR, Task 2 Elec, Cloth HR@10 | 0.541, 0.449, first of 11 | Elec-Cloth substitute, seed 0: 0.443 (seventh of 11), 0.287 (fourth of 11); NMCDR first on Elec (0.475), PriCDR on Cloth (0.349); CL-DTCDR 0.447, 0.274 | a two-domain substitute |
# | ablations (Table 3) | −0.2 to −1.4 points without a prototype term, +4 to +8 without LDP | every variant within 1.4 points of the full model on all six domains, in both directions (e.g. w/o LDP: Phone +0.5, Sport −0.9, Elec +0.4) | with noise six times the signal, the prototype terms are a weak regulariser at α = 0.01 |
# | overlap ratio (Table 4) | every method rises with the ratio; FedPCL-CDR first at each | FedPCL-CDR Phone 0.371 / 0.378 / 0.374, Sport 0.283 / 0.288 / 0.303 at 30 / 50 / 70 %; NMCDR first at every ratio | more shared users help a little; the order of methods is not the paper's |
# | privacy budget (Figure 3) | stable for ε ≥ 4 | flat: over ε = 1 … 16, HR@10 spans at most 0.008 on Phone, Sport and Book, 0.013 on Music, with no trend | the prototype terms barely move training, so their noise level barely matters |
# | α and K (Figures 4–5) | best at α = 0.01, K = 10 | flat within 0.013 (α) and 0.010 (K) on Phone-Sport; no clear optimum | as above |
# | test-set selection | the code reports the best test round; the paper gives no gap | +0.003 domain-mean HR@10 on average over the 45 recorded task–method cells of Tables 2–3 (at most +0.019, P2FCDR on Book-Music); the code's own rule (one batch per round, 98 negatives, best test round) stops after 52 rounds at 0.368 / 0.268 on Phone-Sport | small here, plausibly because the validation and test items come from the same users, so the two curves peak together |
#
# Every cell of the grid that the substitute data allow is recorded; the status table in the
# README shows them beside the cells that need a download.
#
# ## 8. Exercises
#
# 1. **Signal against noise.** Set `clip_norm` to 1.0 with η fixed (`P.FedPCLConfig(clip_norm=1.0)`).
#    *Expected: the cosine between noisy and clean prototypes rises well above the 0.2 seen in §3,
#    the gap between "w/o LDP" and the full model shrinks, and the stated ε = 2β/η grows five-fold
#    (to 20; the mechanism's 2β√d/η to 160).*
# 2. **The paper's layer combination.** Train with `layer_combine="concat"`.
#    *Expected: the predictor's input grows from 128 to 512 numbers and an epoch gets slower; the
#    accuracy changes little, because the concatenation carries the same four layers.*
# 3. **Few shared users.** Build Phone-Sport with `overlap_ratio=0.1` and re-run §1's cell.
#    *Expected: most clusters still hold some of the ~500 shared users, so the server still links
#    almost every cluster pair; the co-membership table stays informative about each shared user.*
# 4. **Why the review leak works.** In `synthetic_reviews`, drop the product name from every
#    review and re-run the review-leak cell.
#    *Expected: the gap shrinks but does not vanish. The user's document no longer names the test
#    item, but the test item's document still carries the user's habitual words from the held-out
#    review, which pulls that item's vector towards the user.*

# %%
fnb.finish()  # wall time
