"""Views and their one-time tickets (decisions.md "Lifecycle").

A view is entered through a ticket that works once and lives 60 s; entering sets the view's
cookie on the app origin, and every later request there must carry a live view's cookie.
"""

from __future__ import annotations

import secrets
import time
from typing import Final

from atrium.lifecycle.instance import Instance, View

TICKET_TTL: Final = 60.0


class ViewDesk:
    """Issues views with tickets, redeems tickets, and recognises view cookies."""

    def __init__(self) -> None:
        self._tickets: dict[str, tuple[str, str, float]] = {}

    def issue(self, instance: Instance, path: str, client: str | None) -> tuple[View, str]:
        view = View(
            id=secrets.token_hex(6), cookie=secrets.token_urlsafe(24), path=path, client=client
        )
        instance.views[view.id] = view
        ticket = secrets.token_urlsafe(24)
        self._tickets[ticket] = (instance.id, view.id, time.monotonic() + TICKET_TTL)
        return view, ticket

    def redeem(self, instance: Instance | None, ticket: str) -> View | None:
        """The ticket's view, once; None when unknown, used, expired or for another instance."""
        entry = self._tickets.pop(ticket, None)
        if entry is None or instance is None:
            return None
        instance_id, view_id, expires = entry
        if instance_id != instance.id or time.monotonic() > expires:
            return None
        return instance.views.get(view_id)

    @staticmethod
    def for_cookie(instance: Instance, cookie: str) -> View | None:
        for view in instance.views.values():
            if secrets.compare_digest(view.cookie, cookie):
                return view
        return None
