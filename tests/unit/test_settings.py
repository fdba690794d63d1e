"""Settings.load: refused values become ConfigError problems, one line each, naming the setting."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from atrium.settings import ConfigError, Settings, prepare_home, setting_name

FLAGS = {"home": None, "port": None, "user": None, "log_level": None}


@pytest.fixture(autouse=True)
def _no_atrium_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("ATRIUM_")]:
        monkeypatch.delenv(name)


def test_a_setting_is_named_by_its_variable_and_its_flag_if_it_has_one() -> None:
    assert setting_name("port", FLAGS) == "ATRIUM_PORT / --port"
    assert setting_name("log_level", FLAGS) == "ATRIUM_LOG_LEVEL / --log-level"
    assert setting_name("token", FLAGS) == "ATRIUM_TOKEN"


def test_each_refused_value_is_one_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATRIUM_USER", "Bad!")
    with pytest.raises(ConfigError) as caught:
        Settings.load(**{**FLAGS, "port": 70000})
    assert caught.value.problems == (
        "ATRIUM_PORT / --port '70000': input should be less than or equal to 65535; "
        "accepted: an integer 0-65535, 0 for any free port",
        "ATRIUM_USER / --user 'Bad!': not a user id; "
        "accepted: 1-32 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
    )


def test_a_short_token_is_refused_without_repeating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATRIUM_TOKEN", "x" * 15)
    with pytest.raises(ConfigError) as caught:
        Settings.load(**FLAGS)
    [problem] = caught.value.problems
    assert problem.startswith("ATRIUM_TOKEN: too short; accepted: at least 16 characters")
    assert "xxx" not in problem


@pytest.mark.parametrize(("given", "kept"), [("", None), ("x" * 16, "x" * 16)])
def test_an_empty_token_is_unset(
    monkeypatch: pytest.MonkeyPatch, given: str, kept: str | None
) -> None:
    monkeypatch.setenv("ATRIUM_TOKEN", given)
    token = Settings.load(**FLAGS).token
    assert (token.get_secret_value() if token else None) == kept


def test_log_levels_are_case_insensitive() -> None:
    assert Settings.load(**{**FLAGS, "log_level": "WARNING"}).log_level == "warning"


def test_prepare_home_creates_the_run_directory_privately(tmp_path: Path) -> None:
    settings = Settings.load(**{**FLAGS, "home": tmp_path / "home"})
    prepare_home(settings)
    assert settings.run_dir.is_dir()
    assert settings.run_dir.stat().st_mode & 0o777 == 0o700
    assert list(settings.run_dir.iterdir()) == []


def test_prepare_home_names_the_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    settings = Settings.load(**{**FLAGS, "home": tmp_path / "file" / "home"})
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'file'} is not a directory")):
        prepare_home(settings)


@pytest.mark.parametrize("url", ["http://0.0.0.0:7070", "http://[::]:7070", "https://0.0.0.0"])
def test_the_kube_shell_url_names_an_address_pods_can_reach(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unspecified address is where a server listens, never one a pod can reach; it would also
    make that address an accepted Host name."""
    monkeypatch.setenv("ATRIUM_KUBE_SHELL_URL", url)
    with pytest.raises(ConfigError) as refused:
        Settings.load()
    assert any("ATRIUM_KUBE_SHELL_URL" in problem for problem in refused.value.problems)
