"""The one error tree of Atrium; every API error body is built from these classes.

Each class carries a stable ``code`` (the JSON ``error.code``), an ``http_status`` and the fields
that report it (camelCase on the wire). The tree mirrors the error table in docs/api.md "Errors"; a
unit test keeps the two together::

    AtriumError                         500 internal
    ├── InvalidRequest                  400 bad_request            (problems)
    │   └── BadRef                      400 bad_ref                (ref, accepted)
    ├── Unauthenticated                 401 unauthenticated
    │   └── BadCredentials              401 bad_credentials
    ├── Forbidden                       403 (abstract)
    │   ├── PermissionDenied            403 permission_denied      (callerAppId, permission)
    │   ├── CallerMismatch              403 caller_mismatch        (claimed, actual)
    │   ├── SystemScopeImmutable        403 system_scope_immutable (scope)
    │   ├── ApprovalDenied              403 approval_denied        (diff)
    │   ├── FetchHostRefused            403 fetch_host_refused     (host, address)
    │   └── UntrustedArtifact           403 untrusted_artifact     (appId, ref, signature)
    ├── NotFound                        404 not_found              (kind, id)
    │   ├── NoProvider                  404 no_provider            (authority, path)
    │   └── NoHandler                   404 no_handler             (action)
    ├── Conflict                        409 (abstract)
    │   ├── LifecycleTransitionError    409 illegal_transition     (instanceId, from, to)
    │   ├── NotServing                  409 not_serving            (instanceId, appId, state)
    │   ├── LastAdmin                   409 last_admin             (user)
    │   ├── BootstrapAdmin              409 bootstrap_admin        (user)
    │   ├── UserExists                  409 user_exists            (user)
    │   ├── TooManyTokens               409 too_many_tokens        (limit)
    │   ├── Busy                        409 busy                   (appId, operation)
    │   ├── ApprovalStale               409 approval_stale         (approvedDigest, digest)
    │   ├── AuthorityConflict           409 authority_conflict     (authority, appId)
    │   ├── NotADevCopy                 409 not_a_dev_copy         (appId, scope)
    │   ├── ScopeNeedsRepair            409 scope_needs_repair     (scope, journals)
    │   └── BackupDamaged               409 backup_damaged         (appId, backup, problem)
    ├── MisdirectedRequest              421 misdirected_request    (host)
    ├── ManifestInvalid                 422 invalid_manifest       (appId, problems)
    ├── ExportTooLarge                  422 export_too_large       (appId, path, bytes, limit)
    ├── TooManyAttempts                 429 too_many_attempts      (retryAfter; Retry-After)
    ├── HeadersTooLarge                 431 headers_too_large      (limit)
    ├── BadGateway                      502 (abstract)
    │   ├── UpstreamFailed              502 upstream_failed
    │   ├── HookFailed                  502 hook_failed            (hook, status)
    │   ├── SpawnFailed                 502 spawn_failed           (appId, cause)
    │   └── FetchFailed                 502 fetch_failed           (ref, reason)
    ├── ProviderUnavailable             503 provider_unavailable   (authority, state; Retry-After)
    ├── UpstreamTimeout                 504 upstream_timeout
    ├── ShellTimeout                    504 shell_timeout          (instanceId, shell, taken)
    ├── ShuttingDown                    503 shutting_down
    ├── DatabaseUnavailable             503 database_unavailable   (database)
    ├── DatabaseLost                    503 database_lost
    ├── StorageFailed                   503 storage_failed         (path)
    │   ├── StorageDamaged              503 storage_damaged        (path)
    │   └── StorageFull                 507 storage_full           (path)
    └── InstallFailed                   500 install_failed         (appId, reason)

An ``AtriumError`` is expected (bad input, a denied permission, a misbehaving app): it is logged as one
line. Anything else is a bug: logged with its traceback and answered 500 ``internal`` without internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

JsonFields = dict[str, Any]


class AtriumError(Exception):
    """Base of every expected error: ``code``, ``http_status``, ``message`` and wire ``fields``."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    #: abstract groupings (Forbidden, Conflict, BadGateway) have no code of their own
    abstract: ClassVar[bool] = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: JsonFields = {k: v for k, v in fields.items() if v is not None}

    def headers(self) -> Mapping[str, str]:
        """Extra response headers (e.g. ``Retry-After``)."""
        return {}

    def to_body(self) -> JsonFields:
        return {"error": {"code": self.code, "message": self.message, **self.fields}}


class InvalidRequest(AtriumError):
    """Malformed body, bad field, unknown scope, non-canonical data path."""

    code = "bad_request"
    http_status = 400

    def __init__(
        self, message: str, *, problems: Sequence[Mapping[str, str]] | None = None, **fields: Any
    ) -> None:
        super().__init__(message, problems=list(problems) if problems else None, **fields)


class BadRef(InvalidRequest):
    """A ref that is none of the accepted forms; the message holds the raw ref."""

    code = "bad_ref"
    ACCEPTED: ClassVar[str] = (
        "oci://<host>/<repo>[:tag|@digest], <host>/<repo>:<tag>, git://…, git+https://…, "
        "git+file://…, <host>/<user>/<repo>[#ref], a reverse-domain app id[@channel], or local:<path>"
    )

    def __init__(self, ref: str, reason: str) -> None:
        super().__init__(
            f"'{ref}' is not a ref: {reason}; accepted: {self.ACCEPTED}",
            ref=ref,
            accepted=self.ACCEPTED,
        )


class Unauthenticated(AtriumError):
    """No or invalid credentials where needed."""

    code = "unauthenticated"
    http_status = 401


class BadCredentials(Unauthenticated):
    """A password sign-in that failed: unknown user, disabled user, no password or a wrong one,
    all answered alike so that the answer tells no one which."""

    code = "bad_credentials"

    def __init__(self) -> None:
        super().__init__("the user name or password is wrong")


class Forbidden(AtriumError):
    """The caller is known but may not do this."""

    code = "forbidden"
    http_status = 403
    abstract = True


class PermissionDenied(Forbidden):
    """The caller lacks the permission."""

    code = "permission_denied"

    def __init__(
        self, message: str, *, caller_app_id: str | None = None, permission: str | None = None
    ) -> None:
        super().__init__(message, callerAppId=caller_app_id, permission=permission)


class CallerMismatch(Forbidden):
    """An inbound ``X-Os-Caller-App-Id`` differs from the authenticated app."""

    code = "caller_mismatch"

    def __init__(self, claimed: str, actual: str | None) -> None:
        super().__init__(
            f"X-Os-Caller-App-Id says {claimed!r} but the request is authenticated as "
            f"{actual or 'the user'!r}",
            claimed=claimed,
            actual=actual,
        )


class SystemScopeImmutable(Forbidden):
    """Install into or removal from the system scope."""

    code = "system_scope_immutable"

    def __init__(self, action: str) -> None:
        super().__init__(
            f"the system scope is immutable: cannot {action}; system apps change only with a "
            "platform release (use scope 'global' or 'user')",
            scope="system",
        )


class ApprovalDenied(Forbidden):
    """The user denied an approval."""

    code = "approval_denied"

    def __init__(self, app_id: str, diff: JsonFields | None = None) -> None:
        super().__init__(
            f"the user denied the permissions asked by {app_id!r}", appId=app_id, diff=diff
        )


class FetchHostRefused(Forbidden):
    """A member's fetch would connect to a host they may not reach (atrium.distribution.reach)."""

    code = "fetch_host_refused"

    def __init__(self, host: str, address: str | None, message: str | None = None) -> None:
        super().__init__(
            message
            or (
                f"a member's fetch may not connect to {host!r} ({address}): it is not a public "
                "address, and the admin has not allowed it (ATRIUM_MEMBER_FETCH_HOSTS)"
            ),
            host=host,
            address=address,
        )


class UntrustedArtifact(Forbidden):
    """The scope's trust policy is ``require`` and the artifact has no trusted signature."""

    code = "untrusted_artifact"

    def __init__(self, app_id: str, ref: str, signature: JsonFields, scope: str) -> None:
        status = signature.get("status")
        why = {
            "unsigned": "it is not signed",
            "unknown_signer": "no key trusted in that scope signed it",
            "invalid": "its signature does not sign this artifact",
        }.get(str(status), f"its signature is {status}")
        super().__init__(
            f"the {scope} scope requires a trusted signature and {ref} ({app_id}) has none: "
            f"{why}; nothing was installed (trust the signer's key with `atrium trust add`, or "
            f"set the policy with `atrium trust policy {scope} warn`)",
            appId=app_id,
            ref=ref,
            signature=signature,
        )


class NotFound(AtriumError):
    """Unknown app, instance, theme, install record, activity, view, key or route."""

    code = "not_found"
    http_status = 404

    def __init__(self, kind: str, id: str, message: str | None = None) -> None:
        super().__init__(message or f"no {kind} {id!r}", kind=kind, id=id)


class NoProvider(NotFound):
    """No visible app declares the authority and path."""

    code = "no_provider"

    def __init__(self, authority: str, path: str) -> None:
        AtriumError.__init__(
            self,
            f"no visible app declares a provider for authority {authority!r} and path {path!r}",
            authority=authority,
            path=path,
        )


class NoHandler(NotFound):
    """No intent filter matches the intent (start)."""

    code = "no_handler"

    def __init__(self, action: str) -> None:
        AtriumError.__init__(
            self, f"no app has an intent filter matching action {action!r}", action=action
        )


class Conflict(AtriumError):
    """The request conflicts with the current state."""

    code = "conflict"
    http_status = 409
    abstract = True


class LastAdmin(Conflict):
    """The change would leave no enabled admin."""

    code = "last_admin"


class IndexUrlFixed(Conflict):
    """The catalogue's address is set by the environment (``ATRIUM_INDEX_URL`` or ``serve
    --index-url``), which wins over a stored one: change it there."""

    code = "index_url_fixed"

    def __init__(self, url: str) -> None:
        super().__init__(
            f"the catalogue is {url!r}, set by ATRIUM_INDEX_URL (or serve --index-url), which "
            "wins over an address stored through the API: change or unset it there",
            url=url,
        )


class BootstrapAdmin(Conflict):
    """The bootstrap admin (``ATRIUM_USER``, whose token is ``run/token``) cannot be deleted:
    the shell would make them again at its next start."""

    code = "bootstrap_admin"


class UserExists(Conflict):
    """A user with that id exists."""

    code = "user_exists"


class TooManyTokens(Conflict):
    """The user holds as many personal tokens as one may (``limit``): delete one first."""

    code = "too_many_tokens"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"you hold {limit} personal tokens, the most one user may; delete one you no longer "
            "use (DELETE /api/tokens/{id}) and try again",
            limit=limit,
        )


class IdentityLinked(Conflict):
    """The OIDC identity is linked to another user."""

    code = "identity_linked"


class LifecycleTransitionError(Conflict):
    """A move the lifecycle table does not allow."""

    code = "illegal_transition"

    def __init__(
        self,
        instance_id: str,
        from_state: str,
        to_state: str,
        app_id: str | None = None,
    ) -> None:
        from_state, to_state = str(from_state), str(to_state)  # plain strings, even for enums
        super().__init__(
            f"instance '{instance_id}' cannot move from '{from_state}' to '{to_state}'",
            instanceId=instance_id,
            appId=app_id,
            **{"from": from_state, "to": to_state},
        )


class NotServing(Conflict):
    """A view or an activity asked of an instance whose state has none to give: nothing moves,
    so no `app:lifecycle.error` either (unlike LifecycleTransitionError)."""

    code = "not_serving"

    def __init__(self, instance_id: str, app_id: str, state: str, wanted: str) -> None:
        super().__init__(
            f"instance '{instance_id}' is {state}: {wanted}",
            instanceId=instance_id,
            appId=app_id,
            state=str(state),
        )


class Busy(Conflict):
    """Another operation on the same app is running."""

    code = "busy"

    def __init__(self, app_id: str, operation: str, *, elsewhere: bool = False) -> None:
        """``elsewhere``: on another shell (several shells on one scope folder)."""
        where = " on another shell" if elsewhere else ""
        super().__init__(
            f"another operation ({operation}) on {app_id!r} is running{where}; try again",
            appId=app_id,
            operation=operation,
            **({"elsewhere": True} if elsewhere else {}),
        )


class ApprovalStale(Conflict):
    """The approved digest differs from what the source resolves to now."""

    code = "approval_stale"

    def __init__(self, approved_digest: str, digest: str) -> None:
        super().__init__(
            f"the source moved since it was approved ({approved_digest} → {digest}); review the new "
            "permission diff",
            approvedDigest=approved_digest,
            digest=digest,
        )


class AuthorityConflict(Conflict):
    """The authority is already declared by another installed app."""

    code = "authority_conflict"

    def __init__(self, authority: str, app_id: str) -> None:
        super().__init__(
            f"authority {authority!r} is already declared by {app_id!r}",
            authority=authority,
            appId=app_id,
        )


class NotADevCopy(Conflict):
    """`atrium dev` would replace an app installed (or placed by hand) in the user scope."""

    code = "not_a_dev_copy"

    def __init__(self, app_id: str, scope: str) -> None:
        super().__init__(
            f"{app_id} is installed in the {scope} scope and is not a dev copy: uninstall it "
            "first, or develop under another app id",
            appId=app_id,
            scope=scope,
        )


class ScopeNeedsRepair(Conflict):
    """Recovery found an install journal it could not read: it cannot prove what in the scope's
    staging is garbage, so it kept it all and the scope takes no install, update or uninstall
    until an operator has looked."""

    code = "scope_needs_repair"

    def __init__(self, scope: str, journals: Sequence[str]) -> None:
        super().__init__(
            f"the {scope} scope needs repair: recovery could not read the install journal(s) "
            f"{', '.join(journals)}; their staging was kept as .staging/<opId>.quarantined; stop "
            "the shell and run `atrium doctor --repair` (it puts the runtime data back and sets "
            "the rest aside in lost+found), or move any runtime data back into the app folder by "
            "hand and delete the .unreadable journal(s) and the quarantined folder(s)",
            scope=scope,
            journals=list(journals),
        )


class BackupDamaged(Conflict):
    """A backup whose files no longer match its ``backup.json`` (a removal cut off, a write the
    disk lost, a hand in the folder): it is never restored, and ``backup`` names it."""

    code = "backup_damaged"

    def __init__(self, app_id: str, backup: str, problem: str, advice: str = "") -> None:
        super().__init__(
            f"the backup {backup} of {app_id} is damaged ({problem}), so it is not restored"
            f"{'; ' + advice if advice else ''}; `atrium doctor` lists it and "
            "`atrium doctor --repair` sets it aside",
            appId=app_id,
            backup=backup,
            problem=problem,
        )


class MisdirectedRequest(AtriumError):
    """The request's ``Host`` is none of the shell's names: refused before anything else, so a
    page on a DNS-rebound name (``attacker.example`` resolving to 127.0.0.1) reaches nothing."""

    code = "misdirected_request"
    http_status = 421

    def __init__(self, message: str, *, host: str | None = None) -> None:
        super().__init__(message, host=host)


class TooManyAttempts(AtriumError):
    """Too many of something within a window (`limit` names which): failed sign-ins for one
    account from one address, any sign-ins from one address, or too many of one address's at
    once; views opened, or actions asked of other shells' instances, by one caller on one shell
    (several shells only)."""

    code = "too_many_attempts"
    http_status = 429
    _WHAT: ClassVar[Mapping[str, str]] = {
        "account": "too many failed sign-ins for this account from this address",
        "address": "too many sign-ins from this address",
        "at_once": "too many sign-ins at once from this address",
        "views": "too many views opened in a minute",
        "asks": "too many actions asked of instances on other shells in a minute",
    }

    def __init__(self, retry_after: int, *, limit: str = "account") -> None:
        super().__init__(
            f"{self._WHAT[limit]}; try again in {retry_after} s",
            retryAfter=retry_after,
            limit=limit,
        )
        self.retry_after = retry_after

    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class HeadersTooLarge(AtriumError):
    """A request line and headers longer than the server accepts; the connection then closes."""

    code = "headers_too_large"
    http_status = 431

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message, limit=limit)


class ImageNotKept(Conflict):
    """An export of an app that carried its image, whose layout the image store does not keep
    (the image was loaded before the store kept carried layouts): the archive would install
    nowhere else, so it is not made."""

    code = "image_not_kept"

    def __init__(self, app_id: str, digest: str, folder: str) -> None:
        super().__init__(
            f"{app_id} cannot be exported: it carried its image ({digest}) as a layout at "
            f"{folder}/, the installed copy keeps none of its blobs and the image store keeps "
            "only the unpacked image, so another machine could not install it; install the app "
            "again from the source that carries its image, then export it",
            appId=app_id,
            digest=digest,
            folder=folder,
        )


class ExportTooLarge(AtriumError):
    """An export whose archive would hold more than an import takes (its files' apparent sizes:
    a sparse file counts its whole length, every zero of which would be packed), or more
    members; refused before anything is stopped or copied. ``path`` names the largest file."""

    code = "export_too_large"
    http_status = 422

    def __init__(self, app_id: str, path: str, size: int, total: int, limit: int, why: str) -> None:
        super().__init__(
            f"{app_id} cannot be exported: {why}, more than an import takes ({limit} bytes "
            f"expanded); its largest file is {path} ({size} bytes, counted at its full length "
            "even where it holds nothing)",
            appId=app_id,
            path=path,
            bytes=total,
            limit=limit,
        )


class ManifestInvalid(AtriumError):
    """Manifest invalid: every problem listed as ``{field, message}``."""

    code = "invalid_manifest"
    http_status = 422

    def __init__(self, app_id: str | None, problems: Sequence[Mapping[str, str]]) -> None:
        listed = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        super().__init__(
            f"invalid manifest for {app_id or 'an app'!r}: {listed}",
            appId=app_id,
            problems=[dict(p) for p in problems],
        )
        self.problems = [dict(p) for p in problems]


class BadGateway(AtriumError):
    """Something the shell called failed."""

    code = "bad_gateway"
    http_status = 502
    abstract = True


class UpstreamFailed(BadGateway):
    """The provider upstream failed."""

    code = "upstream_failed"


class HookFailed(BadGateway):
    """A lifecycle hook answered 4xx/5xx, a 2xx without ``ok: true``, or timed out."""

    code = "hook_failed"

    def __init__(self, message: str, *, hook: str, status: int | None = None) -> None:
        super().__init__(message, hook=hook, status=status)


class SpawnFailed(BadGateway):
    """Spawning failed: port, identity, early exit or mount."""

    code = "spawn_failed"

    def __init__(self, message: str, *, app_id: str, cause: str) -> None:
        super().__init__(message, appId=app_id, cause=cause)


class FetchFailed(BadGateway):
    """Fetching failed: network, credentials, missing ref, digest mismatch."""

    code = "fetch_failed"

    def __init__(self, ref: str, reason: str) -> None:
        super().__init__(f"fetching {ref!r} failed: {reason}", ref=ref, reason=reason)


class ProviderUnavailable(AtriumError):
    """The declared provider has no ``resumed`` instance; answered with Retry-After."""

    code = "provider_unavailable"
    http_status = 503

    def __init__(self, authority: str, state: str | None = None, why: str = "") -> None:
        super().__init__(
            f"the provider of {authority!r} is not running (state: {state or 'not started'})"
            f"{'; ' + why if why else ''}; retry with backoff",
            authority=authority,
            state=state,
        )

    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": "1"}


class UpstreamTimeout(AtriumError):
    """The provider upstream did not answer in time."""

    code = "upstream_timeout"
    http_status = 504


class ShuttingDown(AtriumError):
    """The shell stopped while the request was still running (its shutdown grace had passed)."""

    code = "shutting_down"
    http_status = 503

    def __init__(self) -> None:
        super().__init__(
            "the shell is shutting down and stopped this request before it was answered; "
            "whether it took effect shows once the shell runs again (an install, update or "
            "other change to an app is then either complete or undone)"
        )


class DatabaseLost(AtriumError):
    """This shell is cut off from the shared state database (or its instance lock's session
    ended): it does not act on instances, another shell may hold their locks by now."""

    code = "database_lost"
    http_status = 503

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"this shell lost its link to the state database and does not act on instances "
            f"until it is back; another shell serves them ({reason})"
        )


class InstanceElsewhere(AtriumError):
    """An app origin's instance runs on another shell, on an address only that shell reaches:
    shells do not forward requests to each other."""

    code = "instance_elsewhere"
    http_status = 503


class InstanceUnheld(AtriumError):
    """An app origin's instance runs in a pod whose shell is gone and that no shell holds, and
    the cluster does not say that pod still runs at the address its row gives (it was deleted
    or evicted, and the address may be another pod's now): nothing is sent there."""

    code = "instance_unheld"
    http_status = 503

    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": "2"}


class ShellTimeout(AtriumError):
    """An action asked of another shell's instance (its pod) got no answer in time: with
    ``taken`` false that shell never took it and it is withdrawn (nothing was done); with
    ``taken`` true that shell is doing it still (the instance's state tells the outcome)."""

    code = "shell_timeout"
    http_status = 504


class DatabaseUnavailable(AtriumError):
    """The shell's database did not answer (``GET /api/ready``). ``database`` is its kind
    (``postgresql`` or ``sqlite``), never its address: the answer is for anyone who asks."""

    code = "database_unavailable"
    http_status = 503

    def __init__(self, database: str, outcome: str | None = None) -> None:
        """``outcome``: what the request did not do because of it (the answer to a request
        other than ``/api/ready``)."""
        said = f": {outcome}" if outcome else "; it is not ready to serve"
        super().__init__(
            f"this shell cannot reach its database ({database}){said} (the shell's log says why)",
            database=database,
        )


class StorageFailed(AtriumError):
    """The shell's own storage (the KV database) could not be read or written: an I/O error or a
    read-only file. Nothing was changed; ``path`` names the file the operator must look at."""

    code = "storage_failed"
    http_status = 503

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message, path=path)


class StorageDamaged(StorageFailed):
    """The file is damaged (SQLite found a malformed page): never served or written around."""

    code = "storage_damaged"


class StorageFull(StorageFailed):
    """The disk holding the file is full: the write was rolled back, nothing answered is lost."""

    code = "storage_full"
    http_status = 507


class InstallFailed(AtriumError):
    """Install failed (disk, lock) and nothing changed on disk."""

    code = "install_failed"
    http_status = 500

    def __init__(self, app_id: str, reason: str) -> None:
        super().__init__(
            f"installing {app_id!r} failed, nothing changed on disk: {reason}",
            appId=app_id,
            reason=reason,
        )


def error_classes() -> list[type[AtriumError]]:
    """Every concrete error class of the tree (AtriumError itself stands for ``internal``)."""
    found: list[type[AtriumError]] = [AtriumError]
    pending: list[type[AtriumError]] = [AtriumError]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if not vars(sub).get("abstract", False):
                found.append(sub)
    return found
