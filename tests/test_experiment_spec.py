"""The generic experiment specification (fedlib/experiments/spec.py): expansion, configs, metric
patterns, table rows, and a clear error naming the file, section and key for a malformed spec."""
from __future__ import annotations

import textwrap

import pytest

from fedlib.experiments.spec import SpecError, load_spec

TINY = """
paper = "toy"
version = 2

[options]
datasets = "@all_datasets"

[lists]
all_datasets = ["A", "B", "C"]
small = ["A", "C"]
scales = [1, 3]

[choices.dataset]
A = { rounds = 10, scale = 0.5 }
B = { rounds = 20, scale = 0.25 }
C = { rounds = 30, scale = 2.0 }

[choices.model]
MF = { params = { lr = 1.0 } }
NCF = { params = { lr = 0.05 } }

[cell]
dataset = "@dataset"
model = "@model"
model_params = "@model.params"
rounds = "@dataset.rounds"
noise = 0.0
seed = 0
analysis = false

[parts]
grid.blocks = [{ dataset = "$datasets", model = "@model" }]
small.blocks = [{ dataset = "$datasets", only = { dataset = "@small" }, model = "MF", noise = [0.1, 0.2] }]
sweep.blocks = [{ dataset = "$datasets", model = "MF", sweep = [
    { param = "lr", label = "η", values = "@scales", times = "@dataset.scale" },
    { param = "wd", values = [0.5], model = "NCF" },
] }]
both.blocks = [{ part = "small" }, { dataset = "B", model = "NCF" }]

[tables.t1]
keys = ["dataset", "model", "setting", "metric", "block"]
metrics = { pattern = "{metric}/{block}", metric = { "N@20" = "NDCG@20" }, block = ["D1", "Avg"] }
columns = { setting = "noise={noise:g}" }
rows = [{ dataset = "$datasets", model = "MF", noise = [0.1, 0.5] }]
"""


def write(tmp_path, text: str, name: str = "toy.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture()
def spec(tmp_path):
    return load_spec(write(tmp_path, TINY))


def builder_of(spec):
    def cell(dataset, model, *, params=None, **settings):
        config = spec.config({"dataset": dataset, "model": model}, settings)
        config["params"] = dict(params or {})
        return config
    return cell


def test_config_fills_defaults_casts_overrides_and_names_bad_input(spec):
    cell = builder_of(spec)
    config = cell("B", "NCF")
    assert config == {"paper": "toy", "version": 2, "dataset": "B", "model": "NCF", "model_params": {"lr": 0.05},
                      "rounds": 20, "noise": 0.0, "seed": 0, "analysis": False, "params": {}}
    # an override takes the default's type (the config hash tells 1 from 1.0); None keeps the default
    overridden = cell("A", "MF", rounds=12.0, noise=1, seed=None)
    assert overridden["rounds"] == 12 and type(overridden["rounds"]) is int
    assert overridden["noise"] == 1.0 and type(overridden["noise"]) is float
    assert overridden["seed"] == 0
    # the model's params are copied, not shared with the spec
    overridden["model_params"]["lr"] = 9.0
    assert cell("A", "MF")["model_params"] == {"lr": 1.0}
    with pytest.raises(ValueError, match=r"unknown dataset 'Z'; expected one of \['A', 'B', 'C'\]"):
        cell("Z", "MF")
    with pytest.raises(ValueError, match=r"unknown model 'GCN'"):
        cell("A", "GCN")
    with pytest.raises(TypeError, match=r"unknown cell setting\(s\) \['epochs'\].*'rounds'"):
        cell("A", "MF", epochs=3)


def test_a_part_is_the_product_of_its_axes_in_file_order(spec):
    cells = spec.cells("grid", builder_of(spec))
    assert [(c["dataset"], c["model"]) for c in cells] == [
        ("A", "MF"), ("A", "NCF"), ("B", "MF"), ("B", "NCF"), ("C", "MF"), ("C", "NCF")]
    # a runtime option replaces the declared default; fixed keywords reach every cell
    cells = spec.cells("grid", builder_of(spec), {"datasets": ["C"]}, seed=4)
    assert [(c["dataset"], c["model"], c["seed"]) for c in cells] == [("C", "MF", 4), ("C", "NCF", 4)]


def test_only_keeps_the_listed_values_and_parts_include_parts(spec):
    cells = spec.cells("small", builder_of(spec), {"datasets": ["A", "B", "C"]})
    assert [(c["dataset"], c["noise"]) for c in cells] == [("A", 0.1), ("A", 0.2), ("C", 0.1), ("C", 0.2)]
    both = spec.cells("both", builder_of(spec), {"datasets": ["B", "C"]})
    assert [(c["dataset"], c["model"], c["noise"]) for c in both] == [("C", "MF", 0.1), ("C", "MF", 0.2),
                                                                      ("B", "NCF", 0.0)]


def test_a_sweep_varies_one_parameter_at_a_time_scaled_by_the_cells_choice(spec):
    pairs = spec.labelled_cells("sweep", builder_of(spec), {"datasets": ["A", "C"]})
    got = [(k["dataset"], c["model"], c["params"], k["sweep"]["label"]) for k, c in pairs]
    assert got == [("A", "MF", {"lr": 0.5}, "η"), ("A", "MF", {"lr": 1.5}, "η"), ("A", "NCF", {"wd": 0.5}, "wd"),
                   ("C", "MF", {"lr": 2.0}, "η"), ("C", "MF", {"lr": 6.0}, "η"), ("C", "NCF", {"wd": 0.5}, "wd")]
    with pytest.raises(ValueError, match=r"unknown part 'nope'; expected one of \('grid', 'small', 'sweep', 'both'\)"):
        spec.cells("nope", builder_of(spec))


def test_table_rows_and_metric_patterns(spec):
    pairs = spec.table_rows("t1", builder_of(spec), {"datasets": ["B"]})
    assert [keys for keys, _ in pairs] == [{"dataset": "B", "model": "MF", "setting": "noise=0.1"},
                                           {"dataset": "B", "model": "MF", "setting": "noise=0.5"}]
    assert [config["noise"] for _, config in pairs] == [0.1, 0.5]
    cells = spec.metric_cells("t1")
    assert cells("N@20/Avg") == {"metric": "NDCG@20", "block": "Avg"}
    assert cells("N@20/D1") == {"metric": "NDCG@20", "block": "D1"}
    assert cells("N@20/D2") is None and cells("R@20/Avg") is None and cells("valid N@20/D1") is None


def test_the_f3crec_spec_reproduces_its_settings():
    from fedlib.papers.f3crec import experiment as f3crec

    assert f3crec.SPEC.version == f3crec.VERSION == 1
    sweep = f3crec.SPEC.labelled_cells("sensitivity", f3crec.cell, {"datasets": ["Lastfm-2K"]})
    eps = [k["sweep"]["value"] for k, _ in sweep if k["sweep"]["param"] == "eps"]
    assert eps == [m * 1e-4 for m in (1, 3, 5, 7, 9)]  # multiples of the dataset's eps_scale, as computed
    assert f3crec.SELECTED["Lastfm-2K"]["F3CRec"]["eps"] == eps[-1]
    rows = f3crec.SPEC.table_rows("table8", f3crec.cell, {"datasets": ["ML-100K"]})
    assert [keys["setting"] for keys, _ in rows] == [f"noise lambda={s:g}" for s in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    assert [type(config["upload_noise"]) for _, config in rows] == [float] * 6


# ======================================================================================
# A malformed spec: the error names the file, the section and the key
# ======================================================================================
BROKEN = [
    ("a part names a missing list", ('model = "@model" }]', 'model = "@models" }]'),
     r"toy\.toml: \[parts\.grid\] key 'model': '@models' names no list in \[lists\]"),
    ("a part uses an undeclared option",
     ('grid.blocks = [{ dataset = "$datasets"', 'grid.blocks = [{ dataset = "$sets"'),
     r"toy\.toml: \[parts\.grid\] key 'dataset': option '\$sets' is not declared in \[options\]"),
    ("a sweep entry without values",
     ('{ param = "wd", values = [0.5], model = "NCF" }', '{ param = "wd", model = "NCF" }'),
     r"toy\.toml: \[parts\.sweep\] key 'sweep': an entry lacks 'values'"),
    ("an include of a missing part", ('{ part = "small" }', '{ part = "smal" }'),
     r"toy\.toml: \[parts\.both\] key 'part': no part 'smal'"),
    ("only on a key the block lacks", ('only = { dataset = "@small" }', 'only = { model = "@small" }'),
     r"toy\.toml: \[parts\.small\] key 'only\.model': the block has no axis 'model'"),
    ("an attribute no choice has", ('rounds = "@dataset.rounds"', 'rounds = "@dataset.epochs"'),
     r"toy\.toml: \[cell\] key 'rounds': '@dataset\.epochs': choices \['A', 'B', 'C'\] have no 'epochs'"),
    ("a missing version", ('version = 2', ''), r"toy\.toml: \[top level\] missing key 'version'"),
    ("a misspelt section", ('[lists]', '[list]'), r"toy\.toml: \[top level\] unknown section 'list'"),
    ("a table's pattern field not among its keys", ('"{metric}/{block}"', '"{metric}/{blok}"'),
     r"toy\.toml: \[tables\.t1\] key 'metrics\.pattern': field 'blok' is not one of keys"),
    ("a table without rows", ('rows = [{ dataset = "$datasets", model = "MF", noise = [0.1, 0.5] }]', ''),
     r"toy\.toml: \[tables\.t1\] missing key 'rows'"),
    ("not TOML", ('[cell]', '[cell'), r"toy\.toml: not valid TOML"),
]


@pytest.mark.parametrize("old_new, message", [(b[1], b[2]) for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_malformed_spec_is_refused_naming_file_section_and_key(tmp_path, old_new, message):
    old, new = old_new
    assert old in TINY, old
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, TINY.replace(old, new, 1)))


def test_a_block_key_the_builder_does_not_take_is_refused_at_expansion(tmp_path):
    spec = load_spec(write(tmp_path, TINY.replace('model = "@model" }]', 'model = "@model", colour = "red" }]', 1)))
    with pytest.raises(SpecError, match=r"toy\.toml: \[parts\.grid\] key 'colour' is not a keyword of cell\(\)"):
        spec.cells("grid", builder_of(spec))


def test_a_missing_spec_file_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"absent\.toml: no such specification"):
        load_spec(tmp_path / "absent.toml")


def test_a_paper_without_a_spec_is_named_with_the_papers_that_have_one():
    with pytest.raises(SpecError, match=r"nope: no such specification \(papers with one: \[.*'f3crec'.*\]\)"):
        load_spec("nope")
    assert load_spec("f3crec").path.parent.name == "f3crec"  # fedlib/papers/f3crec/spec.toml


def test_a_table_hook_the_paper_lacks_is_named(spec):
    from fedlib.experiments.spec import build_table

    hooked = TINY.replace('columns = { setting', 'derive = "gone"\ncolumns = { setting')
    broken = load_spec(write(spec.path.parent, hooked, "hooked.toml"))
    with pytest.raises(SpecError, match=r"hooked\.toml: \[tables\.t1\] key 'derive': no function 'gone'"):
        build_table(broken, "t1", [], "smoke", builder=builder_of(broken))


# ======================================================================================
# A choice's own config keys, None defaults, attribute columns, a paper's missing-note rule
# ======================================================================================
OWN_KEYS = """
paper = "toy2"
version = 1

[choices.method]
Plain = { label = "plain", cell = { lr = 0.01 } }
Slow = { label = "slow", cell = { lr = 0.001, rounds = 50 } }
Mine = { label = "ours", cell = { alpha = 0.1, limit = { none = "int" } } }

[cell]
method = "@method"
rounds = 10
overlap = { none = "float" }

[parts]
all.blocks = [{ method = "@method" }]
mine.blocks = [{ method = "Mine", alpha = [0.2, 0.3] }]

[tables.t]
keys = ["method", "metric"]
metrics = { pattern = "{metric}" }
columns = { method = "@method.label" }
rows = [{ method = "Mine" }]
"""


def test_a_choice_carries_its_own_config_keys_and_none_defaults_are_typed(tmp_path):
    spec = load_spec(write(tmp_path, OWN_KEYS, "own.toml"))

    def cell(method, **settings):
        return spec.config({"method": method}, settings)

    assert cell("Plain") == {"paper": "toy2", "version": 1, "method": "Plain", "rounds": 10, "overlap": None,
                             "lr": 0.01}
    slow = cell("Slow")
    assert list(slow) == ["paper", "version", "method", "rounds", "overlap", "lr"] and slow["rounds"] == 50
    mine = cell("Mine", overlap=1, limit=3.0)
    assert mine["overlap"] == 1.0 and type(mine["overlap"]) is float and mine["limit"] == 3
    assert type(mine["limit"]) is int and "lr" not in mine and cell("Mine")["limit"] is None
    with pytest.raises(TypeError, match=r"unknown cell setting\(s\) \['alpha'\]"):
        cell("Plain", alpha=0.5)  # another choice's key
    # a block may set a choice's own key; the builder's **settings accept it
    assert [c["alpha"] for c in spec.cells("mine", cell)] == [0.2, 0.3]
    assert [c["method"] for c in spec.cells("all", cell)] == ["Plain", "Slow", "Mine"]
    assert [keys for keys, _ in spec.table_rows("t", cell, {})] == [{"method": "ours"}]


@pytest.mark.parametrize("old, new, message", [
    ('overlap = { none = "float" }', 'overlap = { none = "real" }',
     r"own\.toml: \[cell\] key 'overlap': a None default is written \{ none = \"<type>\" \}"),
    ('limit = { none = "int" }', 'limit = { none = "int", default = 3 }',
     r"own\.toml: \[choices\.method\.Mine\.cell\] key 'limit': a None default"),
    ('Plain = { label = "plain", cell = { lr = 0.01 } }', 'Plain = { label = "plain", cell = 0.01 }',
     r"own\.toml: \[choices\.method\] key 'Plain\.cell' must be a table of config keys"),
    ('columns = { method = "@method.label" }', 'columns = { method = "@method.name" }',
     r"own\.toml: \[tables\.t\] key 'columns\.method': '@method\.name': choices \['Plain', 'Slow', 'Mine'\] have no 'name'"),
])
def test_malformed_own_keys_none_defaults_and_columns_are_named(tmp_path, old, new, message):
    assert old in OWN_KEYS
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, OWN_KEYS.replace(old, new, 1), "own.toml"))


def test_a_papers_missing_note_replaces_the_default_rule(tmp_path, monkeypatch):
    """compare()'s note of a paper row without our value can be the paper's own function of that row."""
    import pandas as pd

    import fedlib.reporting as reporting
    from fedlib.experiments.spec import compare

    spec = load_spec(write(tmp_path, OWN_KEYS, "own.toml"))
    paper = pd.DataFrame({"table": ["t", "t"], "method": ["ours", "theirs"], "metric": ["HR", "HR"],
                          "value": [0.5, 0.4], "unit": ["fraction"] * 2, "confidence": ["high"] * 2})
    monkeypatch.setattr(reporting, "load_paper_table", lambda paper_name, table_id: paper)
    ours = pd.DataFrame({"method": ["ours"], "metric": ["HR"], "value": [0.45], "commit": ["abc"], "device": ["cpu"]})
    default = compare(spec, ours, "t", ["method", "metric"], "quick")
    assert default.set_index("method").loc["theirs", "note"] == reporting.NEEDS_DOWNLOAD_NOTE  # no [report] available
    own = compare(spec, ours, "t", ["method", "metric"], "quick", missing_note=lambda row: f"no {row['method']} run")
    assert own.set_index("method").loc["theirs", "note"] == "no theirs run"


# ======================================================================================
# Settings that vary together (cases), a row block's own columns, the paper's rows per variant
# ======================================================================================
CASES = """
paper = "toy3"
version = 1

[options]
samplers = ["leaky", "correct"]

[lists]
strengths = [{ interval = 10, beta = 0.9 }, { interval = 1, beta = 0.5 }]

[choices.dataset]
A = {}

[cell]
dataset = "@dataset"
method = "M"
interval = 100
beta = 0.99
sampler = "correct"

[parts]
pairs.blocks = [{ dataset = "A", sampler = ["leaky", "correct"], cases = [{ method = "G", interval = 5 }, { method = "F" }] }]
named.blocks = [{ dataset = "A", method = "G", cases = "@strengths" }]

[tables.t]
keys = ["dataset", "method", "setting", "sampler", "metric"]
metrics = { pattern = "{metric}" }
columns = { setting = "base" }
repeat_paper = { sampler = "$samplers" }
unmatched_in_paper_unit = true
rows = [
    { dataset = "A", sampler = "$samplers", method = ["F", "G"] },
    { dataset = "A", sampler = "$samplers", method = "G", interval = 1, columns = { setting = "every round ({interval})" } },
]
"""


def test_cases_vary_settings_together_in_the_order_of_the_axes(tmp_path):
    spec = load_spec(write(tmp_path, CASES, "cases.toml"))

    def cell(dataset, **settings):
        return spec.config({"dataset": dataset}, settings)

    got = [(c["sampler"], c["method"], c["interval"]) for c in spec.cells("pairs", cell)]
    assert got == [("leaky", "G", 5), ("leaky", "F", 100), ("correct", "G", 5), ("correct", "F", 100)]
    assert [(c["interval"], c["beta"]) for c in spec.cells("named", cell)] == [(10, 0.9), (1, 0.5)]
    rows = spec.table_rows("t", cell, {"samplers": ["correct"]})
    assert [keys for keys, _ in rows] == [
        {"dataset": "A", "method": "F", "setting": "base", "sampler": "correct"},
        {"dataset": "A", "method": "G", "setting": "base", "sampler": "correct"},
        {"dataset": "A", "method": "G", "setting": "every round (1)", "sampler": "correct"}]
    assert [config["interval"] for _, config in rows] == [100, 100, 1]


def test_the_paper_rows_repeat_per_variant_and_unmatched_rows_take_the_paper_percent(tmp_path, monkeypatch):
    import pandas as pd

    import fedlib.reporting as reporting
    from fedlib.experiments.spec import compare

    spec = load_spec(write(tmp_path, CASES, "cases.toml"))
    paper = pd.DataFrame({"table": ["t"], "paper": ["toy3"], "dataset": ["A"], "method": ["F"], "setting": ["base"],
                          "metric": ["HR"], "value": [40.0], "unit": ["percent"], "confidence": ["high"]})
    monkeypatch.setattr(reporting, "load_paper_table", lambda paper_id, table_id: paper.copy())
    ours = pd.DataFrame({"dataset": ["A", "A", "A"], "method": ["F", "F", "G"], "setting": ["base"] * 3,
                         "sampler": ["leaky", "correct", "correct"], "metric": ["HR"] * 3, "value": [0.5, 0.3, 0.2],
                         "ours_unit": ["fraction"] * 3, "commit": ["abc"] * 3, "device": ["cpu"] * 3})
    keys = ["dataset", "method", "setting", "sampler", "metric"]
    table = compare(spec, ours, "t", keys, "quick", repeat_paper={"sampler": ["leaky", "correct"]},
                    unmatched_in_paper_unit=True).set_index(["method", "sampler"])
    assert table.loc[("F", "leaky"), "value_paper"] == table.loc[("F", "correct"), "value_paper"] == 40.0
    assert table.loc[("F", "leaky"), "value_ours"] == pytest.approx(50.0)
    assert table.loc[("G", "correct"), "value_ours"] == pytest.approx(20.0)  # no paper value: percent all the same
    assert table.loc[("G", "correct"), "unit"] == "percent"
    kept = compare(spec, ours, "t", keys, "quick", repeat_paper={"sampler": ["leaky", "correct"]})
    assert kept.set_index(["method", "sampler"]).loc[("G", "correct"), "value_ours"] == pytest.approx(0.2)


def test_derived_rows_may_carry_their_runs_provenance():
    from types import SimpleNamespace

    from fedlib.experiments.spec import derived_row

    runs = [SimpleNamespace(config_hash="h1", commit="c2", device="cpu"),
            SimpleNamespace(config_hash="h2", commit="c1", device="cpu")]
    row = derived_row({"method": "G"}, 1.5, runs, "from two runs", "percent", provenance=True)
    assert (row["run_ids"], row["commit"], row["device"], row["note"]) == ("h1;h2", "c1;c2", "cpu",
                                                                         "derived: from two runs")
    assert "commit" not in derived_row({"method": "G"}, 1.5, runs, "from two runs", "percent")


def test_a_table_like_another_takes_its_layout(tmp_path):
    spec = load_spec(write(tmp_path, CASES + '\n[tables.t_subset]\nlike = "t"\ncolumns = { setting = "sub" }\n',
                           "cases.toml"))
    assert spec.table("t_subset")["keys"] == spec.table("t")["keys"]
    assert [keys["setting"] for keys, _ in spec.table_rows("t_subset", lambda dataset, **s: spec.config(
        {"dataset": dataset}, s), {"samplers": ["leaky"]})] == ["sub", "sub", "every round (1)"]
    with pytest.raises(SpecError, match=r"cases\.toml: \[tables\.t_subset\] key 'like': 'u' is not a table laid out"):
        load_spec(write(tmp_path, CASES + '\n[tables.t_subset]\nlike = "u"\n', "cases.toml"))


@pytest.mark.parametrize("old, new, message", [
    ('cases = "@strengths"', 'cases = "@samplers"', r"cases\.toml: \[parts\.named\] key 'cases': an array of inline"),
    ('cases = "@strengths"', 'cases = ["G"]', r"cases\.toml: \[parts\.named\] key 'cases': an array of inline"),
    ('method = "G", cases = "@strengths" }', 'method = "G", columns = { setting = "x" } }',
     r"cases\.toml: \[parts\.named\] key 'columns': only the row blocks of a table"),
    ('repeat_paper = { sampler = "$samplers" }', 'repeat_paper = { sampler = "$sampler" }',
     r"cases\.toml: \[tables\.t\] key 'repeat_paper\.sampler': option '\$sampler' is not declared"),
])
def test_malformed_cases_columns_and_repeats_are_named(tmp_path, old, new, message):
    assert old in CASES, old
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, CASES.replace(old, new, 1), "cases.toml"))


# ======================================================================================
# Datasets shown under the paper's names; columns that ride along with a row
# ======================================================================================
SHOWN = """
paper = "toy4"
version = 1

[options]
datasets = "@offline"

[lists]
offline = ["a"]

[choices.dataset]
a = { paper = "Alpha" }
b = { paper = "Beta" }

[cell]
dataset = "@dataset"
size = 1

[report]
available = "@offline"

[tables.t]
keys = ["dataset", "size", "metric"]
metrics = { pattern = "{metric}" }
columns = { dataset = "@dataset.paper", size = "{size}", unit = "KB" }
rows = [{ dataset = "$datasets", size = [1, 2], columns = { note = "size {size}" } }]
"""


def test_a_dataset_shown_under_the_papers_name_and_columns_that_ride_along(tmp_path, monkeypatch):
    """A ``"@dataset.<attribute>"`` column names the datasets for compare()'s checks and notes;
    a column that is not a key travels with the row (a note, a unit a derive hook reads)."""
    import pandas as pd

    import fedlib.reporting as reporting
    from fedlib.experiments.spec import compare

    spec = load_spec(write(tmp_path, SHOWN, "shown.toml"))

    def cell(dataset, **settings):
        return spec.config({"dataset": dataset}, settings)

    rows = spec.table_rows("t", cell, {})
    assert [keys for keys, _ in rows] == [
        {"dataset": "Alpha", "size": "1", "unit": "KB", "note": "size 1"},
        {"dataset": "Alpha", "size": "2", "unit": "KB", "note": "size 2"}]
    paper = pd.DataFrame({"table": ["t", "t"], "paper": ["toy4"] * 2, "dataset": ["Alpha", "Beta"],
                          "size": ["1", "1"], "metric": ["HR", "HR"], "value": [0.5, 0.4], "unit": ["fraction"] * 2,
                          "confidence": ["high"] * 2})
    monkeypatch.setattr(reporting, "load_paper_table", lambda paper_id, table_id: paper.copy())
    keys = ["dataset", "size", "metric"]
    table = compare(spec, pd.DataFrame(columns=[*keys, "value"]), "t", keys, "quick").set_index("dataset")
    assert table.loc["Alpha", "note"] == "not run at this profile"  # "a" is available offline, shown as Alpha
    assert table.loc["Beta", "note"] == reporting.NEEDS_DOWNLOAD_NOTE
    ours = pd.DataFrame({"dataset": ["a"], "size": ["1"], "metric": ["HR"], "value": [0.5]})
    with pytest.raises(ValueError, match=r"datasets \['a'\] are not toy4 datasets \['Alpha', 'Beta'\]"):
        compare(spec, ours, "t", keys, "quick")  # the table shows the paper's names, not ours
    with pytest.raises(SpecError, match=r"shown\.toml: \[tables\.t\] key 'columns\.dataset': '@dataset\.name'"):
        load_spec(write(tmp_path, SHOWN.replace("@dataset.paper", "@dataset.name"), "shown.toml"))


SIZES = """
paper = "toy4"
version = 1

[options]
datasets = ["A"]

[lists]
rows = [
    { method = "M", dim = 256, columns = { note = "M at n={cell[dim]}, the paper's size" } },
    { method = "M", dim = 64, columns = { note = "M at n={cell[dim]}, the small size" } },
    { method = "B" },
]

[choices.dataset]
A = { domains = ["a1", "a2"] }
Z = { domains = ["z1"] }

[choices.method]
M = { dim = 256 }
B = { dim = 64 }

[cell]
dataset = "@dataset"
method = "@method"
dim = "@method.dim"

[tables.t]
keys = ["dataset", "method", "dim", "metric"]
metrics = { pattern = "{metric}" }
columns = { dim = "{cell[dim]}", note = "{method}" }
repeat_paper = { dim = { by = ["method"], mark = "repeats_paper_value" } }
rows = [{ dataset = "$datasets", cases = "@rows" }]

[tables.ours]
keys = ["dataset", "domain", "method", "dim", "metric"]
metrics = { pattern = "{domain}/{metric}", metric = { hr = "HR", mrr = "MRR" } }
columns = { dim = "{cell[dim]}" }
skeleton = { domain = "@dataset.domains" }
rows = [{ dataset = ["A", "Z"], method = "M" }]
"""


def _sizes_builder(spec, **overrides):
    def cell(dataset, method, **settings):
        return spec.config({"dataset": dataset, "method": method}, {**settings, **overrides})
    return cell


def test_paper_rows_repeat_per_our_sizes_marked_and_columns_read_the_cell(tmp_path, monkeypatch):
    """FedCSR's case: the paper's one row per method beside every size we run that method at; a
    profile's size replaces the block's (the two FedCSR cells become one row group, the later one's note)."""
    import pandas as pd

    import fedlib.reporting as reporting
    from fedlib.experiments.spec import build_table

    spec = load_spec(write(tmp_path, SIZES, "sizes.toml"))
    paper = pd.DataFrame({"table": ["t", "t", "t"], "paper": ["toy4"] * 3, "dataset": ["A", "A", "Q"],
                          "method": ["M", "B", "M"], "metric": ["HR"] * 3, "value": [40.0, 30.0, 20.0],
                          "unit": ["percent"] * 3, "confidence": ["high"] * 3})
    monkeypatch.setattr(reporting, "load_paper_table", lambda paper_id, table_id: paper.copy())
    rows = spec.table_rows("t", _sizes_builder(spec), {})
    assert [(k["method"], k["dim"], k["note"]) for k, _ in rows] == [
        ("M", "256", "M at n=256, the paper's size"), ("M", "64", "M at n=64, the small size"), ("B", "64", "B")]

    table = build_table(spec, "t", [], "quick", builder=_sizes_builder(spec))
    got = [(r.dataset, r.method, r.dim, r.repeats_paper_value, r.value_paper) for r in table.itertuples()]
    # the third paper row (dataset Q) shares its method with our rows: repeated as well
    assert got == [("A", "M", "256", "False", 40.0), ("A", "M", "64", "True", 40.0), ("A", "B", "64", "False", 30.0),
                   ("Q", "M", "256", "False", 20.0), ("Q", "M", "64", "True", 20.0)]

    smoke = build_table(spec, "t", [], "quick", builder=_sizes_builder(spec, dim=8))
    assert [(r.method, r.dim, r.repeats_paper_value) for r in smoke.itertuples()] == [
        ("M", "8", "False"), ("B", "8", "False"), ("M", "8", "False")]
    from fedlib.experiments.spec import unique_row_groups
    groups = unique_row_groups(spec.table_rows("t", _sizes_builder(spec, dim=8), {}))
    assert [(k["method"], k["note"]) for k, _ in groups] == [("M", "M at n=8, the small size"), ("B", "B")]


def test_a_table_of_ours_only_expects_its_row_groups_times_the_metric_fields(tmp_path):
    from fedlib.experiments.spec import build_table

    spec = load_spec(write(tmp_path, SIZES, "sizes.toml"))
    table = build_table(spec, "ours", [], "quick", builder=_sizes_builder(spec))
    assert [(r.dataset, r.domain, r.metric) for r in table.itertuples()] == [
        ("A", "a1", "HR"), ("A", "a1", "MRR"), ("A", "a2", "HR"), ("A", "a2", "MRR"), ("Z", "z1", "HR"), ("Z", "z1", "MRR")]
    assert table["value_paper"].isna().all() and (table["unit"] == "percent").all() and (table["dim"] == "256").all()
    assert (table["note"].str.len() > 0).all()  # every missing row says why


@pytest.mark.parametrize("old, new, message", [
    ('repeat_paper = { dim = { by = ["method"], mark = "repeats_paper_value" } }',
     'repeat_paper = { dim = { by = "method" } }', r"sizes\.toml: \[tables\.t\] key 'repeat_paper\.dim': a repeat per"),
    ('repeat_paper = { dim = { by = ["method"], mark = "repeats_paper_value" } }',
     'repeat_paper = { dim = { by = ["backbone"] } }', r"sizes\.toml: \[tables\.t\] key 'repeat_paper\.dim': 'backbone' is"),
    ('repeat_paper = { dim = { by = ["method"], mark = "repeats_paper_value" } }',
     'repeat_paper = { dim = { by = ["method"], marks = "x" } }', r"sizes\.toml: \[tables\.t\] key 'repeat_paper\.dim'"),
    ('skeleton = { domain = "@dataset.domains" }', 'skeleton = { domains = "@dataset.domains" }',
     r"sizes\.toml: \[tables\.ours\] key 'skeleton\.domains': not a field"),
    ('skeleton = { domain = "@dataset.domains" }', 'skeleton = { unit = "percent" }',
     r"sizes\.toml: \[tables\.ours\] key 'skeleton': the metric field 'domain' has no values"),
    ('skeleton = { domain = "@dataset.domains" }', 'skeleton = { domain = "@dataset.names" }',
     r"sizes\.toml: \[tables\.ours\] key 'skeleton\.domain': '@dataset\.names': choices"),
    ('rows = [{ dataset = "$datasets", cases = "@rows" }]', 'rows = [{ dataset = "A", cases = "@rows" }]\n'
     '[parts]\np.blocks = [{ dataset = "A", cases = "@rows" }]',
     r"sizes\.toml: \[parts\.p\] key 'cases': only the cases of a table's row blocks name columns"),
])
def test_malformed_repeats_skeletons_and_case_columns_are_named(tmp_path, old, new, message):
    assert old in SIZES, old
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, SIZES.replace(old, new, 1), "sizes.toml"))


def test_every_paper_spec_ships_with_the_package():
    """A spec.toml not listed in pyproject's package-data is missing from an installed (non-editable) fedlib."""
    import tomllib

    from fedlib.paths import project_root

    root = project_root()
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for spec in sorted((root / "fedlib" / "papers").glob("*/spec.toml")):
        package = f"fedlib.papers.{spec.parent.name}"
        assert "spec.toml" in shipped.get(package, []), f"add {package} = [\"spec.toml\"] to [tool.setuptools.package-data]"


def test_versions_give_only_the_cells_that_set_the_key_a_later_version(tmp_path):
    """``versions = { noise = 3 }``: a change that moved only the noisy cells bumps only theirs."""
    spec = load_spec(write(tmp_path, TINY.replace("version = 2\n", "version = 2\nversions = { noise = 3 }\n", 1)))
    noisy = spec.config({"dataset": "A", "model": "MF"}, {"noise": 0.1})
    plain = spec.config({"dataset": "A", "model": "MF"}, {"noise": 0.0})
    assert (noisy["version"], plain["version"]) == (3, 2)
    assert plain == load_spec(write(tmp_path, TINY, "plain.toml")).config({"dataset": "A", "model": "MF"}, {})
    assert spec.cell_version({**plain, "noise": 0.5}) == 3 and spec.cell_version({"noise": None}) == 2
    for bad in ("{ noise = 2 }", "{ noise = 1 }", "{ noise = true }", '{ noise = "3" }'):
        with pytest.raises(SpecError, match=r"\[versions\] key 'noise'"):
            load_spec(write(tmp_path, TINY.replace("version = 2\n", f"version = 2\nversions = {bad}\n", 1), "bad.toml"))


def test_the_results_guide_lists_every_part_of_every_grid():
    """docs/results.md's table of parts is each spec's [parts], in order (a new part must be documented)."""
    import re

    from fedlib.papers import GRID_COMMANDS
    from fedlib.paths import project_root

    text = (project_root() / "docs" / "results.md").read_text()
    listed = {m.group(1): m.group(2).split(", ") for m in re.finditer(r"^\| `(\w+)` \| ([\w, ]+) \|$", text, re.M)}
    for paper in GRID_COMMANDS:
        assert listed.get(paper) == list(load_spec(paper).parts), paper
