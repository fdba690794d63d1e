"""Registry credentials from the Docker config, and which registries are loopback."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from atrium.distribution.credentials import docker_config_file, load_credentials
from atrium.distribution.ociclient import base_url, is_loopback


def write(folder: Path, config: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_auth_entries_are_base64_user_and_password(tmp_path: Path) -> None:
    folder = write(tmp_path, {"auths": {"127.0.0.1:5000": {"auth": b64("me:pa:ss")}}})
    found = load_credentials("127.0.0.1:5000", folder)
    assert found is not None
    assert (found.username, found.password) == ("me", "pa:ss")
    assert "pa:ss" not in repr(found)


def test_username_and_password_fields_and_url_keys_are_understood(tmp_path: Path) -> None:
    config = {"auths": {"https://Reg.Example.com/v1/": {"username": "me", "password": "pw"}}}
    found = load_credentials("reg.example.com", write(tmp_path, config))
    assert found is not None
    assert (found.username, found.password) == ("me", "pw")


def test_other_hosts_and_ports_have_no_credentials(tmp_path: Path) -> None:
    folder = write(tmp_path, {"auths": {"127.0.0.1:5000": {"auth": b64("me:pw")}}})
    assert load_credentials("127.0.0.1:5001", folder) is None


def test_a_missing_or_broken_config_has_no_credentials(tmp_path: Path) -> None:
    assert load_credentials("h.example", tmp_path / "none") is None
    (tmp_path / "config.json").write_text("{not json")
    assert load_credentials("h.example", tmp_path) is None


def test_credential_helpers_are_not_run_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write(tmp_path, {"credHelpers": {"h.example": "secretservice"}})
    with caplog.at_level(logging.INFO):
        assert load_credentials("h.example", folder) is None
    assert "does not run credential helpers" in caplog.text


def test_the_config_file_comes_from_the_argument_then_docker_config_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert docker_config_file(tmp_path) == tmp_path / "config.json"
    assert docker_config_file(tmp_path / "my.json") == tmp_path / "my.json"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "d"))
    assert docker_config_file() == tmp_path / "d" / "config.json"
    monkeypatch.delenv("DOCKER_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert docker_config_file() == tmp_path / "home" / ".docker" / "config.json"


@pytest.mark.parametrize(
    ("registry", "loopback"),
    [
        ("127.0.0.1:5000", True),
        ("127.8.9.10", True),
        ("localhost:5000", True),
        ("LOCALHOST", True),
        ("[::1]:5000", True),
        ("10.0.0.1:5000", False),
        ("registry.example.com", False),
        ("localhost.example.com", False),
        ("[2001:db8::1]:443", False),
    ],
)
def test_only_loopback_registries_use_plain_http(registry: str, loopback: bool) -> None:
    assert is_loopback(registry) is loopback
    assert base_url(registry).scheme == ("http" if loopback else "https")
