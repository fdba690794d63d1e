"""`atrium users …` (accounts; admin, but `me` and one's own `passwd`) and `atrium tokens …`
(one's own personal API tokens)."""

from __future__ import annotations

from typing import Any

import typer

from atrium.cli.client import ShellClient
from atrium.cli.render import console, print_json, print_table

JSON_OPT = typer.Option(False, "--json", help="print the shell's JSON answer")

users_app = typer.Typer(help="Accounts: list, add, change, disable, enable, remove, passwd.")
tokens_app = typer.Typer(help="Your personal API tokens: list, add, remove.")


def _show_user(user: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        print_json(user)
    else:
        state = "disabled" if user.get("disabled") else "enabled"
        console.print(f"{user['id']} ({user['role']}, {state}) {what}", markup=False)


@users_app.command("list")
def list_users(as_json: bool = JSON_OPT) -> None:
    """List every account (admin)."""
    with ShellClient() as client:
        items = client.request("GET", "/api/users")
    if as_json:
        print_json(items)
        return
    rows = [
        (
            u["id"],
            u["name"],
            u["role"],
            "disabled" if u["disabled"] else "enabled",
            "yes" if u["hasPassword"] else "no",
            u["createdAt"],
        )
        for u in items
    ]
    print_table("Users", ["id", "name", "role", "state", "password", "created"], rows)


@users_app.command("me")
def me(as_json: bool = JSON_OPT) -> None:
    """Who the token in use belongs to."""
    with ShellClient() as client:
        user = client.request("GET", "/api/me")
    if as_json:
        print_json(user)
    else:
        console.print(f"{user['id']} ({user['name']}, {user['role']})", markup=False)


@users_app.command("add")
def add(
    user_id: str,
    name: str | None = typer.Option(None, "--name", help="display name (default: the id)"),
    role: str = typer.Option("member", "--role", help="admin or member"),
    as_json: bool = JSON_OPT,
) -> None:
    """Add an account (admin); give it a password with `atrium users passwd ID`."""
    body: dict[str, Any] = {"id": user_id, "role": role}
    if name is not None:
        body["name"] = name
    with ShellClient() as client:
        user = client.request("POST", "/api/users", json=body)
    _show_user(user, as_json, "added")


@users_app.command("set")
def set_user(
    user_id: str,
    name: str | None = typer.Option(None, "--name", help="new display name"),
    role: str | None = typer.Option(None, "--role", help="admin or member"),
    as_json: bool = JSON_OPT,
) -> None:
    """Change an account's name or role (admin)."""
    body = {k: v for k, v in (("name", name), ("role", role)) if v is not None}
    with ShellClient() as client:
        user = client.request("PATCH", f"/api/users/{user_id}", json=body)
    _show_user(user, as_json, "changed")


def _set_disabled(user_id: str, disabled: bool, as_json: bool) -> None:
    with ShellClient() as client:
        user = client.request("PATCH", f"/api/users/{user_id}", json={"disabled": disabled})
    stopped = user.get("stoppedInstances") or []
    _show_user(user, as_json, f"(stopped: {', '.join(stopped)})" if stopped else "")


@users_app.command("disable")
def disable(user_id: str, as_json: bool = JSON_OPT) -> None:
    """Disable an account (admin): its sign-ins and tokens end now, its instances stop."""
    _set_disabled(user_id, True, as_json)


@users_app.command("enable")
def enable(user_id: str, as_json: bool = JSON_OPT) -> None:
    """Enable an account again (admin); the sign-ins and tokens it had stay ended."""
    _set_disabled(user_id, False, as_json)


@users_app.command("remove")
def remove(user_id: str, as_json: bool = JSON_OPT) -> None:
    """Delete an account (admin): its instances stop and its scope moves to lost+found."""
    with ShellClient() as client:
        answer = client.request("DELETE", f"/api/users/{user_id}")
    if as_json:
        print_json(answer)
    else:
        where = answer["lostAndFound"]
        console.print(
            f"{user_id} removed" + (f"; its files are in $ATRIUM_HOME/{where}" if where else ""),
            markup=False,
        )


@users_app.command("passwd")
def passwd(user_id: str, as_json: bool = JSON_OPT) -> None:
    """Set a password, asked twice on the terminal (never an argument). An admin sets anyone's
    (their sign-ins end); a member changes their own, with the current one."""
    with ShellClient() as client:
        you = client.request("GET", "/api/me")
        own = you["id"] == user_id and you["role"] != "admin"
        current = typer.prompt("Current password", hide_input=True, err=True) if own else None
        password = typer.prompt("New password", hide_input=True, confirmation_prompt=True, err=True)
        if own:
            answer = client.request(
                "PUT", "/api/me/password", json={"current": current, "password": password}
            )
            answer = {**client.request("GET", "/api/me"), **answer}
        else:
            answer = client.request(
                "PUT", f"/api/users/{user_id}/password", json={"password": password}
            )
    if as_json:
        print_json(answer)
    else:
        console.print(f"password of {user_id} set", markup=False)


@tokens_app.command("list")
def list_tokens(as_json: bool = JSON_OPT) -> None:
    """Your personal tokens (their secrets are never shown again)."""
    with ShellClient() as client:
        items = client.request("GET", "/api/tokens")
    if as_json:
        print_json(items)
        return
    rows = [(t["id"], t["name"], t["createdAt"], t["expiresAt"] or "never") for t in items]
    print_table("Tokens", ["id", "name", "created", "expires"], rows)


@tokens_app.command("add")
def add_token(
    name: str,
    days: int | None = typer.Option(
        None, "--days", help="expires after this many days (default never)"
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Make a personal token; it is printed this once."""
    body: dict[str, Any] = {"name": name}
    if days is not None:
        body["expiresInDays"] = days
    with ShellClient() as client:
        made = client.request("POST", "/api/tokens", json=body)
    if as_json:
        print_json(made)
    else:
        console.print(f"{made['id']} {made['name']}: {made['token']}", markup=False)
        console.print("(shown once: keep it now; use it as ATRIUM_TOKEN or --token)", markup=False)


@tokens_app.command("remove")
def remove_token(token_id: str, as_json: bool = JSON_OPT) -> None:
    """Delete one of your tokens; it stops working at once."""
    with ShellClient() as client:
        answer = client.request("DELETE", f"/api/tokens/{token_id}")
    if as_json:
        print_json(answer)
    else:
        console.print(f"{token_id} removed", markup=False)
