"""Activities: `onActivityCreate` and `onActivityDestroy/<id>` on a serving instance.

The lifecycle manager walks the instance to `resumed` and holds its lock; this module calls the
app's hook, keeps the activity on the instance and announces it (`activity:opened`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from atrium.bus import EventBus
from atrium.errors import NotFound, NotServing
from atrium.events import ActivityOpened
from atrium.lifecycle.calls import call_hook
from atrium.lifecycle.instance import Activity, Instance
from atrium.lifecycle.states import Hook, InstanceState
from atrium.upstream import UpstreamClient

S = InstanceState
#: states in which an activity may be destroyed (the app is up and has a view to give)
WITH_ACTIVITIES = frozenset({S.RESUMING, S.RESUMED, S.PAUSING, S.PAUSED})


class Activities:
    """Creates and destroys activities on instances the caller has locked."""

    def __init__(self, upstream: UpstreamClient, bus: EventBus) -> None:
        self._upstream = upstream
        self._bus = bus

    async def create(
        self, instance: Instance, extras: Mapping[str, Any], intent: Mapping[str, Any] | None
    ) -> Activity:
        """`onActivityCreate` on a `resumed` instance; the app answers ``{path, title?}``."""
        activity_id = secrets.token_hex(6)
        body: dict[str, Any] = {
            "instanceId": instance.id,
            "appId": instance.app_id,
            "activityId": activity_id,
            "extras": dict(extras),
        }
        if intent is not None:
            body["intent"] = dict(intent)
        if instance.manifest.runtime is not None:
            # an image has no hooks: its activity is its page at the root
            answer: dict[str, Any] = {"path": "/"}
        else:
            answer = await call_hook(
                self._upstream.session,
                instance.address,
                Hook.ON_ACTIVITY_CREATE.value,
                body,
                instance.manifest.hook_timeout_ms,
            )
        title = answer.get("title")
        activity = Activity(
            activity_id, answer["path"], title if isinstance(title, str) else instance.manifest.name
        )
        instance.activities[activity_id] = activity
        self._bus.emit(
            ActivityOpened(
                instance.id,
                instance.app_id,
                activity.id,
                activity.path,
                activity.title,
                owner=instance.owner,
            )
        )
        return activity

    async def destroy(self, instance: Instance, activity_id: str) -> None:
        if activity_id not in instance.activities:
            raise NotFound("activity", activity_id)
        if instance.state not in WITH_ACTIVITIES:
            raise NotServing(
                instance.id,
                instance.app_id,
                instance.state,
                "an activity is destroyed in resuming, resumed, pausing or paused",
            )
        if instance.manifest.runtime is None:
            await call_hook(
                self._upstream.session,
                instance.address,
                f"{Hook.ON_ACTIVITY_DESTROY.value}/{activity_id}",
                {"instanceId": instance.id, "appId": instance.app_id, "activityId": activity_id},
                instance.manifest.hook_timeout_ms,
            )
        del instance.activities[activity_id]
