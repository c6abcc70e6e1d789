"""Deploy platforms, one module each, loaded by name only when used (so `offline --help` imports neither
boto3 nor docker). DESIGN.md section 6 names the ``--platform`` values."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import PlatformAdapter

# --platform value -> (module:class, title shown in the prompt). Order is the prompt's order.
PLATFORMS: dict[str, tuple[str, str]] = {
    "host-a": ("platform_adapters.fly:FlyAdapter", "Fly.io (recommended)"),
    "host-b": ("platform_adapters.railway:RailwayAdapter", "Railway"),
    "cloud-a-containers": ("platform_adapters.lightsail:LightsailAdapter", "AWS Lightsail containers"),
    "cloud-a-orchestrated": ("platform_adapters.ecs:EcsAdapter", "AWS ECS on Fargate"),
    "web-service-host": ("platform_adapters.stubs:WebServiceHostAdapter", "Web service host"),
    "self-hosted-image": ("platform_adapters.stubs:SelfHostedImageAdapter", "Self-hosted container image"),
    "managed-hosting": ("platform_adapters.stubs:ManagedHostingAdapter", "Managed hosting"),
}

STUB_PLATFORMS = frozenset({"web-service-host", "self-hosted-image", "managed-hosting"})


def platform_names() -> list[str]:
    return list(PLATFORMS)


def load_adapter(name: str) -> PlatformAdapter:
    """A fresh adapter for the ``--platform`` value ``name``; KeyError for an unknown name."""
    target, _ = PLATFORMS[name]
    module_name, attr = target.split(":")
    cls = getattr(importlib.import_module(module_name), attr)
    adapter: PlatformAdapter = cls()
    return adapter
