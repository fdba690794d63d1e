"""OIDC providers as a setting (one ConfigError line per problem, the secrets never repeated), and
the pure rules a verified ID token is judged by: the e-mail rule and a signed-up member's id."""

from __future__ import annotations

import json
import os

import pytest

from atrium.settings import ConfigError, Settings
from atrium.users.oidc import OidcProvider, email_problem, new_user_id

SECRET = "do-not-print-this-secret"
GOOD = {
    "id": "work",
    "issuer": "https://id.example.org",
    "clientId": "atrium",
    "clientSecret": SECRET,
    "displayName": "Work",
}


@pytest.fixture(autouse=True)
def _no_atrium_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("ATRIUM_")]:
        monkeypatch.delenv(name)


def problems(monkeypatch: pytest.MonkeyPatch, value: str) -> tuple[str, ...]:
    monkeypatch.setenv("ATRIUM_OIDC_PROVIDERS", value)
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert all(SECRET not in line for line in caught.value.problems)
    return caught.value.problems


def test_providers_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATRIUM_OIDC_PROVIDERS", json.dumps([{**GOOD, "allowSignup": True}]))
    (provider,) = Settings.load().oidc_providers
    assert provider.allow_signup
    assert provider.client_secret.get_secret_value() == SECRET
    assert SECRET not in repr(provider)
    assert provider.metadata_url == "https://id.example.org/.well-known/openid-configuration"
    monkeypatch.delenv("ATRIUM_OIDC_PROVIDERS")
    assert Settings.load().oidc_providers == ()


def test_a_bad_provider_list_is_one_line_naming_where(monkeypatch: pytest.MonkeyPatch) -> None:
    (line,) = problems(monkeypatch, json.dumps([{**GOOD, "issuer": "ftp://id.example.org"}]))
    assert line.startswith("ATRIUM_OIDC_PROVIDERS at 0.issuer: an issuer is an https:// URL")
    (line,) = problems(monkeypatch, json.dumps([GOOD, GOOD]))
    assert "provider id 'work' is given twice" in line
    (line,) = problems(monkeypatch, json.dumps([{**GOOD, "clientSecret": None}]))
    assert line.startswith("ATRIUM_OIDC_PROVIDERS at 0.clientSecret:")
    (line,) = problems(monkeypatch, '[{"id": "work", "clientSecret": "' + SECRET)
    assert line.startswith("ATRIUM_OIDC_PROVIDERS: not valid JSON; accepted: a JSON list")


def test_the_email_rule_needs_a_verified_address_of_a_listed_domain() -> None:
    free = OidcProvider.model_validate(GOOD)
    assert email_problem(free, {}) is None
    ruled = OidcProvider.model_validate({**GOOD, "emailDomains": ["@Example.org"]})
    assert email_problem(ruled, {"email": "a@example.org", "email_verified": True}) is None
    assert email_problem(ruled, {"email": "a@EXAMPLE.ORG", "email_verified": True}) is None
    assert "not verified" in str(email_problem(ruled, {"email": "a@example.org"}))
    unverified = {"email": "a@example.org", "email_verified": "true"}
    assert "not verified" in str(email_problem(ruled, unverified))
    other = {"email": "a@example.org.evil", "email_verified": True}
    assert "may not sign in" in str(email_problem(ruled, other))
    assert "no e-mail" in str(email_problem(ruled, {"email_verified": True}))


def test_a_new_members_id_is_valid_and_unused() -> None:
    taken = {"ann", "ann-2"}.__contains__
    assert new_user_id({"preferred_username": "Ann"}, taken) == "ann-3"
    assert new_user_id({"email": "Bo.B+x@example.org"}, taken) == "bo.b-x"
    assert new_user_id({"preferred_username": "..", "email": "ç@x"}, taken) == "user"
    assert new_user_id({"preferred_username": "z" * 60}, taken) == "z" * 28
    assert new_user_id({}, {"user"}.__contains__) == "user-2"
