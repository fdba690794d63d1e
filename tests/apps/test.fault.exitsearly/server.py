"""Fixture `test.fault.exitsearly`: exits with code 3 before serving."""

from __future__ import annotations

import sys

import atrium.sdk  # noqa: F401 - imported like any app, so only the exit differs

EXIT_CODE = 3

if __name__ == "__main__":
    sys.stderr.write(f"test.fault.exitsearly: exiting with code {EXIT_CODE} before serving\n")
    sys.exit(EXIT_CODE)
