"""The opt-in selection's simulations in worker processes, beside the control loop (``selection.workers``).

Why: a decision of the acrobot's noisy-finals selection is about 28 simulations of 2.5 s; spread over the 0.2 s lead
in the control loop it costs 2.2 ms per 2 ms control step on a 2-core AMD EPYC (docs/learner.md, "Noisy finals in the
selection"): the 500 Hz loop overruns. In worker processes the loop only sends the decision's start and collects the
values; the simulations run on other cores, split between the workers.

How: each worker builds its own shadow supervisor and model from the robot config, the LQR design and rho (the same
objects the supervisor builds), and keeps the candidates the selection last sent it. A decision goes out in one or two
rounds: the options' noise-free simulations, split round-robin between the workers by candidate (a candidate's dither
phases share their simulation up to the first shake), then, with noisy finals, the finalists' noisy simulations
(finalist x sample pairs, split the same way by candidate and sample). Every worker simulates the lead itself (cheap),
and every simulation is the one the in-loop selection runs, with the same noise (seeded by the decision's number and the
sample's), so a decision's values and choice are the in-loop ones bit for bit. Workers are started with the ``spawn``
method (safe beside the threads of a ROS node) and stopped by :meth:`SelectionWorkers.close`, or with their parent
(daemon processes). A worker that fails (an exception, or a process that is gone) is reported by
:class:`SelectionWorkerError`; the selection then makes no more decisions and the running policy goes on.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

START_TIMEOUT = 60.0   # s for a worker to import the package and build its supervisor
NICENESS = 10          # added to a worker's nice value: where the workers and the control loop want the same core,
                       # the loop (latency) goes first and the workers (throughput) wait


class SelectionWorkerError(RuntimeError):
    """A selection worker raised, or its process is gone."""


def _run_to_end(work) -> Any:
    """The value a generator returns, once exhausted (the simulations yield after each step for the in-loop
    spreading; a worker has no use for that)."""
    while True:
        try:
            next(work)
        except StopIteration as stop:
            return stop.value


def _answer(selection, candidates: list, message: tuple) -> tuple:
    """One round of a decision: ``values`` (noise-free simulations of options) or ``noisy`` (finalist, sample)."""
    kind, decision_id, state, x, command, t, running_index, decision, tasks = message
    state = (*state[:7], candidates[running_index], *state[8:])       # the running policy, by index
    due = _run_to_end(selection._lead(state, x, t, command))
    if kind == "values":
        return kind, decision_id, [(i, _run_to_end(selection._simulate(due, candidates, option)))
                                   for i, option in tasks]
    return kind, decision_id, [(k, j, _run_to_end(selection._simulate(due, candidates, option,
                                                                     selection.noise(decision, j), j)))
                               for k, option, j in tasks]


def _serve(conn: Connection, build: Callable[..., Any], config, design, rho: float) -> None:
    """A worker's life: build its selection with ``build(config, design, rho)``, say ready, answer rounds until told
    to stop (None) or the pipe closes. Ctrl-C reaches the whole process group: the parent, not the worker, decides
    when it stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(NICENESS)
    except OSError:                                     # not allowed here: run at the parent's priority
        pass
    try:
        selection = build(config, design, rho)
        conn.send(("ready",))
    except Exception:                                   # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", traceback.format_exc()))
        return
    candidates: list = []
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        try:
            if message[0] == "candidates":
                candidates = message[1]
                continue
            if message[0] == "candidate":
                candidates[message[1]] = message[2]
                continue
            conn.send(_answer(selection, candidates, message))
        except Exception:                               # noqa: BLE001
            conn.send(("error", traceback.format_exc()))


def split_tasks(tasks: Sequence[tuple], count: int) -> list[list[tuple]]:
    """``tasks`` ((i, option) or (k, option, sample)) in ``count`` shares: the options of one candidate (and sample)
    together, so that one worker simulates their common part once (selection.py, ``_simulate``), the groups dealt
    round-robin in the order they first appear."""
    groups: dict[tuple, list[tuple]] = {}
    for task in tasks:
        groups.setdefault((task[1][0], task[2] if len(task) > 2 else None), []).append(task)
    shares: list[list[tuple]] = [[] for _ in range(count)]
    for g, group in enumerate(groups.values()):
        shares[g % count].extend(group)
    return shares


class SelectionWorkers:
    """``count`` worker processes for one supervisor's selection (module docstring). Not thread-safe: the control
    loop's thread alone uses it."""

    def __init__(self, count: int, build: Callable[..., Any], config, design, rho: float) -> None:
        """``build(config, design, rho)`` gives a worker its selection; a module-level function (spawn pickles it by
        name), so that this module never imports the supervisor that builds it (no import circle)."""
        if count < 1:
            raise ValueError(f"selection workers: {count}; at least 1")
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._processes = []
        self._sent_candidates: tuple = ()
        try:
            for _ in range(count):
                parent, child = context.Pipe()
                process = context.Process(target=_serve, args=(child, build, config, design, rho), daemon=True,
                                          name="mcpilco-selection-worker")
                process.start()
                child.close()
                self._conns.append(parent)
                self._processes.append(process)
            for conn in self._conns:
                try:
                    if not conn.poll(START_TIMEOUT):
                        raise SelectionWorkerError(f"a selection worker did not start within {START_TIMEOUT:g} s")
                    reply = conn.recv()
                except (EOFError, OSError) as exc:
                    raise SelectionWorkerError("a selection worker exited while starting (a script that starts workers "
                                        "needs `if __name__ == '__main__':` around its work: the spawned "
                                        "process imports it)") from exc
                if reply[0] != "ready":
                    raise SelectionWorkerError(f"a selection worker failed to start:\n{reply[1]}")
        except BaseException:
            self.close()
            raise

    @property
    def count(self) -> int:
        return len(self._conns)

    def send_round(self, kind: str, decision_id: int, state: tuple, x: tuple, command: tuple, t: float,
                   running_index: int, decision: int, tasks: Sequence[tuple], candidates: Sequence) -> int:
        """Split ``tasks`` between the workers (:func:`split_tasks`; the candidates first, when they changed);
        returns how many answers to expect."""
        self.send_candidates(candidates)
        state = (*state[:7], None, *state[8:])           # the running policy goes by index
        answers = 0
        for conn, share in zip(self._conns, split_tasks(tasks, len(self._conns)), strict=True):
            if share:
                self._send(conn, (kind, decision_id, state, x, command, t, running_index, decision, share))
                answers += 1
        return answers

    def send_candidates(self, candidates: Sequence) -> None:
        """Give the workers these candidates, unless they have them already (the same objects). After a reload only
        the changed ones go (candidate 0: ~22 kB pickled, which the pipe takes without blocking the control loop
        while a worker is busy; the whole bank, ~270 kB, would wait for each worker to read it)."""
        candidates = tuple(candidates)
        if len(candidates) != len(self._sent_candidates):
            self._send_all(("candidates", list(candidates)))
        else:
            for index, (new, old) in enumerate(zip(candidates, self._sent_candidates, strict=True)):
                if new is not old:
                    self._send_all(("candidate", index, new))
        self._sent_candidates = candidates

    def receive(self, timeout: float | None = 0.0) -> list[tuple]:
        """The answers that have arrived (waiting up to ``timeout`` s for the first; None = until one comes)."""
        ready = wait(self._conns, timeout)
        answers = []
        for conn in ready:
            try:
                while conn.poll():
                    answers.append(conn.recv())
            except (EOFError, OSError) as exc:
                raise SelectionWorkerError(f"a selection worker is gone ({exc!r})") from exc
        for answer in answers:
            if answer[0] == "error":
                raise SelectionWorkerError(f"a selection worker failed:\n{answer[1]}")
        if not ready and not all(process.is_alive() for process in self._processes):
            raise SelectionWorkerError("a selection worker's process is gone")
        return answers

    def _send_all(self, message: tuple) -> None:
        for conn in self._conns:
            self._send(conn, message)

    def _send(self, conn: Connection, message: tuple) -> None:
        try:
            conn.send(message)
        except (EOFError, OSError) as exc:
            raise SelectionWorkerError(f"a selection worker is gone ({exc!r})") from exc

    def close(self) -> None:
        """Stop the workers (each finishes the round it is on), waiting up to 2 s each, then terminating."""
        for conn in self._conns:
            try:
                conn.send(None)
            except (EOFError, OSError):
                pass
        for process in self._processes:
            process.join(2.0)
            if process.is_alive():
                process.terminate()
                process.join(1.0)
        for conn in self._conns:
            conn.close()
        self._conns, self._processes = [], []

    def __del__(self) -> None:
        if getattr(self, "_processes", None):
            self.close()
