"""Fixture `test.fault.slowstart`: a healthy app that takes 1.0 s before it serves."""

from __future__ import annotations

import time

from atrium.sdk import App

START_DELAY_SECONDS = 1.0

if __name__ == "__main__":
    time.sleep(START_DELAY_SECONDS)
    App().run()
