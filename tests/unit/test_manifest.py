"""`atrium.manifest.parse_manifest`: valid manifests, every kind of problem, and a fuzz test."""

from __future__ import annotations

from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atrium.errors import ManifestInvalid
from atrium.manifest import Manifest, ThemeStrategy, parse_manifest

DIR: Final = "com.example.notes"
MINIMAL: Final[dict[str, Any]] = {"id": DIR, "version": "1.0.0", "name": "Notes"}
FULL: Final[dict[str, Any]] = {
    "id": DIR,
    "version": "1.2.3-beta.1+build.7",
    "name": "Notes",
    "description": "Take notes",
    "icon": "N",
    "entrypoint": ["python3", "server.py"],
    "dataProvider": {
        "authority": "notes",
        "providers": [
            {
                "path": "/notes",
                "readPerm": "com.example.notes.read",
                "writePerm": "com.example.notes.write",
            },
            {"path": "/public"},
        ],
    },
    "intentFilters": [
        {
            "action": "os.intent.action.VIEW",
            "category": ["default", "browsable"],
            "dataMime": ["text/plain", "image/*"],
            "dataScheme": ["https"],
            "priority": -3,
        }
    ],
    "permissions": ["com.example.other.read", "system.kv.os.theme.read"],
    "themeStrategy": "themed",
    "warmPool": 2,
    "backgroundService": True,
    "tools": ["git", "python3"],
    "hookTimeoutMs": 5000,
    "startTimeoutMs": 20000,
}


def with_(**changes: Any) -> dict[str, Any]:
    """The minimal manifest with ``changes`` applied (camelCase keys, as in the JSON)."""
    return {**MINIMAL, **changes}


def problem_fields(data: object, dir_name: str | None = DIR) -> list[str]:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(data, dir_name)
    problems = caught.value.problems
    assert problems, "ManifestInvalid must list at least one problem"
    for problem in problems:
        assert set(problem) == {"field", "message"}
        assert problem["message"], f"empty message for {problem['field']}"
    return sorted(p["field"] for p in problems)


# --- valid manifests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            MINIMAL,
            {
                "id": DIR,
                "version": "1.0.0",
                "name": "Notes",
                "entrypoint": "entrypoint.sh",
                "data_provider": None,
                "intent_filters": [],
                "permissions": [],
                "theme_strategy": ThemeStrategy.INHERIT,
                "warm_pool": False,
                "background_service": False,
                "tools": [],
                "hook_timeout_ms": 10_000,
                "start_timeout_ms": 10_000,
            },
            id="minimal-gets-defaults",
        ),
        pytest.param(with_(warmPool=True), {"warm_pool": True}, id="warmPool-true"),
        pytest.param(with_(warmPool=False), {"warm_pool": False}, id="warmPool-false"),
        pytest.param(with_(warmPool=3), {"warm_pool": 3}, id="warmPool-int"),
        pytest.param(with_(warmPool=0), {"warm_pool": 0}, id="warmPool-zero"),
        pytest.param(
            with_(entrypoint="bin/serve.sh"), {"entrypoint": "bin/serve.sh"}, id="entrypoint-str"
        ),
        pytest.param(
            with_(entrypoint=["python3", "-m", "app"]),
            {"entrypoint": ["python3", "-m", "app"]},
            id="entrypoint-argv",
        ),
        pytest.param(
            with_(themeStrategy="override"),
            {"theme_strategy": ThemeStrategy.OVERRIDE},
            id="themeStrategy-override",
        ),
        pytest.param(
            with_(version="2.0.0-rc.1+sha.5114f85"),
            {"version": "2.0.0-rc.1+sha.5114f85"},
            id="semver-prerelease-build",
        ),
        pytest.param(with_(id="a.b"), {"id": "a.b"}, id="shortest-id"),
        pytest.param(with_(hookTimeoutMs=1), {"hook_timeout_ms": 1}, id="hookTimeoutMs-one"),
    ],
)
def test_valid_manifest_parses_with_expected_fields(
    data: dict[str, Any], expected: dict[str, Any]
) -> None:
    manifest = parse_manifest(data, data["id"])
    for attr, value in expected.items():
        assert getattr(manifest, attr) == value, attr


@pytest.mark.parametrize(
    ("category", "expected"),
    [("default", ["default"]), (["default", "alternative"], ["default", "alternative"])],
)
def test_intent_filter_category_accepts_string_or_list(
    category: str | list[str], expected: list[str]
) -> None:
    manifest = parse_manifest(
        with_(intentFilters=[{"action": "os.intent.action.SEND", "category": category}]), DIR
    )
    assert manifest.intent_filters[0].category == expected


def test_full_manifest_parses_every_field() -> None:
    manifest = parse_manifest(FULL, DIR)
    assert manifest.version == "1.2.3-beta.1+build.7"
    assert manifest.description == "Take notes"
    assert manifest.icon == "N"
    assert manifest.entrypoint == ["python3", "server.py"]
    assert manifest.data_provider is not None
    assert manifest.data_provider.authority == "notes"
    first, second = manifest.data_provider.providers
    assert (first.path, first.read_perm, first.write_perm) == (
        "/notes",
        "com.example.notes.read",
        "com.example.notes.write",
    )
    assert (second.path, second.read_perm, second.write_perm) == ("/public", None, None)
    (intent_filter,) = manifest.intent_filters
    assert intent_filter.action == "os.intent.action.VIEW"
    assert intent_filter.category == ["default", "browsable"]
    assert intent_filter.data_mime == ["text/plain", "image/*"]
    assert intent_filter.data_scheme == ["https"]
    assert intent_filter.priority == -3
    assert manifest.permissions == ["com.example.other.read", "system.kv.os.theme.read"]
    assert manifest.theme_strategy is ThemeStrategy.THEMED
    assert manifest.warm_pool == 2
    assert manifest.background_service is True
    assert manifest.tools == ["git", "python3"]
    assert manifest.hook_timeout_ms == 5000
    assert manifest.start_timeout_ms == 20000


def test_unknown_fields_are_kept_and_ignored() -> None:
    extra = {"x-vendor": {"nested": [1, 2]}, "homepage": "https://example.com"}
    manifest = parse_manifest(with_(**extra), DIR)
    assert manifest.model_extra == extra
    assert manifest.wire()["x-vendor"] == {"nested": [1, 2]}


def test_unknown_field_looking_like_a_typed_field_is_not_type_checked() -> None:
    # `priority` is an intent-filter field; at the top level it is just an unknown field
    manifest = parse_manifest(with_(priority="1"), DIR)
    assert manifest.model_extra == {"priority": "1"}


def test_provider_path_trailing_slash_is_normalised() -> None:
    manifest = parse_manifest(
        with_(dataProvider={"authority": "notes", "providers": [{"path": "/notes/"}]}), DIR
    )
    assert manifest.data_provider is not None
    assert manifest.data_provider.providers[0].path == "/notes"


def test_dir_name_none_skips_the_directory_check() -> None:
    assert parse_manifest(with_(id="com.example.elsewhere"), None).id == "com.example.elsewhere"


@pytest.mark.parametrize(
    ("warm_pool", "size"),
    [(None, 0), (False, 0), (True, 1), (0, 0), (1, 1), (4, 4), (64, 64)],
)
def test_warm_pool_size_counts_pre_spawned_instances(
    warm_pool: bool | int | None, size: int
) -> None:
    data = MINIMAL if warm_pool is None else with_(warmPool=warm_pool)
    assert parse_manifest(data, DIR).warm_pool_size == size


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(MINIMAL, id="minimal"),
        pytest.param(FULL, id="full"),
        pytest.param(with_(warmPool=True, entrypoint="run.sh", extraField=[1]), id="extras"),
        pytest.param(
            with_(intentFilters=[{"action": "os.intent.action.SEND", "category": "default"}]),
            id="category-string",
        ),
    ],
)
def test_wire_round_trips_through_parse_manifest(data: dict[str, Any]) -> None:
    manifest = parse_manifest(data, DIR)
    wire = manifest.wire()
    again = parse_manifest(wire, DIR)
    assert again == manifest
    assert again.wire() == wire


def test_wire_uses_camel_case_and_drops_none() -> None:
    wire = parse_manifest(FULL, DIR).wire()
    assert {"dataProvider", "intentFilters", "themeStrategy", "warmPool"} <= set(wire)
    assert {"hookTimeoutMs", "startTimeoutMs", "backgroundService"} <= set(wire)
    assert wire["dataProvider"]["providers"][1] == {"path": "/public"}
    assert "icon" not in parse_manifest(MINIMAL, DIR).wire()


# --- invalid manifests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "dir_name", "fields"),
    [
        pytest.param(with_(id="com.example.other"), DIR, ["id"], id="id-differs-from-directory"),
        pytest.param(with_(id="Com.Example.Notes"), None, ["id"], id="id-uppercase"),
        pytest.param(
            with_(id="Com.Example.Notes"), "Com.Example.Notes", ["id"], id="id-uppercase-same-dir"
        ),
        pytest.param(with_(id="notes"), None, ["id"], id="id-one-segment"),
        pytest.param(with_(id="1com.example"), None, ["id"], id="id-starts-with-digit"),
        pytest.param(with_(id="com.1example"), None, ["id"], id="id-segment-starts-with-digit"),
        pytest.param(with_(id="com..example"), None, ["id"], id="id-empty-segment"),
        pytest.param(
            with_(id="com.example.notes\n"),
            "com.example.notes\n",
            ["id"],
            id="id-trailing-newline",
        ),
        pytest.param(with_(version="1.0"), DIR, ["version"], id="semver-two-parts"),
        pytest.param(with_(version="v1.0.0"), DIR, ["version"], id="semver-v-prefix"),
        pytest.param(with_(version="1.0.0.0"), DIR, ["version"], id="semver-four-parts"),
        pytest.param(with_(version=""), DIR, ["version"], id="semver-empty"),
        pytest.param(
            with_(dataProvider={"authority": "notes", "providers": [{"path": "notes"}]}),
            DIR,
            ["dataProvider.providers[0].path"],
            id="provider-path-relative",
        ),
        pytest.param(
            with_(
                dataProvider={
                    "authority": "notes",
                    "providers": [{"path": "/ok"}, {"path": "/notes/../secret"}],
                }
            ),
            DIR,
            ["dataProvider.providers[1].path"],
            id="provider-path-dotdot",
        ),
        pytest.param(
            with_(dataProvider={"authority": "notes", "providers": [{"path": "/a/./b"}]}),
            DIR,
            ["dataProvider.providers[0].path"],
            id="provider-path-dot",
        ),
        pytest.param(
            with_(dataProvider={"authority": "content://notes", "providers": [{"path": "/n"}]}),
            DIR,
            ["dataProvider.authority"],
            id="authority-with-scheme",
        ),
        pytest.param(
            with_(dataProvider={"authority": "Notes", "providers": [{"path": "/n"}]}),
            DIR,
            ["dataProvider.authority"],
            id="authority-uppercase",
        ),
        pytest.param(
            with_(dataProvider={"authority": "notes\n", "providers": [{"path": "/n"}]}),
            DIR,
            ["dataProvider.authority"],
            id="authority-trailing-newline",
        ),
        pytest.param(
            with_(dataProvider={"authority": "notes", "providers": []}),
            DIR,
            ["dataProvider.providers"],
            id="providers-empty",
        ),
        pytest.param(
            with_(dataProvider={"providers": [{"path": "/n"}]}),
            DIR,
            ["dataProvider.authority"],
            id="authority-missing",
        ),
        pytest.param(with_(themeStrategy="dark"), DIR, ["themeStrategy"], id="themeStrategy-bad"),
        pytest.param(with_(themeStrategy=1), DIR, ["themeStrategy"], id="themeStrategy-number"),
        pytest.param(with_(version=1), DIR, ["version"], id="version-number"),
        pytest.param(with_(name=5), DIR, ["name"], id="name-number"),
        pytest.param(with_(name=""), DIR, ["name"], id="name-empty"),
        pytest.param(
            with_(warmPool="true"),
            DIR,
            ["warmPool"],
            id="warmPool-string",
        ),
        pytest.param(
            with_(warmPool=-1),
            DIR,
            ["warmPool"],
            id="warmPool-negative",
        ),
        pytest.param(
            with_(entrypoint=5),
            DIR,
            ["entrypoint"],
            id="entrypoint-number",
        ),
        pytest.param(
            with_(intentFilters=[{"action": "os.intent.action.VIEW", "priority": "1"}]),
            DIR,
            ["intentFilters[0].priority"],
            id="priority-string",
        ),
        pytest.param(
            with_(intentFilters=[{"action": "os.intent.action.VIEW", "priority": 1.5}]),
            DIR,
            ["intentFilters[0].priority"],
            id="priority-float",
        ),
        pytest.param(
            with_(intentFilters=[{"action": "a", "dataMime": ["text"]}]),
            DIR,
            ["intentFilters[0].dataMime"],
            id="dataMime-not-a-mime",
        ),
        pytest.param(
            with_(intentFilters=[{"action": "a", "dataScheme": ["1http"]}]),
            DIR,
            ["intentFilters[0].dataScheme"],
            id="dataScheme-not-a-scheme",
        ),
        pytest.param(
            with_(intentFilters=[{"category": "default"}]),
            DIR,
            ["intentFilters[0].action"],
            id="intent-filter-without-action",
        ),
        pytest.param(
            with_(backgroundService=1), DIR, ["backgroundService"], id="backgroundService-int"
        ),
        pytest.param(
            with_(backgroundService="true"),
            DIR,
            ["backgroundService"],
            id="backgroundService-string",
        ),
        pytest.param(with_(hookTimeoutMs=0), DIR, ["hookTimeoutMs"], id="hookTimeoutMs-zero"),
        pytest.param(with_(hookTimeoutMs=-5), DIR, ["hookTimeoutMs"], id="hookTimeoutMs-negative"),
        pytest.param(with_(hookTimeoutMs=True), DIR, ["hookTimeoutMs"], id="hookTimeoutMs-boolean"),
        pytest.param(
            with_(hookTimeoutMs="1000"), DIR, ["hookTimeoutMs"], id="hookTimeoutMs-string"
        ),
        pytest.param(with_(startTimeoutMs=0), DIR, ["startTimeoutMs"], id="startTimeoutMs-zero"),
        pytest.param(with_(entrypoint="../server.sh"), DIR, ["entrypoint"], id="entrypoint-dotdot"),
        pytest.param(
            with_(entrypoint="bin/../../server.sh"),
            DIR,
            ["entrypoint"],
            id="entrypoint-dotdot-inside",
        ),
        pytest.param(
            with_(entrypoint="/usr/bin/python3"), DIR, ["entrypoint"], id="entrypoint-absolute"
        ),
        pytest.param(with_(entrypoint=[]), DIR, ["entrypoint"], id="entrypoint-empty-argv"),
        pytest.param(with_(icon="../logo.png"), DIR, ["icon"], id="icon-outside"),
        pytest.param(with_(tools=["git", "a b"]), DIR, ["tools"], id="tool-with-space"),
        pytest.param(with_(permissions=["a b"]), DIR, ["permissions"], id="permission-space"),
        pytest.param(with_(permissions="x.read"), DIR, ["permissions"], id="permissions-string"),
        pytest.param({}, DIR, ["id", "name", "version"], id="empty-object"),
        pytest.param([MINIMAL], DIR, ["(manifest)"], id="json-list"),
        pytest.param("com.example.notes", DIR, ["(manifest)"], id="json-string"),
        pytest.param(None, DIR, ["(manifest)"], id="json-null"),
        pytest.param(42, None, ["(manifest)"], id="json-number"),
    ],
)
def test_invalid_manifest_reports_exact_fields(
    data: object, dir_name: str | None, fields: list[str]
) -> None:
    assert problem_fields(data, dir_name) == sorted(fields)


@pytest.mark.parametrize(
    ("part", "name"),
    [
        (
            {
                "dataProvider": {
                    "authority": "n",
                    "providers": [{"path": "/a", "readPerm": "com.example.notes.items.read"}],
                }
            },
            "dataProvider",
        ),
        (
            {
                "dataProvider": {
                    "authority": "n",
                    "providers": [{"path": "/a", "writePerm": "com.example.write"}],
                }
            },
            "dataProvider",
        ),
        (
            {
                "dataProvider": {
                    "authority": "n",
                    "providers": [{"path": "/a", "writePerm": "system.kv.os.theme.write"}],
                }
            },
            "dataProvider",
        ),
        (
            {"intentFilters": [{"action": "a", "permission": "com.other.app.write"}]},
            "intentFilters",
        ),
    ],
)
def test_a_provider_entry_or_filter_names_only_the_apps_own_permissions(
    part: dict[str, Any], name: str
) -> None:
    """Another id's name would be labelled by that id in every review of this app's data."""
    assert problem_fields({**MINIMAL, **part}, DIR) == [name]
    own = {
        **MINIMAL,
        "dataProvider": {
            "authority": "n",
            "providers": [{"path": "/a", "readPerm": f"{DIR}.read"}],
        },
    }
    assert parse_manifest(own, DIR).data_provider is not None


def test_manifest_reports_every_problem_at_once() -> None:
    data = {
        "id": "Bad",
        "version": "1.0",
        "name": "",
        "themeStrategy": "dark",
        "backgroundService": "yes",
        "hookTimeoutMs": 0,
        "entrypoint": "../run.sh",
        "dataProvider": {"authority": "content://notes", "providers": [{"path": "notes"}]},
        "intentFilters": [{"action": "a", "priority": "1"}],
    }
    fields = problem_fields(data, DIR)
    assert set(fields) == {
        "id",
        "version",
        "name",
        "themeStrategy",
        "backgroundService",
        "hookTimeoutMs",
        "entrypoint",
        "dataProvider.authority",
        "dataProvider.providers[0].path",
        "intentFilters[0].priority",
    }
    # a bad id that also differs from the directory is two problems on `id`
    assert fields.count("id") == 2


def test_manifest_invalid_carries_the_id_or_the_directory_name() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(with_(version="1.0"), DIR)
    assert caught.value.fields["appId"] == DIR
    assert caught.value.http_status == 422
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest({"version": "1.0.0"}, "com.example.dir")
    assert caught.value.fields["appId"] == "com.example.dir"


def test_manifest_invalid_message_names_every_field() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(with_(version="1.0", themeStrategy="dark"), DIR)
    assert "version" in caught.value.message
    assert "themeStrategy" in caught.value.message


# --- fuzz ----------------------------------------------------------------------------------------

_SUB_FIELDS: Final = (
    "authority",
    "providers",
    "path",
    "readPerm",
    "writePerm",
    "action",
    "category",
    "dataMime",
    "dataScheme",
    "priority",
)
FIELD_NAMES: Final = sorted(
    {field.alias or name for name, field in Manifest.model_fields.items()} | set(_SUB_FIELDS)
)
_PLAUSIBLE: Final = (
    DIR,
    "1.0.0",
    "/notes",
    "/a/../b",
    "notes",
    "inherit",
    "themed",
    "entrypoint.sh",
    "text/plain",
    "https",
    "*",
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(_PLAUSIBLE)
)
_keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=12)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=6),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    data=st.dictionaries(_keys, _json, max_size=12) | _json,
    dir_name=st.none() | st.just(DIR) | st.text(max_size=20),
)
def test_arbitrary_json_never_raises_anything_but_manifest_invalid(
    data: object, dir_name: str | None
) -> None:
    problems: list[dict[str, str]] | None = None
    try:
        manifest = parse_manifest(data, dir_name)
    except ManifestInvalid as err:
        problems = err.problems
    if problems is not None:
        assert problems
        assert all(isinstance(p["field"], str) and p["field"] for p in problems)
        return
    assert dir_name is None or manifest.id == dir_name
    assert parse_manifest(manifest.wire(), dir_name) == manifest


def test_sharing_says_whether_the_app_enforces_roles_and_is_strictly_typed() -> None:
    base = {"id": "com.example.notes", "version": "1.0.0", "name": "Notes"}
    assert parse_manifest(base, None).sharing.enforces_roles is False
    enforced = parse_manifest({**base, "sharing": {"enforcesRoles": True}}, None)
    assert enforced.sharing.enforces_roles is True
    assert enforced.wire()["sharing"] == {"enforcesRoles": True}
    for bad, field in (
        ({"enforcesRoles": "yes"}, "sharing.enforcesRoles"),
        ({"enforcesRoles": 1}, "sharing.enforcesRoles"),
        (True, "sharing"),
    ):
        with pytest.raises(ManifestInvalid) as err:
            parse_manifest({**base, "sharing": bad}, None)
        assert [p["field"] for p in err.value.problems] == [field]
