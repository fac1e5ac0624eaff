# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · FedCSR, appendix: the recorded grid in detail
#
# The extended results of lesson [05 · FedCSR](../05_fedcsr.ipynb) (Zheng et al., COLING 2025,
# <https://aclanthology.org/2025.coling-main.581/>): the full metric tables, the per-platform
# analysis (Table 9, Figure 4), the α and hidden-size sweeps, the prediction-target ablation
# (Figure 2), communication (App. A.5), full ranking and ties, and the study notes. Everything
# here is read from the recorded `paper`-profile grid (`results/fedcsr/*.csv`, each value traceable
# to `results/fedcsr/runs.jsonl`); nothing is trained. Abbreviations are those of the lesson's
# glossary; "p#" is platform #, "indiv." individual training, "central." centralised training.
# All values are test scores in %, on the substitute split, one seed.

# %%
import fedlib.notebook as fnb

fnb.start("05_fedcsr_appendix")

# %% tags=["parameters"]
PROFILE = None  # "smoke" | "quick" | "paper"; None = $FEDLIB_PROFILE or "quick"

# %%
settings = fnb.use_profile(PROFILE)

import matplotlib.pyplot as plt
import pandas as pd

from fedlib.papers.fedcsr import experiment as experiments
from fedlib.papers.fedcsr import figures, tables
from fedlib.reporting import paper_grid, read_runs, recorded_or_none, use_style

PAPER = "fedcsr"
profile = settings.profile
use_style()
recorded = {t: tables.with_flags(recorded_or_none(PAPER, t)) for t in
            ("table2", "table5", "table6", "table7", "table9", "figure2", "figure6", "appendixA5", "full_ranking")}
print({t: int(frame["value_ours"].notna().sum()) for t, frame in recorded.items()}, "recorded cells with a value")

# %% [markdown]
# ## A. Table 2 in words

# %% [markdown]
# **What the recorded Food-Kitchen rows show** (`paper` profile, seed 0, test MRR in %, Food /
# Kitchen). FedCSR at the paper's embedding size, n = 256: 10.95 / 4.39, against the paper's
# 9.15 / 4.93. At n = 64: 9.32 / 3.57. The larger embedding adds 1.63 / 0.82 points; Food ends
# 1.80 above the paper and Kitchen stays 0.54 below it. At n = 64, the size every baseline runs
# at, FedCSR is first on Food (the best baseline, FedPi-Net, has 8.26) but not on Kitchen, where
# FedPi-Net (4.27), FedCLSR (4.23) and FedPSJNet (4.16) lead; the paper has FedCSR first on both.
# The n = 256 run's best validation round was 11 of the 20 it ran, so the round cap did not cut
# it short; it took 4,140 s on one thread.

# %% [markdown]
# **What the recorded Movie-Book rows show** (`paper` profile, seed 0, test MRR in %, Movie /
# Book). FedCSR at the paper's embedding size, n = 256: 5.29 / 3.06, against the paper's
# 6.73 / 2.74. At n = 64: 4.39 / 2.43. The larger embedding adds 0.90 / 0.63 points; Movie stays
# 1.44 below the paper and Book ends 0.32 above it. At n = 64, the size every baseline runs at,
# FedCSR is first on Movie (the best baseline, FedPi-Net, has 4.36) but not on Book, where
# FedPSJNet (3.31) and FedPi-Net (3.27) lead; the paper has FedCSR first on both. The n = 256
# run's best validation round was 12 of the 20 it ran, so the round cap did not cut it short;
# it took 5,798 s on one thread, resumed twice from its snapshots.

# %% [markdown]
# ## B. Table 2 on Movie-Book, Tables 6-7 (the full metric set), and full ranking
#
# Each cell "ours (paper)"; FedCSR at n = 256 and 64, the baselines at 64. Table 2's Movie-Book
# rows are shaded like the lesson's; Tables 6-7 are printed as text (marks: ˢ substitute
# split, ¹ one seed).

# %%
def with_n(frame):
    return frame.assign(method=frame["method"] + frame["dim"].map(lambda n: f" (n={n})"))


movie_book = with_n(recorded["table2"])[lambda t: t["dataset"] == "Movie-Book"]
fnb.show(paper_grid(movie_book, rows="method", columns=["domain", "metric"], caption="Table 2, Movie-Book"))
for table_id in ("table6", "table7"):
    grid = paper_grid(with_n(recorded[table_id]), rows="method", columns=["domain", "metric"], styled=False)
    print(f"{table_id.title()} ({recorded[table_id]['dataset'].iloc[0]}), ours (paper):")
    print(grid.to_string())

# %% [markdown]
# Every run also ranks the GT against **every item of its domain** with the same selected model
# (ours only; the paper reports the sampled protocol alone). Test MRR (%), sampled 1 + 999 beside
# full ranking:

# %%
full = recorded["full_ranking"]
full = full[full["metric"] == "MRR"].assign(method=lambda t: t["method"] + t["dim"].map(lambda n: f" (n={n})"))
sampled = recorded["table2"]
sampled = sampled[sampled["metric"] == "MRR"].assign(method=lambda t: t["method"] + t["dim"].map(lambda n: f" (n={n})"))
both = pd.concat([sampled.assign(protocol="1 + 999"), full.assign(protocol="full")])
fnb.show(both.pivot_table(index="method", columns=["domain", "protocol"], values="value_ours").round(2),
         "Test MRR (%): sampled 1 + 999 vs full ranking (every item of the domain)")

# %% [markdown]
# ### Ties on the sampled protocol
#
# The sampled protocol counts ties for the ground truth (the public code's strict `>`). A model
# that gives the ground truth and many negatives one score is flattered by that rule: a version
# of our MIFN that floored its probabilities at 1e-12 scored MRR 0.89 on Food-Kitchen this way
# (fixed; the run was discarded). Every run now scores its selected model once more with ties
# counted **against** the ground truth. The two MRRs agree unless ties matter; runs recorded
# before this check show nothing here. The last column, gap × test users, is the reciprocal rank the
# tie rule added, summed over users: one ground truth that shares its exact float32 score with one
# negative at the top of its list adds 1 − 1/2 = 0.5. MIFN's 0.10-point gap on Food (523 users)
# sums to 0.500: one such user (or a few ties lower down), not the floored version's pattern, where
# hundreds of users gained.

# %%
tie_rows = []
for record in read_runs(PAPER, "paper"):
    for domain in record.extra.get("domains", []):
        against = record.metrics.get(f"{experiments.TIES_AGAINST_PREFIX}{domain}/test/MRR")
        if against is not None:
            reported, users = record.metrics[f"{domain}/test/MRR"], record.metrics[f"{domain}/test/count"]
            tie_rows.append({"method": experiments.method_label(record.config), "n": record.config["dim"],
                             "dataset": record.config["dataset"], "domain": domain,
                             "gap (points)": 100 * (reported - against), "summed 1/rank gain": (reported - against) * users})
ties = pd.DataFrame(tie_rows)
visible = ties["gap (points)"].abs() >= 0.005                      # the precision the tables print
print(f"{len(ties)} (run, domain) pairs with the tie check; gap below 0.005 points in {int((~visible).sum())}")
fnb.show(ties[visible].reset_index(drop=True).round(3), "Runs where ties changed the sampled MRR by 0.005 points or more")

# %% [markdown]
# ## C. Tables 3-4 and Figure 2: the ablations

# %% [markdown]
# **What the recorded Movie-Book ablation shows** (`paper` profile, n = 64, seed 0, test MRR in
# %, Movie / Book). FedCSR 4.39 / 2.43; w/o SCL 4.22 / 2.61; w/o MCL (the paper's "SCL only")
# 4.77 / 2.69; w/o SCL & MCL 4.73 / 2.53. In the paper the two contrastive terms add 2.79 / 0.92
# points (3.94 → 6.73 and 1.82 → 2.74, at n = 256). Ours change Movie by -0.34 and Book by -0.10:
# on this scenario the model without either term is slightly better than the full one, and
# both are above the paper's own row without them. The paper's gain is not reproduced on
# either scenario. Again the prediction heads matter more than the contrastive terms (Figure 2):
# without the single-domain heads 3.83 / 2.28, without the unified head 4.04 / 2.31. As on
# Food-Kitchen, these are single runs at a quarter of the paper's embedding size, so gaps of a
# few tenths are within what a second seed could move.

# %%
figure2 = recorded["figure2"]
fnb.show(paper_grid(figure2[figure2["metric"].isin(["MRR", "HR@10"])], rows="method", columns=["dataset", "domain", "metric"],
                    caption="Figure 2: without the unified or the single-domain predictions (n = 64)"))
fig = figures.figure_prediction_targets(figure2, "fig2_prediction_targets_paper_profile", profile=profile)
plt.show()

# %% [markdown]
# ## D. Table 5: every α we ran

# %%
fnb.show(paper_grid(recorded["table5"], rows="setting", columns=["domain", "metric"],
                    row_order=[f"alpha={a}" for a in experiments.ALPHAS], caption="Table 5, Food-Kitchen (n = 64)"))

# %% [markdown]
# **What the recorded α sweep shows** (`paper` profile, Food-Kitchen, n = 64, seed 0, test MRR
# in %, Food / Kitchen). α = 0.1: 8.88 / 3.49; α = 0.2: 8.68 / 3.57; α = 0.3: 9.32 / 3.57;
# α = 0.4: 8.63 / 3.54; α = 0.5: 8.85 / 3.74; α = 0.6: 9.15 / 3.65; α = 0.7: 8.90 / 3.53. The
# paper reports α = 0.1, 0.3, 0.5 and 0.7 only; we also ran 0.2, 0.4 and 0.6.
#
# The paper's claim is that both domains improve from α = 0.1 to 0.3 and decline at 0.5 and
# 0.7. On Food, α = 0.3 is our best value too, and our spread over the paper's four values,
# 0.47 points, is close to the paper's 0.59; Food sits 0.06 to 0.34 points above the paper at
# each of them. But 0.7 is not below 0.5 here, and the Food curve zigzags: α = 0.2 and 0.4, the
# neighbours of the peak, are both lower than α = 0.1 and 0.7. On Kitchen our best value is
# α = 0.5, not 0.3, with a spread of 0.26 points over the paper's four values (the paper: 0.24),
# and Kitchen stays 1.03 to 1.36 points below the paper at each of them: a gap about four times
# larger than anything α changes, so it comes from the substitute split, not from α. These are
# single runs whose neighbouring values differ as much as the α effect: they support "α matters
# little", and the peak at 0.3 on Food, but not the rise-then-decline shape on Kitchen.

# %% [markdown]
# ## E. Figure 6: hidden size of the SCL transformation $t$

# %%
figure6 = recorded["figure6"]
fnb.show(paper_grid(figure6, rows="setting", columns=["domain", "metric"], caption="Figure 6, Food-Kitchen (n = 64)"))
fig = figures.figure_hidden(figure6, "fig6_scl_hidden_paper_profile", profile=profile)
plt.show()

# %% [markdown]
# **What the recorded hidden-size sweep shows** (`paper` profile, Food-Kitchen, n = 64, α = 0.3,
# seed 0, test MRR in %, Food / Kitchen). 0.25·n: 9.04 / 3.45; 0.5·n: 9.27 / 3.58; 1·n: 9.11 / 3.64;
# 2·n: 9.32 / 3.57 (the main run); 4·n: 9.24 / 3.77. The five sizes lie within 0.29 points of
# each other on Food and 0.32 on Kitchen.
#
# The paper says a hidden layer of 2·n gives "a slight improvement in all metrics in both
# domains". Here 2·n is the best size for 1 of the 6 (domain, metric) pairs, Food MRR, and its
# Food HR@10, 15.49, is the lowest of the five. On Kitchen, 4·n is best on all three metrics.
# The differences are a few users: Food HR@10 moves by 0.57 points across the sizes, which is
# 3 of the 523 Food test users. Single runs cannot rank sizes at that resolution. They support
# "the hidden size matters little", and that the broadened t (hidden ≥ n) is no worse than the
# SimSiam-style bottleneck, but not that 2·n is the best choice. Every sweep run except the
# main one selected its last round (20 of 20), so more rounds might still move them.

# %% [markdown]
# ## F. Table 9 and Figure 4: each platform alone vs FedCSR
#
# "Individual" trains one model per platform on that platform's data only and evaluates it on
# that platform's held-out users; "Centralized" (the caption's third setting, not printed in the
# paper) pools every platform's data into one. We also score the one federated model on each
# platform's own test users (the third bar of Figure 4).

# %%
table9 = recorded["table9"]
mrr9 = table9[table9["metric"] == "MRR"]
fnb.show(paper_grid(mrr9, rows="setting", columns=["method", "domain"], caption="Table 9, test MRR, Food-Kitchen (n = 64)"))
fig = figures.figure_individual(table9, "fig4_individual_paper_profile", profile=profile)
plt.show()

# %% [markdown]
# **What the recorded Table 9 shows** (`paper` profile, Food-Kitchen, n = 64, seed 0, test MRR in
# %, Food / Kitchen). Over all 523 / 1,136 test users, the ten platforms' own models score
# 5.67 / 2.73, FedCSR 9.32 / 3.57 and the centralized model 12.43 / 5.20. Federation gains
# 3.65 / 0.84 points over training alone, and pooling the raw data would gain another
# 3.11 / 1.63: the price of keeping each platform's data at home, which the paper does not print.
#
# The paper claims that FedCSR "outperforms all individual platforms". Scored on each platform's
# own test users, FedCSR beats that platform's own model in 14 of the 20 (platform, domain)
# pairs. It loses on platform 3 (Kitchen), 6 (Food), 7 (both) and 10 (both), but each of these
# losses is smaller than the change one test user makes by moving from rank 1 to rank 2
# (50 / users points: 0.74 on platform 10's 68 Food users, where the gap is 12.07 against
# FedCSR's 11.39). The per-platform rows therefore neither refute the claim nor confirm it
# everywhere; platforms 6 and 7 have 13 and 3 Food test users. The paper's second claim, that
# platform 2 (the most training data) is the best alone in both domains, holds for neither
# domain here: platform 2 ranks 2nd on Food and 5th on Kitchen. Platform 10, whose training
# sequences are the longest (15 items on average, 6 to 14 elsewhere), is the best alone in
# both. Platform 7 (the least data) is the worst alone on Kitchen, as the paper says, but not
# on Food.
#
# How far one run is from another. The FedCSR row was trained twice with the same seed and data,
# at two commits: first for Table 2, then again to record its per-platform scores. The two runs
# agree exactly in round 1; by round 4 their losses differ by a few 10⁻⁵. After 20 rounds
# they differ by 0.04 / 0.01 points (9.29 / 3.58, then 9.32 / 3.57; the tables use the later).
# Differences of a few hundredths in this notebook are below that floor; the seed spread, which
# we have not measured, is likely larger.

# %% [markdown]
# ## G. Appendix A.5: communication and rounds to converge

# %%
a5 = recorded["appendixA5"]
print(a5[["dataset", "method", "dim", "metric", "value_paper", "value_ours"]].round(2).to_string(index=False))

# %% [markdown]
# ## H. What we reproduce, what differs, and why
#
# | claim / number | paper | ours | why it differs |
# |---|---|---|---|
# | data | C2DSR Food-Kitchen 34,117 training sequences, Movie-Book 58,515 | substitute split: 13,263 / 12,281 sequences from the valid and test users | the training file is not in the shared data |
# | graphs | "each platform" (text); central in the code | per platform; 77-99 % of the central graph's edges come from other platforms | the central graph breaks the federated premise |
# | MCL and SCL | in the loss (Eq. 18) | in the loss; the code never adds them (lesson §5) | the code trains "w/o SCL & MCL" |
# | selection | not stated; the code reports the best test round | validation MRR, patience 20; the optimism of test selection is measured, as a lower bound | lesson §5 (the audit) |
# | training budget | 100 rounds, full softmax | 20 rounds (patience 20 never fires), 1,000 sampled negatives | CPU budget, stated in the lesson's §4 |
# | Entertainment-Education (Table 8) | reported | needs download | item lists only in the shared data |
# | early training | not reported | the lesson's live run (3 platforms, n = 32, lr 5·10⁻³) leaves the random level within a few rounds; with all ten platforms at the paper's lr 10⁻³ two rounds stay near it | FedAvg over ten platforms with a fresh Adam each round moves slowly at lr 10⁻³ |
# | full ranking | not reported | recorded for every run next to the sampled 1 + 999 protocol (§B) | sampled metrics overstate accuracy; full ranking is the honest scale |
# | α (Table 5) | both domains rise to α = 0.3, then fall | Food peaks at 0.3, Kitchen does not; α moves MRR less than the Kitchen gap to the paper (§D) | single runs; the gap is the substitute split's |
# | individual training (Table 9, Figure 4) | FedCSR beats every platform trained alone; platform 2, the largest, is the best alone | FedCSR is better over all users and on most platforms; each loss is smaller than one test user's move from rank 1 to 2; platform 2 is not the best alone (§F) | single runs; several platforms have a handful of test users |
# | centralized training | in the caption, no row | pooling the raw data beats federation in both domains (§F) | the expected cost of keeping data at home |
# | hidden size of t (Figure 6) | 2·n slightly best on every metric and domain | 2·n best on one pair of six; all five sizes within a few test users (§E) | single runs at the resolution of a few users |

# %% [markdown]
# ## I. The choices the paper leaves open
#
# | question | our reading | where |
# |---|---|---|
# | Eq. 6 sign | minimise −log softmax (NT-Xent) | `mcl_loss` |
# | MCL negatives | the same user's other-domain global representation | `mcl_loss` |
# | global model for MCL | frozen copy of the round's global model, eval mode, the platform's graph | `frozen_copy` |
# | Eq. 9 reorder | the latest ⌊α·\|y\|⌋ items (text), not the latest (1 − α) share (indices) | `augment_sequence` |
# | graphs | per platform, binary (paper); central + counts available (code) | `platform_graphs` |
# | targets | every position predicts its next item (as C2DSR); the code uses the last 10 | `make_batch` |
# | scoring | cross-domain head of the GT's domain at the last position (code) | `sequence_ranks` |
# | optimiser | fresh Adam per platform and round (FedAvg); the code shares one Adam | `FedCSRTrainConfig.shared_optimizer` |
# | selection | validation MRR, patience 20 (code: test set every round) | `train_fedcsr` |
# | softmax | sampled, 1,000 shared negatives (CPU budget; paper: full) | `head_cross_entropy` |

# %% [markdown]
# ### The eight baselines
#
# Each baseline is built from its own paper's defining mechanism (module docstrings list every
# simplification) and federated with FedProx (μ = 0.01), as the paper does.
#
# | baseline | kind | defining mechanism | module |
# |---|---|---|---|
# | TiSASRec | sequential | self-attention with time-interval-aware relations | `tisasrec` |
# | CLSR | sequential | disentangled long- and short-term interests, contrastive self-supervision | `clsr` |
# | CoNet | cross-domain | cross-connection units between the two domains' towers | `conet` |
# | CCDR | cross-domain | intra- and inter-domain contrastive learning | `ccdr` |
# | π-Net | cross-domain sequential | shared-account filter and cross-domain transfer units | `pinet` |
# | PSJNet | cross-domain sequential | split-join of shared-account representations | `psjnet` |
# | MIFN | cross-domain sequential | mixed-information flow with a knowledge graph; generator + pointer | `mifn` |
# | C2DSR | cross-domain sequential | graph + self-attention, contrastive infomax across domains | `c2dsr` |

# %% [markdown]
# The paper-profile grid is recorded in full, all 46 cells: FedCSR at n = 256 and 64, the eight
# baselines and the SCL/MCL ablation and Figure 2 variants on both scenarios; and on Food-Kitchen
# the α sweep, the SCL hidden size, individual and centralized training and the audit. The lesson and this appendix show
# every cell beside the paper; `python -m fedlib grid fedcsr <part> --pending` lists what
# a part still lacks, and the README's status table counts it.
#
# ### The fair-budget headline, cell by cell
#
# The headline (parts `headline_lr` and `headline`: FedCSR at n = 64, π-Net and CLSR on
# Food-Kitchen at the paper's 100 rounds with patience 20) plans each method at each of its
# learning rates at seed 0, then seeds 1 and 2 at the rate the spec's `headline_rows` names. The
# table lists every planned cell: a recorded run with its rounds, the round it selected, what
# stopped it and its one-thread wall time, and a pending cell with the hours `--pending`
# guesses for it (`python -m fedlib grid fedcsr headline_lr --pending`, then `headline --seeds 0 1 2
# --pending`). For a method with no headline run yet, the guess scales its runs of at most 20
# rounds up to the 100-round cap. Patience may stop a run sooner, and wall time depends on what
# shares the cores, so the guess is rough either way. Lesson 05's section "At the
# paper's budget" reads the same records. A method whose rate is not chosen yet, or whose seeds
# are not all recorded, stays "untested" in the lesson's verdict; Table 2's 20-round rows keep
# their flags `one_seed` and, where a run selected its last round, `at_cap`.

# %%
planned = tables.headline_runs(read_runs(PAPER, "paper"))
fnb.show(planned, "Every planned headline cell (hours: recorded wall time, or the --pending guess)",
         formats={"lr": "{:g}", "rounds run": "{:.0f}", "selected round": "{:.0f}", "hours": "{:.1f}"})
pending_h = planned.loc[~planned["recorded"], "hours"].sum()
print(f"{int(planned['recorded'].sum())} of {len(planned)} cells recorded; the other {int((~planned['recorded']).sum())} "
      f"are guessed at {pending_h:.1f} h of one-thread wall time, at least {pending_h / 2:.0f} h on two workers.")

# %% [markdown]
# ### Each headline method at both budgets
#
# Per method, its 20-round run of Table 2 (seed 0, the code's rate 1e-3) and every recorded seed
# of its headline cell (its chosen rate, up to 100 rounds with patience 20): the selected and
# last rounds, the validation score that selected it (mean validation MRR over Food and Kitchen)
# and the test MRR per domain, in %. The lesson reads the same headline runs cut at round 20,
# which separates the longer budget from the tuned rate.

# %%
both_budgets = tables.headline_seeds(read_runs(PAPER, "paper"))
fnb.show(both_budgets, "Each headline method at both budgets (MRR in %)",
         formats={"lr": "{:g}", "selected round": "{:.0f}", "rounds run": "{:.0f}"})

# %%
fnb.finish()
