"""Fixture `test.fault.neverhealthy`: answers every /health with 503."""

from __future__ import annotations

from atrium.sdk import App, Request

app = App()


@app.route("GET", "/health")
def health(request: Request) -> tuple[int, dict[str, object]]:
    return 503, {"appId": app.app_id, "instanceId": app.instance_id, "ok": False}


if __name__ == "__main__":
    app.run()
