"""The index: a catalogue of installable apps fetched from ``ATRIUM_INDEX_URL`` and cached on disk.

The document is ``{schema: 1, apps: [IndexEntry]}`` with the keys of docs/api.md "Requests" (decisions.md
"Distribution"). Entries are validated one by one: a bad entry is reported in ``problems`` and left
out, never fatal. The cache (``$ATRIUM_HOME/cache/index.json``) keeps the document with its fetch
time; it is stale after ``ttl`` seconds. Fetching uses urllib in a worker thread: one code path for
``file://`` and ``http(s)://``, no session to own for a request made once an hour, and no
compressed-body surprises from the proxy's pass-through client.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import os
import re
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from atrium.distribution.refs import (
    CHANNEL_RE,
    GIT_REF_RE,
    TAG_RE,
    GitRef,
    OciRef,
    parse_ref,
)
from atrium.errors import (
    BadRef,
    FetchFailed,
    IndexUrlFixed,
    InvalidRequest,
    ManifestInvalid,
    NotFound,
)
from atrium.files import write_atomic
from atrium.manifest import APP_ID_RE, MANIFEST_FILE, NetworkAsk, Runtime, parse_manifest

_LOGGER = logging.getLogger(__name__)
DEFAULT_TTL: Final = 3600.0
MAX_INDEX_BYTES: Final = 8 << 20
FETCH_TIMEOUT: Final = 15.0
SCHEMA: Final = 1
DEFAULT_CHANNEL: Final = "stable"


class _IndexPart(BaseModel):
    """Index sub-objects: strict types, the index's hyphenated keys, unknown keys kept."""

    model_config = ConfigDict(
        strict=True, extra="allow", frozen=True, validate_by_name=True, validate_by_alias=True
    )


def oci_source(raw: str) -> OciRef:
    """An index's OCI source: ``oci://host/repo`` or ``host/repo`` (the channel gives the tag)."""
    ref = parse_ref(raw if raw.startswith("oci://") else f"oci://{raw}")
    if not isinstance(ref, OciRef) or ref.digest:
        raise ValueError(f"{raw!r} is not an OCI repository (host/repo, without a digest)")
    return ref


def git_source(raw: str) -> GitRef:
    """An index's git source: any git ref form without ``#ref`` (the channel gives the tag)."""
    ref = parse_ref(raw)
    if not isinstance(ref, GitRef) or ref.ref:
        raise ValueError(f"{raw!r} is not a git repository URL (without #ref)")
    return ref


class GitSource(_IndexPart):
    """``sources.git``."""

    ref: str
    default_branch: str | None = Field(default=None, alias="default-branch")

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str) -> str:
        try:
            git_source(value)
        except BadRef as err:
            raise ValueError(err.message) from err
        return value


class OciSource(_IndexPart):
    """``sources.oci``."""

    ref: str

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str) -> str:
        try:
            oci_source(value)
        except BadRef as err:
            raise ValueError(err.message) from err
        return value


class Sources(_IndexPart):
    """``sources``: at least one of git and oci."""

    git: GitSource | None = None
    oci: OciSource | None = None


class Channel(_IndexPart):
    """``channels.<name>``: the tag of each source for that channel."""

    git_tag: str | None = Field(default=None, alias="git-tag")
    oci_tag: str | None = Field(default=None, alias="oci-tag")

    @field_validator("git_tag")
    @classmethod
    def _git_tag(cls, value: str | None) -> str | None:
        if value is not None and (not GIT_REF_RE.fullmatch(value) or ".." in value):
            raise ValueError(f"{value!r} is not a git tag name")
        return value

    @field_validator("oci_tag")
    @classmethod
    def _oci_tag(cls, value: str | None) -> str | None:
        if value is not None and not TAG_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an OCI tag")
        return value


#: a category: a short lower-case word (``productivity``, ``home-automation``)
CATEGORY_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,23}")
#: a screenshot given relative to the index: plain path segments, never ``..``, no query
RELATIVE_PATH_RE: Final = re.compile(
    r"(?!\.{1,2}(/|$))[A-Za-z0-9_.-]+(/(?!\.{1,2}(/|$))[A-Za-z0-9_.-]+)*"
)
MAX_SCREENSHOTS: Final = 12
MAX_CATEGORIES: Final = 8
MAX_URL: Final = 2048
#: an image entry's icon given as a ``data:`` URL: the file it becomes in the app tree, by type
ICON_FILES: Final = {
    "image/svg+xml": "icon.svg",
    "image/png": "icon.png",
    "image/webp": "icon.webp",
    "image/jpeg": "icon.jpg",
    "image/gif": "icon.gif",
}
#: the largest icon an entry carries (the size the shell serves an app's icon file up to)
MAX_ICON_BYTES: Final = 512 * 1024
#: the manifest fields an image entry carries, under the manifest's own names
IMAGE_FIELDS: Final = ("version", "runtime", "permissions", "network")


def icon_bytes(value: str) -> tuple[str, bytes] | None:
    """An entry's ``data:image/<type>;base64,…`` icon as ``(file name, bytes)``; None for a
    glyph. ValueError for anything else."""
    if len([*value]) <= 3:
        return None
    head, comma, body = value.partition(",")
    media = head.removeprefix("data:").removesuffix(";base64")
    if not comma or not head.startswith("data:") or not head.endswith(";base64"):
        raise ValueError(
            "an image entry's icon is a glyph (at most 3 characters) or a "
            "data:image/<png|svg+xml|webp|jpeg|gif>;base64,… URL"
        )
    if media not in ICON_FILES:
        raise ValueError(f"{media!r} is not an icon type ({', '.join(ICON_FILES)})")
    if len(body) > MAX_ICON_BYTES * 4 // 3 + 4:
        raise ValueError(f"the icon is larger than {MAX_ICON_BYTES} bytes")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the icon's data: URL is not valid base64") from None
    if not data or len(data) > MAX_ICON_BYTES:
        raise ValueError(f"the icon is empty or larger than {MAX_ICON_BYTES} bytes")
    return ICON_FILES[media], data


def web_url(value: str, what: str) -> str:
    """``value`` if it is an absolute http(s) URL with a host (the only links a store page
    follows: never ``javascript:``, ``data:`` or ``file:``)."""
    parts = urlsplit(value)
    if len(value) > MAX_URL or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{what} {value!r} is not an http:// or https:// URL")
    return value


class Publisher(_IndexPart):
    """``publisher``: who publishes the app, with an optional web page. A plain string in an
    older index is read as the name."""

    name: str = Field(min_length=1, max_length=100)
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else web_url(value, "the publisher's url")


class IndexEntry(_IndexPart):
    """One app of the index (docs/api.md "The store's catalogue")."""

    id: str
    name: str
    description: str = ""
    publisher: Publisher | None = None
    categories: list[str] = Field(default_factory=list, max_length=MAX_CATEGORIES)
    screenshots: list[str] = Field(default_factory=list, max_length=MAX_SCREENSHOTS)
    homepage: str | None = None
    size: int | None = Field(default=None, ge=0)
    sources: Sources | None = None
    channels: dict[str, Channel] = Field(default_factory=dict)
    #: an image app described by the entry itself (docs/api.md "The store's catalogue"): the
    #: manifest's own fields, checked as the manifest checks them
    #: (semver, checked as the manifest's for an image entry; a source entry's is the store's hint)
    version: str | None = None
    icon: str | None = None
    runtime: Runtime | None = None
    permissions: list[str] | None = None
    network: NetworkAsk | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not APP_ID_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a reverse-domain app id")
        return value

    @field_validator("publisher", mode="before")
    @classmethod
    def _publisher(cls, value: object) -> object:
        if isinstance(value, str):
            return {"name": value} if value.strip() else None
        return value

    @field_validator("categories")
    @classmethod
    def _categories(cls, value: list[str]) -> list[str]:
        for category in value:
            if not CATEGORY_RE.fullmatch(category):
                raise ValueError(
                    f"{category!r} is not a category: a short lower-case word "
                    "(letters, digits and '-', at most 24)"
                )
        return value

    @field_validator("screenshots")
    @classmethod
    def _screenshots(cls, value: list[str]) -> list[str]:
        for shot in value:
            if "://" in shot or ":" in shot.partition("/")[0]:
                web_url(shot, "the screenshot")
            elif len(shot) > MAX_URL or not RELATIVE_PATH_RE.fullmatch(shot):
                raise ValueError(
                    f"the screenshot {shot!r} is neither an http(s) URL nor a path relative to "
                    "the index (plain names under the index's folder, no '..', no leading '/')"
                )
        return value

    @field_validator("homepage")
    @classmethod
    def _homepage(cls, value: str | None) -> str | None:
        return None if value is None else web_url(value, "the homepage")

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: Sources | None) -> Sources | None:
        if value is not None and value.git is None and value.oci is None:
            raise ValueError("an entry needs sources.git or sources.oci")
        return value

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: dict[str, Channel]) -> dict[str, Channel]:
        for name, channel in value.items():
            if not CHANNEL_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not a channel name")
            if channel.git_tag is None and channel.oci_tag is None:
                raise ValueError(f"channel {name!r} names neither a git-tag nor an oci-tag")
        return value

    def problems(self) -> list[tuple[str, str]]:
        """``(field, message)`` for what is wrong across fields: an entry is either fetched from
        its ``sources`` or is an image app described by ``runtime`` (with its ``version``), and
        an image entry's manifest is checked whole, as an install would check it."""
        if self.runtime is None:
            if self.sources is None:
                return [("sources", "an entry needs sources (git or oci) or a runtime (an image)")]
            image_only = [f for f in IMAGE_FIELDS if f in self.model_fields_set]
            return [
                (
                    name,
                    f"{name!r} describes an image app and needs 'runtime' (this entry's "
                    "manifest comes from its sources)",
                )
                for name in image_only
                if name != "version"  # a source entry's version is a hint the store shows
            ]
        found: list[tuple[str, str]] = []
        if self.sources is not None:
            found.append(
                (
                    "runtime",
                    "an entry is fetched from 'sources' or describes an image with "
                    "'runtime', not both (the sources' manifest would be another)",
                )
            )
        if self.channels:
            found.append(
                (
                    "channels",
                    "an image entry has no channels: its version is the entry's "
                    "'version', and an update follows the entry",
                )
            )
        if self.version is None:
            found.append(("version", "an image entry needs a version (semver, e.g. 1.0.0)"))
        if self.runtime.layout is not None:
            found.append(
                (
                    "runtime.image",
                    f"{self.runtime.image!r} is an image layout the app carries, and an entry "
                    "carries no files: name the image's registry, or list the app by a source "
                    "that holds the layout",
                )
            )
        if self.icon is not None:
            try:
                icon_bytes(self.icon)
            except ValueError as err:
                found.append(("icon", str(err)))
        if found:
            return found
        try:
            parse_manifest(self.manifest(), self.id)
        except ManifestInvalid as err:
            return [(p["field"], p["message"]) for p in err.problems]
        return []

    def manifest(self) -> dict[str, Any]:
        """An image entry's manifest, as the app tree the shell makes for it holds it."""
        document: dict[str, Any] = {
            "id": self.id,
            "version": self.version,
            "name": self.name,
            "description": self.description,
        }
        if self.icon is not None:
            icon = icon_bytes(self.icon)
            document["icon"] = self.icon if icon is None else icon[0]
        parts = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for name in ("runtime", "permissions", "network"):
            if name in parts:
                document[name] = parts[name]
        return document

    def app_tree(self) -> dict[str, bytes]:
        """An image entry's app tree, file by file: its manifest, and its icon when the entry
        gives one as a ``data:`` URL."""
        files = {MANIFEST_FILE: json.dumps(self.manifest(), indent=2, sort_keys=True).encode()}
        icon = None if self.icon is None else icon_bytes(self.icon)
        if icon is not None:
            files[icon[0]] = icon[1]
        return files

    def wire(self, index_url: str | None) -> dict[str, Any]:
        """The entry as served: screenshots given relative to the index resolved against its
        address, so a page shows them as they are."""
        answer = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if index_url is not None:
            answer["screenshots"] = [urljoin(index_url, shot) for shot in self.screenshots]
        return answer


def parse_index(document: object) -> tuple[dict[str, IndexEntry], list[dict[str, Any]]]:
    """Valid entries by id, and one problem ``{position, id, field, message}`` per bad entry.

    Raises ValueError when the document itself is not an index.
    """
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"not an index document ({{schema: {SCHEMA}, apps: [...]}})")
    apps = document.get("apps")
    if not isinstance(apps, list):
        raise ValueError("the index has no 'apps' list")
    entries: dict[str, IndexEntry] = {}
    problems: list[dict[str, Any]] = []
    for position, raw in enumerate(apps):
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        try:
            entry = IndexEntry.model_validate(raw)
        except ValidationError as err:
            for e in err.errors(include_url=False):
                where = ".".join(str(p) for p in e["loc"]) or "(entry)"
                message = e["msg"].removeprefix("Value error, ")
                problems.append(
                    {"position": position, "id": raw_id, "field": where, "message": message}
                )
            continue
        found = entry.problems()
        if found:
            problems.extend(
                {"position": position, "id": entry.id, "field": where, "message": message}
                for where, message in found
            )
            continue
        if entry.id in entries:
            message = f"duplicate id {entry.id!r}: the first entry is kept"
            problems.append(
                {"position": position, "id": entry.id, "field": "id", "message": message}
            )
            continue
        entries[entry.id] = entry
    return entries, problems


def tree_digest(files: dict[str, bytes]) -> str:
    """``sha256:<hex>`` over an app tree given file by file (an image entry's): what an update
    compares, so an entry that changes is a new version to take."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{len(files[name])}\0".encode())
        digest.update(files[name])
    return f"sha256:{digest.hexdigest()}"


def refused_entries(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``{id, reason}`` per refused entry, in the index's order: its problems joined as
    ``field: message``."""
    by_position: dict[int, dict[str, Any]] = {}
    for problem in problems:
        reason = f"{problem['field']}: {problem['message']}"
        refused = by_position.setdefault(problem["position"], {"id": problem["id"], "reason": ""})
        refused["reason"] = f"{refused['reason']}; {reason}" if refused["reason"] else reason
    return [by_position[p] for p in sorted(by_position)]


#: how many refused entries the summary message names (all of them are in ``refused``)
MESSAGE_NAMES: Final = 5
NOT_CONFIGURED: Final = (
    "No catalogue is configured: an admin adds one by its URL (PUT /api/dist/index {url}), or "
    "sets ATRIUM_INDEX_URL"
)


def summary(url: str | None, listed: int, refused: list[dict[str, Any]]) -> str:
    """The store's one sentence on the catalogue: missing, empty, every entry refused (and why),
    or how many apps it lists."""
    if url is None:
        return NOT_CONFIGURED
    named = "; ".join(f"{r['id'] or '(no id)'} ({r['reason']})" for r in refused[:MESSAGE_NAMES])
    if len(refused) > MESSAGE_NAMES:
        named += f"; and {len(refused) - MESSAGE_NAMES} more"
    if listed == 0 and refused:
        total = len(refused)
        apps = "1 app" if total == 1 else f"{total} apps"
        return f"The catalogue at {url} lists {apps} and every one was refused: {named}"
    if listed == 0:
        return f"The catalogue at {url} lists no app"
    apps = "1 app" if listed == 1 else f"{listed} apps"
    if refused:
        return f"The catalogue at {url} lists {apps}; {len(refused)} refused: {named}"
    return f"The catalogue at {url} lists {apps}"


@dataclass(frozen=True, slots=True)
class IndexSnapshot:
    """One fetched index: the valid entries, the problems, and when it was fetched."""

    url: str | None
    fetched_at: datetime | None
    entries: dict[str, IndexEntry] = field(default_factory=dict)
    problems: list[dict[str, Any]] = field(default_factory=list)
    #: where ``url`` comes from: ``environment`` (ATRIUM_INDEX_URL, ``serve --index-url``) or
    #: ``stored`` (an admin's PUT /api/dist/index)
    url_from: str | None = None

    def age(self) -> float | None:
        if self.fetched_at is None:
            return None
        return (datetime.now(UTC) - self.fetched_at).total_seconds()

    def wire(self, ttl: float) -> dict[str, Any]:
        age = self.age()
        apps = [e.wire(self.url) for e in self.entries.values()]
        refused = refused_entries(self.problems)
        return {
            "configured": self.url is not None,
            "index": {"schema": SCHEMA, "apps": apps},
            "url": self.url,
            "urlFrom": self.url_from if self.url is not None else None,
            "fetchedAt": self.fetched_at.isoformat().replace("+00:00", "Z")
            if self.fetched_at
            else None,
            "stale": age is not None and age >= ttl,
            "refreshAfterSeconds": None if age is None else max(0, round(ttl - age)),
            "problems": self.problems,
            "refused": refused,
            "message": summary(self.url, len(apps), refused),
        }


def _download(url: str) -> bytes:
    """Blocking: the index document's bytes (file:// or http(s)://)."""
    if not url.startswith(("file://", "http://", "https://")):
        raise FetchFailed(url, "the index URL must be file://, http:// or https://")
    if url.startswith("file://"):
        data = _read_file(url)
    else:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310 - scheme checked above
        try:
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as response:  # noqa: S310
                data = response.read(MAX_INDEX_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise FetchFailed(url, f"the index could not be fetched: {err}") from err
    if len(data) > MAX_INDEX_BYTES:
        raise FetchFailed(url, f"the index is larger than {MAX_INDEX_BYTES} bytes")
    return data


def _read_file(url: str) -> bytes:
    """Blocking: a file:// index's bytes. Opened without blocking and checked to be a regular
    file before any read: a FIFO or a device would hold the fetch (and the index's lock, so every
    read of the store) for good."""
    path = urllib.request.url2pathname(urlsplit(url).path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise FetchFailed(url, f"the index could not be fetched: {err}") from err
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FetchFailed(url, f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_INDEX_BYTES + 1)
    except OSError as err:
        raise FetchFailed(url, f"the index could not be fetched: {err}") from err
    finally:
        os.close(fd)


def check_index_url(url: str) -> str:
    """``url`` if the shell can fetch an index from it (InvalidRequest if not)."""
    parts = urlsplit(url)
    if len(url) > MAX_URL or parts.scheme not in {"file", "http", "https"}:
        raise InvalidRequest(f"{url!r}: a catalogue URL is file://, http:// or https://")
    if parts.scheme != "file" and not parts.hostname:
        raise InvalidRequest(f"{url!r} names no host")
    if parts.scheme == "file" and not parts.path.startswith("/"):
        raise InvalidRequest(f"{url!r}: a file:// URL names an absolute path")
    return url


class IndexClient:
    """Fetches, validates and caches the index; answers entries for bare-id installs.

    The index's address is ``env_url`` (``ATRIUM_INDEX_URL`` or ``serve --index-url``) when set,
    else the one an admin stored (``stored_path``, JSON ``{url}``); with neither there is no
    catalogue (decisions.md "The store's catalogue").
    """

    def __init__(
        self,
        env_url: str | None,
        cache_path: Path,
        ttl: float = DEFAULT_TTL,
        stored_path: Path | None = None,
    ) -> None:
        self.env_url = env_url
        self.ttl = ttl
        self._cache_path = cache_path
        self._stored_path = stored_path
        self._stored_url = self._read_stored()
        self._snapshot: IndexSnapshot | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str | None:
        return self.env_url or self._stored_url

    @property
    def url_from(self) -> str | None:
        if self.env_url:
            return "environment"
        return "stored" if self._stored_url else None

    def _read_stored(self) -> str | None:
        if self._stored_path is None:
            return None
        try:
            url = json.loads(self._stored_path.read_bytes())["url"]
            return check_index_url(url) if isinstance(url, str) else None
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, InvalidRequest) as err:
            _LOGGER.warning(
                "ignoring the unreadable catalogue address %s: %s", self._stored_path, err
            )
            return None

    async def set_url(self, url: str | None) -> IndexSnapshot:
        """Store the catalogue's address (None forgets it): fetched and read first, so a URL that
        does not answer an index is refused and nothing changes. IndexUrlFixed while the
        environment names the index."""
        if self.env_url:
            raise IndexUrlFixed(self.env_url)
        if self._stored_path is None:  # pragma: no cover - the shell always gives a path
            raise InvalidRequest("this shell cannot store a catalogue address")
        async with self._lock:
            if url is None:
                await asyncio.to_thread(self._stored_path.unlink, missing_ok=True)
                self._stored_url = None
                self._snapshot = None
                return IndexSnapshot(None, None)
            snapshot = await self._fetch(check_index_url(url), "stored")
            stored = json.dumps({"url": url}).encode()
            await asyncio.to_thread(write_atomic, self._stored_path, stored)
            self._stored_url = url
            self._snapshot = snapshot
            return snapshot

    async def get(self, refresh: bool = False) -> IndexSnapshot:
        """The cached index (fetched when there is none yet, or when ``refresh``)."""
        async with self._lock:
            url = self.url  # read under the lock: an admin may change it meanwhile
            if url is None:
                return IndexSnapshot(None, None)
            if self._snapshot is None or self._snapshot.url != url:
                self._snapshot = await asyncio.to_thread(self._load_cache, url)
            if refresh or self._snapshot is None:
                self._snapshot = await self._fetch(url, self.url_from)
            return self._snapshot

    async def entry(self, app_id: str) -> IndexEntry:
        """The entry for a bare-id install: from a fresh cache, else refetched; a stale cache is
        used (with a warning) when the index cannot be reached."""
        if self.url is None:
            raise NotFound(
                "index entry",
                app_id,
                f"no index is configured, so {app_id!r} cannot be installed by id: an admin adds "
                "a catalogue (PUT /api/dist/index {url}, or ATRIUM_INDEX_URL), or install by "
                "oci://, git or local: ref",
            )
        snapshot = await self.get()
        age = snapshot.age()
        if age is None or age >= self.ttl:
            try:
                snapshot = await self.get(refresh=True)
            except FetchFailed as err:
                _LOGGER.warning("using the stale cached index: %s", err.message)
        entry = snapshot.entries.get(app_id)
        if entry is None:
            raise NotFound("index entry", app_id, f"the index has no app {app_id!r}")
        return entry

    async def _fetch(self, url: str, url_from: str | None) -> IndexSnapshot:
        data = await asyncio.to_thread(_download, url)
        try:
            document = json.loads(data)
            entries, problems = parse_index(document)
        except (ValueError, RecursionError) as err:
            raise FetchFailed(url, f"the index is not valid: {err}") from err
        fetched_at = datetime.now(UTC).replace(microsecond=0)
        cache = {"url": url, "fetchedAt": fetched_at.isoformat(), "document": document}
        await asyncio.to_thread(write_atomic, self._cache_path, json.dumps(cache).encode())
        _LOGGER.info(
            "index fetched from %s: %d apps, %d problems", url, len(entries), len(problems)
        )
        return IndexSnapshot(url, fetched_at, entries, problems, url_from)

    def _load_cache(self, url: str) -> IndexSnapshot | None:
        try:
            cache = json.loads(self._cache_path.read_bytes())
            if cache.get("url") != url:
                return None
            entries, problems = parse_index(cache["document"])
            fetched_at = datetime.fromisoformat(cache["fetchedAt"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            _LOGGER.warning("ignoring the unreadable index cache %s: %s", self._cache_path, err)
            return None
        return IndexSnapshot(url, fetched_at, entries, problems, self.url_from)
