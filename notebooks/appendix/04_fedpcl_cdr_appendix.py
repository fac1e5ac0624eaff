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
# # 04 · Appendix: FedPCL-CDR, the rest of the reproduction
#
# Companion of [lesson 04](../04_fedpcl_cdr.ipynb) (Li Wang, Qiang Wu, Min Xu, *FedPCL-CDR*,
# arXiv:2409.03294, https://arxiv.org/abs/2409.03294; code https://github.com/Lili1013/FedPCL_CDR).
# It trains nothing: every number is read from the recorded paper-profile grid
# (`results/fedpcl_cdr/runs.jsonl` and the tables built from it), which
# `python -m fedlib grid fedpcl_cdr <parts>` writes.
#
# Contents: A. the ten baselines and their learning-rate search; B. the NDCG@10 halves of
# Tables 2–4; C. Figures 4–6 and the learning curves; D. the choices the paper leaves open;
# E. the secondary audits (test-set selection per run, the code's own training rule).
# Abbreviations are those of the lesson's glossary, plus: HR@N / NDCG@N, the same metrics at list
# length N; lr, the Adam learning rate; GMF, generalised matrix factorisation; BPR, Bayesian
# personalised ranking loss; GNN, graph neural network; SVD, singular value decomposition;
# FedAvg, federated averaging; JL, Johnson–Lindenstrauss projection; PSI, private set intersection.

# %%
import fedlib.notebook as fnb

fnb.start("04_fedpcl_cdr_appendix")

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import matplotlib.pyplot as plt
import pandas as pd

from fedlib.papers.fedpcl_cdr import experiment as X
from fedlib.papers.fedpcl_cdr import lesson
from fedlib.papers.fedpcl_cdr import tables as T
from fedlib.reporting import paper_grid, read_runs, use_style

PAPER = "fedpcl_cdr"
use_style()
paper_runs = read_runs(PAPER, "paper")
hours = sum(r.wall_time_s for r in paper_runs) / 3600
print(f"recorded paper-profile grid: {len(paper_runs)} runs, {hours:.1f} h of wall time (one CPU thread per run)")
fnb.record("paper_runs", {"runs": len(paper_runs), "hours": hours})

# %% [markdown]
# ## A. The baselines of Table 2
#
# Each is implemented from its own paper with the mechanism that defines it (the module
# docstrings list every simplification):
#
# | baseline | kind | defining mechanism | module |
# |---|---|---|---|
# | NeuMF | single domain | GMF ⊕ MLP towers | `cdr_single_domain` |
# | LightGCN | single domain | linear graph propagation, BPR loss | `cdr_single_domain` |
# | FedNCF | single domain, federated over users | FedAvg of item embeddings and MLP | `cdr_single_domain` |
# | GA-DTCDR | centralised CDR | per-user element-wise attention over domains (truncated SVD for Node2vec) | `ga_cdr` |
# | GA-MTCDR-P | centralised CDR | GNN embedding + personalised alignment of sparse to rich domains | `ga_cdr` |
# | NMCDR | centralised CDR | intra- and inter-domain node matching | `nmcdr` |
# | CL-DTCDR | centralised CDR | intra-domain (graph views) and inter-domain contrastive learning | `cl_dtcdr` |
# | PriCDR | privacy-preserving | DP release of a JL-projected rating matrix | `pricdr` |
# | P2FCDR | privacy-preserving, federated | LDP on mapped user embeddings + gated fusion | `p2fcdr` |
# | P²DTR | privacy-preserving, federated | PSI for shared users + prototype FL | `p2dtr` |
#
# The paper says its baselines were "carefully tuned". Our `tuning` part trains each baseline on
# Phone-Sport (seed 0) at lr 1e-3 and 1e-2, and whenever the best rate is an edge of what was
# tried, adds the next rate beyond it (half a decade, from 1e-4 to 1e-1), so no chosen rate is
# an untested edge. The recorded search, mean validation HR@10 in %:

# %%
search = X.tuning_frame(paper_runs)
grid = search.assign(**{"valid HR@10 (%)": 100 * search["valid_HR@10"]}).pivot(
    index="method", columns="lr", values="valid HR@10 (%)").reindex(X.BASELINES)
fnb.show(grid, "Learning-rate search (paper profile, Phone-Sport, seed 0)")
chosen = X.selected_from_records(paper_runs)
print("chosen:", chosen)
fnb.record("chosen_lr", chosen)

# %% [markdown]
# ## B. The NDCG@10 halves of Tables 2–4
#
# Same layout as the lesson's HR@10 grids: `ours (paper)`, `—` = needs download.

# %%
table2 = lesson.recorded_table(2)
ndcg = table2[table2["metric"] == "NDCG@10"].copy()
ndcg.loc[ndcg["stat"] != "score", "method"] = "Imp (points)"
paper_grid(ndcg, rows="method", columns=["task", "domain"], decimals=3, row_order=[*X.METHODS, "Imp (points)"],
           caption="Table 2 · NDCG@10 on the substitute tasks")

# %%
table3 = lesson.recorded_table(3)
paper_grid(table3[table3["metric"] == "NDCG@10"], rows="method", columns=["task", "domain"], decimals=3,
           row_order=list(lesson.ABLATIONS), caption="Table 3 · ablations, NDCG@10")

# %%
table4 = lesson.recorded_table(4)
table4["setting"] = table4["setting"].str.extract(r"(\d+ ?%)")[0] + " shared"
paper_grid(table4[table4["metric"] == "NDCG@10"], rows="method", columns=["setting", "domain"], decimals=3,
           caption="Table 4 · overlapping-user ratio, NDCG@10")

# %% [markdown]
# ## C. Figures 4–6 and the learning curves
#
# Figure 4 varies α (the weight of the prototype losses), Figure 5 the number of clusters K,
# Figure 6 the list length N (read from the main runs: one evaluation gives every N). All are
# recorded paper-profile runs on the substitutes.

# %%
sweeps = T.sweep_frame(paper_runs)
for parameter, name in (("alpha", "fig4_alpha"), ("K", "fig5_clusters")):
    if T.figure_sweeps(sweeps, parameter, f"{name}_paper_profile", profile="quick") is not None:
        plt.show()
lengths = T.list_length_frame(paper_runs, tasks=tuple(X.TASKS))
if T.figure_list_length(lengths, "fig6_list_length_paper_profile", profile="quick") is not None:
    plt.show()
spread = sweeps.groupby(["parameter", "task", "domain", "metric"])["value"].agg(lambda v: v.max() - v.min())
fnb.show(spread.unstack("metric").reset_index(), "Spread (max − min) of each swept curve, fraction")
fnb.record("sweep_spread", {"max": float(spread.max())})

# %% [markdown]
# Validation HR@10 per round (mean over the two domains) of every Table 2 method on one task:

# %%
curves = T.curve_frame(paper_runs, [X.cell(settings.curve_task, m) for m in X.METHODS])
fig = T.figure_curves(curves, "convergence", profile="quick",
                      title=f"Recorded learning curves on {settings.curve_task} (paper profile)")
if fig is not None:
    plt.show()

# %% [markdown]
# ## D. The choices the paper leaves open
#
# | question | our reading | where |
# |---|---|---|
# | layer combination | sum of $E_0..E_L$ (code); concat available | `FedPCLConfig.layer_combine` |
# | ID + review parts | element-wise sum (paper and code) | `DomainModel.propagate` |
# | predictor | 2D → 64 → 32 → 16 → 1, Linear → ReLU → BatchNorm (code) | `DomainModel` |
# | local epochs | one full epoch per round (Algorithm 1); the code trains one mini-batch | `batches_per_round` |
# | which users enter the CL terms | the user of each positive row of the batch | `_local_update` |
# | local loss | the paper's mean of per-positive InfoNCE terms (the code: one log) | `local_prototype_loss` |
# | cluster without overlapping users | never sent (Eq. 4); its own prototype as global and only local prototype (code) | `complete_prototypes` |
# | what the code uploads | all K prototypes; its server only echoes the non-representative ones back, so keeping them home changes no training number | `DomainUpload` |
# | cluster labels for the CL terms | from the previous round's k-means (code) | `_make_upload` |
# | Laplace parameter | scale b = η (numpy's parameter; the paper says standard deviation) | `differential_prototypes` |
# | model selection | validation HR@10 with patience 5 (the code: the test set) | `cdr_schedule` (the trainer's `Selection`) |
# | review branch | off on the substitutes (no text); on for the original format, Doc2Vec from training reviews only | `fedlib.models.review_text` |
#
# ## E. Secondary audits
#
# ### Test-set selection, per recorded run
#
# Every recorded run stores the test score at its best validation round and at its best test
# round. Because our runs stopped on validation, the second read is a **lower bound** on what
# the code's rule (keep training while the test score rises) would report.

# %%
cells = X.grid_cells("table2", X.SUBSTITUTE_TASKS) + X.grid_cells("ablation", X.SUBSTITUTE_TASKS)
gaps = T.selection_gap_frame(paper_runs, cells)
hr = gaps[gaps["metric"] == "HR@10"]
per_method = hr.groupby(["method", "task"])["gap"].mean().unstack("task")
fnb.show(per_method, "Domain-mean HR@10 gap (test-selected − valid-selected), recorded runs", decimals=4)
fnb.record("selection_gap", {"min": float(hr.groupby(["task", "method", "seed"])["gap"].mean().min()),
                             "cells": int(len(per_method))})

# %% [markdown]
# ### The code's own training and evaluation rule
#
# The code trains a single 512-positive mini-batch per round ("epoch" means batch), reads back
# 98 of the 99 stored negatives, and stops after 6 rounds without a better mean test HR@10,
# reporting the best test round. The audit part of the grid runs this rule on Phone-Sport, next
# to the same training stopped on validation with 98 and with 99 negatives:

# %%
audit = pd.concat([T.selection_gap_frame(paper_runs, [config]).assign(negatives=config["num_negatives"])
                   for config in X.grid_cells("audit")])
audit = audit[audit["metric"] == "HR@10"].reset_index(drop=True)
columns = ["negatives", "selection", "domain", "valid-selected", "test-selected", "gap", "valid round", "test round",
           "test-selected is"]
fnb.show(audit[columns], "Audit cells (paper profile, Phone-Sport, one mini-batch per round)", decimals=4)
fnb.record("code_audit_rows", int(len(audit)))

# %% [markdown]
# The code's rule trains as long as the test score keeps rising, and its reported round is
# chosen on the very items it reports. The difference from validation selection is small on
# these substitutes, for the reason given in the lesson's audit; the review leak, which our data
# cannot carry, is the larger concern there.

# %%
fnb.finish()
