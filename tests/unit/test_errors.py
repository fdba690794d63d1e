"""`atrium.errors` mirrors the error table of docs/api.md "Errors", and builds the error body."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from atrium import errors
from atrium.errors import AtriumError, error_classes

#: the project's own API reference, found from this file so a bare clone reads its own copy
API_REFERENCE: Final = Path(__file__).resolve().parents[2] / "docs" / "api.md"
CAMEL_CASE: Final = re.compile(r"^[a-z][a-zA-Z0-9]*$")
#: a cell boundary: a `|` that markdown does not escape
CELL_SEPARATOR: Final = re.compile(r"(?<!\\)\|")
SEPARATOR_ROW: Final = re.compile(r"^\|[\s|:-]+\|$")


def concrete_classes() -> list[type[AtriumError]]:
    """Every class of the tree except those that declare ``abstract = True`` themselves."""
    found: list[type[AtriumError]] = []
    pending: list[type[AtriumError]] = [AtriumError]
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if not vars(cls).get("abstract", False):
            found.append(cls)
    return found


CONCRETE: Final = concrete_classes()


@dataclass(frozen=True)
class Row:
    """One row of the docs/api.md error table."""

    condition: str
    status: int
    code: str
    headers: dict[str, str]


def table_cells(line: str) -> list[str]:
    return [cell.strip() for cell in CELL_SEPARATOR.split(line.strip().strip("|"))]


def error_table_lines(text: str) -> list[str]:
    """The lines of the first table under the ``## Errors`` heading, header row first."""
    lines = text.splitlines()
    try:
        start = lines.index("## Errors")
    except ValueError:
        return []
    table: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("## ") or (table and not line.startswith("|")):
            break
        if line.startswith("|"):
            table.append(line)
    return table


def parse_error_table(text: str) -> list[Row]:
    """The rows of the first table under the ``## Errors`` heading ([] when there is none).

    The header row names the columns: the first is the condition, ``Status`` and ``code`` are
    required, others (such as the extra fields) are ignored. The table ends at its first line that
    is not a table row; later tables of the section are not part of it. A malformed table is a
    ValueError, never a shorter list.
    """
    table = error_table_lines(text)
    if not table:
        return []
    header = [cell.lower() for cell in table_cells(table[0])]
    for column in ("status", "code"):
        if column not in header:
            raise ValueError(f"the error table has no {column} column: {table[0]!r}")
    status_at, code_at = header.index("status"), header.index("code")
    rows: list[Row] = []
    for line in table[1:]:
        if SEPARATOR_ROW.match(line.strip()):
            continue
        cells = table_cells(line)
        if len(cells) != len(header):
            raise ValueError(f"{len(cells)} cells under {len(header)} columns: {line!r}")
        condition, status_cell, code = cells[0], cells[status_at], cells[code_at].strip("`")
        status = re.match(r"^\d{3}", status_cell)
        if status is None:
            raise ValueError(f"no leading status in {status_cell!r} (row {condition!r})")
        headers = dict(re.findall(r"`([A-Za-z-]+):\s*([^`]+)`", status_cell))
        rows.append(Row(condition, int(status.group()), code, headers))
    return rows


@pytest.fixture(scope="module")
def table() -> list[Row]:
    if not API_REFERENCE.is_file():
        pytest.fail(f"the error table's source {API_REFERENCE} is missing")
    rows = parse_error_table(API_REFERENCE.read_text(encoding="utf-8"))
    if not rows:
        pytest.fail(f"no '## Errors' table with rows found in {API_REFERENCE}")
    return rows


def test_the_api_reference_has_one_error_row_per_concrete_class(table: list[Row]) -> None:
    assert len(table) == len(CONCRETE)


def test_error_table_parses_the_special_503_row() -> None:
    text = (
        "## Errors\n| Condition | Status | code |\n|---|---|---|\n"
        "| Declared provider has no instance | 503 + `Retry-After: 1` | `provider_unavailable` |\n"
        "## Next\n| x | 200 | `not_an_error` |\n"
    )
    assert parse_error_table(text) == [
        Row("Declared provider has no instance", 503, "provider_unavailable", {"Retry-After": "1"})
    ]


def test_error_table_columns_are_found_by_their_header() -> None:
    text = (
        "Intro.\n\n## Errors\n\nThe codes.\n\n"
        "| Condition | Extra fields | Status | code |\n|---|---|---|---|\n"
        "| A bad ref | `ref`, `accepted` | 400 | `bad_ref` |\n"
        "| Escaped \\| pipe | | 409 | `busy` |\n"
    )
    assert parse_error_table(text) == [
        Row("A bad ref", 400, "bad_ref", {}),
        Row("Escaped \\| pipe", 409, "busy", {}),
    ]


def test_error_table_ends_at_its_first_non_table_line() -> None:
    text = (
        "## Errors\n| Condition | Status | code |\n|---|---|---|\n| Gone | 404 | `not_found` |\n"
        "\n### More\n| Situation | Status | code |\n|---|---|---|\n| Other | 405 | `bad_request` |\n"
    )
    assert parse_error_table(text) == [Row("Gone", 404, "not_found", {})]


@pytest.mark.parametrize(
    "text",
    ["", "# API\n\n## Errors\n\nNo table yet.\n\n## Next\n| a | 400 | `x` |\n", "## Errorsx\n"],
)
def test_error_table_is_empty_without_a_table_under_the_heading(text: str) -> None:
    assert parse_error_table(text) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("## Errors\n| Condition | Status |\n|---|---|\n| x | 400 |\n", "no code column"),
        ("## Errors\n| Condition | Status | code |\n|---|---|---|\n| x | 400 |\n", "2 cells"),
        ("## Errors\n| Condition | Status | code |\n|---|---|---|\n| x | bad | `y` |\n", "status"),
    ],
)
def test_a_malformed_error_table_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_error_table(text)


def test_error_table_codes_are_unique(table: list[Row]) -> None:
    codes = [row.code for row in table]
    assert len(codes) == len(set(codes))
    assert {"internal", "provider_unavailable", "invalid_manifest"} <= set(codes)


def check_against_table(classes: list[type[AtriumError]], table: list[Row]) -> list[str]:
    """What is wrong between ``classes`` and the table, one line each."""
    mistakes: list[str] = []
    for row in table:
        matching = [cls for cls in classes if cls.code == row.code]
        if len(matching) != 1:
            names = [cls.__name__ for cls in matching]
            mistakes.append(f"{row.code}: {len(matching)} classes {names}, expected exactly one")
        elif matching[0].http_status != row.status:
            mistakes.append(
                f"{row.code}: {matching[0].__name__}.http_status is {matching[0].http_status}, "
                f"table says {row.status}"
            )
    codes = {row.code for row in table}
    mistakes += [
        f"{cls.__name__}: code {cls.code!r} is not in docs/api.md"
        for cls in classes
        if cls.code not in codes
    ]
    return mistakes


def test_every_table_code_has_exactly_one_concrete_class_in_the_tree(table: list[Row]) -> None:
    mistakes = check_against_table(CONCRETE, table)
    assert not mistakes, "\n".join(mistakes)


def test_every_table_code_has_exactly_one_class_in_error_classes(table: list[Row]) -> None:
    mistakes = check_against_table(error_classes(), table)
    assert not mistakes, "\n".join(mistakes)


def test_no_error_class_has_a_code_absent_from_the_table(table: list[Row]) -> None:
    codes = {row.code for row in table}
    strays = {cls.__name__: cls.code for cls in error_classes() if cls.code not in codes}
    assert not strays, f"error classes whose code is not in docs/api.md: {strays}"


def test_error_classes_lists_every_concrete_class() -> None:
    assert set(error_classes()) == set(CONCRETE)


def test_error_classes_are_concrete_and_distinct() -> None:
    classes = error_classes()
    assert len(classes) == len(set(classes))
    assert set(classes) <= set(CONCRETE)
    assert AtriumError in classes
    assert AtriumError.code == "internal"
    for abstract in (errors.Forbidden, errors.Conflict, errors.BadGateway):
        assert abstract not in classes
        assert abstract not in CONCRETE


# --- bodies -------------------------------------------------------------------------------------

#: one instance of every concrete class, built with every field it can carry
SAMPLES: Final[dict[type[AtriumError], Callable[[], AtriumError]]] = {
    AtriumError: lambda: AtriumError("something broke"),
    errors.InvalidRequest: lambda: errors.InvalidRequest(
        "bad body", problems=[{"field": "ref", "message": "required"}]
    ),
    errors.BadRef: lambda: errors.BadRef("ftp://x/y", "unknown scheme"),
    errors.Unauthenticated: lambda: errors.Unauthenticated("sign in"),
    errors.PermissionDenied: lambda: errors.PermissionDenied(
        "no", caller_app_id="com.example.a", permission="com.example.b.read"
    ),
    errors.CallerMismatch: lambda: errors.CallerMismatch("com.example.a", "com.example.b"),
    errors.SystemScopeImmutable: lambda: errors.SystemScopeImmutable("install"),
    errors.ApprovalDenied: lambda: errors.ApprovalDenied("com.example.a", {"appId": "x"}),
    errors.TooManyTokens: lambda: errors.TooManyTokens(100),
    errors.FetchHostRefused: lambda: errors.FetchHostRefused(
        "metadata.internal", "169.254.169.254"
    ),
    errors.UntrustedArtifact: lambda: errors.UntrustedArtifact(
        "com.example.a", "oci://127.0.0.1:5000/a:1", {"status": "unsigned"}, "global"
    ),
    errors.NotFound: lambda: errors.NotFound("app", "com.example.a"),
    errors.NoProvider: lambda: errors.NoProvider("notes", "/notes/5"),
    errors.NoHandler: lambda: errors.NoHandler("os.intent.action.VIEW"),
    errors.LifecycleTransitionError: lambda: errors.LifecycleTransitionError(
        "com.example.a-0", "installed", "resumed", app_id="com.example.a"
    ),
    errors.NotServing: lambda: errors.NotServing(
        "com.example.a-1", "com.example.a", "stopped", "a view needs a serving instance"
    ),
    errors.Busy: lambda: errors.Busy("com.example.a", "install"),
    errors.LastAdmin: lambda: errors.LastAdmin("the last admin", user="ada"),
    errors.IndexUrlFixed: lambda: errors.IndexUrlFixed("https://apps.example.org/index.json"),
    errors.UserExists: lambda: errors.UserExists("exists", user="ada"),
    errors.BootstrapAdmin: lambda: errors.BootstrapAdmin("the bootstrap admin", user="default"),
    errors.BadCredentials: errors.BadCredentials,
    errors.TooManyAttempts: lambda: errors.TooManyAttempts(60),
    errors.IdentityLinked: lambda: errors.IdentityLinked(
        "linked", issuer="https://id.example", subject="s1"
    ),
    errors.ApprovalStale: lambda: errors.ApprovalStale("sha256:aa", "sha256:bb"),
    errors.AuthorityConflict: lambda: errors.AuthorityConflict("notes", "com.example.a"),
    errors.NotADevCopy: lambda: errors.NotADevCopy("com.example.a", "user"),
    errors.BackupDamaged: lambda: errors.BackupDamaged(
        "com.atrium.notes", "20260101T000000000000Z-1.0.0", "data/x is missing"
    ),
    errors.ScopeNeedsRepair: lambda: errors.ScopeNeedsRepair(
        "global", ["/h/.journal/x.unreadable"]
    ),
    errors.ManifestInvalid: lambda: errors.ManifestInvalid(
        "com.example.a", [{"field": "version", "message": "not semver"}]
    ),
    errors.ImageNotKept: lambda: errors.ImageNotKept(
        "com.example.a", f"sha256:{'a' * 64}", "image"
    ),
    errors.ExportTooLarge: lambda: errors.ExportTooLarge(
        "com.example.a", "data/com.example.a-1/big", 2**40, 2**40, 2**36, "too big"
    ),
    errors.MisdirectedRequest: lambda: errors.MisdirectedRequest("not ours", host="evil.test:1"),
    errors.HeadersTooLarge: lambda: errors.HeadersTooLarge("too long", limit=65536),
    errors.UpstreamFailed: lambda: errors.UpstreamFailed("upstream reset", authority="notes"),
    errors.HookFailed: lambda: errors.HookFailed("hook said 500", hook="onStart", status=500),
    errors.SpawnFailed: lambda: errors.SpawnFailed(
        "died", app_id="com.example.a", cause="early exit"
    ),
    errors.FetchFailed: lambda: errors.FetchFailed("oci://r/x:1", "401"),
    errors.ProviderUnavailable: lambda: errors.ProviderUnavailable("notes", "paused"),
    errors.UpstreamTimeout: lambda: errors.UpstreamTimeout("no answer in 30 s"),
    errors.ShuttingDown: errors.ShuttingDown,
    errors.DatabaseUnavailable: lambda: errors.DatabaseUnavailable("postgresql"),
    errors.DatabaseLost: lambda: errors.DatabaseLost("no answer within 1.5 s"),
    # ``shell`` is the machine the instance runs on, not subprocess's (ruff's S604)
    errors.InstanceElsewhere: lambda: errors.InstanceElsewhere(  # noqa: S604
        "runs on another shell", instanceId="com.example.a-1", shell="node2"
    ),
    errors.InstanceUnheld: lambda: errors.InstanceUnheld(
        "its pod is gone", instanceId="com.example.a-1"
    ),
    errors.ShellTimeout: lambda: errors.ShellTimeout(  # noqa: S604
        "not taken in 5 s", instanceId="com.example.a-1", shell="node2", taken=False
    ),
    errors.InstallFailed: lambda: errors.InstallFailed("com.example.a", "disk full"),
    errors.StorageFailed: lambda: errors.StorageFailed("I/O error", path="/h/kv.sqlite3"),
    errors.StorageDamaged: lambda: errors.StorageDamaged("damaged", path="/h/kv.sqlite3"),
    errors.StorageFull: lambda: errors.StorageFull("disk full", path="/h/kv.sqlite3"),
}


def test_samples_cover_every_error_class() -> None:
    assert set(SAMPLES) == set(CONCRETE)


@pytest.mark.parametrize("cls", CONCRETE, ids=lambda cls: cls.__name__)
def test_to_body_shape_is_error_code_message_and_camel_case_fields(
    cls: type[AtriumError],
) -> None:
    err = SAMPLES[cls]()
    assert type(err) is cls
    body = err.to_body()
    assert list(body) == ["error"]
    inner = body["error"]
    assert inner["code"] == cls.code
    assert isinstance(inner["message"], str)
    assert inner["message"]
    assert inner["message"] == err.message == str(err)
    for key, value in inner.items():
        assert CAMEL_CASE.match(key), f"{cls.__name__} field {key!r} is not camelCase"
        assert value is not None, f"{cls.__name__} field {key!r} is None"
    assert {k: v for k, v in inner.items() if k not in {"code", "message"}} == err.fields


@pytest.mark.parametrize(
    ("err", "dropped"),
    [
        (errors.PermissionDenied("no", caller_app_id="com.example.a"), "permission"),
        (errors.PermissionDenied("no", permission="x.read"), "callerAppId"),
        (errors.CallerMismatch("com.example.a", None), "actual"),
        (errors.HookFailed("timed out", hook="onStart"), "status"),
        (errors.ProviderUnavailable("notes"), "state"),
        (errors.ApprovalDenied("com.example.a"), "diff"),
        (errors.LifecycleTransitionError("a-0", "installed", "resumed"), "appId"),
        (errors.InvalidRequest("bad"), "problems"),
        (errors.ManifestInvalid(None, [{"field": "id", "message": "x"}]), "appId"),
    ],
)
def test_to_body_drops_none_fields(err: AtriumError, dropped: str) -> None:
    assert dropped not in err.to_body()["error"]


def test_lifecycle_transition_error_body_names_from_and_to() -> None:
    body = errors.LifecycleTransitionError("com.example.a-0", "installed", "resumed").to_body()
    assert body == {
        "error": {
            "code": "illegal_transition",
            "message": body["error"]["message"],
            "instanceId": "com.example.a-0",
            "from": "installed",
            "to": "resumed",
        }
    }


def test_manifest_invalid_body_lists_every_problem() -> None:
    problems = [
        {"field": "version", "message": "not semver"},
        {"field": "id", "message": "must equal the directory name"},
    ]
    body = errors.ManifestInvalid("com.example.a", problems).to_body()["error"]
    assert body["code"] == "invalid_manifest"
    assert body["appId"] == "com.example.a"
    assert body["problems"] == problems


@pytest.mark.parametrize(
    "ref",
    ["ftp://example.com/app", "not a ref at all", "Com.Example.Notes@", "oci://", "local:"],
)
def test_bad_ref_message_contains_the_raw_ref_and_the_accepted_forms(ref: str) -> None:
    err = errors.BadRef(ref, "unrecognised")
    assert ref in err.message
    assert errors.BadRef.ACCEPTED in err.message
    assert err.fields == {"ref": ref, "accepted": errors.BadRef.ACCEPTED}
    assert err.http_status == 400


def test_bad_ref_message_contains_a_raw_ref_with_a_backslash() -> None:
    ref = "local:C:\\apps\\notes"
    assert ref in errors.BadRef(ref, "unrecognised").message


def test_provider_unavailable_asks_to_retry_after_one_second(table: list[Row]) -> None:
    assert errors.ProviderUnavailable("notes").headers() == {"Retry-After": "1"}
    (row,) = [row for row in table if row.code == "provider_unavailable"]
    assert row.headers == {"Retry-After": "1"}


@pytest.mark.parametrize("cls", CONCRETE, ids=lambda cls: cls.__name__)
def test_headers_are_exactly_those_the_table_names(
    cls: type[AtriumError], table: list[Row]
) -> None:
    (row,) = [row for row in table if row.code == cls.code]
    assert dict(SAMPLES[cls]().headers()) == row.headers
