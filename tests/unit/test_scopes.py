"""`atrium.scopes`: the scope table of docs/api.md "Scopes" rooted at a home directory, and masking by priority."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from atrium.scopes import BY_PRIORITY, PRIORITY, Scope, ScopeLayout, parse_scope, visible, winner

HOME: Final = Path("/data")  # /data in docs/api.md stands for $ATRIUM_HOME
SYSTEM_APPS: Final = Path("/workspace/apps")
APP: Final = "com.example.notes"
INSTANCE: Final = "com.example.notes-0"


@pytest.fixture
def layout() -> ScopeLayout:
    return ScopeLayout(home=HOME, system_apps=SYSTEM_APPS)


def subsets() -> Iterator[tuple[Scope, ...]]:
    """Every subset of the three scopes, in every order."""
    for size in range(len(Scope) + 1):
        for combo in itertools.combinations(Scope, size):
            yield from itertools.permutations(combo)


# --- paths (docs/api.md "Scopes") ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "app_dir", "runtime_dir"),
    [
        (
            Scope.SYSTEM,
            "/workspace/apps/com.example.notes",
            "/data/scopes/system/apps/com.example.notes/com.example.notes-0",
        ),
        (
            Scope.GLOBAL,
            "/data/scopes/global/apps/com.example.notes",
            "/data/scopes/global/apps/com.example.notes/com.example.notes-0",
        ),
        (
            Scope.USER,
            "/data/scopes/users/default/apps/com.example.notes",
            "/data/scopes/users/default/apps/com.example.notes/com.example.notes-0",
        ),
    ],
)
def test_layout_paths_match_the_spec_scope_table(
    layout: ScopeLayout, scope: Scope, app_dir: str, runtime_dir: str
) -> None:
    assert layout.app_dir(scope, APP) == Path(app_dir)
    assert layout.runtime_dir(scope, APP, INSTANCE) == Path(runtime_dir)


@pytest.mark.parametrize(
    ("scope", "root", "apps_dir"),
    [
        (Scope.SYSTEM, "/data/scopes/system", "/workspace/apps"),
        (Scope.GLOBAL, "/data/scopes/global", "/data/scopes/global/apps"),
        (Scope.USER, "/data/scopes/users/default", "/data/scopes/users/default/apps"),
    ],
)
def test_layout_roots_and_apps_dirs(
    layout: ScopeLayout, scope: Scope, root: str, apps_dir: str
) -> None:
    assert layout.root(scope) == Path(root)
    assert layout.apps_dir(scope) == Path(apps_dir)


def test_system_apps_dir_is_the_given_folder_whatever_the_home(tmp_path: Path) -> None:
    shipped = tmp_path / "wheel" / "atrium" / "system_apps"
    layout = ScopeLayout(home=tmp_path / "home", system_apps=shipped)
    assert layout.apps_dir(Scope.SYSTEM) == shipped
    assert layout.app_dir(Scope.SYSTEM, APP) == shipped / APP
    # runtime data of system apps still lives under the home, not in the shipped folder
    assert layout.runtime_dir(Scope.SYSTEM, APP, INSTANCE) == (
        tmp_path / "home" / "scopes" / "system" / "apps" / APP / INSTANCE
    )


@pytest.mark.parametrize("scope", list(Scope))
def test_runtime_dir_is_data_dir_then_app_then_instance(layout: ScopeLayout, scope: Scope) -> None:
    assert layout.runtime_dir(scope, APP, INSTANCE) == layout.data_dir(scope) / APP / INSTANCE


@pytest.mark.parametrize("scope", [Scope.GLOBAL, Scope.USER])
def test_mutable_scope_runtime_data_lives_inside_the_installed_app_dir(
    layout: ScopeLayout, scope: Scope
) -> None:
    assert layout.runtime_dir(scope, APP, INSTANCE).parent == layout.app_dir(scope, APP)


@pytest.mark.parametrize(
    ("scope", "staging"),
    [
        (Scope.SYSTEM, "/data/scopes/system/.staging"),
        (Scope.GLOBAL, "/data/scopes/global/.staging"),
        (Scope.USER, "/data/scopes/users/default/.staging"),
    ],
)
def test_staging_dir_is_in_the_scope_root_outside_apps(
    layout: ScopeLayout, scope: Scope, staging: str
) -> None:
    assert layout.staging_dir(scope) == Path(staging)
    assert layout.staging_dir(scope) == layout.root(scope) / ".staging"
    assert not layout.staging_dir(scope).is_relative_to(layout.apps_dir(scope))


def test_another_user_id_changes_only_the_user_scope_paths(layout: ScopeLayout) -> None:
    alice = ScopeLayout(home=HOME, system_apps=SYSTEM_APPS, user="alice")
    assert alice.root(Scope.USER) == Path("/data/scopes/users/alice")
    assert alice.app_dir(Scope.USER, APP) == Path("/data/scopes/users/alice/apps/com.example.notes")
    assert alice.runtime_dir(Scope.USER, APP, INSTANCE) == Path(
        "/data/scopes/users/alice/apps/com.example.notes/com.example.notes-0"
    )
    assert alice.staging_dir(Scope.USER) == Path("/data/scopes/users/alice/.staging")
    for scope in (Scope.SYSTEM, Scope.GLOBAL):
        assert alice.root(scope) == layout.root(scope)
        assert alice.app_dir(scope, APP) == layout.app_dir(scope, APP)
        assert alice.runtime_dir(scope, APP, INSTANCE) == layout.runtime_dir(scope, APP, INSTANCE)


def test_layout_computes_paths_without_touching_the_disk(tmp_path: Path) -> None:
    layout = ScopeLayout(home=tmp_path / "home", system_apps=tmp_path / "apps")
    for scope in Scope:
        layout.root(scope)
        layout.apps_dir(scope)
        layout.runtime_dir(scope, APP, INSTANCE)
        layout.staging_dir(scope)
    assert list(tmp_path.iterdir()) == []


# --- scope properties --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "priority", "mutable"),
    [(Scope.SYSTEM, 0, False), (Scope.GLOBAL, 1, True), (Scope.USER, 2, True)],
)
def test_scope_priority_and_mutability_follow_the_spec(
    scope: Scope, priority: int, mutable: bool
) -> None:
    assert scope.priority == priority
    assert PRIORITY[scope] == priority
    assert scope.is_mutable is mutable


def test_by_priority_lists_highest_first() -> None:
    assert BY_PRIORITY == (Scope.USER, Scope.GLOBAL, Scope.SYSTEM)
    assert set(BY_PRIORITY) == set(Scope)


@pytest.mark.parametrize(
    ("text", "scope"),
    [
        ("system", Scope.SYSTEM),
        ("global", Scope.GLOBAL),
        ("user", Scope.USER),
        ("System", None),
        ("GLOBAL", None),
        ("users", None),
        ("default", None),
        (" user", None),
        ("", None),
    ],
)
def test_parse_scope_accepts_exact_names_only(text: str, scope: Scope | None) -> None:
    assert parse_scope(text) is scope


# --- masking by priority ---------------------------------------------------------------------


@pytest.mark.parametrize("scopes", list(subsets()), ids=lambda s: "+".join(s) or "none")
def test_winner_is_the_highest_priority_scope_present(scopes: tuple[Scope, ...]) -> None:
    expected = next((s for s in BY_PRIORITY if s in scopes), None)
    assert winner(scopes) is expected
    assert winner(iter(scopes)) is expected


@pytest.mark.parametrize("scopes", list(subsets()), ids=lambda s: "+".join(s) or "none")
def test_visible_orders_copies_by_priority_and_the_first_wins(scopes: tuple[Scope, ...]) -> None:
    copies = [(scope, f"copy-in-{scope}") for scope in scopes]
    result = visible(copies)
    if not scopes:
        assert result is None
        return
    assert result is not None
    assert list(result) == [s for s in BY_PRIORITY if s in scopes]
    assert next(iter(result)) is winner(scopes)
    assert result == dict(copies)
    # every other copy is masked by the winner: all of strictly lower priority
    masked = list(result)[1:]
    assert all(s.priority < next(iter(result)).priority for s in masked)


@pytest.mark.parametrize("scopes", [s for s in subsets() if len(s) >= 2], ids=lambda s: "+".join(s))
def test_removing_the_winner_unmasks_the_next_scope(scopes: tuple[Scope, ...]) -> None:
    ordered = visible((s, s.value) for s in scopes)
    assert ordered is not None
    top, runner_up = list(ordered)[:2]
    remaining = [s for s in scopes if s is not top]
    assert winner(remaining) is runner_up
