"""Open the CAN transport named by a :class:`TransportConfig` with the official moteus library.

Must be called from inside the asyncio loop that will use the transport: a moteus transport binds to the
first event loop that uses it (docs/hardware.md).
"""

from __future__ import annotations

from typing import Any

import moteus

from .config import DriverConfig, TransportConfig


class TransportError(RuntimeError):
    """The configured transport could not be opened; the message names it."""


def make_transport(config: TransportConfig, can_ids: tuple[int, ...] = ()) -> Any:
    """A moteus transport (object with ``cycle``) for ``config``; ``can_ids`` are needed by the pi3hat."""
    try:
        return _open(config, can_ids)
    except TransportError:
        raise
    except Exception as exc:  # the library raises OSError, can.CanError, RuntimeError, ...
        raise TransportError(f"cannot open {config.describe()}: {exc}") from exc


def _open(config: TransportConfig, can_ids: tuple[int, ...]) -> Any:
    if config.kind == "socketcan":
        return moteus.PythonCan(interface="socketcan", channel=config.channel, disable_brs=config.disable_brs)
    if config.kind == "pythoncan":
        return moteus.PythonCan(interface=config.interface, channel=config.channel, disable_brs=config.disable_brs)
    if config.kind == "fdcanusb":
        return moteus.Fdcanusb(config.path or None, disable_brs=config.disable_brs)
    if config.kind == "pi3hat":
        try:
            import moteus_pi3hat  # type: ignore[import-not-found]
        except ImportError as exc:
            raise TransportError("transport kind 'pi3hat' needs the moteus-pi3hat package") from exc
        return moteus_pi3hat.Pi3HatRouter(servo_bus_map={config.pi3hat_bus: list(can_ids)})
    return moteus.get_singleton_transport()


def driver_transport(config: DriverConfig) -> Any:
    """The transport of a driver configuration (both joints' CAN ids for routing)."""
    return make_transport(config.transport, tuple(j.can_id for j in config.joints))
