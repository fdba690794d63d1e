"""Fixture `test.fault.wrongidentity`: /health names another instance (or, on request, app)."""

from __future__ import annotations

from atrium.sdk import App, Request

app = App()


@app.route("GET", "/health")
def health(request: Request) -> dict[str, object]:
    if (app.data_dir / "wrong-appid").exists():
        return {"appId": "test.fault.impostor", "instanceId": app.instance_id, "ok": True}
    return {"appId": app.app_id, "instanceId": f"{app.instance_id}-impostor", "ok": True}


if __name__ == "__main__":
    app.run()
