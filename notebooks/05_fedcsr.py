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
# # 05 · FedCSR: sequential recommendation across platforms that never share users
#
# *FedCSR: A Federated Framework for Multi-Platform Cross-Domain Sequential Recommendation with
# Dual Contrastive Learning* (COLING 2025; paper: `shared/seeds/004`; code study:
# `shared/notes/FedCSR-reference.md`).
#
# Ten **platforms** (say, ten online shops) each hold their own users' purchase sequences in two
# domains, Food and Kitchen. A user's **cross-domain sequence** $s^*$ interleaves both domains in
# time; its Food-only and Kitchen-only parts are $s^A$ and $s^B$. No user appears on two
# platforms, and the platforms differ in size, sequence length and taste. FedCSR trains one
# next-item model for all of them with FedAvg: only model weights travel.
#
# On top of the usual next-item cross-entropy, each platform adds two contrastive terms:
#
# * **MCL** (model contrastive learning): keep the local model's sequence representation close to
#   the global model's for the same domain, and away from the global model's for the other
#   domain, so that local training does not drift (Eqs. 3-6);
# * **SCL** (sequence contrastive learning): make the representation robust to a cross-domain
#   augmentation that swaps some early items into the other domain and shuffles the latest ones
#   (Eqs. 7-15).
#
# This notebook builds each piece from its equations, trains FedCSR, every ablation, the eight
# FedProx baselines, individual and centralised training, and regenerates the paper's Tables 1-9
# and Figures 2-6. The shared copy of the C2DSR data has no training file, so every number of ours
# is on a labelled **substitute split** (§2).

# %%
import fedlib.notebook as fnb

fnb.start("05_fedcsr")  # provenance: git revision, versions, device, profile, start time

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

from fedlib.data.protocols import fedcsr as protocol
from fedlib.device import default_device
from fedlib.experiments import fedcsr as X
from fedlib.experiments import fedcsr_tables as T
from fedlib.methods import fedcsr as M
from fedlib.methods import fedcsr_train as FT
from fedlib.reporting import paper_vs_ours, read_runs, recorded_or_none, save_figure, use_style

PAPER = "fedcsr"
profile = settings.profile
device = default_device()
use_style()
torch.manual_seed(settings.seed)

datasets = list(settings.datasets)
cell_kwargs = {"dim": settings.dim, "rounds": settings.rounds, "patience": settings.patience,
               "local_epochs": settings.local_epochs, "lr": settings.lr, "batch_size": settings.batch_size,
               "seed": settings.seed}
method_kwargs = {m: {"rounds": settings.baseline_rounds} for m in X.BASELINES}
print(f"profile {profile!r} on {device}: {datasets}, n = {settings.dim}, FedCSR {settings.rounds} rounds, "
      f"baselines {settings.baseline_rounds} rounds, {settings.local_epochs} local epoch(s) per round")

# %% [markdown]
# Every setting of every profile. `smoke` runs a tiny synthetic two-domain task (it exists for the
# tests and touches every code path); `quick` trains every method on Food-Kitchen for one or two
# rounds of one local epoch at n = 32 (early-training snapshots, far from converged); `paper`
# runs the recorded grid of `fedlib.experiments.fedcsr` (n = 256 for FedCSR's main rows, 64 for
# the baselines, the sweeps, and FedCSR again). The recorded paper-profile results are shown next
# to the live ones at every profile. This table does not depend on the profile being run.

# %% tags=["nbval-check-output"]
print(fnb.settings_frame("05_fedcsr").to_string())

# %% [markdown]
# ## 1. Setting: who holds what
#
# | | lives on | leaves it? |
# |---|---|---|
# | users' cross-domain sequences $s^*$ and their parts $s^A$, $s^B$ | platform $k$ | never |
# | item-transition graphs $A^*, A^A, A^B$ built from those sequences | platform $k$ | never (here; see below) |
# | model weights $w_k$ (three item tables, three encoders, two prediction layers, projector, SCL transform and matchers) | platform $k$ → server | every round |
# | global weights $w = \sum_k N_k w_k / \sum_k N_k$ (Eq. 19) | server → every platform | every round |
#
# **The platforms differ.** The data layer cuts the users, sorted by sequence length, into ten
# groups of the code's fixed shares, so platform 1 holds short sequences and platform 10 long
# ones. Statistics of the real Food-Kitchen platforms (training data of the substitute split;
# this table does not depend on the profile):

# %% tags=["nbval-check-output"]
food_kitchen = X.load_split("Food-Kitchen")
print(protocol.platform_statistics(food_kitchen).to_string(index=False))

# %% [markdown]
# **The graphs are platform data.** Eq. 1 propagates item embeddings over item-transition
# graphs. Each platform can only build them from its own sequences. The public code builds one
# graph from *all* platforms' training data and hands it to every platform, which breaks the
# federated premise: a platform's model then sees transitions that only other platforms'
# users made. How much of the central graph each platform could not have built itself
# (real Food-Kitchen, profile-independent):

# %% tags=["nbval-check-output"]
def edge_set(graph):
    """Set of (row, column) pairs of a sparse adjacency."""
    idx = graph.coalesce().indices().numpy()
    return set(zip(idx[0].tolist(), idx[1].tolist()))


own_graphs = FT.platform_graphs(food_kitchen)
central_edges = edge_set(FT.platform_graphs(food_kitchen, central=True)[0].cross)
graph_rows = [{"platform": k + 1, "own edges": len(edge_set(g.cross)),
               "central edges it never saw (%)": round(100 * (1 - len(edge_set(g.cross)) / len(central_edges)), 1)}
              for k, g in enumerate(own_graphs)]
print(f"central cross-domain graph: {len(central_edges)} edges")
print(pd.DataFrame(graph_rows).to_string(index=False))

# %% [markdown]
# Every platform would receive between 77 % and 99 % of its graph's edges from other
# platforms' users.
# We build each platform's graphs from its own data (`platform_graphs(split)`), and evaluate the
# global model on each platform's held-out rows with that platform's graphs; the audit (§6)
# trains the code's central graph too (`central_graph=True`).
#
# ## 2. Data and protocol
#
# **Data.** C2DSR's Food-Kitchen and Movie-Book scenarios (Amazon). The shared copy has the
# validation and test files but not `traindata_new.txt`. The data layer then builds a documented
# **substitute split**: the users of the valid and test files (one sequence each) are pooled and
# split 80/10/10 % into train / valid / test users (seeded). So we train on ~13k sequences
# instead of the paper's 34k, and evaluate on ~1.7k instead of ~8k. Every row of ours says so.
# Entertainment-Education (Table 8) has item lists only here: its cells read "needs download".
#
# **Protocol** (the public code's; the paper does not state it). For each valid/test sequence
# the last item is the ground truth (GT), ranked against **999 items sampled from the GT's
# domain** (excluding the user's own items; fixed by seed), with the cross-domain head of the
# GT's domain (Eq. 16) at the last position. Metrics per domain: MRR, NDCG@5/10, HR@1/5/10
# (ties count for the GT, as the code's strict `>`). **Selection**: the round with the best mean
# (over domains) validation MRR, patience 20 (the paper's); the code instead logs the test set after every
# round and reports the best (§6).
#
# **Training budget** (stated reductions, `fedlib.experiments.fedcsr`): at most 20 rounds of 3
# local epochs with the paper's patience 20, so every run trains 20 rounds and reports its
# best-validation round (paper: 100 rounds; the paper's own curves converge in ~25
# rounds), and on real data a **sampled softmax** with 1,000 shared uniform negatives per
# domain and mini-batch for every model whose loss is a softmax over ~30k items (Eqs. 16-17
# are full softmaxes; evaluation is unchanged).

# %%
records = read_runs(PAPER, profile)
T.statistics_records(profile, datasets, records)
records = read_runs(PAPER, profile)
stats_live = T.table1(records, profile, datasets)
stats_recorded = recorded_or_none(PAPER, "table1")
paper_vs_ours(stats_live if profile != "paper" else None, stats_recorded)

# %% [markdown]
# ## 3. The method from its equations
#
# Notation: two domains A and B; item ids below `num_items_a` are A, the rest B; $n$ is the
# embedding size.
#
# ### Eq. 1: transition graphs and propagation
#
# A directed edge $i \to j$ when $j$ directly follows $i$ (in $s^*$ for $A^*$, in $s^d$ for
# $A^d$), binary as the paper says (the code counts repeats), row-normalised. Propagation has no
# parameters: $E' = (E + AE)/2$, and the encoder input is $(E'[s] + E[s])\sqrt n$ plus a
# position embedding. A toy with 3 A items (0-2) and 2 B items (3, 4):

# %%
NA, NB = 3, 2
toy_sequences = [[0, 3, 1, 0, 4], [0, 3]]
toy_graphs = M.transition_graphs(toy_sequences, NA, NB)
print("A* (cross-domain, items 0-4):\n", toy_graphs.cross.to_dense().numpy())
print("A^A (items 0-2):\n", toy_graphs.a.to_dense().numpy())
fnb.record("toy_graph_cross", toy_graphs.cross.to_dense().tolist())

# %% [markdown]
# ### Eqs. 1-2: GAEncoder and the sequence representation
#
# Three causal self-attention encoders (cross, A, B) give $H^*$, $H^A$, $H^B$; the domain-$d$
# representation is $r^d = \mathrm{Avg}_j(H^d_j + H^*_j)$. **Reading chosen**: the single-domain
# sequences stay time-aligned with $s^*$ (other-domain positions are padding and masked), so
# $H^d_j + H^*_j$ is defined at every position; the encoder still sees exactly $s^d$ in order.
# The encoders are causal: changing the last item leaves every earlier position's output alone.

# %%
torch.manual_seed(0)
toy_model = M.FedCSRModel(NA, NB, M.FedCSRConfig(dim=8, maxlen=6, dropout=0.0), toy_graphs).eval()
# the model reads a sequence's history s[:-1]: the two histories differ only in their last item (4 vs 2)
x1 = M.make_batch([[0, 3, 1, 0, 4, 1]], NA, NB, maxlen=6).inputs
x2 = M.make_batch([[0, 3, 1, 0, 2, 1]], NA, NB, maxlen=6).inputs
with torch.no_grad():
    h1, h2 = toy_model.represent(x1)[0], toy_model.represent(x2)[0]
causal_gap = float((h1[0, :-1] - h2[0, :-1]).abs().max())
print(f"H* before the changed last item: max difference {causal_gap:.2e}; at the last item: "
      f"{float((h1[0, -1] - h2[0, -1]).abs().max()):.3f}")
fnb.record("causal_gap", {"before": causal_gap, "last": float((h1[0, -1] - h2[0, -1]).abs().max())})

# %% [markdown]
# ### Eqs. 16-17: three predictions per domain
#
# $P_{sd} = \mathrm{softmax}(h^d_j W^d)$ (single-domain), $P_{ud} = \mathrm{softmax}(h^*_j W^d)$
# (unified), $P_{cd} = \mathrm{softmax}((h^d_j + h^*_j) W^d)$ (cross-domain); $W^d$ is shared
# by the three heads of domain $d$, so there are six cross-entropy terms. $W^B$'s index space
# starts at the first B item: global id `num_items_a` is column 0 of the B head. (The code's
# `> |X|` test misfiles that item as not-B.) A toy: making column 0 of $W^B$ certain drives the
# unified-B loss of a sequence whose next item is item `NA` to zero.

# %%
b = M.make_batch([[0, NA]], NA, NB, maxlen=3)
with torch.no_grad():
    toy_model.head_b.weight.zero_()
    toy_model.head_b.bias.copy_(torch.tensor([50.0, -50.0]))
    terms = M.prediction_loss((toy_model.head_a, toy_model.head_b), *toy_model.represent(b.inputs)[:3], b)
print({k: round(float(v), 6) for k, v in terms.items()})
fnb.record("first_b_item_loss", float(terms["unified_b"]))

# %% [markdown]
# ### Eqs. 3-6: MCL
#
# $z^d = \phi(r^d)$ with a projector $\phi: n \to n/2$; the information gap
# $ig(a, b) = -\exp(\cos(a, b)/\tau)$; for each domain, the local $z^d_l$ should match the
# frozen global model's $z^d_g$ against the global representation of the other domain:
# $L_{MCL} = -\sum_d \log \frac{ig(z^d_l, z^d_g)}{\sum_{d'} ig(z^d_l, z^{d'}_g)}$.
# **Reading chosen**: taken literally the ratio is a softmax probability and minimising its log
# would push the pair *apart*; we minimise $-\log$ softmax, the NT-Xent form the text names.
# Aligned pairs give a lower loss than shuffled ones:

# %%
g = torch.Generator().manual_seed(0)
z_global = [torch.randn(64, 16, generator=g) for _ in range(2)]
z_aligned = [z + 0.1 * torch.randn(64, 16, generator=g) for z in z_global]
z_swapped = [z_aligned[1], z_aligned[0]]
mcl_values = {"aligned": float(M.mcl_loss(z_aligned, z_global, 0.5)),
              "domains swapped": float(M.mcl_loss(z_swapped, z_global, 0.5))}
print(mcl_values)
fnb.record("mcl_toy", mcl_values)

# %% [markdown]
# ### Eqs. 7-11: cross-domain augmentation
#
# Split $s^*$ into halves $x, y$; replace $\lfloor\alpha|x|\rfloor$ random items of $x$ by items
# of the other domain; shuffle the latest $\lfloor\alpha|y|\rfloor$ items of $y$; re-derive
# $\tilde s^A, \tilde s^B$ from $\tilde s^*$. **Reading chosen**: Eq. 9's indices would reorder the
# latest $(1-\alpha)$ share; the text says "the latest items with a ratio α", which we follow.

# %%
na, nb = food_kitchen.num_items_a, food_kitchen.num_items_b
example = food_kitchen.train.sequence(int(np.argmax(food_kitchen.train.lengths())))
augmented = M.augment_sequence(example, na, nb, 0.3, np.random.default_rng(settings.seed))
view = pd.DataFrame({"s*": example, "domain": np.where(example < na, "A", "B"),
                     "augmented": augmented, "aug. domain": np.where(augmented < na, "A", "B")})
print(view.T.to_string())
half = example.size // 2
replaced = int((augmented[:half] != example[:half]).sum())
print(f"α = 0.3 on a length-{example.size} sequence: {replaced} of the first {half} items replaced "
      f"(all by the other domain), the latest {int(0.3 * (example.size - half))} items reordered")
fnb.record("augmentation", {"replaced": replaced, "length": int(example.size),
                            "replaced_cross_domain": bool(np.all(((augmented[:half] < na) != (example[:half] < na))
                                                                 | (augmented[:half] == example[:half])))})

# %% [markdown]
# ### Eqs. 12-15: SCL with stop-gradient
#
# $p = t(r)$ with a broadened transform $t: n \to 2n \to n$; a matcher $q = g_d(p)$ per domain;
# $L_{SCL} = \sum_d -\cos(q^d, \mathrm{sg}(\tilde p^d)) - \cos(\tilde q^d, \mathrm{sg}(p^d))$. The
# stop-gradient means a branch's target receives no gradient from its own term:

# %%
targets = [torch.randn(4, 8, requires_grad=True) for _ in range(2)]     # p, p̃ (only ever targets here)
predictions = [torch.randn(4, 8, requires_grad=True) for _ in range(2)]  # q, q̃
M.scl_loss(predictions[0], targets[1], predictions[1], targets[0]).backward()
stop_gradient = {"target_grad": sum(float(t.grad.abs().sum()) for t in targets if t.grad is not None),
                 "predictor_grad": sum(float(q.grad.abs().sum()) for q in predictions)}
print(stop_gradient)
fnb.record("stop_gradient", stop_gradient)

# %% [markdown]
# ### Eqs. 18-19: the local objective and the server
#
# $L = \lambda_1 L_{Pre} + \lambda_2 L_{MCL} + \lambda_3 L_{SCL}$ with $(\lambda_1, \lambda_2,
# \lambda_3) = (0.5, 1.5, 0.5)$ (paper App. A.2, λ1 read as the weight of $L_{Pre}$). The server
# averages the platforms' weights by their number of users (Eq. 19; the code weights by
# sequences, the same thing when every user has one sequence):

# %%
states = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}]
averaged = FT.fedavg(states, [3, 1])["w"].tolist()
print("FedAvg of [1, 0] (3 users) and [0, 1] (1 user):", averaged)
fnb.record("fedavg_toy", averaged)

# %% [markdown]
# ### The choices the paper leaves open
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
#
# ## 4. Training every component
#
# First one FedCSR run whose trained model the next cells inspect (case study, communication).
# Then the grid: FedCSR, its ablations (all flags of one implementation), the code's
# configuration, individual and centralised training, and the eight baselines of Table 2, each
# federated with FedProx (μ = 0.01) as the paper does. Each baseline is built from its own
# paper's defining mechanism (module docstrings list every simplification):
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

# %%
demo_dataset = datasets[0]
demo_cell = X.cell(demo_dataset, **{**cell_kwargs, "rounds": settings.demo_rounds})
demo_split = X.load_split(demo_dataset, demo_cell["num_negatives"], demo_cell["seed"])
demo_model_config, demo_train_config = X.fedcsr_configs(demo_cell, device)
started = time.perf_counter()
demo = FT.train_fedcsr(demo_split, demo_model_config, demo_train_config)
demo_seconds = time.perf_counter() - started
print(f"{demo_dataset}: {settings.demo_rounds} round(s) in {demo_seconds:.0f} s; "
      f"validation MRR per round {[round(r['valid/MRR'], 4) for r in demo.history]}")
fnb.record("demo_curve", [{"round": r["round"], "loss": r["loss"], "valid_mrr": r["valid/MRR"]} for r in demo.history])

# %% [markdown]
# ### Communication per round (Appendix A.5), measured
#
# Every platform downloads and uploads the whole model each round; graphs never leave a
# platform. The item tables dominate: three tables over all items (cross) or one domain's items,
# plus the two prediction layers.

# %%
model_bytes = demo.artifacts["model_bytes"]
platforms = len(demo.artifacts["active_platforms"])
parameter_bytes = {name: p.numel() * p.element_size() for name, p in demo.models[0].named_parameters()}
item_table_bytes = sum(v for k, v in parameter_bytes.items() if "emb_" in k or "head_" in k)
comm = {"model MB (one platform, one way)": model_bytes / 2**20,
        "item tables and heads (% of the model)": 100 * item_table_bytes / model_bytes,
        "per round, all platforms, up + down (MB)": 2 * model_bytes * platforms / 2**20,
        "paper's formula: Σ items × n × 8 bytes (MB)": (demo_split.num_items_a + demo_split.num_items_b)
        * demo_model_config.dim * 8 / 2**20}
print(pd.Series(comm).round(2).to_string())
fnb.record("communication", comm)

# %% [markdown]
# The paper's formula counts one table of all items in float64; the model actually carries
# three item tables and two prediction layers in float32, so it sends about three times as many
# numbers as the formula says (at half the bytes each).

# %%
if profile == "paper":
    main_cells = X.table2_cells(datasets)
    ablation_cells = X.ablation_cells(datasets)
    audit_cells = X.audit_cells(datasets[0])
    individual_cells = X.individual_cells(datasets[0])
    sweep_cells = X.alpha_cells(datasets[0]) + X.hidden_cells(datasets[0])
else:
    main_cells = [X.method_cell(d, m, cell_kwargs, method_kwargs) for d in datasets for m in ("FedCSR", *settings.baselines)]
    ablation_cells = [X.cell(d, variant=v, **cell_kwargs) for d in datasets for v in settings.variants]
    audit_cells = [X.cell(datasets[0], variant=v, **cell_kwargs) for v in ("FedCSR", *settings.audit_variants)]
    individual_cells = ([X.cell(datasets[0], m, **cell_kwargs) for m in ("FedCSR", "Individual", "Centralized")]
                        if settings.individual else [])
    sweep_cells = ([X.cell(datasets[0], alpha=a, **cell_kwargs) for a in settings.alphas]
                   + [X.cell(datasets[0], scl_hidden_factor=f, **cell_kwargs) for f in settings.hidden_factors])
all_cells = X.unique_cells(main_cells + ablation_cells + audit_cells + individual_cells + sweep_cells)
print(f"{len(all_cells)} distinct runs")
started = time.perf_counter()
results = {X.config_hash(r["config"]): r for r in X.run_cells(all_cells, profile, description="FedCSR grid")}
print(f"trained in {time.perf_counter() - started:.0f} s")


# %%
def run_row(config):
    result = results[X.config_hash(config)]
    m, domains = result["metrics"], result["extra"]["domains"]
    row = {"dataset": config["dataset"], "method": X.method_label(config), "n": config["dim"]}
    for d in domains:
        row[f"{d} MRR"] = m.get(f"{d}/test/MRR")
        row[f"{d} HR@10"] = m.get(f"{d}/test/HR@10")
        row[f"{d} MRR (full ranking)"] = m.get(f"full/{d}/test/MRR")
    row.update({"round": m.get("selected_round"), "seconds": m.get("seconds")})
    return row


shown = X.unique_cells(main_cells + ablation_cells + audit_cells + individual_cells)
main_frame = pd.DataFrame([run_row(c) for c in shown])
print(main_frame.round(4).to_string(index=False))
fnb.record("main_runs", main_frame)

# %% [markdown]
# Random ranking of 1 + 999 candidates gives MRR ≈ 0.0075 and HR@10 = 0.01. At `quick` the runs
# see one or two epochs of data and sit near that level; the recorded paper-profile runs in §5
# are the ones to read. "MRR (full ranking)" ranks the ground truth against every item of its
# domain (~30k on Food-Kitchen) with the selected model; the paper reports only the sampled
# protocol, whose numbers are far higher for the same model.

# %% [markdown]
# ## 5. Results
#
# Each table shows the paper's value, ours from this run (live) and ours from the recorded
# paper-profile grid, with deltas, in the paper's unit (percent). Every row of ours is on the
# substitute split (see its note); baselines are at n = 64, FedCSR at 256 and at 64.

# %%
# At `paper` the sizes are the grid's own (256 for FedCSR's main rows, 64 elsewhere); at the
# other profiles every live cell uses the profile's single size.
table_kwargs = ({}, {}) if profile == "paper" else (cell_kwargs, method_kwargs)
records = read_runs(PAPER, profile)
live = T.all_tables(records, profile, *table_kwargs, datasets=datasets)
if profile == "paper":
    live = T.write_tables(profile, *table_kwargs, datasets=datasets)
recorded = {table_id: recorded_or_none(PAPER, str(frame["table"].iloc[0]) if len(frame) else table_id)
            for table_id, frame in live.items()}
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
# ### Table 2: every method (MRR, NDCG@5, HR@5; the full metric set is Tables 6-8)

# %%
show("table2_main")

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
# ### Tables 6-8: the full metric set per scenario (Table 8: Entertainment-Education needs a download)

# %%
show("table6_food_kitchen_full")

# %%
show("table7_movie_book_full")

# %%
show("table8_entertainment_education_full", metric="MRR")

# %% [markdown]
# ### Full ranking beside the sampled protocol (ours only)
#
# Tables 2 and 6-8 rank the ground truth against 1 + 999 sampled items of its domain, the
# protocol of the paper's public code. Every run of ours also ranks it against **every item of
# its domain**, with the same selected model. These rows are ours only: the paper reports the
# sampled protocol alone, so they carry no paper value and their `protocol` says so. On the same
# model the full-ranking scores are far lower; they are the scale a real recommender faces. A run
# recorded before this second ranking existed has an empty cell that says so.

# %%
show("full_ranking")

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
def tie_check(records):
    """Test MRR (%) of each recorded run with ties for and against the ground truth, per domain."""
    from fedlib.reporting.results import latest_records

    rows = []
    for record in latest_records(records).values():
        for domain in record.extra.get("domains", []):
            against = record.metrics.get(f"{X.TIES_AGAINST_PREFIX}{domain}/test/MRR")
            if against is not None:
                reported = record.metrics[f"{domain}/test/MRR"]
                users = record.metrics[f"{domain}/test/count"]
                # gap × users = Σ_u (1/rank_for − 1/rank_against): 0.5 is one GT tied with one negative at rank 1
                rows.append({"dataset": record.config["dataset"], "method": X.method_label(record.config),
                             "dim": record.config["dim"], "domain": domain, "MRR ties for GT": 100 * reported,
                             "MRR ties against GT": 100 * against, "gap": 100 * (reported - against),
                             "test users": int(users), "summed 1/rank gain": (reported - against) * users})
    return pd.DataFrame(rows)


for shown in dict.fromkeys(["paper", profile]):  # the recorded grid first, then this run's profile
    ties = tie_check(read_runs(PAPER, shown))
    print(f"profile {shown!r}:")
    print(ties.round(3).to_string(index=False) if len(ties) else "  no run has the tie check yet")
    if shown == profile and len(ties):
        fnb.record("largest_tie_gap_points", float(ties["gap"].abs().max()))

# %% [markdown]
# ### Tables 3-4: SCL and MCL
#
# The paper has rows for neither term, SCL only, and both; "w/o SCL" (MCL only) is ours.

# %%
show("table3_ablation_food_kitchen")

# %%
show("table4_ablation_movie_book")

# %% [markdown]
# **What the recorded Food-Kitchen ablation shows** (`paper` profile, n = 64, seed 0, test MRR
# in %, Food / Kitchen). FedCSR 9.32 / 3.57; w/o SCL 8.94 / 3.52; w/o MCL (the paper's "SCL
# only") 8.61 / 3.62; w/o SCL & MCL 8.73 / 3.72. In the paper the two contrastive terms add
# 2.67 / 1.36 points (6.48 → 9.15 and 3.57 → 4.93). Ours add 0.59 on Food and take 0.15 from
# Kitchen: our full model is close to the paper's on Food, but so is our model without either
# term, and the paper's gap is not reproduced. These are single runs whose seed spread we have
# not measured, so differences of a few tenths are not evidence either way. The prediction heads
# matter more (Figure 2 below): without the single-domain heads 7.73 / 2.93, without the unified
# head 8.40 / 2.74. The audit's "code: prediction only" (the public code's loss, which computes
# SCL and MCL but never adds them) gives 8.73 / 3.72, the same as "w/o SCL & MCL" to every digit,
# as it should: both train the same loss from the same seed.

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

# %% [markdown]
# ### Figure 2: without the unified or the single-domain predictions

# %%
show("figure2")

# %%
fig = T.figure_prediction_targets(live["figure2"], "fig2_prediction_targets", profile=profile)
if fig is not None:
    plt.show()
if profile != "paper" and recorded.get("figure2") is not None:
    fig = T.figure_prediction_targets(recorded["figure2"], "fig2_prediction_targets_paper_profile", profile=profile)
    if fig is not None:
        plt.show()

# %% [markdown]
# ### Figure 3: convergence (validation MRR per round)

# %%
curve_configs = [c for c in main_cells + ablation_cells if c["dataset"] == datasets[0]]
curves = T.curve_frame(read_runs(PAPER, profile), curve_configs)
fig = T.figure_curves(curves, "fig3_convergence", profile=profile)
if fig is not None:
    plt.show()
if profile != "paper" and paper_runs:
    recorded_curves = T.curve_frame(paper_runs, T.figure3_configs())
    fig = T.figure_curves(recorded_curves, "fig3_convergence_paper_profile", profile=profile)
    if fig is not None:
        plt.show()
fnb.record("curve_points", int(len(curves)))

# %% [markdown]
# ### Table 9 and Figure 4: each platform alone vs FedCSR
#
# "Individual" trains one model per platform on that platform's data only (no communication)
# and evaluates it on that platform's held-out users; "Centralized" (ours, the caption's third
# setting, not printed in the paper) pools every platform's data into one. The paper prints
# FedCSR only over all users; we also score the one federated model on each platform's own
# test users (rows `FedCSR`, `platform k`; the third bar of Figure 4), so each platform's model
# is compared with FedCSR on the same users.

# %%
show("table9_individual_training", metric="MRR")

# %%
fig = T.figure_individual(live["table9_individual_training"], "fig4_individual", profile=profile)
if fig is not None:
    plt.show()
if profile != "paper" and recorded.get("table9_individual_training") is not None:
    fig = T.figure_individual(recorded["table9_individual_training"], "fig4_individual_paper_profile",
                              profile=profile)
    if fig is not None:
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
# ### Table 5: the augmentation ratio α

# %%
show("table5_alpha")

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
# ### Figure 6: hidden size of the SCL transformation $t$

# %%
show("figure6")

# %%
for frame, suffix in ((live["figure6"], ""), (recorded.get("figure6") if profile != "paper" else None, "_paper_profile")):
    fig = T.figure_hidden(frame, "fig6_scl_hidden" + suffix, profile=profile) if frame is not None else None
    if fig is not None:
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
# ### Appendix A.5: communication and rounds to converge

# %%
show("appendixA5_comm_cost")

# %% [markdown]
# ### Figure 5: a case study with the short demo model (not the recorded run's model)
#
# **Which model.** This list comes from the short demo run of §4 (`demo.models[0]`: a few rounds
# at this profile's small size), not from the selected model of the recorded paper-profile run.
# It shows how to read a ranked list; its quality says nothing about the recorded results of §5.
#
# One test user: their history, the ground truth, and the demo model's top ten among the
# 1 + 999 candidates (1 + 20 on the synthetic smoke task). The paper's Figure 5 shows the same
# kind of list for its trained model.

# %%
test_rows = demo_split.extra["test_platforms"]
platform = int(np.argmax([len(r) for r in test_rows]))
row = int(test_rows[platform][0])
history = demo_split.test.sequence(row)
candidates = np.asarray(demo_split.test_candidates[row])
na_demo = demo_split.num_items_a
model = demo.models[0]
model.set_graphs(demo.graphs[platform])
model.eval()
with torch.no_grad():
    inputs = M.make_batch(demo_split.test, na_demo, demo_split.num_items_b, model.config.maxlen,
                          rows=np.array([row])).inputs.to(device)
    cand = torch.as_tensor(candidates, device=device).view(1, -1)                  # (1, 1000), GT first
    scores = model.score(inputs, cand, (cand[:, 0] >= na_demo).long())[0].cpu().numpy()  # (1000,)
order = np.argsort(-scores, kind="stable")
names = demo_split.extra.get("domain_names", ("A", "B"))
domain_of = lambda item: names[int(item >= na_demo)]
print(f"Figure 5 (case study), model: the short demo run of §4 ({len(demo.history)} round(s), "
      f"n = {demo_model_config.dim}, {demo_dataset}), NOT the recorded paper-profile run's selected model")
print(f"platform {platform + 1}, test user {row}: history (oldest first) "
      f"{[f'{i}:{domain_of(i)}' for i in history[:-1]]}")
print(f"ground truth: item {history[-1]} ({domain_of(history[-1])}), rank {int(np.where(order == 0)[0][0]) + 1} of "
      f"{candidates.size}")
case = pd.DataFrame({"rank": np.arange(1, 11), "item": candidates[order[:10]],
                     "score": scores[order[:10]].round(3), "ground truth": order[:10] == 0})
print(case.to_string(index=False))
fnb.record("case_study", {"rank_of_truth": int(np.where(order == 0)[0][0]) + 1, "candidates": int(candidates.size)})

# %% [markdown]
# ## 6. Reproducibility audit
#
# The public code differs from the paper in three ways that change what is trained and
# reported (notes §0, §1.3, §1.4):
#
# 1. **The contrastive losses are never added.** The code computes the SCL and MCL terms but
#    optimises only the six cross-entropy terms: what it trains is "w/o SCL & MCL".
# 2. **One Adam for every platform.** A single optimiser instance is shared by all platforms
#    and rounds, so the moment estimates carry one platform's gradients into the next one's
#    training, information that FedAvg would never move.
# 3. **Test-set selection.** The code evaluates the test set after every round and reports the
#    best round, without a validation set.
#
#    Our "test-selected" numbers are a **lower bound** on what that rule gains. Each of our runs
#    stops when validation stops improving, and we pick its best test round only among the
#    rounds it actually trained. The public code logs the test score after every round of its
#    whole run (its own early stopping is looser: the counter restarts whenever validation beats
#    the previous round) and reports the best one. More rounds can only offer an equal or better
#    best test round, so on the mean test MRR it maximises, the code's rule gains at least as
#    much as the audit shows. The audit table's notes say so too.
#
# It also builds the graphs centrally (§1). The runs below change one thing at a time, then all
# of them ("code: all", which also weights by sequences and breaks ties as the code does).

# %%
audit_rows = []
for config in audit_cells:
    result = results[X.config_hash(config)]
    m, domains = result["metrics"], result["extra"]["domains"]
    row = {"variant": X.method_label(config)}
    for d in domains:
        row[f"{d} MRR"] = m[f"{d}/test/MRR"]
        row[f"{d} MRR (test-selected)"] = m[f"test_selected/{d}/test/MRR"]
    audit_rows.append(row)
audit_frame = pd.DataFrame(audit_rows)
print(audit_frame.round(4).to_string(index=False))
fnb.record("audit_runs", audit_frame)

# %% [markdown]
# The same audit in the recorded `paper` grid (Food-Kitchen, n = 64, seed 0, test MRR in %; the
# paper reports none of these, so its column is empty). "valid-selected" is our rule,
# "test-selected" the best round by mean test MRR among the rounds the run trained, and "gap"
# their difference in points.

# %%
show("audit", metric="MRR")

# %% [markdown]
# **What the recorded audit shows** (Food-Kitchen, n = 64, seed 0, validation-selected test MRR
# in %, Food / Kitchen). The paper's method as we implement it: FedCSR 9.32 / 3.57. One code
# difference at a time: without the contrastive terms (code: prediction only) 8.73 / 3.72; one
# shared Adam (code: shared Adam) 9.02 / 3.77; one graph from every platform's data (code:
# central graph) 10.05 / 3.92. All of them together (code: all) 9.72 / 3.92, which is +0.39 /
# +0.35 over the paper's method. The central graph is the only change that lifts both domains,
# and it is the one that breaks the federated premise: part of what the code reports is the
# value of transitions that no platform holds. Selecting the round on the test set adds at most
# 0.25 points here (code: prediction only, Food); in the other runs the best test round is the
# best validation round or within 0.07 points of it. These are single runs, so differences of a
# few tenths are not evidence either way.

# %% [markdown]
# **Test-set selection** can only raise the domain-mean test MRR it maximises: the gap between
# the two columns is the optimism of reporting the best test round. It is a lower bound: the
# best test round is searched only among the rounds each run trained before validation stopped
# it, while the public code searches every round it logged. Across every run of this notebook:

# %%
gaps = []
for config in all_cells:
    result = results[X.config_hash(config)]
    m, domains = result["metrics"], result["extra"]["domains"]
    valid_sel = np.mean([m[f"{d}/test/MRR"] for d in domains])
    test_sel = np.mean([m[f"test_selected/{d}/test/MRR"] for d in domains])
    gaps.append(test_sel - valid_sel)
gaps = np.asarray(gaps)
print(f"domain-mean test MRR, test-selected minus validation-selected: min {gaps.min():.4f}, "
      f"mean {gaps.mean():.4f}, max {gaps.max():.4f} over {gaps.size} runs")
fnb.record("selection_gap", {"min": float(gaps.min()), "mean": float(gaps.mean()), "max": float(gaps.max())})

# %% [markdown]
# ## 7. What we reproduce, what differs, and why
#
# | claim / number | paper | ours | why it differs |
# |---|---|---|---|
# | data | C2DSR Food-Kitchen 34,117 training sequences, Movie-Book 58,515 | substitute split: 13,263 / 12,281 sequences from the valid and test users | the training file is not in the shared data |
# | graphs | "each platform" (text); central in the code | per platform; 77-99 % of the central graph's edges come from other platforms | the central graph breaks the federated premise |
# | MCL and SCL | in the loss (Eq. 18) | in the loss; the code never adds them (§6) | the code trains "w/o SCL & MCL" |
# | selection | not stated; the code reports the best test round | validation MRR, patience 20; the optimism of test selection is measured, as a lower bound | §6 |
# | training budget | 100 rounds, full softmax | 20 rounds (patience 20 never fires), 1,000 sampled negatives | CPU budget, stated in §2 |
# | Entertainment-Education (Table 8) | reported | needs download | item lists only in the shared data |
# | early training | not reported | in the committed quick run (two rounds of one local epoch at n = 32) FedCSR and most baselines are still at the random level (MRR ≈ 0.0075), while the same model trained centrally is several times above it | FedAvg over ten platforms with a fresh Adam each round moves slowly at the paper's lr 1e-3; the recorded paper profile runs up to 20 rounds of 3 epochs |
# | full ranking | not reported | recorded for every run next to the sampled 1 + 999 protocol (§5, "Full ranking") | sampled metrics overstate accuracy; full ranking is the honest scale |
# | α (Table 5) | both domains rise to α = 0.3, then fall | Food peaks at 0.3, Kitchen does not; α moves MRR less than the Kitchen gap to the paper (§5, Table 5) | single runs; the gap is the substitute split's |
# | individual training (Table 9, Figure 4) | FedCSR beats every platform trained alone; platform 2, the largest, is the best alone | FedCSR is better over all users and on most platforms; each loss is smaller than one test user's move from rank 1 to 2; platform 2 is not the best alone (§5, Table 9) | single runs; several platforms have a handful of test users |
# | centralized training | in the caption, no row | pooling the raw data beats federation in both domains (§5, Table 9) | the expected cost of keeping data at home |
# | hidden size of t (Figure 6) | 2·n slightly best on every metric and domain | 2·n best on one pair of six; all five sizes within a few test users (§5, Figure 6) | single runs at the resolution of a few users |
#
# **FedCSR on Food-Kitchen, recorded runs against the paper.** The cell below prints the paper's
# FedCSR scores next to ours from the recorded paper-profile Tables 6 and A.5, so it always
# shows the latest recorded grid. Ours differ in four ways: a smaller embedding size (column
# `our n`; the paper's is 256), the substitute split with fewer training sequences, a round cap
# far below the paper's, and a sampled softmax. When the selected round is the last round the
# cap allows, validation MRR was still improving when training stopped.

# %%
table6_recorded = recorded.get("table6_food_kitchen_full")
a5_recorded = recorded.get("appendixA5_comm_cost")
if table6_recorded is None or a5_recorded is None:
    print("no recorded paper-profile Tables 6 and A.5 yet")
else:
    fedcsr_rows = table6_recorded[(table6_recorded["method"] == "FedCSR")
                                  & table6_recorded["metric"].isin(["MRR", "HR@10"])
                                  & table6_recorded["value_ours"].notna()]
    if fedcsr_rows.empty:
        print("no recorded paper-profile FedCSR run on Food-Kitchen yet")
    else:
        print(fedcsr_rows[["dim", "domain", "metric", "value_paper", "value_ours", "delta", "n_seeds"]]
              .rename(columns={"dim": "our n", "value_paper": "paper (%)", "value_ours": "ours (%)",
                               "delta": "Δ (points)", "n_seeds": "our seeds"})
              .round(2).to_string(index=False))
        print("paper: n = 256, mean of 5 runs; ours: substitute split (see the rows' notes)")
    for dim in sorted(set(fedcsr_rows["dim"]), key=int):
        a5_rows = a5_recorded[(a5_recorded["dataset"] == "Food-Kitchen") & (a5_recorded["dim"] == dim)]
        selected_round = a5_rows.loc[a5_rows["metric"] == T.ROUNDS_METRIC, "value_ours"].dropna()
        rounds_run = a5_rows.loc[a5_rows["metric"] == T.ROUNDS_RUN_METRIC, "value_ours"].dropna()
        if len(selected_round) and len(rounds_run):
            at_cap = int(selected_round.iloc[0]) == X.ROUNDS
            print(f"n = {dim}: selected (best validation) round {int(selected_round.iloc[0])} of "
                  f"{int(rounds_run.iloc[0])} rounds run, cap {X.ROUNDS} rounds"
                  + ("; the best round is the last one allowed: still improving at the cap" if at_cap else ""))

# %% [markdown]
# The paper-profile grid is recorded in full, all 46 cells: FedCSR at n = 256 and 64, the eight
# baselines and the SCL/MCL ablation and Figure 2 variants on both scenarios; and on Food-Kitchen
# the α sweep, the SCL hidden size, individual and centralized training and the audit. §5 shows
# every cell beside the paper; `python -m fedlib.experiments.fedcsr <part> --pending` lists what
# a part still lacks, and the README's status table counts it.
#
# ## 8. Exercises
#
# 1. **A graph from everyone.** Re-run the demo cell of §4 with `central_graph=True` in
#    `FedCSRTrainConfig`. *Expected: the validation MRR after the same rounds is a little higher,
#    because each platform's encoder now propagates over transitions of ~10x more users, which
#    a real platform could never have; this is the information the federated setting forbids.*
# 2. **What MCL pulls towards.** Replace the frozen global model in `fedcsr_loss` by the local
#    model itself (`global_model=frozen_copy(model)` at every step). *Expected: L_MCL becomes a
#    pure cross-domain separation term (the positive pair is identical), it falls fast, and the
#    accuracy changes little: the drift control of Eq. 3 is gone.*
# 3. **Augmentation strength.** Compute the SCL loss of a trained model on views made with
#    α = 0.1 and α = 0.7. *Expected: the loss is lower at 0.1 (views closer to the original);
#    Table 5 shows the accuracy is flat across α in the paper and in our runs.*
# 4. **The first B item.** Change `domain_index` to use `> num_items_a` (the code's test) and
#    re-run §3's head cell. *Expected: the unified-B loss of the sequence whose next item is
#    `NA` is no longer defined for B: the item is filed under A, where its index is out of range.*

# %%
fnb.finish()  # wall time
