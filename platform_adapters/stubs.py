"""Platforms the prompt offers but that are not built yet (SPEC 4.6): each refuses with NOT_IMPLEMENTED."""

from __future__ import annotations

from .base import StubAdapter


class ManagedHostingAdapter(StubAdapter):
    name = "managed-hosting"
    title = "Managed hosting"
