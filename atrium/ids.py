"""The grammars of the names permissions are made of: app ids, KV keys, and the shell's own prefix.

Foundation: the manifest (which ids an app may have) and the permissions (which names a grant may
hold) both read these, so neither owns them.
"""

from __future__ import annotations

import re
from typing import Final

#: a reverse-domain app id: lowercase, at least two dot-separated parts (docs/api.md "Manifest")
APP_ID_RE: Final = re.compile(r"^[a-z][a-z0-9]*(\.[a-z][a-z0-9-]*)+\Z")
#: an app id names its folder, and a file name is at most 255 bytes
MAX_APP_ID: Final = 255
MAX_KV_KEY: Final = 128
#: a KV key: 1-128 letters, digits, '.', '_' and '-', starting with a letter or digit; never a '/'
KV_KEY_RE: Final = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_KV_KEY - 1}}}\Z")
#: names under this prefix are the shell's: no app has such an id, defines or labels such a permission
SYSTEM_PREFIX: Final = "system."


def is_reserved(app_id: str) -> bool:
    """Whether ``app_id`` lies under the shell's own ``system.`` prefix."""
    return app_id.startswith(SYSTEM_PREFIX)
