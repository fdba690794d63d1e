"""The base of every model that crosses the wire: camelCase outside, snake_case in Python."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """Frozen, camelCase on the wire, snake_case in Python; unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        frozen=True,
        extra="forbid",
    )

    def wire(self) -> dict[str, Any]:
        """The JSON form sent to clients."""
        return self.model_dump(mode="json", by_alias=True)
