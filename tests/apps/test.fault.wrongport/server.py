"""Fixture `test.fault.wrongport`: listens on OS_PORT + 1 (a port disagreement)."""

from __future__ import annotations

from atrium.sdk import App

if __name__ == "__main__":
    app = App()
    app.port += 1
    app.run()
