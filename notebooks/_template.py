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
# # NN · Paper title (Venue Year)
#
# *Copy this file to `notebooks/NN_name.py` and `profiles/_template.toml` to
# `profiles/NN_name.toml`. The `.py` is the source of truth; `./run notebooks` writes the
# paired `.ipynb` with the outputs of a quick-profile run.*
#
# What this notebook reproduces, in one paragraph. Paper: `../shared/seeds/...`.

# %%
import fedlib.notebook as fnb

fnb.start("NN_name")  # provenance header: git revision, versions, device, profile, start time

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

# %% [markdown]
# Every setting of every profile (this table does not depend on the profile being run, so
# nbval compares it with the committed outputs).

# %% tags=["nbval-check-output"]
print(fnb.settings_frame("NN_name").to_string())

# %% [markdown]
# ## 1. Setting
# Who holds what, what is uploaded, what the server may see (a small table or diagram).
#
# ## 2. Data and protocol
# The paper's statistics table next to ours (a cell tagged `nbval-check-output` when it is
# computed on real data), and the evaluation protocol in plain words.
#
# ## 3. The method from its equations
# Each equation, numbered as in the paper, next to the fedlib function implementing it.
#
# ## 4. Training every component
# The method, every baseline of the paper's tables, every ablation (flags, not copies),
# with progress bars (`tqdm.auto`).
#
# ## 5. Results
# Every table: paper, ours, delta (`fedlib.reporting`). Figures saved with
# `fedlib.reporting.save_figure(fig, "<paper>", "<name>", settings.profile)`.
# Record the key numbers for tests: `fnb.record("ndcg20_fedmf", value)`.
#
# ## 6. Reproducibility audit
# Where the public code differs from the paper or its protocol leaks: run both, explain.
#
# ## 7. What we reproduce, what differs, and why
#
# ## 8. Exercises

# %%
fnb.finish()  # wall time
