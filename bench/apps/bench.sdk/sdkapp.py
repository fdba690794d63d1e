"""bench.sdk: the SDK's own server answering a small JSON body (what the load bench measures)."""

from __future__ import annotations

from atrium.sdk import App, Request

app = App()
ITEMS = [{"id": n, "text": f"item {n}", "done": n % 2 == 0} for n in range(5)]


@app.provider("/items")
def items(request: Request) -> dict[str, object]:
    return {"items": ITEMS}


if __name__ == "__main__":
    app.run()
