"""`atrium.events`: topic globs (`*` within one `:`-segment, `**` across) and `matches_any`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atrium import events
from atrium.events import MAX_GLOB_LENGTH, TOPIC_RE, compile_glob, matches_any


@pytest.mark.parametrize(
    ("glob", "topic", "expected"),
    [
        # exact names
        ("app:installed", "app:installed", True),
        ("app:installed", "app:removed", False),
        ("app:installed", "app:installed.extra", False),
        ("app:installed", "xapp:installed", False),
        ("theme:changed", "theme:changed", True),
        # `.` is literal, not a regex wildcard
        ("app:lifecycle.error", "app:lifecycle.error", True),
        ("app:lifecycle.error", "app:lifecyclexerror", False),
        # `*` stays within one segment
        ("app:*", "app:installed", True),
        ("app:*", "app:lifecycle.error", True),
        ("app:*", "app:x:y", False),
        ("app:*", "dist:install.complete", False),
        ("app:*", "app", False),
        ("*", "app", True),
        ("*", "app:installed", False),
        ("*:installed", "app:installed", True),
        ("*:installed", "app:x:installed", False),
        ("dist:install.*", "dist:install.complete", True),
        ("dist:install.*", "dist:uninstall.complete", False),
        ("*:*", "app:installed", True),
        ("*:*", "app:x:y", False),
        # `**` crosses segments
        ("**", "app:installed", True),
        ("**", "app:x:y", True),
        ("**", "theme", True),
        ("app:**", "app:x:y", True),
        ("app:**", "app:installed", True),
        ("app:**", "dist:install.complete", False),
        ("**:complete", "dist:install:complete", True),
        ("**.complete", "dist:install.complete", True),
    ],
)
def test_glob_matching(glob: str, topic: str, expected: bool) -> None:
    assert compile_glob(glob).match(topic) is expected
    assert matches_any(topic, (glob,)) is expected


@pytest.mark.parametrize("topic", ["app:installed", "app:x:y", "theme:changed", "anything"])
def test_no_globs_means_every_topic(topic: str) -> None:
    assert matches_any(topic, None) is True


def test_empty_glob_tuple_matches_nothing() -> None:
    assert matches_any("app:installed", ()) is False


def test_matches_any_is_true_when_one_glob_matches() -> None:
    globs = ("theme:*", "app:installed")
    assert matches_any("app:installed", globs)
    assert matches_any("theme:changed", globs)
    assert not matches_any("app:removed", globs)


@pytest.mark.parametrize(
    "glob",
    [
        "",
        "App:*",
        "app:installed ",
        "app installed",
        "app/*",
        "app:[a-z]",
        "app:(x)",
        "app:+",
        "app:?",
        "app,theme",
        "app:é",
    ],
)
def test_invalid_glob_raises_value_error(glob: str) -> None:
    with pytest.raises(ValueError, match="topic glob"):
        compile_glob(glob)
    with pytest.raises(ValueError, match="topic glob"):
        matches_any("app:installed", (glob,))


def test_glob_with_trailing_newline_is_invalid() -> None:
    with pytest.raises(ValueError, match="topic glob"):
        compile_glob("app:*\n")


@pytest.mark.parametrize(
    "topic",
    [
        events.APP_INSTALLED,
        events.APP_REMOVED,
        events.APP_STATE,
        events.APP_LIFECYCLE_ERROR,
        events.APP_CRASHED,
        events.ACTIVITY_OPENED,
        events.KV_CHANGED,
        events.THEME_CHANGED,
        events.DIST_INSTALL_COMPLETE,
        events.DIST_UPDATE_COMPLETE,
        events.DIST_UNINSTALL_COMPLETE,
        events.DIST_PUBLISH_COMPLETE,
        events.DIST_PUBLISH_PROGRESS,
        events.DIST_PUBLISH_DONE,
    ],
)
def test_every_named_event_is_a_topic_its_family_glob_matches(topic: str) -> None:
    assert TOPIC_RE.match(topic)
    family = topic.split(":")[0]
    assert matches_any(topic, (f"{family}:*",))
    assert matches_any(topic, ("**",))
    assert not matches_any(topic, ("*",))


def _reference(glob: str) -> re.Pattern[str]:
    """The regex translation the shell used to match with (correct, but it backtracks)."""
    parts = re.split(r"(\*\*|\*)", glob)
    body = "".join(".*" if p == "**" else "[^:]*" if p == "*" else re.escape(p) for p in parts)
    return re.compile(f"^{body}\\Z")


@given(
    glob=st.text(alphabet="ab:*", min_size=1, max_size=10),
    topic=st.text(alphabet="ab:", max_size=10),
)
def test_glob_matches_exactly_what_the_regex_translation_matches(glob: str, topic: str) -> None:
    """Same semantics as before on every small glob, runs of stars included (`***` is `**`)."""
    assert compile_glob(glob).match(topic) is bool(_reference(glob).match(topic))


@pytest.mark.parametrize(
    ("glob", "topic", "expected"),
    [
        ("**" * 60 + "z", "kv:changed", False),
        ("**" * 60 + "d", "kv:changed", True),
        ("*a" * 60, "a" * 59 + "b", False),
        ("*a" * 60, "a" * 60, True),
        (":".join(["*"] * 40), ":".join(["x"] * 40), True),
        (":".join(["*"] * 40), ":".join(["x"] * 39), False),
        ("**:" * 40 + "z", "a:" * 40 + "y", False),
        ("***", "a:b", True),
        ("a***b", "a:x:b", True),
        ("a*b", "a:b", False),
    ],
)
def test_pathological_globs_answer_correctly(glob: str, topic: str, expected: bool) -> None:
    """Globs that made the old regex backtrack for hours; the answer comes in one linear pass."""
    assert compile_glob(glob).match(topic) is expected


def test_a_glob_longer_than_the_limit_is_refused() -> None:
    compile_glob("a" * MAX_GLOB_LENGTH)
    with pytest.raises(ValueError, match=f"the limit is {MAX_GLOB_LENGTH}"):
        compile_glob("a" * (MAX_GLOB_LENGTH + 1))


# --- typed payloads against docs/api.md "Topics and payloads" ----------------------------------

DOCS_API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def documented_topics() -> dict[str, list[str]]:
    """``topic → payload keys`` from the table under "### Topics and payloads"."""
    text = DOCS_API.read_text()
    table = text[text.index("### Topics and payloads") :].split("\n\n")[1]
    found: dict[str, list[str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        topic, payload = cells[0].strip("`"), cells[1].strip("`{}")
        found[topic] = [key.strip() for key in payload.split(",")]
    return found


def test_every_documented_topic_has_its_payload_class_with_the_same_keys() -> None:
    documented = documented_topics()
    assert sorted(documented) == sorted(events.PAYLOADS)
    for topic, cls in events.PAYLOADS.items():
        assert list(_example(cls).wire()) == documented[topic], topic


def _example(cls: type[events.Payload]) -> events.Payload:
    return cls(*(None for f in dataclasses.fields(cls) if not f.kw_only))


def test_wire_names_are_camel_case_and_from_is_a_keyword() -> None:
    state = events.AppState("i-1", "com.example.a", "created", "started")
    assert state.wire() == {
        "instanceId": "i-1",
        "appId": "com.example.a",
        "from": "created",
        "to": "started",
    }
    assert events.PAYLOADS["app:state"] is events.AppState


def test_the_shell_emits_only_typed_payloads() -> None:
    """`bus.publish(topic, mapping)` is for the bus's own tests; the shell uses `bus.emit`."""
    root = Path(__file__).resolve().parents[2] / "atrium"
    raw = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if path.name != "bus.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"bus\.publish\(", line)
    ]
    assert raw == []
