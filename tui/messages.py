"""Messages from the poller and workers to the app; workers never touch widgets."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from lynxtop.contract.status import Status


class StatusArrived(Message):
    """A fresh status object from the agent."""

    def __init__(self, status: Status):
        super().__init__()
        self.status = status

    def can_replace(self, message: Message) -> bool:
        # A slow screen drops stale frames instead of queueing them.
        return isinstance(message, StatusArrived)


class AgentLost(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class ProfilesArrived(Message):
    def __init__(self, profiles: dict[str, Any]):
        super().__init__()
        self.profiles = profiles


class LiveRefreshed(Message):
    """Posted by the app to the current screen after the live state changed."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LiveRefreshed)
