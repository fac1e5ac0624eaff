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
# Jaehyung Lim, Wonbin Kweon, Woojoo Kim, Junyoung Kim, Seongjin Choi, Dongha Kim, Hwanjo Yu.
# *Federated Continual Recommendation.* CIKM 2025. https://arxiv.org/abs/2508.04792 ·
# official code: https://github.com/Jaehyung-Lim/F3CRec-CIKM-25
#
# Recommenders are retrained as new interactions arrive. A federated recommender cannot keep
# old interactions on a server to replay them, so each new block of data can overwrite what the
# model knew: it **forgets**. F3CRec fights forgetting on both sides of federated learning:
# each client distils from its own previous top-N list (less when the user's taste moved), and
# the server pulls each item's embedding back towards its previous value (less when the item
# moved).
#
# **Learning objectives.** After this lesson you can
# 1. describe the federated continual setting (a base block, incremental blocks, nothing old
#    revisited, nothing private uploaded) and measure forgetting with an accuracy matrix;
# 2. derive the adaptive replay memory: rank shift Δ, sampling rate δ = exp(−ε·Δ), memory size
#    ⌊δN⌋ and the distillation loss weighted by λ_KD, and find each in the code;
# 3. derive the server's item-wise temporal mean γ_i = β/(1+‖ΔQ_i‖²/√d) and explain why new
#    items keep the clients' average;
# 4. train fine-tuning and F3CRec live and read their forgetting curves, and tell which half of
#    F3CRec keeps old knowledge;
# 5. audit a reproduction: the code's chronological test split versus the paper's random one,
#    and a top-N memory of which a large share is already consumed items.
#
# **Prerequisites.** Lesson 00 (federated matrix factorisation, FedAvg, full-ranking NDCG)
# and lesson 01 (reading a paper grid of "ours (paper)" cells). Background: knowledge
# distillation with soft targets, binary cross-entropy, catastrophic forgetting.
#
# **Time** (2 CPU cores): smoke under 1 minute; quick (ML-100K, FedMF, 60 rounds per block,
# nine live runs including the solutions) an estimated 4–6 minutes on an idle machine, 14
# minutes measured on a machine shared with other jobs; paper (the same live runs at 100 rounds
# per block) roughly twice quick. The paper's full grid (Tables 2–8, about 300 runs) is not run
# here: its recorded results are read from `results/f3crec/`.
#
# **Glossary.**
#
# | term | meaning |
# |---|---|
# | FCRec | federated continual recommendation, the task: blocks arrive in time, data stay on clients |
# | D0, D1, D2, D3 | the base block (first 60 % of interactions) and the three incremental blocks |
# | FT | fine-tuning: train each block starting from the previous model, nothing else |
# | Reg | regularisation baseline: penalty ‖θ − θ_previous‖² on the parameters |
# | KD | knowledge-distillation baseline: distil the whole top-N list every step, no server side |
# | RLP2 | ReLoop2, a baseline with a per-user memory of mispredicted samples |
# | SPP | stability and plasticity proxies, a continual-learning baseline |
# | FedMF, FedNCF, PFedRec | the three backbones: federated matrix factorisation, federated neural collaborative filtering, personalised federated recommendation |
# | SWOR | sampling without replacement |
# | BCE | binary cross-entropy |
# | a.r.m | adaptive replay memory (the client side, Eqs. 1–6) |
# | c.c | client-side continual learning: the whole client half (replay + distillation) |
# | s.c | server-side continual learning: the whole server half (Eqs. 8–13) |
# | i.t.m | item-wise temporal mean (the per-item γ_i of the server side) |
# | w/o x | the ablation "F3CRec without component x" (e.g. w/o a.r.m: distil every top-N item) |
# | ε (eps) | sensitivity of the sampling rate to the rank shift Δ |
# | λ_KD | weight of the distillation loss in the client's total loss |
# | β | the largest pull of an old item towards its previous embedding |
# | N | size of the top-N memory (30) |
# | Q, Q', Q^{t−1}, d | the item embedding table, its average over the uploads, the previous block's best table, the embedding size (32) |
# | Δ_u, δ_u, φ_i, γ_i | a user's rank shift, its sampling rate, an item's knowledge shift, its mixing weight |
# | N@20, R@20 | NDCG@20 and Recall@20 under full ranking over all items seen so far |
# | Avg, Improv | mean over D1–D3; F3CRec's relative gain over the best baseline |
# | A[t][s] | accuracy matrix: N@20 on block s's test users after training block t |

# %%
import fedlib.notebook as fnb

fnb.start("02_f3crec")

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display

from fedlib import reporting
from fedlib.data import dataset_status
from fedlib.device import default_device
from fedlib.papers.f3crec import (experiment as f3crec_experiments, figures as f3crec_figures,
                                  method as f3crec, tables as f3crec_tables)

profile, device = settings.profile, default_device()
reporting.use_style()
torch.manual_seed(settings.seed)
live_kwargs = {"rounds": settings.rounds or None, "patience": settings.patience, "seed": settings.seed}
base_dir = Path(tempfile.mkdtemp(prefix="f3crec-lesson-"))  # block 0 is trained once and shared
print(f"{settings.dataset}, {settings.backbone}, rounds per block {settings.rounds or 'as in the paper'}, "
      f"patience {settings.patience}, {device}")

# %% [markdown]
# ## 1. The problem and the setting
#
# Interactions arrive as blocks $\mathcal D^0, \mathcal D^1, \mathcal D^2, \mathcal D^3$ in
# time order. The model is trained on $\mathcal D^0$, then on $\mathcal D^1$, and so on. While
# block $t$ is trained, blocks $0..t-1$ are gone (the continual constraint), and every user's
# data stay on the user's device (the federated constraint). New users and new items appear in
# every block, so the embedding tables grow by appended rows.
#
# | what | lives on | uploaded? | seen by the server? |
# |---|---|---|---|
# | the interactions of block $t$ | client $u$ | never | no |
# | private parameters (FedMF: the user vector $p_u$) | client $u$ | never | no |
# | the item table $Q$ | server, copied to every client | every round | yes: each client's updated copy |
# | F3CRec's top-N memory $S_u^{t-1}$ and its teacher logits | client $u$ | never | no |
# | F3CRec's previous best item table $Q^{t-1}$ | server | — | yes (it is the server's own) |
#
# One round of block $t \ge 1$: every user with training data in the block downloads $Q$,
# trains its private vector and its copy of $Q$ for one local epoch on
# $\mathcal L_{rec} + \lambda_{KD}\mathcal L_{KD}$, and uploads its copy; the server averages
# the uploads and mixes the average with $Q^{t-1}$ item by item. The best validation round of
# each block is kept (the paper's patience: 30 evaluations).
#
# **Protocol.** A 10-core filter (5-core for Lastfm-2K); interactions sorted by time; the first
# 60 % form $\mathcal D^0$, the rest three equal blocks. Within a block each user's interactions
# are split 80/10/10 into train/validation/test. Evaluation ranks **all** items seen so far (full
# ranking), masks the block's training items, and reports N@20 and R@20 per block and their
# average over D1–D3. The paper's Table 1 beside ours (recorded from the raw files):

# %%
table1 = f3crec_tables.recorded_table("table1")
table1 = table1[table1.metric.isin(["# of accumulated users", "# of accumulated items", "# of interactions"])]
reporting.paper_grid(table1, rows=["dataset", "metric"], columns="block", decimals=0,
                     caption="Table 1: accumulated users and items, interactions per block")

# %%
print("HetRec2011:", dataset_status(f3crec_experiments.DATASETS["HetRec2011"]))

# %% [markdown]
# ML-100K and ML-Latest-Small match the paper exactly. Lastfm-2K's public files hold listening
# counts instead of ratings; our closest reading of the paper's preprocessing keeps slightly
# fewer users and items. HetRec2011 is not in the offline data root: every cell that needs it
# is a visible "needs download" (grey).
#
# ## 2. The method from its equations
#
# ### Client side: adaptive replay memory
#
# After block $t-1$ each user keeps the teacher's top-N list $S_u^{t-1} = (i_1, \dots, i_N)$
# (Eq. 1) and their logits. While training block $t$, the student's current rank $r_u(i_k)$ of
# the teacher's $k$-th item measures how far the user's preferences moved:
#
# $$\Delta_u^{t,r} = \sum_{k=1}^{N} \bigl\lvert r_u^{t,r}(i_k) - k \bigr\rvert \qquad (2)$$

# %%
fnb.show_source(f3crec.preference_shift)
fnb.show_source(f3crec.student_ranks)

# %% [markdown]
# A user whose preferences moved gets a **smaller** replay memory: the sampling rate decays
# exponentially with the shift, and the memory is a sample without replacement (SWOR) of
# $\lfloor\delta N\rfloor$ items of $S_u^{t-1}$:
#
# $$\delta_u^{t,r} = \exp\bigl(-\epsilon\,\Delta_u^{t,r}\bigr), \qquad
#   M_u^{t,r} = \mathrm{SWOR}\bigl(S_u^{t-1}, \lfloor \delta_u^{t,r} N \rfloor\bigr) \qquad (3, 4)$$

# %%
fnb.show_source(f3crec.consistency_sampling_rate)
fnb.show_source(f3crec.replay_memory_size)

# %% [markdown]
# A check you can edit: one user, six items, a teacher top-3 of items 0, 1, 2. The student now
# ranks item 0 fourth, so $\Delta = |4-1| + |2-2| + |3-3| = 3$.

# %%
teacher_scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])  # one user, 6 items
memory_items, teacher_logits = f3crec.top_n_memory(teacher_scores, n=3)  # Eq. 1: items 0, 1, 2
student_scores = torch.tensor([[1.0, 3.0, 2.5, 4.0, 0.0, -1.0]])  # the user's taste moved
ranks = f3crec.student_ranks(student_scores, student_scores.gather(1, memory_items))
shift = f3crec.preference_shift(ranks)  # Eq. 2
sizes = []
for eps in (0.01, 0.1, 1.0):
    rate = f3crec.consistency_sampling_rate(shift, eps)  # Eq. 3
    sizes.append(int(f3crec.replay_memory_size(rate, 3)))  # Eq. 4
    print(f"ε = {eps:<4}  Δ = {int(shift)}  δ = exp(−εΔ) = {float(rate):.3f}  |M_u| = ⌊δN⌋ = {sizes[-1]}")
assert ranks.tolist() == [[4, 2, 3]] and float(shift) == 3.0 and sizes == [2, 2, 0]
fnb.record("toy_client", {"shift": float(shift), "ranks": ranks.tolist(), "sizes": sizes})

# %% [markdown]
# The sampled items are distilled with binary cross-entropy against the teacher's
# probabilities, added to the backbone's own loss with weight $\lambda_{KD}$:
#
# $$\mathcal L_{KD} = -\frac{1}{\lvert M_u\rvert}\sum_{i\in M_u}
#   \Bigl[\hat y^{t-1}_{ui}\log \hat y_{ui} + (1-\hat y^{t-1}_{ui})\log(1-\hat y_{ui})\Bigr],
#   \qquad \mathcal L = \mathcal L_{rec} + \lambda_{KD}\,\mathcal L_{KD} \qquad (5, 6)$$
#
# The paper prints Eq. 5 as a sum without the minus sign; the public code takes the mean BCE,
# which we follow (`reduction="sum"` gives the printed form).

# %%
fnb.show_source(f3crec.kd_loss, start="targets =", end="return total /")

# %%
priorities = torch.tensor([[2, 0, 1]])  # a random permutation per client and step (SWOR)
selected = f3crec.adaptive_replay_memory(priorities, torch.tensor([2]))  # keep the 2 lowest priorities
kd = f3crec.kd_loss(student_scores.gather(1, memory_items), teacher_logits, selected)  # Eq. 5
by_hand = torch.nn.functional.binary_cross_entropy_with_logits(
    student_scores.gather(1, memory_items)[selected], torch.sigmoid(teacher_logits[selected]))
print("selected", selected.tolist(), f"L_KD = {float(kd):.4f}, by hand {float(by_hand):.4f}")
assert torch.isclose(kd, by_hand).all()
fnb.record("toy_kd", {"selected": selected.tolist(), "kd": float(kd)})

# %% [markdown]
# In training these steps run for every client of a mini-batch at once, from each client's
# current local model. The engine's loss, `ReplayDistillationLoss`, chains the same functions;
# `tests/test_f3crec_components.py::test_client_loss_wiring_by_hand` and
# `::test_f3crec_client_loss_sequential_equals_batched` tie it to the readable versions above.

# %%
fnb.show_source(f3crec.ReplayDistillationLoss.__call__, start="if self.adaptive:", end="return total_client_loss")

# %% [markdown]
# ### Server side: item-wise temporal mean
#
# The server first averages the uploads, $Q' = \frac{1}{|U|}\sum_u Q_u$ (Eq. 7). For every old
# item it measures how far the average moved from the previous block's best table and turns the
# shift into a mixing weight (new items get $\gamma_i = 0$):
#
# $$\varphi_i = \frac{\lVert Q^{t-1}_i - Q'_i\rVert^2}{\sqrt d}, \qquad
#   \gamma_i = \frac{\beta}{1 + \varphi_i} \qquad (8, 9)$$

# %%
fnb.show_source(f3crec.item_knowledge_shift, start="num_old, dim")
fnb.show_source(f3crec.temporal_mean_weights, start="old = beta")

# %% [markdown]
# $$Q = (1-\gamma)\odot Q' + \gamma\odot \mathrm{ZeroPad}\bigl(Q^{t-1}\bigr) \qquad (10, 12, 13)$$

# %%
fnb.show_source(f3crec.temporal_mean, start="padded =")

# %% [markdown]
# A check you can edit: item 0 did not move, item 1 moved by (2, 0), item 2 is new.

# %%
previous = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # Q^{t−1}: two old items, d = 2
aggregated = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.5, 0.5]])  # Q': item 1 moved, item 2 is new
phi = f3crec.item_knowledge_shift(previous, aggregated)  # Eq. 8: [0, 4/√2]
gamma = f3crec.temporal_mean_weights(phi, beta=0.9, num_items=3)  # Eqs. 9, 11
mixed = f3crec.temporal_mean(aggregated, previous, gamma)  # Eqs. 10, 12, 13
print("φ =", phi.numpy().round(3), " γ =", gamma.numpy().round(3))
print("Q =", mixed.numpy().round(3).tolist())
assert torch.allclose(mixed[0], previous[0]) and torch.allclose(mixed[2], aggregated[2])
fnb.record("toy_server", {"phi": phi.tolist(), "gamma": gamma.tolist(), "mixed": mixed.tolist()})

# %% [markdown]
# The unchanged item keeps its value, the moved item is pulled back only partly
# ($\gamma_1 \approx 0.24$ instead of $\beta = 0.9$), and the new item keeps the clients'
# average. The ablation "w/o i.t.m" uses one global $\gamma_i = \beta$ instead.
#
# ## 3. Train it live
#
# Each step below trains one continual run on this profile's data and backbone. All runs share
# block 0 and use the authors' example hyperparameters (λ_KD 0.1, β 0.9, N 30, ε 0.006 on
# ML-100K). After each block, the run also scores every **earlier** block's test users: the
# accuracy matrix A[t][s]. A falling row of that matrix is forgetting.
#
# **Step 1: the data and block 0**, plain training shared by every method.

# %%
def live_cell(method, **overrides):
    """One live run's configuration (this profile's dataset, backbone and schedule)."""
    return f3crec_experiments.cell(settings.dataset, settings.backbone, method, tuned=False,
                                   **{**live_kwargs, **overrides})


stream = f3crec_experiments.load_stream(live_cell("FT"))
started = time.perf_counter()
base = f3crec_experiments.base_block(live_cell("FT"), stream, base_dir, device)
print([f"{s.name}: {s.num_users} users, {s.num_items} items" for s in stream])
print(f"block 0 trained in {time.perf_counter() - started:.0f} s, best round {base.best_round}, "
      f"test N@20 {base.test_metrics['NDCG@20']:.4f}")

# %% [markdown]
# **Step 2: fine-tuning (FT)**, the baseline that only trains each new block.

# %%
live = {"FT": f3crec_experiments.run_live(live_cell("FT"), profile, cache_dir=base_dir, description="FT")}
print(f"FT: N@20 Avg over D1–D3 = {live['FT']['metrics']['N@20/Avg']:.4f}")

# %% [markdown]
# **Step 3: F3CRec**, both halves switched on.

# %%
live["F3CRec"] = f3crec_experiments.run_live(live_cell("F3CRec"), profile, cache_dir=base_dir, description="F3CRec")
print(f"F3CRec: N@20 Avg over D1–D3 = {live['F3CRec']['metrics']['N@20/Avg']:.4f}")

# %% [markdown]
# **Step 4: one half at a time**: "w/o s.c" keeps only the client's replay, "w/o c.c" keeps
# only the server's temporal mean.

# %%
for ablation in ("w/o s.c", "w/o c.c"):
    live[ablation] = f3crec_experiments.run_live(live_cell(ablation), profile, cache_dir=base_dir,
                                                 description=ablation)
print({name: round(result["metrics"]["N@20/Avg"], 4) for name, result in live.items()})

# %% [markdown]
# **Step 5: the forgetting curves.** Each line follows one block's test users while training
# moves on to later blocks.

# %%
labels = {"FT": "FT (fine-tuning)", "F3CRec": "F3CRec", "w/o s.c": "w/o s.c (client side only)",
          "w/o c.c": "w/o c.c (server side only)"}
forgetting = f3crec_experiments.forgetting_frame({label: live[key] for key, label in labels.items()})
figure = f3crec_figures.plot_forgetting(forgetting, title=f"Forgetting on {settings.dataset} "
                                        f"({settings.backbone}, {profile} profile)")
reporting.save_figure(figure, "f3crec", "lesson_forgetting_curve", profile)
plt.show()
matrix = forgetting.pivot_table(index=["test block", "run"], columns="after training", values="N@20", sort=False)
print("N@20 on each block's test users (rows) after training each block (columns):")
print(matrix.round(4).to_string())
fnb.record("forgetting", forgetting)

# %% [markdown]
# **What the live run shows** (the quick profile's numbers are checked by `./run quick-check`).
# Fine-tuning forgets: D0's test users lose about half of their N@20 as soon as D1 is
# trained, and D1's users lose again with D2 and D3. F3CRec keeps D0's users far above FT. The
# two ablations say which half does it: without the server side ("w/o s.c") the curve falls
# with FT's; with the server side alone ("w/o c.c") it stays near F3CRec's. With FedMF the
# user vectors are private and never averaged, so what is forgotten is the **shared item table**,
# and the item-wise temporal mean is what protects it. The new blocks' own N@20 (the diagonal)
# barely changes: retention here costs little plasticity.
#
# ## 4. The paper's tables and figures
#
# The tables below come from the recorded `paper`-profile grid (ML-100K, ML-Latest-Small and
# Lastfm-2K; FedMF, FedNCF and PFedRec; 100 or 150 rounds per block, patience 30; one seed as in
# the paper, three on ML-100K), not from the live run above. Hyperparameters were chosen on
# validation N@20: with FedMF's sweeps on every dataset, and on ML-100K, the headline setting,
# for each backbone on its own, its learning rate included (the appendix shows the sweeps and
# the values chosen). Each cell reads "ours (paper)".
#
# ### Table 2: N@20 averaged over the incremental blocks D1–D3

# %%
table2 = f3crec_tables.recorded_table("table2")
average = table2[(table2.metric == "N@20") & (table2.block == "Avg")]
reporting.paper_grid(average, rows=["backbone", "method"], columns="dataset", decimals=4,
                     column_order=["ML-100K", "ML-Latest-Small", "Lastfm-2K", "HetRec2011"],
                     caption="Table 2: N@20, average of D1–D3 (HetRec2011 needs a download)")

# %% [markdown]
# The per-block values (D1, D2, D3), R@20 and the "Improv" row are in
# `results/f3crec/table2.csv`; the appendix shows them in the paper's layout.
#
# ### Tables 3 and 6: client-side and server-side ablations (FedMF, average of D1–D3)
#
# Rows: "w/o c.c" = without client-side continual learning (no replay, no distillation); "w/o
# a.r.m" = without the adaptive replay memory (distil all N items every step); "w/o s.c" =
# without the server side (plain averaging); "w/o i.t.m" = without the item-wise temporal mean
# (one global γ = β for every old item); FT = fine-tuning, for reference.

# %%
for table_id, title in (("table3", "Table 3: client side"), ("table6", "Table 6: server side")):
    ablation = f3crec_tables.recorded_table(table_id)
    ablation = ablation[ablation.stat == "score"]
    display(reporting.paper_grid(ablation, rows="method", columns=["dataset", "metric"], decimals=4,
                                 caption=f"{title} ablations"))

# %% [markdown]
# ### Figure 3: F3CRec's improvement over the second-best method

# %%
improvement = pd.concat([f3crec_tables.improvement_over_second_best(table2, "value_paper").assign(source="paper"),
                         f3crec_tables.improvement_over_second_best(table2, "value_ours")
                         .assign(source="ours (recorded paper profile)")], ignore_index=True)
figure = f3crec_figures.plot_improvement(improvement)
reporting.save_figure(figure, "f3crec", "figure3_improvement", "paper")
plt.show()

# %% [markdown]
# ### Every deviation above 20 %, with its reason
#
# All cells of Tables 2, 3 and 6 (N@20 and R@20, derived rows included) more than 20 % from the
# paper, grouped by table, dataset and reason; no cell is left out (`reporting.deviations`
# raises on a deviating cell without a reason). The appendix lists Tables 4, 5, 7 and 8.

# %%
shown = {t: f3crec_tables.recorded_table(t) for t in ("table2", "table3", "table6")}
summary = f3crec_tables.deviation_summary(shown)
fnb.show(summary, "Cells more than 20 % from the paper, by table, dataset and reason", decimals=0)
claims = f3crec_tables.lesson_claims(shown["table2"])
fnb.show(claims, "The paper's headline claims against the recorded tables")
fnb.record("deviation_summary", summary)

# %% [markdown]
# ### The headline setting, at a fair budget
#
# A verdict is only as good as the weakest budget behind it. On ML-100K every backbone has its
# own learning rate and its methods' own hyperparameters, chosen on validation from grids in
# which the chosen value is interior (the appendix lists them), and F3CRec, FT and the
# strongest baselines have three seeds. Each row compares F3CRec with one rival by a Welch test
# across seeds; "within seed noise" means the gap could be the seed's doing.

# %%
headline = f3crec_tables.headline_verdicts(shown["table2"])
fnb.show(headline[["backbone", "rival", "gap %", "p", "verdict"]].round({"gap %": 1, "p": 2}),
         "ML-100K, N@20 averaged over D1–D3, three seeds each: F3CRec against FT and the two strongest others")
fnb.record("headline_verdicts", headline[["backbone", "rival", "verdict"]].to_dict("records"))

# %% [markdown]
# **Summary.** The claims table counts every setting: F3CRec has the best average N@20 in fewer
# settings than the paper's nine of nine (one seed each outside ML-100K), and on ML-100K its
# margin over the second-best method is below 2 % for every backbone (paper: 2.1 % to 8.5 %).
# The headline setting settles it: on ML-100K, with every backbone tuned on its own and three
# seeds, F3CRec is within seed noise of FT and of the two strongest baselines on every backbone
# (gaps from −3.6 % to +1.3 %, every Welch p ≥ 0.17). Every Table 2 cell of ML-100K lies
# within 30 % of the paper. Lastfm-2K is at 41 % to 79 % of the paper's level for every method
# but SPP, FT included: a data difference, not a method one. SPP falls to about a fifth of it with
# FedMF and PFedRec, where its replay overwhelms users with two or three interactions (appendix
# A.12 switches its mechanisms off one at a time). In the ablations, removing the server side
# hurts on ML-100K as the paper says and removing the client side hurts much less; on Lastfm-2K
# no ablation falls below F3CRec.
#
# ## 5. The audit
#
# ### Chronological (code) or random (paper) test split?
#
# The paper says each incremental block is split at random per user; the public code takes each
# user's **last** 10 % of the block as the test set. A random split puts test interactions next
# to training interactions of the same days, so test items look like training items and every
# method scores much higher. Which reading produced the paper's numbers? Train FT and F3CRec
# under the random split (the chronological runs are steps 2 and 3):

# %%
for method in ("FT", "F3CRec"):
    live[f"{method}, random split"] = f3crec_experiments.run_live(
        live_cell(method, split="random"), profile, cache_dir=base_dir, description=f"{method} (random split)")

# %%
audit = pd.DataFrame([{"split": split, "method": method, "N@20 Avg": live[key]["metrics"]["N@20/Avg"]}
                      for split, suffix in (("chronological (code)", ""), ("random (paper text)", ", random split"))
                      for method in ("FT", "F3CRec") for key in [method + suffix]])
audit["F3CRec over FT (%)"] = audit.groupby("split")["N@20 Avg"].transform(lambda v: 100 * (v.iloc[1] / v.iloc[0] - 1))
paper_ft = table2.query("dataset == 'ML-100K' and backbone == 'FedMF' and method == 'FT' and metric == 'N@20' "
                        "and block == 'Avg'")["value_paper"].iloc[0]
fnb.show(audit, f"{settings.dataset}, {settings.backbone}: the paper's FT N@20 Avg on ML-100K is {paper_ft}",
         decimals=4)
fnb.record("split_audit", audit)

# %% [markdown]
# On ML-100K the chronological split gives FT about the paper's value and the random split about
# twice it: **the paper's numbers come from the code's chronological split**, which every
# table of section 4 therefore uses. The split also changes the comparison: the relative gain of
# F3CRec over FT is not the same under the two splits.
#
# ### Three smaller departures from the code
#
# Reading the official code closely finds three more places where it does what the paper's text
# does not say, each now an option of a cell (`spec.toml`, `[cell]`): the next block grows from
# the **last** round's tables rather than the best-validation ones (its FedMF engine), the
# validation set holds ⌈(n − ⌈n/10⌉)/9⌉ items per user rather than ⌈n/10⌉, and after a block
# only the users who trained in it get a new top-N list. Do they explain the paper's margin of
# F3CRec over FT (ML-100K: +20.9 % with FedMF, +13.8 % FedNCF, +5.5 % PFedRec)? The recorded
# `code_options` part, three seeds per cell:

# %%
readings = f3crec_tables.code_options_frame(reporting.read_runs("f3crec", "paper"))
gains = readings.pivot(index="reading", columns="backbone", values="F3CRec over FT (%)").loc[list(f3crec_tables.CODE_OPTIONS)]
fnb.show(gains.reset_index(), "F3CRec over FT (%), N@20 averaged over D1–D3 on ML-100K, three seeds each", decimals=1)
fnb.record("code_options", readings[["backbone", "reading", "F3CRec over FT (%)"]].to_dict("records"))

# %% [markdown]
# Under every reading, alone or all three together, F3CRec stays within 5 % of FT on every
# backbone (−5.0 % to +2.7 %), and the readings move the two methods by about as much as the
# seeds do. These departures do not explain the paper's margin; its numbers need something the
# paper and its code do not show (the values it chose for its hyperparameters are not reported).
#
# ### Much of the top-N memory is items the user already consumed
#
# Eq. 1 takes the teacher's top-N over **all** items. The code does not mask the user's own
# training items, and a trained model ranks those highest, so much of the "replay" re-teaches
# old positives rather than the predicted next items (about 40 % of the list at the rate chosen
# for FedMF on ML-100K, more at faster rates). We follow the code; the share on this run's
# block-0 model:

# %%
consumed = f3crec_experiments.memory_consumed_share(live_cell("F3CRec"), base, stream, top_n=30)
print(f"{100 * consumed:.1f} % of the top-30 memory items are items the user already trained on in D0")
fnb.record("memory_consumed_share", consumed)

# %% [markdown]
# ## 6. Takeaways
#
# 1. In federated continual recommendation nothing old can be replayed from a server; fine-tuning
#    on each new block forgets the earlier blocks' users, visibly in the accuracy matrix.
# 2. F3CRec's client side distils each user's previous top-N list, sampling fewer items the more
#    the user's ranks moved (δ = exp(−ε·Δ)); its server side pulls each old item back towards
#    its previous embedding by γ_i = β/(1+φ_i), and leaves new items alone.
# 3. With FedMF the forgotten knowledge sits in the shared item table; the server's temporal
#    mean is what keeps it, the client's replay adds little on top.
# 4. The paper's numbers come from its code's chronological test split, not the random split its
#    text describes; the random split roughly doubles every score.
# 5. Our recorded grid reproduces the levels on ML-100K but not F3CRec's consistent margin over
#    the baselines: at a fair budget (each backbone tuned on its own, three seeds) F3CRec is
#    within seed noise of fine-tuning and of the strongest baselines. Every deviation above 20 %
#    is listed with its reason.
#
# ### Review questions
#
# 1. Which parts of the model and of F3CRec's state are uploaded, and which never leave a client?
# 2. Why can a federated continual recommender not simply replay old interactions on the server?
# 3. What does the row t of the accuracy matrix A[t][s] show, and what does its diagonal show?
# 4. In Eq. 2, why is the teacher's rank of its k-th item exactly k?
# 5. What memory size does a user get when ε·Δ is large, and what happens to its distillation loss?
# 6. Why does a new item get γ_i = 0 in Eq. 11, and what would go wrong with γ_i = β for it?
# 7. An item whose average embedding moved a lot is pulled back less. Why is that a sensible
#    choice for stability and plasticity?
# 8. In the live run, which ablation keeps D0's users close to F3CRec, and what does that say
#    about where FedMF stores knowledge?
# 9. Why does a random within-block split give much higher N@20 than a chronological one?
# 10. Why does a top-N memory over all items contain so many items the user already consumed?
#
# ### Exercises
#
# Each exercise changes one argument of `live_cell(...)` (the parameters of
# `fedlib.papers.f3crec.experiment.cell`) and trains one run with `run_live` (about a minute at quick).
#
# 1. **No replay.** Set `params={"eps": 1.0}` for F3CRec: δ = exp(−Δ) is about 0 for every user
#    who moved at all, so almost nothing is replayed. *Expected:* D0's curve stays close to
#    F3CRec's (the server side still runs), as with "w/o c.c".
# 2. **No server pull.** Set `params={"beta": 0.0}`: γ_i = 0, the server keeps the plain
#    average. *Expected:* D0's N@20 after D3 falls towards FT's.
# 3. **Stronger distillation.** Set `params={"lambda_kd": 1.0}`. *Expected:* the replay now
#    weighs as much as the new data; the run changes, and not for the better in the recorded
#    sweep (the appendix's Figure 4: λ_KD = 1 is the worst value on ML-100K and Lastfm-2K).
# 4. **Noisy uploads.** Set `upload_noise=0.3` (Laplace noise of scale 0.3 on every uploaded
#    item table, the paper's Table 8). *Expected:* N@20 Avg drops only slightly.

# %% tags=["solution"]
solutions = {"F3CRec": live["F3CRec"]}
solutions["ε = 1 (no replay)"] = f3crec_experiments.run_live(
    live_cell("F3CRec", params={"eps": 1.0}), profile, cache_dir=base_dir, description="ε = 1")
print({k: round(v["metrics"]["N@20/Avg"], 4) for k, v in solutions.items()})

# %% tags=["solution"]
solutions["β = 0 (no server pull)"] = f3crec_experiments.run_live(
    live_cell("F3CRec", params={"beta": 0.0}), profile, cache_dir=base_dir, description="β = 0")
curves = f3crec_experiments.forgetting_frame({"FT": live["FT"], **solutions})
print(curves[curves["test block"] == "D0"].pivot(index="run", columns="after training", values="N@20").round(4))

# %% tags=["solution"]
solutions["λ_KD = 1"] = f3crec_experiments.run_live(
    live_cell("F3CRec", params={"lambda_kd": 1.0}), profile, cache_dir=base_dir, description="λ_KD = 1")
print({k: round(v["metrics"]["N@20/Avg"], 4) for k, v in solutions.items()})

# %% tags=["solution"]
solutions["Laplace noise 0.3"] = f3crec_experiments.run_live(
    live_cell("F3CRec", upload_noise=0.3), profile, cache_dir=base_dir, description="noise 0.3")
print({k: round(v["metrics"]["N@20/Avg"], 4) for k, v in solutions.items()})
fnb.record("solutions", {k: v["metrics"]["N@20/Avg"] for k, v in solutions.items()})

# %% [markdown]
# The appendix, [appendix/02_f3crec_appendix.ipynb](appendix/02_f3crec_appendix.ipynb), holds
# the rest of the recorded study: R@20 and the Improv row of Table 2, the static and dynamic
# users and items (Tables 4, 5, 7), upload noise (Table 8), the significance tests, Figure 4's
# sensitivity sweeps, the hyperparameter selection, the rebuilt baselines' assumptions and the
# remaining departures from the public code.

# %%
fnb.finish()
