"""The audit log's action names (docs/api.md "Audit log"): one stable dotted name for every route
that may change state, by the route's name. The one place they are written: a route missing here is
recorded under its bare route name, and the test that walks the OpenAPI document fails, so a new
route cannot land unnamed."""

from __future__ import annotations

from typing import Final

AUDIT_ACTIONS: Final[dict[str, str]] = {
    # sign-in and sign-out
    "sign_in": "session.create",
    "login": "session.link",
    "oidc_callback": "session.oidc",
    "sign_out": "session.delete",
    "end_session": "session.end",
    # accounts, their passwords, identities and tokens
    "add_user": "user.create",
    "change_user": "user.update",
    "delete_user": "user.delete",
    "change_own_password": "password.change",
    "reset_password": "password.reset",
    "link_identity": "identity.link",
    "unlink_identity": "identity.unlink",
    "create_token": "token.create",
    "delete_token": "token.delete",
    # apps: distribution
    "install": "app.install",
    "preview": "app.preview",
    "update": "app.update",
    "rollback": "app.rollback",
    "uninstall": "app.uninstall",
    "import_app": "app.import",
    "publish": "app.publish",
    "backup": "app.backup",
    "restore": "app.restore",
    "dev_problems": "app.dev_problem",
    "grant_egress": "app.egress.grant",
    "revoke_egress": "app.egress.revoke",
    # instances and what hangs off them
    "create_instance": "instance.launch",
    "delete_instance": "instance.delete",
    "instance_action": "instance.control",
    "proxy": "instance.proxy",
    "create_view": "view.create",
    "delete_view": "view.delete",
    "create_activity": "activity.create",
    "delete_activity": "activity.delete",
    "add_grant": "grant.create",
    "revoke_grant": "grant.delete",
    "resolve": "intent.resolve",
    "start": "intent.start",
    "forget_default": "intent.forget_default",
    "announce": "data.announce",
    # key-value store
    "put_value": "kv.put",
    "delete_value": "kv.delete",
    "put_value_global": "kv.global.put",
    "delete_value_global": "kv.global.delete",
    # the shell's own settings
    "set_git_repo": "scope.set_git_repo",
    "set_trust": "scope.set_trust",
    "set_catalogue": "store.set_catalogue",
    "select": "theme.select",
    "reload": "theme.reload",
    "add_tool": "tool.add",
    "remove_tool": "tool.remove",
}


def audit_action(route_name: str) -> str:
    """The action a route's calls are recorded under."""
    return AUDIT_ACTIONS.get(route_name, route_name)
