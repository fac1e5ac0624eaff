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
