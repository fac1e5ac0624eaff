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
# # 02 · F3CRec: federated continual recommendation
#
# Lim, Kweon, Kim, Kim, Choi, Kim, Yu. *Federated Continual Recommendation.* CIKM 2025.
#
# Recommenders are retrained as new interactions arrive; federated recommenders cannot keep
# the old interactions on a server to replay them. F3CRec asks how a federated recommender can
# learn block after block of new data **without forgetting** what it knew, when nobody may
# revisit past blocks and nobody may see another client's data. Its answer has two halves:
#
# * **client side, adaptive replay memory:** each user distils from the previous model's
#   top-N list, and distils *less* when the user's preferences have moved (Eqs. 1–6);
# * **server side, item-wise temporal mean:** each item's embedding is pulled towards its
#   previous value, *less* when the item's knowledge has shifted (Eqs. 7–13).
#
# This notebook builds the task, the three backbones, F3CRec, its four ablations and five
# continual-learning baselines (FT, Reg, KD, RLP2, SPP), trains all of them, and regenerates
# Tables 1–8 and Figures 3–4 next to the paper's numbers.

# %%
import fedlib.notebook as fnb

fnb.start("02_f3crec")  # provenance: git revision, versions, device, profile, start time

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import math
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

from fedlib.data import dataset_status
from fedlib.data.protocols import build_split
from fedlib.data.stats import stats_table
from fedlib.device import default_device
from fedlib.experiments import f3crec as X
from fedlib.experiments import f3crec_tables as T
from fedlib.methods import f3crec as F
from fedlib.reporting import paper_vs_ours, read_runs, recorded_or_none, save_figure, use_style

PAPER = "f3crec"
profile = settings.profile
device = default_device()
use_style()
torch.manual_seed(settings.seed)

cell_kwargs = {"rounds": settings.rounds or None, "patience": settings.patience, "seed": settings.seed}
datasets = list(settings.datasets)
print(f"profile {profile!r} on {device}: datasets {datasets}, backbones {list(settings.backbones)}, "
      f"rounds per block {settings.rounds or 'paper (100 / 150)'}, patience {settings.patience}")

# %% [markdown]
# Every setting of every profile. `smoke` runs on a small synthetic drifting stream (it exists
# for the tests), `quick` trains FedMF on ML-100K with every method, ablation and analysis
# (shorter blocks: 60 rounds, patience 15), and `paper` runs the paper's full grid on the three
# datasets we can read offline. This table does not depend on the profile being run.

# %% tags=["nbval-check-output"]
print(fnb.settings_frame("02_f3crec").to_string())

# %% [markdown]
# ## 1. Setting: who holds what
#
# **The FCRec task** (F3CRec §3). Interactions arrive as blocks $\mathcal D^0, \mathcal D^1,
# \dots, \mathcal D^T$. The model is trained on $\mathcal D^0$, then on $\mathcal D^1$, and so
# on; when block $t$ is trained, blocks $0..t-1$ are gone (the continual constraint), and
# every user's data stays on the user's device (the federated constraint). New users and new
# items appear in every block, so the embedding tables grow.
#
# | | lives on | uploaded? | FedMF | FedNCF | PFedRec |
# |---|---|---|---|---|---|
# | interactions of block $t$ | client $u$ | never | ✓ | ✓ | ✓ |
# | private parameters $\Phi_u$ | client $u$ | never | $p_u$ | $p_u$, head $\mathbb R^{2d}\to\mathbb R$ | head $\mathbb R^{d}\to\mathbb R$ |
# | public item table $Q$ | server, copied to clients | every round | ✓ | ✓ | ✓ |
# | F3CRec memory: top-N list $S_u^{t-1}$ and teacher logits | client $u$ | never | ✓ | ✓ | ✓ |
# | F3CRec: previous best item table $Q^{t-1}$ | server | — | ✓ | ✓ | ✓ |
#
# One round of block $t \ge 1$ (F3CRec's Algorithm 1, in `run_continual` + `run_federated`):
# every user with training data in the block downloads $Q$, trains its private parameters and
# its copy of $Q$ on $\mathcal L_{rec} + \lambda_{KD}\mathcal L_{KD}$ (one local epoch), uploads
# the full table; the server averages the uploads (Eq. 7) and mixes the average with
# $Q^{t-1}$ item by item (Eqs. 8–13). After each round the block's validation N@20 is computed;
# the best round is kept (patience 30), and the block is tested with full ranking.
#
# The server sees only item tables; the top-N memory, $\Delta_u$ and the replay choices never
# leave the client.

# %%
from fedlib.models import FedMF, FedNCF, PFedRec

sizes = []
for name, model in (("FedMF", FedMF(943, 1152, dim=32)), ("FedNCF", FedNCF.f3crec_variant(943, 1152, dim=32)),
                    ("PFedRec", PFedRec(943, 1152, dim=32))):
    private = model.init_private(torch.Generator().manual_seed(0))
    public = model.init_global(torch.Generator().manual_seed(0))
    sizes.append({"backbone": name,
                  "private parameters per client": sum(v[0].numel() for v in private.values()),
                  "public parameters (uploaded per client and round)": sum(v.numel() for v in public.values()),
                  "upload per client and round (KiB, float32)": sum(v.numel() for v in public.values()) * 4 / 1024})
print("ML-100K after D3 (943 users, 1,152 items, d = 32):")
print(pd.DataFrame(sizes).set_index("backbone").to_string())

# %% [markdown]
# ## 2. Data and protocol
#
# **Preprocessing** (the public code's notebook; F3CRec §5.1). Ratings are positives; a
# 10-core filter (5-core for Lastfm-2K) runs until stable; interactions are sorted by time and
# users/items re-indexed by first appearance, so that "the items of blocks $0..t$" are exactly
# the first $|I^t|$ ids and tables grow by appending rows. The first 60 % of interactions are
# $\mathcal D^0$, the rest is cut into three equal blocks $\mathcal D^1..\mathcal D^3$. Each
# user's interactions in a block are split 80/10/10 into train/valid/test.
#
# **Evaluation.** Full ranking over every item seen so far ($|I^t|$); validation masks the
# block's training items, test masks training + validation items of the block (items of
# earlier blocks stay candidates, a user may consume them again). N@20 and R@20 (R = hits /
# number of test items), per block $\mathcal D^1..\mathcal D^3$, and their average. Selection:
# the best validation N@20 round of each block (first best, patience 30).
#
# **Table 1**, computed from the raw files at every profile:

# %% tags=["nbval-check-output"]
statistics = []
for name in settings.statistics_datasets:
    long = stats_table(X.DATASETS[name], "f3crec")
    long.attrs = {}  # (its attrs hold the raw tables; pandas cannot compare them when concatenating)
    long.insert(0, "dataset", name)
    statistics.append(long)
statistics = pd.concat(statistics, ignore_index=True)
print(statistics.pivot_table(index=["dataset", "statistic"], columns="block", values="ours", sort=False).to_string())
print()
print("max |ours − paper| per dataset:", statistics.assign(gap=statistics["delta"].abs())
      .groupby("dataset", sort=False)["gap"].max().to_dict())
for name in ("HetRec2011",):
    print(f"{name}: {dataset_status(X.DATASETS[name])}")

# %% [markdown]
# ML-100K and ML-Latest-Small match the paper exactly. Lastfm-2K's public data has no
# rating, only listening counts with a tag timestamp; our closest reading of the paper's
# preprocessing gives 22 fewer users and 59 fewer items in $\mathcal D^0$ (1,320 fewer
# interactions) and about 290 fewer interactions per later block. HetRec2011 (MovieLens-2k
# ratings) is not in the offline data root: its loader and its protocol run, and every cell
# that needs it is a visible "needs download".
#
# **Which split.** The paper says the incremental blocks are split *at random* per user; the
# public code splits them *chronologically* (each user's last 10 % is the test set). Section 6
# runs both. The paper's numbers were evidently produced by the code: with FedMF on ML-100K,
# FT reaches N@20 ≈ 0.088 (chronological) vs 0.18 (random); the paper reports 0.0855.
# **Every table below therefore uses the chronological split.**

# %% [markdown]
# ## 3. The method from its equations
#
# ### Client side: adaptive replay memory (§4.2)
#
# For a user $u$ of block $t-1$, the teacher is the block-$(t-1)$ best model.
#
# | Eq. | formula | fedlib |
# |---|---|---|
# | 1 | $S_u^{t-1} = \text{top-}N$ items of the teacher's scores (over **all** items, as in the code) | `F.top_n_memory` |
# | 2 | $\Delta_u^{t,r} = \sum_{k=1}^{N} \lvert r_u^{t,r}(i_k) - k\rvert$, $r$ = the student's current rank of the teacher's $k$-th item | `F.student_ranks`, `F.preference_shift` |
# | 3 | $\delta_u^{t,r} = \exp(-\epsilon\,\Delta_u^{t,r})$ | `F.consistency_sampling_rate` |
# | 4 | $M_u^{t,r} = \mathrm{SWOR}(S_u^{t-1}, \lfloor\delta_u^{t,r} N\rfloor)$ | `F.replay_memory_size`, `F.adaptive_replay_memory` |
# | 5 | $\mathcal L_{KD} = -\frac{1}{\lvert M_u\rvert}\sum_{i\in M_u} \hat y^{t-1}_{ui}\log \hat y_{ui} + (1-\hat y^{t-1}_{ui})\log(1-\hat y_{ui})$ | `F.kd_loss` |
# | 6 | $\mathcal L = \mathcal L_{rec} + \lambda_{KD}\mathcal L_{KD}$ | `F.total_client_loss` |
#
# Readings we implement where paper and code differ (notes §1.3): Eq. 5 is printed as a sum
# without the minus sign; the code takes the **mean** BCE (we do, `kd_reduction="mean"`;
# `"sum"` is a flag). $\Delta$ and the sample are recomputed at **every local mini-batch**, from
# the client's current local model, as in the code. The top-N list includes items the user has
# already consumed (see §6).

# %%
teacher_scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])  # one user, 6 items
memory_items, teacher_logits = F.top_n_memory(teacher_scores, n=3)  # Eq. 1: items 0, 1, 2
student_scores = torch.tensor([[1.0, 3.0, 2.5, 4.0, 0.0, -1.0]])  # preferences moved
ranks = F.student_ranks(student_scores, student_scores.gather(1, memory_items))  # item 0 → 4th, 1 → 2nd, 2 → 3rd
shift = F.preference_shift(ranks)  # Eq. 2: |4−1| + |2−2| + |3−3| = 3
for eps in (0.01, 0.1, 1.0):
    rate = F.consistency_sampling_rate(shift, eps)  # Eq. 3
    size = F.replay_memory_size(rate, 3)  # Eq. 4
    print(f"ε = {eps:<4}  Δ = {int(shift)}  δ = exp(−εΔ) = {float(rate):.3f}  |M_u| = ⌊δN⌋ = {int(size)}")
priorities = torch.tensor([[2, 0, 1]])  # a random permutation per client and step
selected = F.adaptive_replay_memory(priorities, torch.tensor([2]))  # keep the 2 lowest priorities
kd = F.kd_loss(student_scores.gather(1, memory_items), teacher_logits, selected)  # Eq. 5 (mean)
print("memory items", memory_items.tolist(), "ranks", ranks.tolist(), "selected", selected.tolist(),
      f"L_KD = {float(kd):.4f}")
fnb.record("toy_client", {"shift": float(shift), "ranks": ranks.tolist(), "selected": selected.tolist(), "kd": float(kd),
                          "sizes": [int(F.replay_memory_size(F.consistency_sampling_rate(shift, e), 3)) for e in (0.01, 0.1, 1.0)]})

# %% [markdown]
# ### Server side: item-wise temporal mean (§4.3)
#
# | Eq. | formula | fedlib |
# |---|---|---|
# | 7 | $Q' = \frac{1}{\lvert U^{t,r}\rvert}\sum_u Q_u$ | `F.pre_aggregation` (the engine's uniform FedAvg) |
# | 8 | $\phi_i = \lVert Q^{t-1}_i - Q'_i\rVert^2 / \sqrt d$ for old items | `F.item_knowledge_shift` |
# | 9, 11 | $\gamma_i = \beta / (1+\phi_i)$ for old items, $0$ for new items | `F.temporal_mean_weights` |
# | 10, 12, 13 | $Q = (1-\gamma)\odot Q' + \gamma \odot \mathrm{ZeroPad}(Q^{t-1})$ | `F.temporal_mean` |
#
# $Q^{t-1}$ is the previous block's **best-validation** table, fixed for the whole block (the
# code's choice). "w/o i.t.m" replaces $\gamma_i$ by one global $\beta$; "w/o s.c" switches the
# server side off.

# %%
previous = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # Q^{t−1}: two old items, d = 2
aggregated = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.5, 0.5]])  # Q': item 1 moved, item 2 is new
phi = F.item_knowledge_shift(previous, aggregated)  # Eq. 8: [0, 4/√2]
gamma = F.temporal_mean_weights(phi, beta=0.9, num_items=3)  # Eqs. 9, 11: [0.9, 0.9/(1+2.83), 0]
mixed = F.temporal_mean(aggregated, previous, gamma)  # Eqs. 10, 12, 13
print("φ =", phi.numpy().round(3), " γ =", gamma.numpy().round(3))
print("Q =", mixed.numpy().round(3).tolist())
fnb.record("toy_server", {"phi": phi.tolist(), "gamma": gamma.tolist(), "mixed": mixed.tolist()})

# %% [markdown]
# The unchanged item keeps its value, the moved item is pulled back only partly, the new item
# keeps the clients' average.
#
# ### Baselines (F3CRec §5.1; the authors released none of them, notes §5)
#
# | method | mechanism | fedlib | our assumptions |
# |---|---|---|---|
# | FT | fine-tune block after block | `FineTuning` | — |
# | Reg | $\mathcal L_{rec} + \lambda\lVert\theta-\theta^{t-1}\rVert^2$ on the client's private parameters and the old item rows of its batch | `ParameterRegularisation` | $\lambda$ set so one step pulls an old row 10 % back ($\lambda = 0.1 / 2\eta_{item}$); the paper's absolute grid diverges with the $\eta\cdot|I|$ item step |
# | KD | distil the whole top-N list every step, no server side | `kd_baseline` (= F3CRec with `adaptive_replay=False, server_cl=False`) | — |
# | RLP2 | ReLoop2's error memory: per-user memory of mispredicted samples, error compensation at inference | `fedlib.methods.rlp2.RLP2` | see its docstring (printed below) |
# | SPP | CCD's stability/plasticity proxies, rank-discrepancy replay on clients, proxy mixing on the server | `fedlib.methods.spp.SPP` | see its docstring (printed below) |

# %%
from fedlib.methods import rlp2, spp

for module in (rlp2, spp):
    doc = module.__doc__ or ""
    start = doc.find("Assumptions")
    print(f"--- {module.__name__} ---")
    print(doc[start:].strip() if start >= 0 else doc.strip())

# %% [markdown]
# ### Hyperparameters: chosen once on validation
#
# The paper tunes ε, λ_KD, β and N on validation data (§5.1) but does not report the values
# chosen. We ran the `tuning` part of the paper-profile grid on FedMF (Figure 4's one-at-a-time
# sweeps of F3CRec around the README example λ_KD 0.1, β 0.9, N 30, plus KD's λ_KD, Reg's pull
# and RLP2's α) and picked each value with the best mean **validation** N@20 over D1–D3. Test
# data plays no part in the choice. The chosen values are used for every backbone and profile;
# a dataset missing from the table runs with the untuned defaults.

# %%
tuned_rows = [{"dataset": d, "method": m, **v} for d, by_method in X.SELECTED.items() for m, v in by_method.items()]
print(pd.DataFrame(tuned_rows).to_string(index=False) if tuned_rows else "(no tuned values: untuned defaults)")
print("untuned F3CRec defaults per dataset:",
      {d: X.method_params("F3CRec", d, tuned=False) for d in X.OFFLINE_DATASETS})

# %% [markdown]
# ## 4. Training every component
#
# One cell = one continual run: block $\mathcal D^0$ (plain backbone, shared by all methods of
# a backbone), then $\mathcal D^1..\mathcal D^3$ with the method. Every run is recorded in
# `results/f3crec[/profile]/runs.jsonl` with its configuration hash, seed, commit, device and
# wall time; the tables of §5 are built from these records only. At `quick` and `smoke` every
# cell is trained live here; at `paper` the grid goes through a resumable cache (the same code
# as `python -m fedlib.experiments.f3crec table2 ablation analysis noise sensitivity audit`).
#
# ### Table 2 grid: backbones × methods

# %%
grid_started = time.perf_counter()
table2_cells = X.table2_cells(datasets, settings.backbones, settings.methods, **cell_kwargs)
main_runs = X.run_cells(table2_cells, profile, description="Table 2")
show_columns = ["dataset", "backbone", "method", "N@20/D1", "N@20/D2", "N@20/D3", "N@20/Avg", "R@20/Avg", "seconds"]
print(main_runs[show_columns].round(4).to_string(index=False))
fnb.record("main_runs", main_runs[show_columns])

# %% [markdown]
# ### Ablations (Tables 3, 6), static/dynamic analyses (Tables 4, 5, 7), noise (Table 8)

# %%
extra_cells = []
if settings.ablations:
    extra_cells += X.ablation_cells([d for d in datasets if d in X.ANALYSIS_DATASETS], **cell_kwargs)
if settings.analysis:
    extra_cells += X.analysis_cells([d for d in datasets if d in X.ANALYSIS_DATASETS], **cell_kwargs)
extra_cells += X.noise_cells(datasets, settings.noise_scales, **cell_kwargs)
trained = {X.config_hash(c) for c in table2_cells}
extra_cells = [c for c in extra_cells if X.config_hash(c) not in trained]  # λ = 0 is Table 2's F3CRec run
extra_runs = X.run_cells(extra_cells, profile, description="ablations, analyses, noise")
if len(extra_runs):
    extra_runs["analysis"] = [c["analysis"] for c in extra_cells]
    print(extra_runs[["dataset", "method", "upload_noise", "analysis", "N@20/Avg", "R@20/Avg", "seconds"]]
          .round(4).to_string(index=False))

# %% [markdown]
# ### Hyperparameter sweeps (Figure 4) and the split audit

# %%
sensitivity_grid = {"eps_multiple": settings.sensitivity_eps_multiple, "lambda_kd": settings.sensitivity_lambda_kd,
                    "beta": settings.sensitivity_beta}
sweep_cells = X.sensitivity_cells(datasets, sensitivity_grid, **cell_kwargs) if settings.sensitivity else []
audit_dataset = datasets[0]
audit_cells = X.audit_cells(audit_dataset, **cell_kwargs) if settings.audit_split else []
trained |= {X.config_hash(c) for c in extra_cells}
more_cells = [c for c in sweep_cells + audit_cells if X.config_hash(c) not in trained]
more_runs = X.run_cells(more_cells, profile, description="sweeps and audit")
grid_seconds = time.perf_counter() - grid_started
print(f"{len(table2_cells) + len(extra_cells) + len(more_cells)} cells, "
      f"{grid_seconds:.0f} s of training and evaluation in this run")

# %% [markdown]
# ## 5. Results
#
# Each table shows the paper's value, ours and the difference. At `quick` and `smoke` the
# **recorded** `paper`-profile numbers (committed in `results/f3crec/`) are shown next to this
# run's **live** numbers; a paper number is never shown as ours. Cells whose transcription from
# the paper is uncertain are marked in the `confidence` column.

# %%
records = read_runs(PAPER, profile)
T.data_statistics_records(profile, [d for d in settings.statistics_datasets], records)
records = read_runs(PAPER, profile)
live = T.all_tables(records, profile, datasets, cell_kwargs)
if profile == "paper":
    live = T.write_tables(profile, datasets, cell_kwargs)
recorded = {table_id: recorded_or_none(PAPER, table_id) for table_id in live}
print("live cells with a value:", {k: int(v["value_ours"].notna().sum()) for k, v in live.items()})
fnb.record("live_cells_with_value", {k: int(v["value_ours"].notna().sum()) for k, v in live.items()})
fnb.record("live_table2", live["table2"][["dataset", "backbone", "method", "metric", "block", "value_ours"]]
           .dropna(subset=["value_ours"]))
print("recorded paper-profile cells with a value:",
      {k: (int(v["value_ours"].notna().sum()) if v is not None else 0) for k, v in recorded.items()})


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
    return paper_vs_ours(keep(live[table_id]) if profile != "paper" else None, keep(recorded[table_id]))


# %% [markdown]
# ### Table 1: data blocks

# %%
show("table1", metric=["# of accumulated users", "# of accumulated items", "# of interactions"])

# %% [markdown]
# ### Table 2: N@20 per block, average and improvement over FT
#
# (R@20 is in the results file `results/f3crec/table2.csv`; it tells the same story.)

# %%
show("table2", dataset=["ML-100K"], metric="N@20")

# %%
show("table2", dataset=["ML-Latest-Small", "Lastfm-2K"], metric="N@20", block=["Avg", "Improv"])

# %%
show("table2", dataset=["HetRec2011"], metric="N@20", block="Avg", backbone="FedMF")

# %% [markdown]
# **Significance.** The paper marks F3CRec's average with `*` when a paired t-test against the
# best baseline gives $p \le 0.05$ on N@20. We pool the per-user N@20 of $\mathcal D^1..\mathcal
# D^3$ (the same test users for both methods) and test F3CRec against the best other method of
# the same dataset and backbone.

# %%
def significance_frame(table):
    if table is None:
        return pd.DataFrame()
    rows = table[(table["method"] == "F3CRec") & (table["metric"] == "N@20") & (table["block"] == "Avg")]
    rows = rows.dropna(subset=["value_ours"])
    return rows[["dataset", "backbone", "value_paper", "value_ours", "p_value_ours", "marker_ours", "note"]]


for label, table in (("live", live["table2"] if profile != "paper" else None), ("recorded", recorded["table2"])):
    frame = significance_frame(table)
    if len(frame):
        print(f"{label}:")
        print(frame.round(4).to_string(index=False))
fnb.record("significance_live", significance_frame(live["table2"])[["dataset", "backbone", "p_value_ours"]])

# %% [markdown]
# ### Figure 3: improvement over the second-best method

# %%
figure3 = []
for label, table in (("paper", recorded["table2"] if recorded["table2"] is not None else live["table2"]),
                     ("ours (recorded paper profile)", recorded["table2"]),
                     (f"ours (live, {profile})", live["table2"])):
    if table is None:
        continue
    frame = T.improvement_over_second_best(table, "value_paper" if label == "paper" else "value_ours")
    frame["source"] = label
    figure3.append(frame)
figure3 = pd.concat(figure3, ignore_index=True) if figure3 else pd.DataFrame()
if len(figure3):
    figure3["setting"] = figure3["dataset"] + "\n" + figure3["backbone"]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * figure3["setting"].nunique()), 3.5))
    sns.barplot(data=figure3, x="setting", y="improvement_percent", hue="source", ax=ax)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xlabel="", ylabel="F3CRec vs second best (N@20 Avg, %)", title="Figure 3: improvement over the second-best method")
    ax.tick_params(axis="x", labelsize=8)
    save_figure(fig, PAPER, "figure3_improvement", profile)
    plt.show()
    print(figure3[["source", "dataset", "backbone", "second_best", "improvement_percent"]].round(2).to_string(index=False))

# %% [markdown]
# ### Tables 3 and 6: client-side and server-side ablations (FedMF, Avg over D1–D3)

# %%
show("table3")

# %%
show("table6")

# %% [markdown]
# ### Tables 4 and 5: static vs dynamic users
#
# Users present in $\mathcal D^0$'s test set and trained in $\mathcal D^1$ are ranked by their
# mean preference shift $\Delta_u$ during F3CRec's $\mathcal D^1$ training; the bottom 20 % are
# *static*, the top 20 % *dynamic*, and the same groups are used for every method. Table 4:
# degradation rate $(a_{00} - a_{10})/a_{00}$ of N@20 on the $\mathcal D^0$ test set (block-0
# model vs block-1 model); Table 5: $a_{10}$.

# %%
show("table4")

# %%
show("table5")

# %% [markdown]
# ### Table 7: static vs dynamic items
#
# Items are ranked by their knowledge shift $\varphi_i$ between consecutive best tables
# (Eq. 8); the change rate of an item is $\lvert r^{t-1} - r^{t}\rvert / r^{t-1}$, with $r$
# the item's mean rank in the old users' full score lists, averaged over the three
# transitions. The paper does not define "rank" further; this is our reading.

# %%
show("table7")

# %% [markdown]
# ### Table 8: Laplace noise on the uploaded item tables (FedMF)

# %%
show("table8", metric="NDCG@20")

# %% [markdown]
# ### Figure 4: sensitivity to ε, λ_KD and β (FedMF, N@20 Avg)

# %%
sweep_sources = []
if profile == "paper" or recorded["table2"] is not None:
    sweep_sources.append(("recorded paper profile", read_runs(PAPER, "paper"), {"rounds": None, "patience": 30, "seed": 0},
                          X.OFFLINE_DATASETS, X.SENSITIVITY_GRID))
if profile != "paper" and settings.sensitivity:
    sweep_sources.append((f"live, {profile}", records, cell_kwargs, datasets, sensitivity_grid))
figure4 = pd.concat([T.sensitivity_frame(recs, ds, kwargs, grid).assign(source=label)
                     for label, recs, kwargs, ds, grid in sweep_sources] or [pd.DataFrame()], ignore_index=True)
if len(figure4):
    parameters = ["ε", "λ_KD", "β"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, parameter in zip(axes, parameters):
        part = figure4[figure4["parameter"] == parameter]
        if len(part):
            part = part.assign(line=part["dataset"] + " (" + part["source"] + ")")
            sns.lineplot(data=part, x="value", y="N@20", hue="line", marker="o", ax=ax, legend=parameter == "β")
        ax.set(title=parameter, xlabel=parameter, ylabel="N@20 (Avg D1–D3)")
        if parameter in ("ε", "λ_KD"):
            ax.set_xscale("log")
    if axes[-1].get_legend() is not None:
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.suptitle("Figure 4: F3CRec (FedMF) hyperparameter sensitivity")
    save_figure(fig, PAPER, "figure4_sensitivity", profile)
    plt.show()
    spread = figure4.groupby(["source", "dataset", "parameter"])["N@20"].agg(lambda v: v.max() - v.min())
    print("max − min N@20 across each sweep (paper: typically < 0.01):")
    print(spread.round(4).unstack("parameter").to_string())

# %% [markdown]
# ## 6. Reproducibility audit
#
# ### Chronological (code) vs random (paper text) incremental split
#
# The public code builds $\mathcal D^1..\mathcal D^3$'s test sets from each user's *last*
# 10 % of the block; the paper says the split is random. A random split puts test
# interactions in the middle of the block, next to training interactions of the same period,
# so the test items look much more like the training items: the same models score about twice
# as high, and the gap between methods changes.

# %%
def audit_frame(recs, kwargs, dataset):
    known = {r.config_hash: r for r in recs}
    rows = []
    for config in X.audit_cells(dataset, **kwargs):
        record = known.get(X.config_hash({**config, "seed": kwargs.get("seed", 0)}))
        if record is not None:
            rows.append({"split": config["split"], "method": config["method"],
                         **{k: record.metrics[k] for k in ("N@20/D1", "N@20/D2", "N@20/D3", "N@20/Avg", "R@20/Avg")}})
    return pd.DataFrame(rows)


audit_sources = [(f"live, {profile}", audit_frame(records, cell_kwargs, audit_dataset))]
if profile != "paper":
    audit_sources.append(("recorded paper profile", audit_frame(read_runs(PAPER, "paper"),
                                                                {"rounds": None, "patience": 30, "seed": 0}, "ML-100K")))
for label, frame in audit_sources:
    if len(frame):
        frame = frame.set_index(["split", "method"])
        print(f"{label} ({audit_dataset if label.startswith('live') else 'ML-100K'}, FedMF):")
        print(frame.round(4).to_string())
        if {("chronological", "F3CRec"), ("chronological", "FT"), ("random", "F3CRec"), ("random", "FT")} <= set(frame.index):
            for split in ("chronological", "random"):
                gain = frame.loc[(split, "F3CRec"), "N@20/Avg"] / frame.loc[(split, "FT"), "N@20/Avg"] - 1
                print(f"  F3CRec over FT, {split}: {100 * gain:+.1f} %")
fnb.record("split_audit_live", audit_sources[0][1])

# %% [markdown]
# ### The top-N memory includes already-consumed items
#
# Eq. 1 takes the teacher's top-N over all items. The code does not mask the user's past
# training items, and a trained model ranks those highest, so most of $S_u$ is items the user
# has already consumed: the "replay" mostly re-teaches old positives rather than the user's
# predicted next items. **We follow the code** (unmasked), because the paper's numbers come from
# it; the share below shows what that means on the block-0 model of this run.

# %%
memory_dataset = datasets[0]
memory_config = X.cell(memory_dataset, "FedMF", "F3CRec", **cell_kwargs)
stream = X.load_stream(memory_config)
base = X.base_block(memory_config, stream, None if profile != "paper" else X.Path(".cache/f3crec/paper"), device)
backbone = X.make_backbone(memory_config)
model0 = backbone.make_model(stream[0].num_users, stream[0].num_items)
with torch.no_grad():
    scores0 = model0.score_users(base.global_state, base.private_state,
                                 torch.arange(stream[0].num_users, device=device))
top_items, _ = F.top_n_memory(scores0, 30)
train0 = stream[0].train
consumed = np.zeros(top_items.shape, dtype=bool)
top_np = top_items.cpu().numpy()
for user in range(stream[0].num_users):
    items = train0.items[train0.indptr[user]:train0.indptr[user + 1]]
    consumed[user] = np.isin(top_np[user], items)
share_consumed = float(consumed.mean())
print(f"{memory_dataset}: {100 * share_consumed:.1f} % of the top-30 memory items are items the user already "
      f"trained on in D0 (users: {stream[0].num_users})")
fnb.record("memory_consumed_share", share_consumed)

# %% [markdown]
# ### Other departures we keep from the code (notes §4)
#
# * Every block user participates in every round (`clients_sample_ratio = 1.0`).
# * Negatives are resampled every round among all items of the block except the user's
#   training positives of the block.
# * New users' and items' rows use the backbone's initialiser (FedMF $\mathcal N(0, 0.01^2)$,
#   FedNCF/PFedRec items $\mathcal N(0, 1)$).
# * PFedRec's third "KD-only" step in the code is a no-op (its loss does not depend on the
#   item table it steps); we do not run it. FedNCF's head stays private.
# * The code refreshes top-N lists only for users trained in the block (others keep an old
#   list with new teacher logits); we refresh every user (`memory_refresh="all"`; `"trained"`
#   is a flag).

# %% [markdown]
# ## 7. What we reproduce, what differs, and why

# %%
def claims(table2, table3, table6, table8):
    rows = []
    if table2 is None:
        return pd.DataFrame([{"claim": "(no recorded paper-profile tables yet)", "held": ""}])
    avg = table2[(table2["metric"] == "N@20") & (table2["block"] == "Avg")].dropna(subset=["value_ours"])
    wins, total = 0, 0
    for (d, b), group in avg.groupby(["dataset", "backbone"]):
        values = group.set_index("method")["value_ours"]
        if "F3CRec" in values and len(values) > 1:
            total += 1
            wins += int(values["F3CRec"] >= values.drop("F3CRec").max())
    rows.append({"claim": "F3CRec is best on N@20 Avg in every dataset × backbone (Table 2)",
                 "held": f"{wins} of {total} settings"})
    ft_gain = []
    for (d, b), group in avg.groupby(["dataset", "backbone"]):
        values = group.set_index("method")["value_ours"]
        if {"F3CRec", "FT"} <= set(values.index):
            ft_gain.append(100 * (values["F3CRec"] / values["FT"] - 1))
    if ft_gain:
        rows.append({"claim": "F3CRec improves on FT (paper: +3 % to +44 %)",
                     "held": f"{min(ft_gain):+.1f} % to {max(ft_gain):+.1f} %"})
    for table, label in ((table3, "client ablations"), (table6, "server ablations")):
        if table is None:
            continue
        dec = table[(table["stat"] == "decrease_vs_F3CRec") & (table["metric"] == "N@20")
                    & (table["method"] != "FT")].dropna(subset=["value_ours"])  # FT is a reference row, not an ablation
        if len(dec):
            rows.append({"claim": f"removing a component hurts ({label}, Tables 3/6)",
                         "held": f"{int((dec['value_ours'] < 0).sum())} of {len(dec)} variants below F3CRec"})
    if table8 is not None:
        noise = table8[table8["metric"] == "NDCG@20"].dropna(subset=["value_ours"])
        if len(noise):
            drop = noise.groupby("dataset")["value_ours"].agg(lambda v: 100 * (v.min() / v.max() - 1))
            rows.append({"claim": "Laplace noise λ ≤ 0.5 costs little (Table 8)",
                         "held": "; ".join(f"{d}: worst {x:+.1f} %" for d, x in drop.items())})
    return pd.DataFrame(rows)


summary = claims(recorded["table2"], recorded["table3"], recorded["table6"], recorded["table8"])
print("From the recorded paper-profile tables:")
print(summary.to_string(index=False))
large = []
for table_id, table in recorded.items():
    if table is None:
        continue
    rel = table.dropna(subset=["value_ours", "delta_rel"])
    large.append((table_id, int((rel["delta_rel"].abs() > 0.10).sum()), len(rel)))
print("cells with |delta_rel| > 10 %:", {t: f"{n} of {m}" for t, n, m in large})

# %% [markdown]
# **Why the deltas larger than 10 % arise** (the recorded table rows carry the numbers):
#
# 1. **Block-level noise.** Each incremental block has only ~200 test users on ML-100K and
#    ~110–130 on ML-Latest-Small; one run's per-block N@20 moves by ±0.01 (10 % of the value)
#    between seeds. The paper reports one run; so do we.
# 2. **Tuned once, on one backbone.** The paper tunes ε, λ_KD, β, N per dataset *and*
#    backbone (grids in §5.1). We tune ε, λ_KD and β of F3CRec, λ_KD of KD, the pull of Reg and
#    α of RLP2 on FedMF only, one parameter at a time around the authors' README example
#    (λ_KD 0.1, β 0.9, N 30), by mean validation N@20 over D1–D3 (`SELECTED` in
#    `fedlib.experiments.f3crec`, checked against the recorded sweep by the tests), and reuse the
#    values for FedNCF and PFedRec. Where the best value on FedNCF or PFedRec differs, F3CRec's
#    gain over FT is smaller than the paper's (Figure 4 shows how much each parameter moves).
# 3. **Rebuilt baselines.** Reg, KD, RLP2 and SPP are not in the public code; our versions
#    follow the paper's one-line descriptions and their own papers, with the assumptions listed
#    in §3. Their deltas say as much about those assumptions as about the paper.
# 4. **Derived cells.** `Improv` and the ablations' relative decrease divide two noisy averages,
#    so their relative deltas are large whenever the underlying gain is small.
# 5. **Lastfm-2K** differs in its preprocessing (Table 1), and **HetRec2011** needs a download.
# 6. **Tables 4, 5, 7** depend on definitions the paper leaves open (how Δ is aggregated per
#    user, what an item's "rank" is); our readings are stated above each table.
# 7. **Validation does not always pick what test rewards.** On ML-Latest-Small the tuned
#    F3CRec (FedMF) has a higher mean validation N@20 than FT but a lower test N@20; a block
#    holds ~110–130 test users, so both orderings are within one run's noise. We keep the
#    validation choice rather than pick on test.
# 8. **SPP on Lastfm-2K (FedMF)** scores far below FT in our runs: its validation N@20 already
#    drops in D1, so the collapse is in training, not in selection. Our SPP is a reconstruction
#    (§3); its rank-discrepancy replay with FedMF's large item step (η·|I|) on Lastfm-2K's sparse
#    blocks is the likely cause, which we report as measured rather than retune on test.
# 9. **The `quick` profile** (ML-100K, 60 rounds per block, patience 15) trains each block for
#    fewer rounds than the paper; differences of ±0.005 N@20 between methods there are noise,
#    and its ranking of methods need not match the recorded `paper` profile.

# %% [markdown]
# ## 8. Exercises
#
# 1. Switch the top-N memory to unconsumed items only (mask each user's training items before
#    Eq. 1, e.g. by setting their teacher scores to −∞). *Expected:* the replay then distils the
#    teacher's predicted *next* items instead of re-teaching old positives (§6 shows how much of
#    the memory changes); compare the D0-test N@20 after D1 (Table 5's quantity) with the
#    unmasked memory to see which kind of replay protects old knowledge better.
# 2. Set `eps` to 0 (δ = 1: always replay the whole list) and to a very large value (δ ≈ 0:
#    never replay). *Expected:* ε = 0 reproduces "w/o a.r.m" (the KD baseline plus the server
#    side); a huge ε reproduces "w/o c.c".
# 3. Run `python -m fedlib.experiments.f3crec audit` with `--profile quick` and compare F3CRec's
#    gain over FT under both splits. *Expected:* both methods score about twice as high under the
#    random split, and the relative gain of F3CRec shrinks.
# 4. Replace `memory_refresh="all"` by `"trained"` (the code's behaviour). *Expected:* users who
#    skip a block keep distilling an outdated list; on ML-100K few users skip a block, so the
#    average barely moves, but the per-user effect is visible in Table 5's dynamic users.

# %%
fnb.finish()  # wall time
