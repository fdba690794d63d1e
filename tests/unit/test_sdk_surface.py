"""The SDK's public surface is a promise (docs/authoring.md "The SDK"): an app written against
this shell keeps working on the next. Removing or changing any of these is a deliberate act —
this test fails until the list below and the promise are updated together."""

from __future__ import annotations

import inspect

import atrium.sdk as sdk

PROMISED: dict[str, dict[str, str]] = {
    "App": {
        "call_shell": "(self, method: 'str', path: 'str', json: 'object' = None, timeout: 'float' = 30.0) -> 'tuple[int, Any]'",
        "hook": "(self, name: 'str') -> 'Callable[[K], K]'",
        "notify_change": "(self, *paths: 'str') -> 'bool'",
        "provider": "(self, path: 'str') -> 'Callable[[H], H]'",
        "route": "(self, method: 'str', path: 'str') -> 'Callable[[H], H]'",
        "run": "(self) -> 'None'",
        "static": "(self, url_prefix: 'str', directory: 'str | os.PathLike[str]') -> 'None'",
        "theme": "(self) -> 'dict[str, Any] | None'",
    },
    "Request": {"json": "(self) -> 'Any'", "json_object": "(self) -> 'dict[str, Any]'"},
    "Response": {
        "html": "(text: 'str', status: 'int' = 200) -> 'Response'",
        "json": "(data: 'object', status: 'int' = 200, headers: 'Mapping[str, str] | None' = None) -> 'Response'",
    },
}
PROMISED_PROPERTIES = {
    "Request": {"caller_app_id", "kind", "permission", "user"},
    "User": {"can_change"},
    "App": {"data_dir"},
}


def test_every_promised_name_keeps_its_signature() -> None:
    assert {"App", "HttpError", "Request", "Response", "User", "HOOKS"} <= set(sdk.__all__)
    for class_name, methods in PROMISED.items():
        cls = getattr(sdk, class_name)
        for name, signature in methods.items():
            assert str(inspect.signature(getattr(cls, name))) == signature, f"{class_name}.{name}"


def test_promised_attributes_and_hooks_stay() -> None:
    assert sdk.HOOKS == (
        "onCreate",
        "onStart",
        "onResume",
        "onPause",
        "onStop",
        "onDestroy",
        "onActivityCreate",
        "onActivityDestroy",
    )
    assert all(
        isinstance(inspect.getattr_static(sdk.Request, n), property)
        for n in PROMISED_PROPERTIES["Request"]
    )
    assert isinstance(inspect.getattr_static(sdk.User, "can_change"), property)
    assert set(sdk.User.__slots__) == {"id", "name", "role"}
    app = sdk.App("surface")
    assert hasattr(app, "data_dir")
