"""The platform contract that plugins implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from deepinfer_core.config import EngineConfig, PlatformSettings
    from deepinfer_core.ops.backends import Backends


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""  # why not, or a short description of the device when available

    def __bool__(self) -> bool:
        return self.available


class Platform(ABC):
    """A named target (``reference``, ``cuda_sm100``, ``ascend950``, a third party's ...).

    ``backend="auto"`` picks the available platform with the highest :attr:`priority`.
    A platform's ops come from the op hooks (``deepinfer_attention_ops`` ...) called with its name;
    a concern no plugin serves falls back to the reference ops (see
    :func:`deepinfer_core.plugins.registry.resolve_backends`).
    """

    name: str
    priority: int = 0
    device_type: str = "cpu"
    #: the platform's settings (a :class:`~deepinfer_core.config.PlatformSettings` subclass), its section of the
    #: engine configuration keyed by :attr:`name`; ``None``: it has none. The op hooks and :meth:`finalize` read
    #: them with ``config.platform_settings(name, model)``; nothing else reads the environment.
    settings_model: ClassVar[type[PlatformSettings] | None] = None

    @abstractmethod
    def is_available(self) -> Availability:
        """Cheap probe: can this platform run here? Must not raise; say why not in ``reason``."""

    def describe(self) -> str:
        """One line about the device (name, compute capability ...) for ``deepinfer plugins``."""
        return self.is_available().reason

    def finalize(self, backends: Backends, config: EngineConfig) -> None:  # noqa: B027 - optional hook
        """Called once after all backends are resolved (e.g. to set up graph capture, or to hand the platform's
        settings, ``config.platform_settings(self.name, self.settings_model)``, to its kernels)."""
