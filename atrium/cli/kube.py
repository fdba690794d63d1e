"""`atrium kube render`: every object the Kubernetes runner would create for one instance, as YAML.

Offline, from the local ``ATRIUM_HOME`` and the ``ATRIUM_*`` settings (the database only read
for its key, which labels data claims), built by the functions the
runner's spawn calls (`render.pod_command`, `render.plan_for`, `render.instance_objects`,
`render.namespace_objects`), so what is reviewed is what is created. Secrets are placeholders:
they exist only at spawn.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from atrium.lifecycle.runners.kubernetes import render

if TYPE_CHECKING:  # pydantic-settings is loaded by the command, not by `atrium --help`
    from atrium.settings import Settings

kube_app = typer.Typer(
    help='The Kubernetes runner\'s objects (docs/deploying.md "On Kubernetes").',
    no_args_is_help=True,
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _instance_id(app_id: str, owner: str, bootstrap: str) -> str:
    """The id the owner's first instance of the app takes (`LifecycleIndex.id_prefix` + 1)."""
    return f"{app_id}-1" if owner == bootstrap else f"{app_id}~{owner}-1"


def _state_key(url: str) -> str:
    """The database's key the runner labels data claims with (`atrium.state.key`), read
    without writing anything; "" when there is no database yet (a review before any shell ran)
    or it cannot be read (then the claim is printed without that label)."""
    import asyncio
    from pathlib import Path

    from sqlalchemy.exc import SQLAlchemyError

    from atrium.settings import ConfigError
    from atrium.state.database import Database, parse_url
    from atrium.state.key import read_key

    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        return ""

    async def read() -> str:
        async with Database.open(url) as db:
            return await read_key(db)

    try:
        return asyncio.run(read())
    except (SQLAlchemyError, OSError, ConfigError):  # ConfigError: a file it may not open
        return ""


def _app_objects(
    settings: Settings, app_id: str, owner: str, instance_id: str | None
) -> list[dict[str, Any]]:
    from atrium.lifecycle.limits import Limits, ceilings_of, effective_limits
    from atrium.lifecycle.runners.kubernetes.source import source_digest
    from atrium.lifecycle.spawning import app_environment, resolve_argv
    from atrium.registry import read_copy
    from atrium.scopes import BY_PRIORITY, ScopeLayout
    from atrium.users.model import valid_user_id

    if not valid_user_id(owner):
        raise _fail(f"--owner {owner!r} is not a user id")
    layout = ScopeLayout(settings.home, settings.system_apps, settings.user, settings.scopes_dir)
    copy = None
    for scope in BY_PRIORITY:  # the copy the owner sees: their scope, then global, then system
        folder = layout.app_dir(scope, app_id, owner)
        if folder.is_dir():
            candidate = read_copy(scope, folder)
            if candidate.manifest is not None:
                copy = candidate
                break
    if copy is None or copy.manifest is None:
        raise _fail(f"no installed app {app_id!r} that {owner} sees in {settings.home}")
    manifest = copy.manifest
    instance = instance_id or _instance_id(app_id, owner, settings.user)
    asked = manifest.resources
    limits = effective_limits(
        None if asked is None else Limits(asked.memory_mib, asked.cpu_milli, asked.pids),
        ceilings_of(settings.app_memory_mib, settings.app_cpu_milli, settings.app_pids),
    )
    # as the shell says its own URL when ATRIUM_KUBE_SHELL_URL is unset (atrium.shell.loopback)
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104
    host = wildcard.get(settings.host, settings.host)
    shell_url = settings.kube_shell_url or f"http://{host}:{settings.port}"
    shell = render.shell_key(str(settings.home), settings.kube_namespace)
    plan = render.plan_for(
        namespace=settings.kube_namespace,
        shell=shell,
        app_id=app_id,
        instance_id=instance,
        owner=owner,
        image=settings.kube_image,
        source_digest=source_digest(copy.path),
        shell_url=shell_url,
        entrypoint=render.pod_command(resolve_argv(copy), str(copy.path)),
        env=app_environment(
            app_id=app_id,
            instance_id=instance,
            host=render.POD_HOST,
            port=render.POD_PORT,
            shell_url=shell_url,
        ),
        secrets={},
        memory_mib=limits.memory_mib,
        cpu_milli=limits.cpu_milli,
        # a pod has no process ceiling of its own (the node's podPidsLimit holds it): the runner
        # claims none, so none is shown
        pids=None,
        storage_class=settings.kube_storage_class,
        state=_state_key(settings.state_url),
    )
    return [
        *render.namespace_objects(
            plan.namespace,
            shell,
            render.SHELL_POD_LABELS,
            render.shell_cidrs(shell_url, settings.kube_config is not None),
        ),
        *render.instance_objects(plan),
    ]


@kube_app.command("render")
def render_objects(
    app_id: str | None = typer.Argument(
        None, help="the app whose instance to render (may be left out with --shell)"
    ),
    owner: str | None = typer.Option(
        None, "--owner", help="the user the instance belongs to (default: ATRIUM_USER)"
    ),
    instance: str | None = typer.Option(
        None, "--instance", help="the instance id (default: the owner's first, <appId>-1)"
    ),
    shell: bool = typer.Option(
        False, "--shell", help="also the shell's own objects: RBAC, Service, StatefulSet"
    ),
    shell_image: str | None = typer.Option(
        None,
        "--shell-image",
        help="the image that runs `atrium serve` (default: ATRIUM_KUBE_IMAGE)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the objects as one JSON list"),
) -> None:
    """Print, as YAML documents, every object the Kubernetes runner creates for one instance
    (secrets as placeholders), from the local ATRIUM_HOME and the ATRIUM_KUBE_* settings."""
    from atrium.settings import ConfigError, Settings

    try:
        settings = Settings.load()
    except ConfigError as err:
        for problem in err.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2) from None
    if app_id is None and not shell:
        raise _fail("name an app to render, or give --shell for the shell's own objects")
    objects: list[dict[str, Any]] = []
    if shell:
        objects += render.shell_objects(
            settings.kube_namespace,
            shell_image or settings.kube_image,
            app_image=settings.kube_image,
            storage_class=settings.kube_storage_class,
        )
    if app_id is not None:
        objects += _app_objects(settings, app_id, owner or settings.user, instance)
    if as_json:
        typer.echo(json.dumps(objects, indent=2, ensure_ascii=False))
    else:
        typer.echo(render.to_yaml(objects), nl=False)
