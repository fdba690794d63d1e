"""The theme selection (KV `os`/`theme`), `theme:changed`, the theme CSS and the HTML injection.

Each user has their own selection (their KV row `os`/`theme`); a user without one has the
platform's default (`global`/`theme`, written by an admin), and without that the catalogue's
default. One door for changes: the KV store. `ThemeService` registers a validator for both keys,
so every write there (a select, or a raw `PUT /api/kv/os/theme` or `/api/kv/global/theme`) is
merged with the selection it replaces and validated the same way, and it listens to `kv:changed`,
so a raw write or delete also emits `theme:changed` to each user whose selection changed (once the
new value is read back). `select` writes, updates the cached selection and publishes at once. A
stored id that no longer names a theme of its slot's tone reads as that slot's default
(decisions.md "Themes", "Users: KV, events and theme").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self

from atrium.bus import Event, EventBus
from atrium.errors import AtriumError, InvalidRequest, NotFound
from atrium.events import KV_CHANGED, KvChanged, ThemeChanged
from atrium.kv import GLOBAL, PLATFORM, KvStore
from atrium.manifest import ThemeStrategy
from atrium.theme.catalogue import CatalogueReport, ThemeCatalogue
from atrium.theme.css import css_etag, theme_css
from atrium.theme.inject import HtmlTransform, theme_snippet, transform_html
from atrium.theme.model import ColorMode, Theme, ThemePrefs, Tone, active_theme_id

if TYPE_CHECKING:
    from atrium.manifest import Manifest


class Themed(Protocol):
    """What a page's theme needs of the instance it comes from (this shell's or another's)."""

    @property
    def owner(self) -> str: ...

    @property
    def manifest(self) -> Manifest: ...


_LOGGER = logging.getLogger(__name__)

NAMESPACE: Final = "os"
KEY: Final = "theme"
#: selection field → the tone its theme must have
SLOTS: Final[Mapping[str, Tone]] = {"themeIdLight": Tone.LIGHT, "themeIdDark": Tone.DARK}
FIELDS: Final = (*SLOTS, "colorMode")
MODES: Final = tuple(m.value for m in ColorMode)


@dataclass(frozen=True, slots=True)
class ThemeCss:
    """A theme CSS document and its ETag."""

    text: str
    etag: str


def _bad(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(
        f"bad theme selection: {field}: {message}", problems=[{"field": field, "message": message}]
    )


def check_selection(value: object, current: ThemePrefs, catalogue: ThemeCatalogue) -> ThemePrefs:
    """``value`` (any of themeIdLight, themeIdDark, colorMode) merged onto ``current`` and
    validated like a select: NotFound for an unknown id; InvalidRequest for an unknown field or
    mode, a non-string id, or a theme of the wrong tone for its slot."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            "the theme selection is an object with themeIdLight, themeIdDark and colorMode, "
            f"not {type(value).__name__}"
        )
    if unknown := sorted(str(k) for k in value if k not in FIELDS):
        raise _bad(unknown[0], f"unknown field; a selection has {', '.join(FIELDS)}")
    merged = {**current.wire(), **value}
    mode = merged["colorMode"]
    if mode not in MODES:
        raise _bad("colorMode", f"{mode!r} is not one of {', '.join(MODES)}")
    for field, tone in SLOTS.items():
        theme_id = merged[field]
        if not isinstance(theme_id, str):
            raise _bad(field, f"must be a theme id (a string), not {theme_id!r}")
        theme = catalogue.get(theme_id)
        if theme is None:
            raise NotFound(
                "theme", theme_id, f"no theme {theme_id!r} (GET /api/os/themes lists them)"
            )
        if theme.tone is not tone:
            raise _bad(
                field, f"theme {theme_id!r} is {theme.tone}; the {tone} slot needs a {tone} theme"
            )
    return ThemePrefs.model_validate(merged)


class ThemeService:
    """Owns the theme selection. Open it with ``async with`` (reads the stored selection,
    registers the KV validator and the `kv:changed` listener); closing cancels pending reads.

    `select` raises NotFound (404, kind `theme`) for an unknown id and InvalidRequest (400) for
    a theme of the wrong tone for its slot, an unknown mode or field, or a non-string id.
    """

    def __init__(
        self,
        kv: KvStore,
        bus: EventBus,
        catalogue: ThemeCatalogue,
        users: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self._kv = kv
        self._bus = bus
        self._catalogue = catalogue
        #: the ids of every user (who hears a change of the platform default)
        self._users = users or (lambda: (kv.user,))
        #: the platform default (`global`/`theme`, else the catalogue's)
        self._global: ThemePrefs | None = None
        #: the selections of the users who made their own
        self._own: dict[str, ThemePrefs] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._unlisten: Callable[[], None] | None = None
        self._snippets: dict[tuple[str | None, ThemeStrategy], bytes] = {}
        self._warned: set[tuple[str, str]] = set()

    async def __aenter__(self) -> Self:
        self._global = await self._read_global()
        for user in await self._kv.owners(NAMESPACE, KEY):
            entry = await self._kv.get(NAMESPACE, KEY, owner=user)
            if entry is not None:
                self._own[user] = self.resolve(entry.value)
        self._kv.add_owned_validator(NAMESPACE, KEY, self._validate_write)
        self._kv.add_owned_validator(GLOBAL, KEY, self._validate_write)
        self._unlisten = self._bus.listen((KV_CHANGED,), self._on_kv_changed, others=True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        for task in tuple(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def catalogue(self) -> ThemeCatalogue:
        return self._catalogue

    @property
    def selection(self) -> ThemePrefs:
        """The bootstrap admin's selection as last read or written (synchronous)."""
        return self.selection_of(self._kv.user)

    def selection_of(self, user: str) -> ThemePrefs:
        """``user``'s selection as last read or written: their own, else the platform default
        (``user`` `PLATFORM`: the platform default). Synchronous, for the HTML transform."""
        if self._global is None:
            raise RuntimeError("the theme service is not open")
        own = self._own.get(user)
        return self._global if own is None else own

    def default_selection(self) -> ThemePrefs:
        """`auto` with the first light and the first dark theme of the catalogue."""
        light, dark = self._catalogue.first(Tone.LIGHT), self._catalogue.first(Tone.DARK)
        if light is None or dark is None:
            raise AtriumError(
                "the theme catalogue needs at least one light and one dark theme; check the "
                "theme files (the bundled ones ship with Atrium)"
            )
        return ThemePrefs(theme_id_light=light.id, theme_id_dark=dark.id, color_mode=ColorMode.AUTO)

    # -- reading and validating ---------------------------------------------------------------

    def _fits(self, theme_id: object, tone: Tone) -> bool:
        theme = self._catalogue.get(theme_id) if isinstance(theme_id, str) else None
        return theme is not None and theme.tone is tone

    def resolve(self, stored: object) -> ThemePrefs:
        """A usable selection from a stored value: each field that is missing or no longer valid
        falls back to the default for it (with a warning)."""
        default = self.default_selection().wire()
        if stored is None:
            return ThemePrefs.model_validate(default)
        raw: Mapping[str, Any] = stored if isinstance(stored, dict) else {}
        resolved = dict(default)
        for field, tone in SLOTS.items():
            if self._fits(raw.get(field), tone):
                resolved[field] = raw[field]
            elif (field, repr(raw.get(field))) not in self._warned:  # once, not per CSS request
                self._warned.add((field, repr(raw.get(field))))
                _LOGGER.warning(
                    "stored theme selection: %s %r is not a %s theme; using %r",
                    field,
                    raw.get(field),
                    tone,
                    default[field],
                )
        if raw.get("colorMode") in MODES:
            resolved["colorMode"] = raw["colorMode"]
        return ThemePrefs.model_validate(resolved)

    async def _read_global(self) -> ThemePrefs:
        entry = await self._kv.get(GLOBAL, KEY)
        return self.resolve(None if entry is None else entry.value)

    async def _read_own(self, user: str) -> ThemePrefs | None:
        entry = await self._kv.get(NAMESPACE, KEY, owner=user)
        return None if entry is None else self.resolve(entry.value)

    async def _read(self, user: str) -> ThemePrefs:
        """``user``'s stored selection (their own, else the platform default; `PLATFORM`: the
        platform default)."""
        own = None if user == PLATFORM else await self._read_own(user)
        return await self._read_global() if own is None else own

    async def current(self, user: str | None = None) -> ThemePrefs:
        """``user``'s stored selection, read from the KV store (None: the bootstrap admin's)."""
        return await self._read(self._kv.user if user is None else user)

    def check(self, value: object, user: str | None = None) -> ThemePrefs:
        """``value`` merged onto ``user``'s current selection (None: the bootstrap admin's) and
        validated (see `check_selection`)."""
        current = self.selection_of(self._kv.user if user is None else user)
        return check_selection(value, current, self._catalogue)

    def _validate_write(self, value: object, owner: str) -> dict[str, Any]:
        if owner == PLATFORM:  # the platform default replaces the platform default
            return check_selection(value, self.selection_of(PLATFORM), self._catalogue).wire()
        return self.check(value, owner).wire()

    # -- changing -----------------------------------------------------------------------------

    async def select(self, partial: Mapping[str, object], user: str | None = None) -> ThemePrefs:
        """Merge ``partial`` onto ``user``'s selection (None: the bootstrap admin's), write it as
        their own in one transaction, publish `theme:changed` to them; returns the selection."""
        who = self._kv.user if user is None else user
        async with self._lock:
            stored = await self._read(who)
            entry = await self._kv.set(NAMESPACE, KEY, {**stored.wire(), **partial}, owner=who)
            prefs = ThemePrefs.model_validate(entry.value)
            self._own[who] = prefs
            self._snippets.clear()
            self._publish(prefs, who)
            return prefs

    async def reload(self) -> CatalogueReport:
        """Read the theme files again; `theme:changed` to each user whose active themes
        changed."""
        users = self._everyone()
        before = {user: self._effective(user) for user in users}
        report = await asyncio.to_thread(self._catalogue.reload)
        self._global = await self._read_global()
        for user in tuple(self._own):
            own = await self._read_own(user)
            if own is None:
                self._own.pop(user, None)
            else:
                self._own[user] = own
        self._snippets.clear()
        for user in users:
            if self._effective(user) != before[user]:
                self._publish(self.selection_of(user), user)
        return report

    def forget(self, user: str) -> None:
        """Drop a removed user's selection (their rows were set aside)."""
        self._own.pop(user, None)
        self._snippets.clear()

    def _everyone(self) -> list[str]:
        return sorted({*self._users(), *self._own})

    def _effective(self, user: str) -> tuple[ThemePrefs, Theme | None, Theme | None]:
        prefs = self.selection_of(user)
        return (
            prefs,
            self._catalogue.get(prefs.theme_id_light),
            self._catalogue.get(prefs.theme_id_dark),
        )

    def payload(self, prefs: ThemePrefs) -> ThemeChanged:
        """The `theme:changed` payload (decisions.md "Themes"); in `auto` the server cannot know
        the browser's preference: `resolvedMode` is null and `themeId` names the light slot."""
        active = self._catalogue.require(active_theme_id(prefs, None))
        mode = prefs.color_mode
        return ThemeChanged(
            theme_id=active.id,
            theme_name=active.name,
            theme_id_light=prefs.theme_id_light,
            theme_id_dark=prefs.theme_id_dark,
            color_mode=mode.value,
            resolved_mode=None if mode is ColorMode.AUTO else mode.value,
        )

    def _publish(self, prefs: ThemePrefs, user: str) -> None:
        """`theme:changed` to ``user`` alone: another user's selection is not theirs to hear."""
        payload = self.payload(prefs)
        self._bus.emit(dataclasses.replace(payload, owner=user))

    def _on_kv_changed(self, event: Event) -> None:
        changed = event.data
        if not isinstance(changed, KvChanged) or changed.key != KEY:
            return
        # another shell's change: this shell's copy is read again, and that shell announced it
        announce = not event.foreign
        if changed.namespace == GLOBAL:
            refresh = self._refresh_global(announce=announce)
        elif changed.namespace == NAMESPACE and changed.owner is not None:
            refresh = self._refresh_own(changed.owner, announce=announce)
        else:
            return
        task = asyncio.create_task(refresh, name="theme selection refresh")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh_own(self, user: str, *, announce: bool = True) -> None:
        """Read back a write of ``user``'s row that did not come through `select` (a raw KV
        write or delete)."""
        before = self.selection_of(user)
        try:
            own = await self._read_own(user)
        except Exception:
            _LOGGER.exception("reading the theme selection back failed")
            return
        if own is None:
            self._own.pop(user, None)
        else:
            self._own[user] = own
        self._snippets.clear()
        if announce and self.selection_of(user) != before:
            self._publish(self.selection_of(user), user)

    async def _refresh_global(self, *, announce: bool = True) -> None:
        """Read back the platform default; every user who has no selection of their own hears
        the change."""
        users = self._everyone()
        before = {user: self.selection_of(user) for user in users}
        try:
            self._global = await self._read_global()
        except Exception:
            _LOGGER.exception("reading the platform theme default back failed")
            return
        self._snippets.clear()
        for user in users:
            if announce and self.selection_of(user) != before[user]:
                self._publish(self.selection_of(user), user)

    # -- serving ------------------------------------------------------------------------------

    async def css(self, mode: ColorMode | None = None, user: str | None = None) -> ThemeCss:
        """The CSS of ``user``'s stored selection (None: the bootstrap admin's; `PLATFORM`: the
        platform default, for a page nobody signed in to); ``mode`` (light or dark) forces one
        tone."""
        prefs = await self._read(self._kv.user if user is None else user)
        text = theme_css(
            self._catalogue.require(prefs.theme_id_light),
            self._catalogue.require(prefs.theme_id_dark),
            mode or prefs.color_mode,
        )
        return ThemeCss(text, css_etag(text))

    def snippet(self, strategy: ThemeStrategy, user: str | None = None) -> bytes:
        """The tags injected into an app page of ``strategy`` for ``user``'s selection (None:
        the bootstrap admin's)."""
        who = self._kv.user if user is None else user
        cached = self._snippets.get((who, strategy))
        if cached is None:
            prefs = self.selection_of(who)
            theme = self._catalogue.require(active_theme_id(prefs, None))
            cached = theme_snippet(
                strategy,
                theme_id=theme.id,
                color_mode=prefs.color_mode,
                design_framework=theme.framework,
            )
            self._snippets[(who, strategy)] = cached
        return cached

    def html_transform(self, strategy: ThemeStrategy, user: str | None = None) -> HtmlTransform:
        """The proxy's HTML transform for an app of ``strategy`` with ``user``'s selection
        (read per page)."""

        def transform(body: bytes, content_type: str, content_encoding: str | None) -> bytes:
            return transform_html(
                body, content_type, content_encoding, self.snippet(strategy, user)
            )

        return transform


#: the request scope key under which an app origin names the user looking through a view, so the
#: theme its pages link (`/_os/api/os/theme.css`) is that user's
VIEWER_SCOPE_KEY: Final = "atrium.theme.viewer"


def html_transform_for(
    instance: Themed, service: ThemeService, viewer: str | None = None
) -> HtmlTransform | None:
    """The seam `AppOrigins(transform_html=…)` takes: the injection for the instance's
    manifest `themeStrategy` with the selection of ``viewer``, the user looking (None: the
    instance's owner); None for an image app that names no ``themeStrategy`` (theming none)."""
    if not instance.manifest.injects_theme:
        return None
    return service.html_transform(instance.manifest.theme_strategy, viewer or instance.owner)
