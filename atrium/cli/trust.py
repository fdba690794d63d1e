"""`atrium keygen` and `atrium trust …`: signing keys, and which signers a scope trusts.

`keygen` runs without the shell: it writes ``<name>.key`` (the private key, 0600) and
``<name>.pub`` into the current folder, as cosign's ``generate-key-pair`` does (decisions.md
"Signed apps"). `trust` reads and replaces the scope's trust store over
``GET/PUT /api/scopes/{scope}/trust``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from atrium.cli.client import ShellClient, fail
from atrium.cli.dist import JSON_OPT
from atrium.cli.render import console, print_json, print_table
from atrium.distribution import signing

SCOPE_OPT = typer.Option("--scope", help="the scope whose trust store to change: global or user")

trust_app = typer.Typer(help="Signed apps: the keys a scope trusts and its policy.")


def keygen(
    name: Annotated[str, typer.Argument(help="the key's name: <name>.key and <name>.pub")],
    directory: Annotated[
        Path, typer.Option("--dir", help="where to write the two files (default: here)")
    ] = Path(),
    as_json: bool = JSON_OPT,
) -> None:
    """Write a new ECDSA P-256 key pair: NAME.key (private, 0600) and NAME.pub (PEM)."""
    if not signing.KEY_NAME_RE.fullmatch(name):
        fail(f"{name!r} is not a key name: letters, digits, '.', '_', '-'")
    private_file, public_file = directory / f"{name}.key", directory / f"{name}.pub"
    for existing in (private_file, public_file):
        if existing.exists():
            fail(f"{existing} exists already; choose another name or move it away")
    private, public = signing.generate_key_pair()
    fd = os.open(private_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private)
    public_file.write_bytes(public)
    fingerprint = signing.fingerprint(signing.load_public_key(public.decode()))
    if as_json:
        print_json(
            {
                "privateKey": str(private_file.absolute()),
                "publicKey": str(public_file.absolute()),
                "fingerprint": fingerprint,
            }
        )
        return
    console.print(f"wrote {private_file} (keep it private) and {public_file} ({fingerprint})")
    console.print(
        f"sign with `atrium publish … --sign {private_file}`; trust it with "
        f"`atrium trust add {name} {public_file}`",
        soft_wrap=True,
    )


def _get(client: ShellClient, scope: str) -> dict[str, Any]:
    answer: dict[str, Any] = client.request("GET", f"/api/scopes/{scope}/trust")
    return answer


def _put(
    client: ShellClient, scope: str, policy: str, keys: list[dict[str, str]]
) -> dict[str, Any]:
    body = {"policy": policy, "keys": [{"name": k["name"], "key": k["key"]} for k in keys]}
    answer: dict[str, Any] = client.request("PUT", f"/api/scopes/{scope}/trust", json=body)
    return answer


@trust_app.command("add")
def trust_add(
    name: Annotated[str, typer.Argument(help="the signer's name, shown on installs it signed")],
    key_file: Annotated[
        Path, typer.Argument(help="a PEM public key (keygen's, cosign's) or an SSH public key")
    ],
    scope: Annotated[str, SCOPE_OPT] = "global",
    as_json: bool = JSON_OPT,
) -> None:
    """Trust the key in KEY_FILE under NAME (replacing a key of that name)."""
    try:
        text = key_file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        fail(f"cannot read {key_file}: {err}")
    with ShellClient() as client:
        current = _get(client, scope)
        keys = [k for k in current["keys"] if k["name"] != name] + [{"name": name, "key": text}]
        answer = _put(client, scope, current["policy"], keys)
    _show(answer, as_json)


@trust_app.command("remove")
def trust_remove(
    name: str, scope: Annotated[str, SCOPE_OPT] = "global", as_json: bool = JSON_OPT
) -> None:
    """Stop trusting the key NAME: what it signs is no longer `signed` in that scope."""
    with ShellClient() as client:
        current = _get(client, scope)
        keys = [k for k in current["keys"] if k["name"] != name]
        if len(keys) == len(current["keys"]):
            fail(f"the {scope} scope trusts no key named {name!r}")
        answer = _put(client, scope, current["policy"], keys)
    _show(answer, as_json)


@trust_app.command("list")
def trust_list(scope: Annotated[str, SCOPE_OPT] = "global", as_json: bool = JSON_OPT) -> None:
    """The scope's policy and trusted keys."""
    with ShellClient() as client:
        _show(_get(client, scope), as_json)


@trust_app.command("policy")
def trust_policy(
    scope: Annotated[str, typer.Argument(help="global or user")],
    policy: Annotated[str, typer.Argument(help="off, warn or require")],
    as_json: bool = JSON_OPT,
) -> None:
    """Set what installs into SCOPE need: off (no check), warn (shown), require (refused)."""
    if policy not in ("off", "warn", "require"):
        fail(f"{policy!r} is not a policy: off, warn or require")
    with ShellClient() as client:
        current = _get(client, scope)
        _show(_put(client, scope, policy, current["keys"]), as_json)


def _show(answer: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(answer)
        return
    console.print(f"{answer['scope']} scope: policy {answer['policy']}")
    rows = [(k["name"], k["type"], k["fingerprint"]) for k in answer["keys"]]
    print_table("Trusted keys", ["name", "type", "fingerprint"], rows)
