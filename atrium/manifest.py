"""The app manifest (`app.manifest.json`): its model, and `parse_manifest` reporting every problem.

Pure: takes decoded JSON and the directory name, returns a Manifest or raises ManifestInvalid with
one problem per field (docs/api.md "Manifest"; decisions.md "Manifest").
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from enum import StrEnum
from typing import Annotated, Any, Final

import semver
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from atrium.errors import ManifestInvalid
from atrium.ids import APP_ID_RE as APP_ID_RE
from atrium.ids import SYSTEM_PREFIX, is_reserved
from atrium.permissions import migrate_grants, permission_owner

MANIFEST_FILE: Final = "app.manifest.json"
AUTHORITY_RE: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,126}[a-z0-9])?\Z")
TOOL_RE: Final = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._+-]{0,63})\Z")
MAX_DEADLINE_MS: Final = 600_000
DEFAULT_DEADLINE_MS: Final = 10_000
MAX_WARM_POOL: Final = 64
DEFAULT_WAKE_TIMEOUT_MS: Final = 10_000
DEFAULT_IDLE_TIMEOUT_MS: Final = 60_000
MAX_IDLE_MS: Final = 86_400_000
#: bounds of ``resources`` (a Python app under 16 MiB cannot start; beyond, a typo)
MIN_MEMORY_MIB: Final = 16
MAX_MEMORY_MIB: Final = 1_048_576
MIN_CPU_MILLI: Final = 10
MAX_CPU_MILLI: Final = 1_024_000
MIN_PIDS: Final = 8
MAX_PIDS: Final = 1_000_000
#: ``runtime.image``: ``host[:port]/repository[:tag][@sha256:<64 hex>]``, the registry named
IMAGE_RE: Final = re.compile(
    r"(?P<registry>(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?)/"
    r"(?P<repository>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?\Z"
)
#: ``runtime.image`` carried by the app: ``oci:<folder>[@sha256:<64 hex>]``, an OCI image layout
#: at that folder of the app tree (the transport name skopeo and podman give such a layout)
LAYOUT_PREFIX: Final = "oci:"
LAYOUT_RE: Final = re.compile(
    r"oci:(?P<path>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(?:/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){0,7})"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?\Z"
)
ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: kernel file systems the sandbox mounts itself: a data folder there would hide or shadow them
SYSTEM_FOLDERS: Final = ("/proc", "/sys", "/dev")
MAX_DATA_PATHS: Final = 32
#: ``network.egress`` as a list: at most this many ``host:port`` entries
MAX_EGRESS: Final = 32
#: a DNS name of ``network.egress``: dot-separated labels of letters, digits and hyphens
HOSTNAME_RE: Final = re.compile(
    r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
)


class ThemeStrategy(StrEnum):
    """How the proxy treats theming for the app (docs/api.md "Injection into app pages")."""

    INHERIT = "inherit"
    THEMED = "themed"
    OVERRIDE = "override"


def check_app_id(value: str) -> str:
    if not APP_ID_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a reverse-domain app id (lowercase, at least two dot-separated parts, "
            "e.g. com.example.notes)"
        )
    return value


def _check_semver(value: str) -> str:
    if not semver.Version.is_valid(value):
        raise ValueError(f"{value!r} is not a semver 2.0 version (e.g. 1.2.3 or 1.0.0-beta.1)")
    return value


def _check_relative_file(value: str) -> str:
    if not value or value.startswith("/") or ".." in value.split("/") or "\x00" in value:
        raise ValueError(f"{value!r} must be a relative path inside the app directory")
    return value


AppId = Annotated[str, AfterValidator(check_app_id)]
Version = Annotated[str, AfterValidator(_check_semver)]


class _ManifestPart(BaseModel):
    """Manifest sub-objects: strict types (a wrong type is a problem, never coerced), camelCase keys."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        frozen=True,
        strict=True,
        extra="allow",
    )


class ProviderEntry(_ManifestPart):
    """One provider path with the permission each verb needs (null: open)."""

    path: str
    read_perm: str | None = None
    write_perm: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"provider path {value!r} must start with '/'")
        segments = value.split("/")[1:]
        if any(s in {".", ".."} for s in segments) or "\x00" in value or "\\" in value:
            raise ValueError(
                f"provider path {value!r} must be canonical (no '.', '..', '\\' or NUL)"
            )
        return value.rstrip("/") or "/"


class DataProvider(_ManifestPart):
    """``dataProvider``: a globally unique authority and its provider entries."""

    authority: str
    providers: list[ProviderEntry] = Field(min_length=1)
    #: a data request while no instance is `resumed` starts a headless provider instance
    wake: bool = False
    #: how long held requests wait for that instance to reach `resumed`
    wake_timeout_ms: int = Field(default=DEFAULT_WAKE_TIMEOUT_MS, ge=100, le=MAX_DEADLINE_MS)
    #: a headless provider instance with no data request for this long is stopped and destroyed
    idle_timeout_ms: int = Field(default=DEFAULT_IDLE_TIMEOUT_MS, ge=1_000, le=MAX_IDLE_MS)

    @field_validator("authority")
    @classmethod
    def _authority(cls, value: str) -> str:
        if "://" in value or not AUTHORITY_RE.fullmatch(value):
            raise ValueError(
                f"authority {value!r} must be a bare lowercase name (a-z, 0-9, '.', '-'), no scheme"
            )
        return value


def _as_list(value: Any) -> Any:
    """``category`` may be one string or a list (decisions.md "Data proxy and intents")."""
    return [value] if isinstance(value, str) else value


class IntentFilter(_ManifestPart):
    """One intent filter (docs/api.md "Scoring")."""

    action: str = Field(min_length=1)
    category: Annotated[list[str], Field(default_factory=list)]
    data_mime: list[str] | None = None
    data_scheme: list[str] | None = None
    priority: int = 0
    #: the permission an app must hold to start this filter's activity (the user always may, and
    #: so does the app itself); null: any caller. An intent is a request from anyone: a handler
    #: that acts on it, rather than only showing a screen, names the permission that act needs
    permission: str | None = None

    @field_validator("category", mode="before")
    @classmethod
    def _category(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("data_mime")
    @classmethod
    def _mime(cls, value: list[str] | None) -> list[str] | None:
        for mime in value or []:
            if mime != "*/*" and not re.fullmatch(
                r"^[\w.+-]+/([\w.+-]+|\*)$", mime.split(";")[0].strip()
            ):
                raise ValueError(f"{mime!r} is not a MIME type (type/subtype, type/* or */*)")
        return value

    @field_validator("data_scheme")
    @classmethod
    def _scheme(cls, value: list[str] | None) -> list[str] | None:
        for scheme in value or []:
            if not re.fullmatch(r"^[A-Za-z][A-Za-z0-9+.-]*$", scheme):
                raise ValueError(f"{scheme!r} is not a URI scheme (RFC 3986)")
        return value

    @field_validator("permission")
    @classmethod
    def _permission(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(f"{value!r} is not a permission string (non-empty, no spaces)")
        return value


class PermissionInfo(_ManifestPart):
    """How a permission an app defines reads to a person (`permissionInfo` in the manifest)."""

    label: str = Field(min_length=1, max_length=80)
    description: str = Field(default="", max_length=300)


class Sharing(_ManifestPart):
    """``sharing``: how the app treats users an instance is shared with."""

    #: the app checks `X-Os-User-Role` itself, so the shell passes a viewer's changes on to it
    #: instead of refusing them with 403
    enforces_roles: bool = False


def _own_permission(info: ValidationInfo, name: str | None, where: str) -> None:
    """Refuse a permission ``name`` (when given) that the app being validated does not own."""
    app_id = info.data.get("id")
    if name is not None and (app_id is None or permission_owner(name) != app_id):
        raise ValueError(
            f"{where} must be one of the app's own permissions, named {app_id}.<word> (its id, "
            f"a dot and one word without dots), not {name!r}"
        )


class Resources(_ManifestPart):
    """``resources``: what one instance may use at most, each capped by the shell's own ceiling
    (docs/api.md "Resource limits"). Absent values take the shell's ceiling."""

    memory_mib: int | None = Field(
        default=None, alias="memoryMiB", ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB
    )
    cpu_milli: int | None = Field(default=None, ge=MIN_CPU_MILLI, le=MAX_CPU_MILLI)
    pids: int | None = Field(default=None, ge=MIN_PIDS, le=MAX_PIDS)


class RuntimeHealth(_ManifestPart):
    """``runtime.health``: the HTTP probe of an image app (200-399 within the start deadline)."""

    path: str = Field(min_length=1, max_length=2000)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError(f"{value!r} must be a URL path starting with '/' (no spaces)")
        return value


def check_image(value: str) -> str:
    """``host[:port]/repository`` with a tag, a digest or both (the digest wins); or
    ``oci:<folder>``, an OCI image layout the app carries, optionally pinned ``@sha256:...``."""
    if value.startswith(LAYOUT_PREFIX) and not value.startswith("oci://"):
        if not LAYOUT_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an image layout in the app: oci:<folder> (a relative folder "
                "of the app, no '..', no leading '/', no ':tag': a layout carries one image), "
                "optionally pinned as oci:<folder>@sha256:<64 hex>"
            )
        return value
    if not IMAGE_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an OCI image reference: host[:port]/repository with a :tag or "
            "an @sha256:<64 hex> digest (e.g. registry.example.com/apps/web@sha256:...)"
        )
    match = IMAGE_RE.fullmatch(value)
    if match is not None and not match["tag"] and not match["digest"]:
        raise ValueError(f"{value!r} names no tag and no digest (add :<tag> or @sha256:...)")
    return value


def _check_data_path(value: str) -> str:
    if (
        not value.startswith("/")
        or "\x00" in value
        or posixpath.normpath(value) != value
        or ".." in value.split("/")
        or "//" in value
    ):
        raise ValueError(f"{value!r} must be an absolute, normalised path (no '..', '//', '/.')")
    if value == "/":
        raise ValueError("'/' cannot be a data folder (the image's root stays read-only)")
    if any(value == f or value.startswith(f + "/") for f in SYSTEM_FOLDERS):
        raise ValueError(f"{value!r} is under {', '.join(SYSTEM_FOLDERS)}, which the sandbox owns")
    return value


class Runtime(_ManifestPart):
    """``runtime``: the app is an existing OCI image run in its own root file system (docs/api.md
    "Manifest"). ``image`` may carry a tag in what an author writes; the installed manifest holds
    it pinned by digest (``pinned``). Unknown keys are refused here: a misspelt ``comand`` would
    otherwise run the image's own command without a word."""

    model_config = ConfigDict(**{**_ManifestPart.model_config, "extra": "forbid"})

    image: Annotated[str, AfterValidator(check_image)]
    #: where the image's server listens; None takes the one TCP port of the image config's
    #: ``ExposedPorts`` (`atrium.images.config.image_port`)
    port: int | None = Field(default=None, ge=1, le=65535)
    health: RuntimeHealth
    data: list[Annotated[str, AfterValidator(_check_data_path)]] = Field(
        default_factory=list, max_length=MAX_DATA_PATHS
    )
    env: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None

    @field_validator("data")
    @classmethod
    def _apart(cls, value: list[str]) -> list[str]:
        for number, path in enumerate(value):
            for other in value[:number]:
                if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                    raise ValueError(f"{path!r} and {other!r} overlap (each folder once, apart)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not an environment variable name (letters, digits, '_', "
                    "not starting with a digit)"
                )
            if "\x00" in text:
                raise ValueError(f"the value of {name!r} contains a NUL byte")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(value) or any("\x00" in v for v in value)):
            raise ValueError("must be a non-empty argv list of non-empty strings")
        return value

    @property
    def digest(self) -> str | None:
        """The ``sha256:`` digest the image is pinned to, or None (a tag only)."""
        match = LAYOUT_RE.fullmatch(self.image) or IMAGE_RE.fullmatch(self.image)
        return match["digest"] if match else None

    @property
    def layout(self) -> str | None:
        """The app tree's folder holding the image as an OCI image layout (``oci:<folder>``),
        or None: the image is pulled from the registry ``image`` names."""
        match = LAYOUT_RE.fullmatch(self.image)
        return match["path"] if match else None

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def parts(self) -> tuple[str, str, str | None, str | None]:
        """``(registry, repository, tag, digest)`` of ``image``, a registry's reference."""
        match = IMAGE_RE.fullmatch(self.image)
        if match is None:  # validated on construction
            raise ValueError(f"{self.image!r} is not an OCI image reference")
        return match["registry"], match["repository"], match["tag"], match["digest"]

    def pin(self, digest: str) -> Runtime:
        """This runtime with ``image`` pinned to ``digest`` (the tag, if any, is dropped)."""
        if (folder := self.layout) is not None:
            return self.model_copy(update={"image": f"{LAYOUT_PREFIX}{folder}@{digest}"})
        registry, repository, _, _ = self.parts()
        return self.model_copy(update={"image": f"{registry}/{repository}@{digest}"})


def check_egress_entry(value: str) -> str:
    """``host:port`` of ``network.egress``: an IPv4 address the outside has (not loopback, a
    link-local such as a cloud's metadata address, a multicast or an unspecified one) or a
    lowercase DNS name, and a port 1-65535 (docs/api.md "Manifest")."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not host:port (e.g. api.example.com:443)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number 1-65535")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        if not HOSTNAME_RE.fullmatch(host) or host == "localhost" or host.endswith(".localhost"):
            raise ValueError(
                f"{value!r}: {host!r} is not an IPv4 address or a lowercase DNS name"
            ) from None
        return value
    if (
        address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    ):
        raise ValueError(f"{value!r}: {host} is not an address of the outside")
    return value


class NetworkAsk(_ManifestPart):
    """``network``: what an app asks to reach beyond the shell's API. ``egress`` true asks for
    the internet, a list for those ``host:port`` only; what the user approved at install is
    what the instances get, until it is revoked (docs/api.md "Network")."""

    model_config = ConfigDict(**{**_ManifestPart.model_config, "extra": "forbid"})

    egress: bool | list[str] = False

    @field_validator("egress", mode="before")
    @classmethod
    def _egress(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError('must be true, false or a list of "host:port" strings')
        if len(value) > MAX_EGRESS:
            raise ValueError(f"at most {MAX_EGRESS} host:port entries, not {len(value)}")
        if len(set(value)) != len(value):
            raise ValueError("names a host:port twice")
        for number, entry in enumerate(value):
            try:
                check_egress_entry(entry)
            except ValueError as err:
                raise ValueError(f"[{number}] {err}") from None
        return value

    @property
    def asked(self) -> bool | tuple[str, ...]:
        """False: nothing; True: the internet; else the ``host:port`` entries, sorted."""
        if isinstance(self.egress, bool):
            return self.egress
        return tuple(sorted(self.egress)) or False


class Manifest(_ManifestPart):
    """An app's manifest. Unknown fields are kept and ignored (decisions.md "Manifest").

    ``permissions`` holds the grants as the shell reads them: a KV name in an older shell's form
    is read as the one grant its review showed, or dropped (`atrium.permissions.migrate_grant`).
    """

    id: AppId
    version: Version
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    icon: str | None = None
    entrypoint: str | list[str] = "entrypoint.sh"
    data_provider: DataProvider | None = None
    intent_filters: list[IntentFilter] = Field(default_factory=list)
    permissions: list[str] = Field(default_factory=list)
    #: labels for the permissions this app defines (``<its id>.<one word>``)
    permission_info: dict[str, PermissionInfo] = Field(default_factory=dict)
    theme_strategy: ThemeStrategy = ThemeStrategy.INHERIT
    warm_pool: bool | int = False
    background_service: bool = False
    sharing: Sharing = Field(default_factory=Sharing)
    tools: list[str] = Field(default_factory=list)
    resources: Resources | None = None
    #: an existing OCI image instead of the app tree's entrypoint
    runtime: Runtime | None = None
    #: what the app asks to reach beyond the shell's API (None: nothing)
    network: NetworkAsk | None = None
    hook_timeout_ms: Annotated[int, Field(gt=0, le=MAX_DEADLINE_MS)] = DEFAULT_DEADLINE_MS
    start_timeout_ms: Annotated[int, Field(gt=0, le=MAX_DEADLINE_MS)] = DEFAULT_DEADLINE_MS

    @field_validator("id")
    @classmethod
    def _not_the_shells(cls, value: str) -> str:
        # the shell's own permissions are named system.…: an app under that prefix would own them
        if is_reserved(value):
            raise ValueError(
                f"app ids starting with {SYSTEM_PREFIX!r} are reserved for the shell, not {value!r}"
            )
        return value

    @field_validator("data_provider")
    @classmethod
    def _provider_permissions(
        cls, value: DataProvider | None, info: ValidationInfo
    ) -> DataProvider | None:
        # a provider guards its entries with permissions of its own: a name another app id owns
        # would be worded (labelled) by that app in every review, so the user would approve
        # that app's words while granting access to this provider's data
        for entry in value.providers if value else []:
            for verb, name in (("readPerm", entry.read_perm), ("writePerm", entry.write_perm)):
                _own_permission(info, name, f"provider {entry.path!r} {verb}")
        return value

    @field_validator("intent_filters")
    @classmethod
    def _filter_permissions(
        cls, value: list[IntentFilter], info: ValidationInfo
    ) -> list[IntentFilter]:
        for number, intent_filter in enumerate(value):
            _own_permission(info, intent_filter.permission, f"intent filter {number} permission")
        return value

    @field_validator("theme_strategy", mode="before")
    @classmethod
    def _strategy(cls, value: Any) -> Any:
        # strict mode would refuse the plain string for the enum; accept exactly the enum's values
        if isinstance(value, str) and value in ThemeStrategy.__members__.values():
            return ThemeStrategy(value)
        if isinstance(value, str):
            raise ValueError(f"{value!r} is not one of inherit, themed, override")
        return value

    @field_validator("permission_info")
    @classmethod
    def _own_permissions(
        cls, value: dict[str, PermissionInfo], info: ValidationInfo
    ) -> dict[str, PermissionInfo]:
        # an app labels only its own permissions: a friendly label on another app's (or the
        # system's) permission would make the install dialog lie about what is granted. Its own
        # means its id exactly, then one word: com.atrium labels com.atrium.read, never
        # com.atrium.notes.read (com.atrium.notes's)
        app_id = info.data.get("id")
        foreign = [name for name in value if app_id is None or permission_owner(name) != app_id]
        if foreign:
            raise ValueError(
                f"may only describe permissions named {app_id}.<word> (its own id, a dot and one "
                f"word without dots), not {foreign[0]!r}"
            )
        return value

    @field_validator("warm_pool", mode="before")
    @classmethod
    def _warm_pool(cls, value: Any) -> Any:
        # one problem for the field, not one per member of the union
        if isinstance(value, bool) or (isinstance(value, int) and 0 <= value <= MAX_WARM_POOL):
            return value
        raise ValueError(f"must be a boolean or a whole number 0-{MAX_WARM_POOL}, not {value!r}")

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _entrypoint(cls, value: Any) -> Any:
        if isinstance(value, str):
            return _check_relative_file(value)
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return value
        raise ValueError(
            "must be a file in the app directory or a non-empty argv list of non-empty strings"
        )

    @field_validator("icon")
    @classmethod
    def _icon(cls, value: str | None) -> str | None:
        if value is None or len(value) <= 3:
            return value
        return _check_relative_file(value)

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        for tool in value:
            if not TOOL_RE.fullmatch(tool):
                raise ValueError(
                    f"{tool!r} is not a tool name (a file name in the toolchain, or '*')"
                )
        return value

    @field_validator("permissions")
    @classmethod
    def _permissions(cls, value: list[str]) -> list[str]:
        for perm in value:
            if not perm or any(c.isspace() for c in perm):
                raise ValueError(f"{perm!r} is not a permission string (non-empty, no spaces)")
        return migrate_grants(value)[0]

    @property
    def injects_theme(self) -> bool:
        """Whether the proxy injects theming into the app's pages: an image app, which knows
        nothing of the shell's themes, only when its manifest names a ``themeStrategy``."""
        return self.runtime is None or "theme_strategy" in self.model_fields_set

    @property
    def warm_pool_size(self) -> int:
        """``warmPool``: true means one pre-spawned instance, a number means that many."""
        if isinstance(self.warm_pool, bool):
            return 1 if self.warm_pool else 0
        return self.warm_pool

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _field_name(loc: tuple[int | str, ...]) -> str:
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else part
    return name or "(manifest)"


def parse_manifest(data: object, dir_name: str | None) -> Manifest:
    """Validate decoded manifest JSON; ``dir_name`` (when known) must equal the id.

    Raises ManifestInvalid listing every problem at once, each as ``{field, message}``.
    """
    problems: list[dict[str, str]] = []
    manifest: Manifest | None = None
    if not isinstance(data, dict):
        raise ManifestInvalid(
            dir_name, [{"field": "(manifest)", "message": "must be a JSON object"}]
        )
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        for e in err.errors(include_url=False):
            message = e["msg"].removeprefix("Value error, ")
            problems.append({"field": _field_name(tuple(e["loc"])), "message": message})
    raw_id = data.get("id")
    if dir_name is not None and isinstance(raw_id, str) and raw_id != dir_name:
        problems.append(
            {
                "field": "id",
                "message": f"id {raw_id!r} must equal the directory name {dir_name!r}",
            }
        )
    if problems or manifest is None:
        app_id = raw_id if isinstance(raw_id, str) else dir_name
        raise ManifestInvalid(app_id, problems)
    return manifest
