"""Benchmark of the moteus driver loop against the emulated moteus (no hardware needed).

Measures, for each transport:
- the driver loop (torque command + query to one controller, query to the other, one ``transport.cycle``
  per period): achieved rate, period p50 / p99, late cycles, and the cycle's CAN round trip p50 / p99;
- a single-controller query round trip (``transport.cycle([query])`` back to back) p50 / p99.

Transports: python-can ``virtual`` bus with the emulator in this process (its own thread), and an fdcanusb
pty with the emulator in a separate process (``python -m mcpilco_core.hardware.emulator``). The emulated
motors drive the pendubot plant; the driver commands a small constant torque.

Run: ``python benchmarks/bench_moteus_driver.py [--seconds 5] [--rate 500]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcpilco_core.hardware.commands import query_command  # noqa: E402
from mcpilco_core.hardware.config import DriverConfig, TransportConfig, load_driver_config  # noqa: E402
from mcpilco_core.hardware.driver import MoteusDriver  # noqa: E402
from mcpilco_core.hardware.emulator import VirtualCanEmulator, robot_bus  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402

CONFIG = REPO / "config"


async def measure(config: DriverConfig, seconds: float, queries: int) -> dict[str, float]:
    driver = MoteusDriver(config)
    await driver.start()
    try:
        rtts = []
        controller = driver.controllers[1]
        for _ in range(queries):
            t0 = time.perf_counter()
            await asyncio.wait_for(driver.transport.cycle([query_command(controller)]), 0.5)
            rtts.append(time.perf_counter() - t0)
        driver.set_command((0.2, 0.0))
        stop = asyncio.Event()
        end = driver.clock() + seconds

        def on_sample(sample: object) -> None:
            driver.set_command((0.2, 0.0))
            if driver.clock() >= end:
                stop.set()

        await driver.run(stop, on_sample)
        result = driver.stats.summary()
        result["query_rtt_p50_ms"] = 1e3 * float(np.percentile(rtts, 50))
        result["query_rtt_p99_ms"] = 1e3 * float(np.percentile(rtts, 99))
        result["state"] = driver.safety.state.value  # type: ignore[assignment]
        return result
    finally:
        await driver.shutdown("benchmark done")


def in_process(base: DriverConfig, seconds: float, queries: int) -> dict[str, float]:
    channel = f"bench-{uuid.uuid4().hex}"
    config = dataclasses.replace(base, transport=TransportConfig(kind="pythoncan", interface="virtual",
                                                                  channel=channel))
    bus = robot_bus(config, DoublePendulum.from_yaml(CONFIG / "pendubot.yaml"))
    with VirtualCanEmulator(bus, channel):
        return asyncio.run(measure(config, seconds, queries))


def over_pty(base: DriverConfig, seconds: float, queries: int) -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, "-m", "mcpilco_core.hardware.emulator", "--driver-config",
                             str(CONFIG / "moteus_driver_pendubot.yaml"), "--robot-config",
                             str(CONFIG / "pendubot.yaml")], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        path = proc.stdout.readline().strip()  # type: ignore[union-attr]
        config = dataclasses.replace(base, transport=TransportConfig(kind="fdcanusb", path=path, can_timeout=0.05))
        return asyncio.run(measure(config, seconds, queries))
    finally:
        proc.terminate()
        proc.wait(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="s of driver loop per transport")
    parser.add_argument("--rate", type=float, default=500.0, help="Hz, driver loop rate")
    parser.add_argument("--queries", type=int, default=500, help="single-query round trips per transport")
    args = parser.parse_args()
    base = dataclasses.replace(load_driver_config(CONFIG / "moteus_driver_pendubot.yaml"), rate=args.rate)
    rows = [("virtual CAN, in-process", in_process(base, args.seconds, args.queries)),
            ("fdcanusb pty, other process", over_pty(base, args.seconds, args.queries))]
    keys = ("rate_hz", "period_p50_ms", "period_p99_ms", "late_cycles", "cycles", "rtt_p50_ms", "rtt_p99_ms",
            "query_rtt_p50_ms", "query_rtt_p99_ms", "can_timeouts")
    print(f"moteus driver loop vs emulated moteus: target {args.rate:g} Hz, {args.seconds:g} s per transport")
    print(f"{'transport':30} " + " ".join(f"{k:>16}" for k in keys))
    for name, result in rows:
        print(f"{name:30} " + " ".join(f"{result.get(k, float('nan')):16.3f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
