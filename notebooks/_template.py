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
# # NN · Method: what the paper does, in a few words
#
# First Author, Second Author, …, Last Author. **Title of the paper.** Venue Year.
# <https://doi.org/10.xxxx/yyyy> (or the arXiv, OpenReview, ACL Anthology or publisher page).
# Official code: <https://github.com/owner/repository> (or: "no public code").
#
# *Template (delete the lines in italics): copy this file to `notebooks/NN_slug.py` and
# `profiles/_template.toml` to `profiles/NN_slug.toml`, then follow `docs/adding-a-paper.md`.
# In the front matter, only the learning objectives are a list: `tests/test_lessons.py` counts
# every list item after "Learning objectives" up to the first code cell (3–5 are expected), so
# write the prerequisites and times in prose and the glossary as a table.*
#
# One paragraph for a student who has done the prerequisites: the problem the paper solves,
# who holds which data, and the idea of its answer.
#
# **Learning objectives.** After this lesson you can
# 1. explain …;
# 2. derive / implement …;
# 3. audit …
#
# **Prerequisites.** Lesson 00 (and any other lesson this one builds on); background: …
#
# **Time.** smoke: under 1 minute; quick (the default): about N minutes on 2 CPU cores;
# paper: the recorded grid (N hours of one-thread wall time), not re-run here.
#
# **Glossary.** Every abbreviation used anywhere in the lesson's text, tables or figures.
#
# | term | meaning |
# |---|---|
# | HR@K, R@K | hit rate / recall at cut-off K: share of users whose held-out item is in the top K |
# | N@K | NDCG at cut-off K: like HR@K, but a hit at rank r counts 1 / log₂(r + 1) |
# | w/o X | the ablation of the method without component X |
#
# Extended investigations (tuning studies, long tables, per-dataset analyses) are in the
# appendix, [NN_slug_appendix](appendix/NN_slug_appendix.ipynb).

# %%
import fedlib.notebook as fnb

fnb.start("NN_slug")  # one compact provenance line: git revision, versions, device, profile

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from fedlib import reporting
from fedlib.data.stats import stats_table
from fedlib.papers.fedxyz.experiment import run_cell  # import the names you use, never a short alias
from fedlib.papers.fedxyz.method import equation_one, equation_three, equation_two

PAPER = "fedxyz"  # the paper's slug: results/fedxyz/, figures/fedxyz/, tests/test_fedxyz_*.py
torch.manual_seed(settings.seed)

# %% [markdown]
# Every setting of every profile (this table does not depend on the profile being run, so
# nbval compares it with the committed outputs).

# %% tags=["nbval-check-output"]
fnb.show(fnb.settings_frame("NN_slug"), "Settings per profile (notebooks/profiles/NN_slug.toml)")

# %% [markdown]
# ## 1. The problem and the setting
#
# Who holds what, what is uploaded, what the server may see:
#
# | party | holds | sends | may see |
# |---|---|---|---|
# | client (one user) | … | … | … |
# | server | … | … | … |
#
# The data and the evaluation protocol in plain words: full ranking or 1 + 99 / 1 + 999
# sampled candidates, the split, the model-selection rule, K.

# %% tags=["nbval-check-output"]
# The paper's statistics table beside ours, computed on the real data (profile-independent).
fnb.show(stats_table("ml-100k", PAPER), "Dataset statistics: ours, the paper's, the delta")

# %% [markdown]
# ## 2. The method from its equations
#
# **Eq. (1): name.** What it computes, in one sentence.
#
# $$ \theta^{t+1} = \sum_{c} \frac{n_c}{n}\, \theta_c^{t} \tag{1} $$
#
# Where the paper is ambiguous or its public code differs: which reading we implement and why.

# %%
fnb.show_source(equation_one)  # start="...", end="..." narrow a long function to the equation

# %%
# Check on a toy case small enough to compute by hand; edit the numbers and run again.
toy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
print(equation_one(toy), "expected by hand: …")

# %% [markdown]
# **Eq. (2): name.** …
#
# $$ \ldots \tag{2} $$

# %%
fnb.show_source(equation_two)

# %%
print(equation_two(toy), "expected by hand: …")

# %% [markdown]
# **Eq. (3): name.** … Where the implementation is vectorised beyond readability, show the
# readable reference next to it and name the test that ties them (`tests/test_fedxyz.py::…`).
#
# $$ \ldots \tag{3} $$

# %%
fnb.show_source(equation_three)

# %%
print(equation_three(toy), "expected by hand: …")

# %% [markdown]
# ## 3. Train it live
#
# One step per cell, each under about 2 minutes at `quick`, with a progress bar: never one
# opaque call that trains a whole grid. The live run must show the mechanism working (better
# than random, the effect the paper claims) or plainly its absence.

# %%
cell = {"dataset": settings.dataset, "rounds": settings.rounds, "seed": settings.seed}
baseline = run_cell({"method": "baseline", **cell})
fnb.record("baseline_metric", baseline["metrics"]["N@10"])  # recorded metrics print nothing

# %%
method = run_cell({"method": "method", **cell})
fnb.record("method_metric", method["metrics"]["N@10"])
fnb.show(pd.DataFrame([baseline["metrics"], method["metrics"]], index=["baseline", "method"]),
         "Live run at this profile (not the paper's configuration)")

# %% [markdown]
# ## 4. The paper's tables and figures
#
# Regenerated from the recorded `paper`-profile runs (`results/fedxyz/*.csv`, built from
# `results/fedxyz/runs.jsonl`), one compact table per paper table in the paper's own layout:
# each cell "ours (paper)", shaded by the relative delta, with its flags. The long tidy
# tables stay in the CSV files.

# %%
table2 = reporting.read_results_table(PAPER, "table2")
reporting.paper_grid(table2, rows="method", columns=["dataset", "metric"],
                     caption="Table 2: … (ours at the paper profile, paper in brackets)")

# %%
# Every cell more than 20 % from the paper, each with a one-line reason (deviations raises
# when a deviating cell has no reason, so the list cannot select the convenient cells).
REASONS = [({"dataset": "Substitute"}, "substitute data: …"), ({}, "…")]
fnb.show(reporting.deviations(table2, REASONS, keys=["dataset", "method", "metric"]),
         "Deviations above 20 % and their reasons")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.set(title="Figure 3: …", xlabel="round", ylabel="N@10 (%)")
reporting.save_figure(fig, PAPER, "figure3", settings.profile)

# %% [markdown]
# ## 5. The audit
#
# The paper's single most important reproducibility finding (a leak, test-set selection, a
# loss computed but not added, a vacuous privacy budget), shown live and explained in plain
# words.

# %%
audit = run_cell({"method": "method", "audit": True, **cell})
fnb.record("audit_metric", audit["metrics"]["N@10"])

# %% [markdown]
# ## 6. Takeaways
#
# 1. …
# 2. …
# 3. …
# 4. …
# 5. …
#
# ### Review questions
#
# 1. …
# 2. …
# 3. …
# 4. …
# 5. …
# 6. …
# 7. …
# 8. …
#
# ### Exercises
#
# Each exercise runs at `quick` as written, names the exact parameter to change and the
# observation to expect. `tests/test_fedxyz_exercises.py` runs each change at smoke size by
# calling the same function and checks that it changes the result.
#
# **Exercise 1.** Change `…` from … to … in `run_cell(...)` and rerun. What happens to …?
# Expected: …

# %% tags=["solution"]
exercise1 = run_cell({"method": "method", **cell, "parameter": "new value"})
print(exercise1["metrics"])

# %% [markdown]
# **Exercise 2.** …

# %% tags=["solution"]
print("solution 2")

# %% [markdown]
# **Exercise 3.** …

# %% tags=["solution"]
print("solution 3")

# %% [markdown]
# **Exercise 4.** …

# %% tags=["solution"]
print("solution 4")

# %%
fnb.finish()  # footer: the wall time (recorded for ./run test and course budget)
