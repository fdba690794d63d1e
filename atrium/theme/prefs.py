"""The theme selection (KV `os`/`theme`), `theme:changed`, the theme CSS and the HTML injection.

One door for changes: the KV store. `ThemeService` registers a validator for `os`/`theme`, so
every write there (a select, or a raw `PUT /api/kv/os/theme`) is merged with the stored selection
and validated the same way, and it listens to `kv:changed`, so a raw write or delete of the key
also emits `theme:changed` (once the new value is read back; only when the selection changed).
`select` writes, updates the cached selection and publishes at once. A stored id that no longer
names a theme of its slot's tone reads as that slot's default (decisions.md "Themes").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from atrium.bus import Event, EventBus
from atrium.errors import AtriumError, InvalidRequest, NotFound
from atrium.events import KV_CHANGED, KvChanged, ThemeChanged
from atrium.kv import KvStore
from atrium.manifest import ThemeStrategy
from atrium.theme.catalogue import CatalogueReport, ThemeCatalogue
from atrium.theme.css import css_etag, theme_css
from atrium.theme.inject import HtmlTransform, theme_snippet, transform_html
from atrium.theme.model import ColorMode, Theme, ThemePrefs, Tone, active_theme_id

if TYPE_CHECKING:
    from atrium.lifecycle.instance import Instance

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

    def __init__(self, kv: KvStore, bus: EventBus, catalogue: ThemeCatalogue) -> None:
        self._kv = kv
        self._bus = bus
        self._catalogue = catalogue
        self._selection: ThemePrefs | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._unlisten: Callable[[], None] | None = None
        self._snippets: dict[ThemeStrategy, bytes] = {}
        self._warned: set[tuple[str, str]] = set()

    async def __aenter__(self) -> Self:
        self._selection = await self._read()
        self._kv.add_validator(NAMESPACE, KEY, self._validate_write)
        self._unlisten = self._bus.listen((KV_CHANGED,), self._on_kv_changed)
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
        """The selection as last read or written (synchronous, for the HTML transform)."""
        if self._selection is None:
            raise RuntimeError("the theme service is not open")
        return self._selection

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

    async def _read(self) -> ThemePrefs:
        entry = await self._kv.get(NAMESPACE, KEY)
        return self.resolve(None if entry is None else entry.value)

    async def current(self) -> ThemePrefs:
        """The stored selection, read from the KV store."""
        return await self._read()

    def check(self, value: object) -> ThemePrefs:
        """``value`` merged onto the current selection and validated (see `check_selection`)."""
        return check_selection(value, self.selection, self._catalogue)

    def _validate_write(self, value: object) -> dict[str, Any]:
        return self.check(value).wire()

    # -- changing -----------------------------------------------------------------------------

    async def select(self, partial: Mapping[str, object]) -> ThemePrefs:
        """Merge ``partial`` onto the stored selection, write it in one transaction, publish
        `theme:changed`; returns the stored selection."""
        async with self._lock:
            stored = await self._read()
            entry = await self._kv.set(NAMESPACE, KEY, {**stored.wire(), **partial})
            prefs = ThemePrefs.model_validate(entry.value)
            self._apply(prefs)
            self._publish(prefs)
            return prefs

    async def reload(self) -> CatalogueReport:
        """Read the theme files again; `theme:changed` when the active themes changed."""
        before = self._effective()
        report = await asyncio.to_thread(self._catalogue.reload)
        self._apply(await self._read())
        if self._effective() != before:
            self._publish(self.selection)
        return report

    def _effective(self) -> tuple[ThemePrefs, Theme | None, Theme | None]:
        prefs = self.selection
        return (
            prefs,
            self._catalogue.get(prefs.theme_id_light),
            self._catalogue.get(prefs.theme_id_dark),
        )

    def _apply(self, prefs: ThemePrefs) -> None:
        self._selection = prefs
        self._snippets.clear()

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

    def _publish(self, prefs: ThemePrefs) -> None:
        self._bus.emit(self.payload(prefs))

    def _on_kv_changed(self, event: Event) -> None:
        changed = event.data
        if not isinstance(changed, KvChanged) or (changed.namespace, changed.key) != (
            NAMESPACE,
            KEY,
        ):
            return
        task = asyncio.create_task(self._refresh(), name="theme selection refresh")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self) -> None:
        """Read back a write that did not come through `select` (raw KV write or delete)."""
        try:
            prefs = await self._read()
        except Exception:
            _LOGGER.exception("reading the theme selection back failed")
            return
        if prefs != self._selection:
            self._apply(prefs)
            self._publish(prefs)

    # -- serving ------------------------------------------------------------------------------

    async def css(self, mode: ColorMode | None = None) -> ThemeCss:
        """The CSS of the stored selection; ``mode`` (light or dark) forces one tone."""
        prefs = await self._read()
        text = theme_css(
            self._catalogue.require(prefs.theme_id_light),
            self._catalogue.require(prefs.theme_id_dark),
            mode or prefs.color_mode,
        )
        return ThemeCss(text, css_etag(text))

    def snippet(self, strategy: ThemeStrategy) -> bytes:
        """The tags injected into an app page of ``strategy`` for the current selection."""
        cached = self._snippets.get(strategy)
        if cached is None:
            prefs = self.selection
            theme = self._catalogue.require(active_theme_id(prefs, None))
            cached = theme_snippet(
                strategy,
                theme_id=theme.id,
                color_mode=prefs.color_mode,
                design_framework=theme.framework,
            )
            self._snippets[strategy] = cached
        return cached

    def html_transform(self, strategy: ThemeStrategy) -> HtmlTransform:
        """The proxy's HTML transform for an app of ``strategy`` (reads the selection per page)."""

        def transform(body: bytes, content_type: str, content_encoding: str | None) -> bytes:
            return transform_html(body, content_type, content_encoding, self.snippet(strategy))

        return transform


def html_transform_for(instance: Instance, service: ThemeService) -> HtmlTransform | None:
    """The seam `AppOrigins(transform_html=…)` takes: the injection for the instance's
    manifest `themeStrategy` with the current selection."""
    return service.html_transform(instance.manifest.theme_strategy)
