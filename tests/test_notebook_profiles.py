"""Profiles: base + override, environment override, validation errors."""
import pytest

from fedlib.notebook import profiles


def write(tmp_path, text):
    (tmp_path / "notebooks" / "profiles").mkdir(parents=True)
    (tmp_path / "notebooks" / "profiles" / "99_demo.toml").write_text(text)


GOOD = """
[base]
rounds = 5
dataset = "ml-100k"
[smoke]
rounds = 1
dataset = "synthetic"
[quick]
[paper]
rounds = 100
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    return tmp_path


def test_profile_overrides_base(project):
    write(project, GOOD)
    assert profiles.load_settings("99_demo", "smoke").as_dict() == {"rounds": 1, "dataset": "synthetic"}
    assert profiles.load_settings("99_demo", "quick").rounds == 5
    assert profiles.load_settings("99_demo", "paper")["rounds"] == 100


def test_default_is_quick_and_env_overrides(project, monkeypatch):
    write(project, GOOD)
    assert profiles.load_settings("99_demo").profile == "quick"
    monkeypatch.setenv("FEDLIB_PROFILE", "smoke")
    assert profiles.load_settings("99_demo").profile == "smoke"
    # an explicit profile (the parameters cell) wins over the environment
    assert profiles.load_settings("99_demo", "paper").profile == "paper"


def test_unknown_profile_is_an_error(project, monkeypatch):
    write(project, GOOD)
    monkeypatch.setenv("FEDLIB_PROFILE", "fast")
    with pytest.raises(ValueError, match="unknown profile 'fast'.*smoke, quick, paper"):
        profiles.load_settings("99_demo")


def test_setting_not_declared_in_base_is_rejected(project):
    write(project, GOOD.replace("[paper]\nrounds = 100", "[paper]\nround = 100"))
    with pytest.raises(ValueError, match=r"\[paper\] sets \['round'\]"):
        profiles.load_settings("99_demo", "paper")


def test_missing_profile_table_and_file(project):
    write(project, "[base]\nx = 1\n[smoke]\n[quick]\n")
    with pytest.raises(ValueError, match="missing profile table"):
        profiles.load_settings("99_demo", "quick")
    with pytest.raises(FileNotFoundError, match="no profile file for notebook '98_other'"):
        profiles.load_settings("98_other", "quick")


def test_unknown_attribute_names_the_file(project):
    write(project, GOOD)
    settings = profiles.load_settings("99_demo", "quick")
    with pytest.raises(AttributeError, match="no setting 'epochs'.*99_demo.toml"):
        settings.epochs


def test_settings_frame_lists_every_profile(project):
    write(project, GOOD)
    frame = profiles.settings_frame("99_demo")
    assert list(frame.columns) == ["smoke", "quick", "paper"]
    assert frame.loc["rounds"].tolist() == [1, 5, 100]


def test_override_environment_variable(project, monkeypatch):
    write(project, GOOD)
    monkeypatch.setenv("FEDLIB_OVERRIDE", '{"rounds": 7}')
    assert profiles.load_settings("99_demo", "quick").rounds == 7
    monkeypatch.setenv("FEDLIB_OVERRIDE", '{"epochs": 7}')
    with pytest.raises(ValueError, match="unknown setting"):
        profiles.load_settings("99_demo", "quick")
    monkeypatch.setenv("FEDLIB_OVERRIDE", "[1]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        profiles.load_settings("99_demo", "quick")
