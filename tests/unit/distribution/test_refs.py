"""Refs: every accepted form, every bad kind (with the raw ref in the message), and the round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atrium.distribution.refs import GitRef, IndexRef, LocalRef, OciRef, Ref, parse_ref
from atrium.errors import BadRef

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("oci://registry.example/apps/notes", OciRef("registry.example", "apps/notes", "latest")),
        ("oci://localhost:5000/notes:1.2.0", OciRef("localhost:5000", "notes", "1.2.0")),
        (f"oci://r.example/notes@{DIGEST}", OciRef("r.example", "notes", None, DIGEST)),
        (
            "registry.example:5000/team/notes:v2",
            OciRef("registry.example:5000", "team/notes", "v2"),
        ),
        (f"r.example/notes@{DIGEST}", OciRef("r.example", "notes", None, DIGEST)),
        ("github.com/alice/notes", GitRef("https://github.com/alice/notes")),
        ("github.com/alice/notes#v1.0", GitRef("https://github.com/alice/notes", "v1.0")),
        (
            "git://127.0.0.1:9418/com.example.notes.git",
            GitRef("git://127.0.0.1:9418/com.example.notes.git"),
        ),
        ("git+https://git.example/a/b.git#main", GitRef("https://git.example/a/b.git", "main")),
        ("git+file:///srv/repos/x.git#release/2", GitRef("file:///srv/repos/x.git", "release/2")),
        ("com.example.notes", IndexRef("com.example.notes")),
        ("com.example.notes@beta", IndexRef("com.example.notes", "beta")),
        ("local:/home/me/apps/com.example.notes", LocalRef("/home/me/apps/com.example.notes")),
        ("  com.example.notes  ", IndexRef("com.example.notes")),
    ],
)
def test_each_accepted_form_parses(raw: str, expected: Ref) -> None:
    assert parse_ref(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "it is empty"),
        ("com.exa\tmple.notes", "control characters"),
        ("local:relative/dir", "absolute path"),
        ("oci://", "needs <host>[:port]/<repository>"),
        ("oci://registry.example", "needs <host>[:port]/<repository>"),
        ("oci://r.example/notes@sha256:xyz", "is not a sha256 digest"),
        ("oci://r.example/notes:bad/tag", "is not an OCI"),
        ("oci://r.example/Notes:1", "is not an OCI repository name"),
        ("git+https://git.example/a/b#bad..ref", "is not a branch or tag name"),
        ("git://", "needs a URL"),
        ("git://host-only", "needs a host and a path"),
        ("git://host//double", "without empty segments"),
        ("git+file://relative/repo.git", "absolute path"),
        ("ftp://example.com/x", "unknown scheme 'ftp'"),
        ("oci//r.example/x", "a schemeless git ref is"),
        ("Com.Example", "is not a reverse-domain app id"),
        ("com.example.notes@Beta!", "is not a channel name"),
        ("example/notes", "a schemeless git ref is <host>/<user>/<repo>"),
        ("github.com/alice", "a schemeless git ref is <host>/<user>/<repo>"),
    ],
)
def test_a_bad_ref_is_bad_ref_naming_the_raw_ref_and_the_accepted_forms(
    raw: str, reason: str
) -> None:
    with pytest.raises(BadRef) as caught:
        parse_ref(raw)
    err = caught.value
    assert (err.code, err.http_status) == ("bad_ref", 400)
    assert f"'{raw}'" in err.message
    assert reason in err.message
    assert "local:<path>" in err.message
    assert err.fields["ref"] == raw


# -- the round trip ---------------------------------------------------------------------------

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
host = st.builds(
    lambda parts, port: ".".join(parts) + (f":{port}" if port else ""),
    st.lists(label, min_size=1, max_size=3),
    st.one_of(st.none(), st.integers(1, 65535)),
)
repo_part = st.from_regex(r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+){0,2}", fullmatch=True)
repository = st.lists(repo_part, min_size=1, max_size=3).map("/".join)
tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)
oci_refs = st.one_of(
    st.builds(OciRef, host, repository, tag, st.none()),
    st.builds(OciRef, host, repository, st.none(), digest),
)
segment = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,12}", fullmatch=True)
path = st.lists(segment, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s))
git_ref_name = (
    st.lists(segment, min_size=1, max_size=2).map("/".join).filter(lambda r: ".." not in r)
)
git_urls = st.one_of(
    st.builds(lambda h, p: f"https://{h}{p}", host, path.filter(lambda p: p.count("/") >= 1)),
    st.builds(lambda h, p: f"git://{h}{p}", host, path),
    path.map(lambda p: f"file://{p}"),
)
git_refs = st.builds(GitRef, git_urls, st.one_of(st.none(), git_ref_name))
app_id = st.lists(
    st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), min_size=1, max_size=3
).map(lambda parts: "com." + ".".join(parts))
index_refs = st.builds(
    IndexRef, app_id, st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True))
)
local_refs = st.builds(LocalRef, path)


@given(st.one_of(oci_refs, git_refs, index_refs, local_refs))
def test_parse_ref_of_str_round_trips(ref: Ref) -> None:
    assert parse_ref(str(ref)) == ref
