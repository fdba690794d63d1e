"""Fixture `test.bg.service`: a plain SDK app whose manifest declares a background service."""

from __future__ import annotations

from atrium.sdk import App

if __name__ == "__main__":
    App().run()
