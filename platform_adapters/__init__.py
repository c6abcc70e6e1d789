"""Deploy platforms, one module each, loaded by name only when used (so `offline --help` imports neither
boto3 nor docker). DESIGN.md sections 6 and 7 name the ``--platform`` values and their aliases."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import PlatformAdapter

# --platform value -> (module:class, vendor name shown in prompts and results). Order is the menu's order.
PLATFORMS: dict[str, tuple[str, str]] = {
    "host-a": ("platform_adapters.fly:FlyAdapter", "Fly.io"),
    "host-b": ("platform_adapters.railway:RailwayAdapter", "Railway"),
    "cloud-a-containers": ("platform_adapters.lightsail:LightsailAdapter", "AWS Lightsail containers"),
    "cloud-a-orchestrated": ("platform_adapters.ecs:EcsAdapter", "AWS ECS on Fargate"),
    "web-service-host": ("platform_adapters.render:RenderAdapter", "Render"),
    "self-hosted-image": ("platform_adapters.self_hosted:SelfHostedAdapter", "Self-hosted container image"),
    "managed-hosting": ("platform_adapters.stubs:ManagedHostingAdapter", "Managed hosting"),
}

#: The names a person types (DESIGN.md section 7); deploy.json keeps the neutral code they stand for.
ALIASES: dict[str, str] = {
    "fly": "host-a",
    "railway": "host-b",
    "lightsail": "cloud-a-containers",
    "ecs": "cloud-a-orchestrated",
    "self-hosted": "self-hosted-image",
    "docker": "self-hosted-image",
    "render": "web-service-host",
}

STUB_PLATFORMS = frozenset({"managed-hosting"})

#: Shown first in the menu and suggested by hints.
RECOMMENDED = "host-a"


def platform_names() -> list[str]:
    return list(PLATFORMS)


def canonical(name: str) -> str:
    """The neutral code of ``name`` (an alias or a code); ``name`` itself when it is neither."""
    return ALIASES.get(name, name)


def vendor_name(name: str) -> str:
    """``Fly.io`` for ``host-a`` or ``fly``; the name itself when unknown."""
    entry = PLATFORMS.get(canonical(name))
    return entry[1] if entry else name


def alias_of(code: str) -> str:
    """The typed name of a neutral code (``fly`` for ``host-a``); the code when it has none."""
    return next((alias for alias, target in ALIASES.items() if target == code), code)


def implemented() -> list[str]:
    return [name for name in PLATFORMS if name not in STUB_PLATFORMS]


def load_adapter(name: str) -> PlatformAdapter:
    """A fresh adapter for the ``--platform`` value ``name`` (alias or code); KeyError for an unknown name."""
    target, _ = PLATFORMS[canonical(name)]
    module_name, attr = target.split(":")
    cls = getattr(importlib.import_module(module_name), attr)
    adapter: PlatformAdapter = cls()
    return adapter
