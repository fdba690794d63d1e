"""`atrium doctor --repair` for one mutable scope: back to its last commit, nothing deleted.

The scope repository's HEAD is the truth of what is installed (every install, update and
uninstall is one commit of the app folder and its record). Start-up recovery already finishes or
undoes every operation whose journal it can read; what it leaves for the operator is what it
cannot prove: an unreadable journal with its quarantined staging, changes nobody committed, a
record without its app folder, a record that cannot be read. Repair brings the scope back to HEAD
and moves everything it takes out of the way into ``lost+found/<stamp>/<scope>/`` (same
filesystem, so a rename), never deleting:

1. an app folder HEAD does not hold is one placed by hand (it stays untracked until an
   operation on that id commits it) and is left alone: a fresh install cut off before its commit
   leaves the same thing, a complete and validated tree, harmless to keep;
2. every other untracked file is moved and every modified tracked file copied to lost+found, then the
   tree is reset to HEAD (``git reset --hard``; runtime data folders are ignored by git and stay);
3. a quarantined staging folder gives back the runtime data folders (``<appId>-<n>``) an app
   folder now lacks, the data an update or uninstall had moved out when it was cut off; the rest
   of it and the unreadable journal go to lost+found;
4. a record whose app folder is missing, or which cannot be read even at HEAD, goes to
   lost+found and its removal is committed.

Runs only while no shell holds the home (the CLI takes ``run/serve.lock`` first).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from atrium.distribution.backups import BackupStore
from atrium.distribution.journal import JOURNAL_DIR, QUARANTINE_SUFFIX, UNREADABLE_SUFFIX
from atrium.distribution.records import RECORDS_DIR, RecordStore
from atrium.distribution.validate import runtime_dir_re
from atrium.files import sync_dir
from atrium.git import ScopeRepo, run_git
from atrium.scopes import Scope, ScopeLayout


class _LostAndFound:
    """``lost+found/<stamp>/<scope>/``, created on first use; paths keep their place in the
    scope (``apps/x/y`` → ``<lost>/apps/x/y``)."""

    def __init__(self, root: Path, scope_root: Path) -> None:
        self.root = root
        self._scope_root = scope_root

    def place(self, path: Path) -> Path:
        target = self.root / path.relative_to(self._scope_root)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        suffix = 0
        while target.exists() or target.is_symlink():
            suffix += 1
            target = target.with_name(f"{target.name}.{suffix}")
        return target

    def move(self, path: Path) -> Path:
        target = self.place(path)
        path.rename(target)
        return target

    def copy(self, path: Path) -> Path:
        target = self.place(path)
        shutil.copy2(path, target, follow_symlinks=False)
        return target


async def _tracked_apps(root: Path) -> set[str]:
    out = await run_git("ls-tree", "--name-only", "-z", "HEAD", "apps/", cwd=root)
    return {Path(p).name for p in out.split("\0") if p}


def by_hand(name: str, tracked: set[str]) -> bool:
    """Whether the scope-relative path ``name`` lies in an app folder placed by hand."""
    parts = Path(name).parts
    return len(parts) >= 2 and parts[0] == "apps" and parts[1] not in tracked


async def uncommitted(root: Path) -> list[tuple[str, str]]:
    """``(status, path)`` of every change git sees in the scope repository at ``root``, except in
    app folders placed by hand (ignored runtime data is never listed). Raises GitError."""
    tracked = await _tracked_apps(root)
    out = await run_git(
        "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", cwd=root
    )
    changes = [(item[:2], item[3:]) for item in out.split("\0") if item]
    return [(status, name) for status, name in changes if not by_hand(name, tracked)]


async def _restore_head(repo: ScopeRepo, lost: _LostAndFound) -> list[str]:
    root = repo.root
    done: list[str] = []
    changes = await uncommitted(root)
    for status, name in changes:
        path = root / name
        if status == "??":
            moved = await asyncio.to_thread(lost.move, path)
            done.append(f"uncommitted file {path}: moved to {moved}")
        elif path.is_file() or path.is_symlink():
            kept = await asyncio.to_thread(lost.copy, path)
            done.append(f"uncommitted change to {path}: kept as {kept}, the committed file back")
        else:
            done.append(f"{path} missing: the committed file back")
    if changes or done:
        await run_git("reset", "--hard", "--quiet", "HEAD", cwd=root)
    return done


def _give_back_data(layout: ScopeLayout, scope: Scope, lost: _LostAndFound) -> list[str]:
    """Runtime data out of quarantined staging back into app folders that lack it; the rest of
    each quarantined folder, and every unreadable journal, to lost+found."""
    done: list[str] = []
    staging = layout.staging_dir(scope)
    quarantined = sorted(staging.glob(f"*{QUARANTINE_SUFFIX}")) if staging.is_dir() else []
    for folder in quarantined:
        for staged in sorted(folder.iterdir()):
            app_dir = layout.app_dir(scope, staged.name)
            if not staged.is_dir() or staged.is_symlink() or not app_dir.is_dir():
                continue
            reserved = runtime_dir_re(staged.name)
            for data in sorted(staged.iterdir()):
                wanted = reserved.fullmatch(data.name) and not (app_dir / data.name).exists()
                if wanted and data.is_dir() and not data.is_symlink():
                    data.rename(app_dir / data.name)
                    sync_dir(app_dir)
                    done.append(f"runtime data {data.name} put back into {app_dir}")
        moved = lost.move(folder)
        done.append(f"quarantined staging {folder}: moved to {moved}")
    journals = layout.root(scope) / JOURNAL_DIR
    for journal in sorted(journals.glob(f"*{UNREADABLE_SUFFIX}")) if journals.is_dir() else []:
        moved = lost.move(journal)
        done.append(f"unreadable journal {journal}: moved to {moved}")
    return done


async def _drop_bad_records(
    layout: ScopeLayout, repo: ScopeRepo, scope: Scope, lost: _LostAndFound
) -> list[str]:
    done: list[str] = []
    records = repo.root / RECORDS_DIR
    damaged = {
        Path(item["path"]): item["problem"]
        for item in RecordStore(layout).damaged()
        if item["scope"] == scope.value
    }
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        if path in damaged:
            why = f"cannot be read ({damaged[path]})"
        elif not layout.app_dir(scope, path.stem).is_dir():
            why = f"has no app folder {layout.app_dir(scope, path.stem)}"
        else:
            continue
        moved = await asyncio.to_thread(lost.move, path)
        done.append(f"install record {path} {why}: moved to {moved}")
    if done:
        await run_git("add", "--all", "--", RECORDS_DIR, cwd=repo.root)
        await run_git(
            "commit",
            "--quiet",
            "-m",
            "doctor: set aside install records it could not use",
            cwd=repo.root,
        )
    return done


def repair_backups(store: BackupStore, lost: Path) -> list[str]:
    """Finish the backup removals and drop the partial snapshots a kill cut off (what start-up
    does), and move every folder that is not an intact backup of its app into
    ``lost/backups/<scope>/<appId>/`` (it is never listed nor restored; nothing else is
    deleted)."""
    done = store.recover()
    found = _LostAndFound(lost / "backups", store.root)
    for path, problem in store.unusable():
        try:
            moved = found.move(path)
        except OSError as err:
            done.append(f"damaged backup {path} ({problem}) could not be set aside: {err}")
            continue
        sync_dir(path.parent)
        done.append(f"damaged backup {path} ({problem}): moved to {moved}")
    return done


async def repair_scope(layout: ScopeLayout, repo: ScopeRepo, scope: Scope, lost: Path) -> list[str]:
    """Bring ``scope`` back to its last commit (see the module docstring); returns one line per
    action. ``lost`` is this run's ``lost+found/<stamp>/``. The repository must be open and
    start-up recovery done."""
    root = layout.root(scope)
    if not (root / ".git").is_dir():
        return []
    found = _LostAndFound(lost / scope.value, root)
    async with repo.lock:
        done = await _restore_head(repo, found)
        done += await asyncio.to_thread(_give_back_data, layout, scope, found)
        done += await _drop_bad_records(layout, repo, scope, found)
    return done
