"""A scope's trust store: ``trust.json`` at the scope's root, committed in the scope's repository
so the policy and the trusted keys travel with the scope (decisions.md "Signed apps").

The format is atrium.distribution.signing.Trust's; this module reads and writes the file. A file
that cannot be read is not "no policy": reading it raises StorageDamaged, so a damaged store never
quietly turns ``require`` into ``off``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from atrium.distribution.signing import TRUST_FILE, Trust
from atrium.errors import StorageDamaged
from atrium.files import write_atomic
from atrium.git import ScopeRepo, run_git


def trust_path(scope_root: Path) -> Path:
    return scope_root / TRUST_FILE


def read_trust(scope_root: Path) -> Trust:
    """The scope's trust store; the default (policy ``off``, no keys) when it has none."""
    path = trust_path(scope_root)
    try:
        return Trust.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return Trust()
    except (OSError, ValidationError) as err:
        raise StorageDamaged(
            f"the trust store {path} cannot be read ({str(err).splitlines()[0]}); repair or "
            "remove it (its history is in the scope's git repository)",
            path=str(path),
        ) from err


async def write_trust(repo: ScopeRepo, trust: Trust, message: str) -> None:
    """Write ``trust.json`` and commit it alone (other changes in the scope stay as they are)."""
    data = trust.model_dump_json(by_alias=True, indent=2) + "\n"
    async with repo.writing(), repo.lock:
        await repo.fence()
        write_atomic(trust_path(repo.root), data.encode())
        await run_git("add", "--", TRUST_FILE, cwd=repo.root)
        staged = await run_git("diff", "--cached", "--name-only", "--", TRUST_FILE, cwd=repo.root)
        if staged.strip():
            await run_git("commit", "--quiet", "-m", message, "--", TRUST_FILE, cwd=repo.root)
