"""One app as a portable archive: its tree, its install record and its runtime data
(docs/api.md "Export and import").

The archive is a tar stream compressed with zstd. Every member sits under `atrium-export/`:
`app/…` (the installed tree as committed), `data/<appId>-<n>/…` (the runtime data of the
exporting user's instances, from a backup taken for the export, so it is consistent; named so
whoever's they were, and given to the importing user's instances of the same numbers) and,
last, `export.json`:
`{format, formatVersion, appId, version, record, exportedAt, files}` where `files` maps every
other member to its SHA-256. `unpack` refuses anything it does not recognise — another format
name or version, a member outside those folders, a link, a missing, extra or changed file —
before anything is installed, with the reason. The archive is input like any other: each member
is judged from its header, against the members before it, before a byte of it is written, so
that what tarfile would do with a contradiction (write a file over another, put a folder where a
file is, fail on a name or a time no disk takes) never happens.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import zstandard
from pydantic import ValidationError

from atrium.distribution.backups import NAME_MAX, owned_name
from atrium.distribution.fdcopy import open_regular
from atrium.distribution.records import InstallRecord
from atrium.errors import ExportTooLarge, InvalidRequest, StorageFailed, StorageFull

FORMAT: Final = "atrium-app-export"
FORMAT_VERSION: Final = 1
ROOT: Final = "atrium-export"
MANIFEST: Final = "export.json"
#: the largest archive `import` accepts, compressed
MAX_ARCHIVE: Final = 4 * 1024**3
#: what an archive may expand to: members, and bytes (also never more than the disk has free,
#: less ``DISK_RESERVE``): a few KiB of zstd can hold GiBs of zeros
MAX_MEMBERS: Final = 200_000
#: the largest GNU long-name or pax header: tarfile reads such a header whole into memory and
#: parses pax records with a regex that is quadratic in their length (CPython before 3.11.10)
MAX_HEADER: Final = 16 * 1024
#: a member's path: at most this many bytes, each component at most NAME_MAX
MAX_PATH: Final = 4096
_HEADER_TYPES: Final = frozenset(
    {
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
    }
)
#: the only member types an export holds (pack writes regular files; folders are accepted)
_PLAIN: Final = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE})
#: the largest export.json: it is read whole (200,000 members' names and digests take ~40 MiB)
MAX_MANIFEST: Final = 64 * 1024**2
#: a modification time beyond this (either way) fits no platform's time_t: os.utime overflows
MAX_MTIME: Final = 2**62
MAX_EXPANDED: Final = 64 * 1024**3
DISK_RESERVE: Final = 512 * 1024**2
CHUNK: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Unpacked:
    """A checked archive, unpacked: the app tree, the data folders and the exported record."""

    app_dir: Path
    data_dirs: list[Path]
    record: InstallRecord
    manifest: dict[str, Any]


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as file:
        while block := file.read(CHUNK):
            sha.update(block)
    return sha.hexdigest()


def _files(root: Path, leave_out: re.Pattern[str] | None = None) -> Iterator[Path]:
    """Every regular file under ``root``, sorted; links are neither followed nor listed, and
    folders directly in ``root`` whose names match ``leave_out`` are not entered."""
    found = []
    for folder, dirs, files in os.walk(root):
        if leave_out is not None and folder == str(root):
            dirs[:] = [name for name in dirs if not leave_out.fullmatch(name)]
        for name in files:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                found.append(path)
    yield from sorted(found)


def _member(name: str, info: os.stat_result) -> tarfile.TarInfo:
    """A regular file's header from the ``fstat`` of the descriptor its bytes are read from."""
    member = tarfile.TarInfo(name)
    member.size = info.st_size
    member.mode = stat.S_IMODE(info.st_mode)
    member.mtime = info.st_mtime
    return member


#: an image layout the archive carries in the app tree: its folder there, and where it is read
#: from (the image store's copy, `ImageStore.keep_layout`)
CarriedImage = tuple[str, Path]


def _members(
    app_dir: Path, data_dirs: list[Path], app_id: str, image: CarriedImage | None = None
) -> list[tuple[str, Path]]:
    """The archive's file members (``app/…``, ``data/<folder>/…``) and where each is read from."""
    runtime = re.compile(rf"{re.escape(app_id)}-(?:[0-9]+|provider)")
    members: list[tuple[str, Path]] = []
    for path in _files(app_dir, leave_out=runtime):
        members.append((f"app/{path.relative_to(app_dir).as_posix()}", path))
    if image is not None:
        where, layout = image
        for path in _files(layout):
            members.append((f"app/{where}/{path.relative_to(layout).as_posix()}", path))
    for folder in data_dirs:
        # whoever's instance it was (`<appId>~<user>-<n>`): `<appId>-<n>`, for any user to import
        name = owned_name(folder.name, app_id, None)
        for path in _files(folder):
            members.append((f"data/{name}/{path.relative_to(folder).as_posix()}", path))
    return members


def check_size(
    app_dir: Path, data_dirs: list[Path], app_id: str, image: CarriedImage | None = None
) -> None:
    """ExportTooLarge when the archive of ``app_dir`` and ``data_dirs`` would expand to more
    than an import takes (MAX_EXPANDED bytes, MAX_MEMBERS members): found from the files'
    lengths before a byte is read. Blocking (one ``lstat`` per file)."""
    _within_bounds(_members(app_dir, data_dirs, app_id, image), app_id)


def _within_bounds(members: list[tuple[str, Path]], app_id: str) -> None:
    """Apparent sizes (``st_size``): pack writes a sparse file's every zero, so a file of a few
    TiB holding nothing would keep the digest and the compressor going for hours."""
    total, largest = 0, ("", -1)
    for name, path in members:
        try:
            size = path.lstat().st_size
        except FileNotFoundError:
            continue  # gone since the listing (live data): pack skips it too, or fails
        total += size
        largest = max(largest, (name, size), key=lambda item: item[1])
    if total > MAX_EXPANDED:
        why = f"its files add up to {total} bytes"
    elif len(members) + 1 > MAX_MEMBERS:
        why = f"it holds {len(members)} files"
    else:
        return
    raise ExportTooLarge(app_id, largest[0], max(largest[1], 0), total, MAX_EXPANDED, why)


def pack(
    target: Path,
    app_dir: Path,
    data_dirs: list[Path],
    record: InstallRecord,
    app_id: str,
    image: CarriedImage | None = None,
) -> None:
    """Write the archive of ``app_dir`` (without its runtime folders, which are not even
    entered: the app's uid writes them), ``image`` (the layout of the image the app carried,
    put back in its folder of the tree) and ``data_dirs``. Each member is read through a
    descriptor opened without following a link (fdcopy.open_regular), its header taken from
    that descriptor."""
    members = _members(app_dir, data_dirs, app_id, image)
    _within_bounds(members, app_id)
    files = {name: _digest(path) for name, path in members}
    manifest = {
        "format": FORMAT,
        "formatVersion": FORMAT_VERSION,
        "appId": app_id,
        "version": record.version,
        "record": record.wire(),
        "exportedAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "files": files,
    }
    compressor = zstandard.ZstdCompressor(level=3)
    with (
        target.open("wb") as raw,
        compressor.stream_writer(raw) as zstd,
        tarfile.open(fileobj=zstd, mode="w|") as tar,
    ):
        for name, path in members:
            with os.fdopen(open_regular(path), "rb") as file:
                tar.addfile(_member(f"{ROOT}/{name}", os.fstat(file.fileno())), file)
        body = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(f"{ROOT}/{MANIFEST}")
        info.size = len(body)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(body))


def unpack(archive: Path, into: Path) -> Unpacked:
    """Check and unpack an archive into ``into`` (an empty staging folder); InvalidRequest
    naming the first problem otherwise."""
    try:
        _extract(archive, into)
    except _Oversized as err:  # from inside tarfile, which reads a header on open, too
        raise _refused(f"it holds {err}") from None
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as err:
        raise _refused(f"it is not a readable zstd-compressed tar archive ({err})") from err
    root = into / ROOT
    manifest, record = _export_json(root)
    app_id = record.id
    if manifest.get("appId") != app_id:
        raise _refused("its appId and its record disagree")
    _check_files(root, manifest.get("files"))
    data_root = root / "data"
    folder = re.compile(rf"{re.escape(app_id)}-[0-9]+")
    data_dirs = sorted(data_root.iterdir()) if data_root.is_dir() else []
    for data in data_dirs:
        if not folder.fullmatch(data.name):
            raise _refused(f"data/{data.name} is not a runtime data folder of {app_id}")
        if data.is_symlink() or not data.is_dir():  # (refused member by member already)
            raise _refused(f"data/{data.name} is not a folder")
    app_dir = root / "app"
    try:
        app_manifest = json.loads((app_dir / "app.manifest.json").read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        raise _refused("it holds no readable app tree (app/app.manifest.json)") from err
    named_id = app_manifest.get("id") if isinstance(app_manifest, dict) else None
    if named_id != app_id:
        raise _refused(f"it is the export of {app_id}, but its app tree is {str(named_id)[:120]!r}")
    # beside the archive's root, where no member can be (an app id may be `export.json`)
    named = into / app_id
    app_dir.rename(named)
    return Unpacked(named, data_dirs, record, manifest)


def _export_json(root: Path) -> tuple[dict[str, Any], InstallRecord]:
    """`export.json` and the install record it holds, checked."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError) as err:  # nested deeper than the parser goes
        raise _refused(f"it has no readable {ROOT}/{MANIFEST}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _refused(f"it is not an Atrium app export (format {FORMAT!r} expected)")
    if manifest.get("formatVersion") != FORMAT_VERSION:
        raise _refused(
            f"its format version is {_short(manifest.get('formatVersion'))}; this shell reads "
            f"version {FORMAT_VERSION}"
        )
    try:
        record = InstallRecord.model_validate(manifest["record"])
    except KeyError as err:
        raise _refused("its install record is missing") from err
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise _refused(f"its install record is malformed ({where}: {first['msg'][:200]})") from err
    return manifest, record


class _Oversized(Exception):
    """Raised from inside tarfile's header parsing; not a HeaderError, which tarfile would take
    for the end of the archive."""


class _CheckedInfo(tarfile.TarInfo):
    """A member header that refuses, before tarfile reads it, an extended header longer than
    MAX_HEADER or any negative size."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.size < 0:
            raise _Oversized(f"a member announces a negative size ({self.size})")
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER:
            raise _Oversized(f"an extended header of {self.size} bytes (at most {MAX_HEADER})")
        processed: tarfile.TarInfo = super()._proc_member(tar)  # type: ignore[misc]
        return processed


def _extract(archive: Path, into: Path) -> None:
    """Every member into ``into``, each checked before it is written, within the budget."""
    into.mkdir(parents=True, exist_ok=True)
    budget = min(MAX_EXPANDED, shutil.disk_usage(into).free - DISK_RESERVE)
    expanded = members = 0
    seen = _Seen()
    with archive.open("rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        with tarfile.open(fileobj=reader, mode="r|", tarinfo=_CheckedInfo) as tar:
            for member in tar:
                _check_member(member)
                seen.add(member)
                expanded += member.size
                members += 1
                if expanded > budget or members > MAX_MEMBERS:
                    raise _refused(
                        f"it expands to more than {max(budget, 0) // 1024**2} MiB or "
                        f"{MAX_MEMBERS} members (the limit, or the free disk space)"
                    )
                try:
                    tar.extract(member, into, filter="data")
                except OSError as err:
                    raise _unwritten(member.name, into, err) from err


def _check_member(member: tarfile.TarInfo) -> None:
    """What one header says, on its own: where, what kind, how big, which name and time."""
    name = member.name
    inside = name == f"{ROOT}/{MANIFEST}" or name.startswith((f"{ROOT}/app/", f"{ROOT}/data/"))
    top = name in {ROOT, f"{ROOT}/app", f"{ROOT}/data"}
    if top and member.isfile():
        raise _refused(f"{name[:120]!r} is a file, not a folder")
    if not (inside or top):
        raise _refused(f"it holds {name[:120]!r}, outside what an export contains")
    parts = name.split("/")
    if any(part in {"", ".", ".."} for part in parts):  # (an absolute name is outside)
        raise _refused(f"it holds the path {name[:120]!r}")
    if "\0" in name:
        raise _refused(f"{name[:120]!r} holds a NUL character, which no file name can")
    if member.type not in _PLAIN or member.issparse():
        raise _refused(f"{name[:120]!r} is a link or a special file")
    if member.size < 0 or (member.isdir() and member.size != 0):
        raise _refused(f"{name[:120]!r} announces a size of {member.size}")
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PATH or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise _refused(f"{name[:120]!r}… is a longer path or name than a disk takes")
    mtime = member.mtime
    if not (isinstance(mtime, int | float) and math.isfinite(mtime) and abs(mtime) < MAX_MTIME):
        raise _refused(f"{name[:120]!r} announces a modification time no disk holds")
    if name == f"{ROOT}/{MANIFEST}" and not member.isfile():
        raise _refused(f"{name[:120]!r} is not a file")
    if name == f"{ROOT}/{MANIFEST}" and member.size > MAX_MANIFEST:
        raise _refused(f"{name[:120]!r} is larger than {MAX_MANIFEST} bytes")
    if len(parts) == 3 and parts[1] == "data" and not member.isdir():
        raise _refused(f"{name[:120]!r} is a file, not a runtime data folder")


class _Seen:
    """The members so far, to judge the next against them before it is written: tarfile would
    write a second member of a name over the first, keep a file where a later folder of its name
    goes (the folder's files then fail to be written) and fail on a folder in a file's place."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.folders: set[str] = set()
        #: folders a member's name implies (``a/b`` for ``a/b/c``), named or not
        self.implied: set[str] = set()

    def add(self, member: tarfile.TarInfo) -> None:
        name = member.name
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in self.files:
                raise _refused(f"{name[:120]!r} is under {parent[:120]!r}, a file")
            self.implied.add(parent)
        if member.isdir() and name in self.files:
            raise _refused(f"{name[:120]!r} is both a file and a folder")
        if not member.isdir() and (name in self.folders or name in self.implied):
            raise _refused(f"{name[:120]!r} is both a folder and a file")
        if name in self.files or name in self.folders:
            raise _refused(f"it holds {name[:120]!r} twice")
        (self.folders if member.isdir() else self.files).add(name)


def _unwritten(name: str, into: Path, err: OSError) -> InvalidRequest | StorageFailed:
    """An error writing a checked member: the disk's (full: `507`, other: `503`, naming the
    folder), or a name the filesystem refuses (`400`)."""
    if err.errno in {errno.ENOSPC, errno.EDQUOT}:
        return StorageFull(f"cannot unpack the archive into {into}: {err.strerror}", path=str(into))
    if err.errno in {errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL}:
        return _refused(f"{name[:120]!r} cannot be written here ({err.strerror})")
    return StorageFailed(f"cannot unpack the archive into {into}: {err.strerror}", path=str(into))


def _short(value: object) -> str:
    """A value from the archive, for a message: at most 60 characters."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "a huge number"
    return text if len(text) <= 60 else f"{text[:60]}…"


def _check_files(root: Path, files: object) -> None:
    if not isinstance(files, dict):
        raise _refused("its file list is missing")
    found = {
        path.relative_to(root).as_posix()
        for path in _files(root)
        if path.relative_to(root).as_posix() != MANIFEST
    }
    missing = sorted(set(files) - found)
    extra = sorted(found - set(files))
    if missing or extra:
        what = f"missing {missing[:3]}" if missing else f"not listed {extra[:3]}"
        raise _refused(f"its files do not match its list ({what})")
    for name, digest in files.items():
        if _digest(root / name) != digest:
            raise _refused(f"{name} is damaged (its SHA-256 does not match)")


def _refused(reason: str) -> InvalidRequest:
    return InvalidRequest(f"cannot import this archive, nothing was changed: {reason}")
