"""The crash harness: kill your app at every crash point, recover it, count what the world got.

Point it at a factory for your app (``module:factory``, called with a working
directory) that returns a :class:`CrashApp`::

    class MyApp:
        def __init__(self, workdir: Path) -> None: ...

        def prepare(self, run_id: str) -> None:
            # a fresh world for this run: a workspace, a sandbox account...
            ...

        def runtime(self, store, run_id: str, crash: CrashPlan) -> Runtime:
            return Runtime(store=store, ..., crash=crash)  # pass the plan on

        def effects(self, run_id: str) -> dict[str, int]:
            # what the real systems received for this run, by action kind,
            # counted from their own books (tickets in the service's database,
            # messages in the mailbox), never from tether's
            return {"http.post": ..., "email.send": ...}

then ``tether crashtest --app mymodule:MyApp`` or
``run_crash_harness("mymodule:MyApp").passed``.

An app whose own loop makes its effects (``tether.effects.run`` and
``@tether.effect``, no :class:`~tether.runtime.Agent`) adds a ``drive``
method, making it a :class:`LoopCrashApp`; each child then calls it where an
agent's run would be stepped::

        def drive(self, runtime: Runtime, run_id: str) -> None:
            # the app's loop, run to its end (or as far as the run allows)
            with tether.effects.run(runtime, run_id) as run:
                if not run.phase.terminal:
                    my_loop(...)
                    run.finish("done")

It is called for the fresh run and for every recovery alike, so it opens
the run with ``tether.effects.run`` (which starts or recovers it) and
leaves a run that already ended alone. An app whose effects are your own
functions (``@tether.effect`` with ``fn.adapter`` as the runtime's adapter)
is put through the harness the same way: ``examples/own_function/crash_app.py``.

What it does: one clean run first, in a child process, to learn how often
the run passes each :class:`~tether.runtime.CrashPoint` and what the world
receives when nothing goes wrong (it must end the same way every time, and
every effect it makes must have its receipt in the ledger). Then for every
pass of every point, ``trials`` times: a fresh run in a child process armed
to SIGKILL itself at that pass; ``recoveries`` recoveries, each in a fresh
process (``start_or_recover`` and run); and the world's count compared with
the clean run's, kind by kind (:func:`~tether.testing._crashreport.judge`):
more is a duplicate effect; an effect without a committed receipt on the
recovered run's signed ledger is a lost receipt, unless the run is frozen in
``needs_review`` over exactly that uncertain effect, which is how an adapter
that cannot be asked is meant to end (reported as ``review``); a committed
receipt for an effect the world never got is a phantom receipt; and fewer
effects than the clean run made, in a run that ended as the clean run did
with no receipt for them, are missing effects (a look-up that called a send
it never received "refused"). A run in another phase is ``stuck``.
:attr:`CrashReport.passed` is false on any duplicate or missing effect, lost
or phantom receipt, or trial that could not be judged. The comparison is by
counts per kind, so a duplicate and a phantom receipt of one kind in one
trial can hide each other (see :mod:`tether.testing._crashreport`).

A trial whose ``prepare`` or ``effects`` raises, or whose child fails, is
an error for that trial only (``error`` in its row, the reason in the report);
the other trials are still run and judged. Only the clean run's failures stop
the harness with :class:`CrashHarnessError`, as there is nothing to compare with.

Runs get unique ids and each a world of its own, so trials may run side by
side (``jobs``); ``prepare`` and ``effects`` are then called from several
threads, for different runs. Runs are started without a lease (a killed
child's lease would block its recovery until it expired); recoveries keep
the runtime's own lease setting and release the lease when done.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from tether.core import Phase, TetherError
from tether.runtime import AppLoadError, CrashPlan, CrashPoint, Runtime, load_factory
from tether.testing._crashreport import (
    Baseline,
    Cell,
    CrashReport,
    Judgement,
    Settled,
    Trial,
    Verdict,
    judge,
)

__all__ = [
    "Baseline",
    "Cell",
    "CrashApp",
    "CrashHarnessError",
    "CrashReport",
    "Judgement",
    "LoopCrashApp",
    "Settled",
    "Trial",
    "Verdict",
    "judge",
    "load_app",
    "run_crash_harness",
]

#: A child that runs this long is stopped and its trial reported as an error.
CHILD_TIMEOUT_S = 120.0
_STDERR_TAIL = 600


class CrashHarnessError(TetherError):
    """The app cannot be put through the harness as given; the message says what to change."""


@runtime_checkable
class CrashApp(Protocol):
    """What the harness needs from your app (see the module docstring)."""

    def prepare(self, run_id: str) -> None:
        """Make a fresh world for ``run_id`` (called once per run, before its first process)."""
        ...

    def runtime(self, store: Any, run_id: str, crash: CrashPlan) -> Runtime:
        """The run's :class:`~tether.runtime.Runtime` over ``store``, built with ``crash=crash``."""
        ...

    def effects(self, run_id: str) -> Mapping[str, int]:
        """What the real systems received for ``run_id``, by action kind, from their own books."""
        ...


@runtime_checkable
class LoopCrashApp(CrashApp, Protocol):
    """A :class:`CrashApp` whose own loop makes the run's effects (see the module docstring)."""

    def drive(self, runtime: Runtime, run_id: str) -> None:
        """Start or recover ``run_id`` on ``runtime`` with ``tether.effects.run`` and run the loop."""
        ...


def load_app(spec: str, workdir: Path) -> CrashApp:
    """Import ``module:factory`` and call it with ``workdir``; it must return a :class:`CrashApp`."""
    # The worker's loader does the importing (one way to name module:factory);
    # its type names a worker's factory, this one takes the working directory.
    module = spec.partition(":")[0]
    try:
        factory = cast(Callable[[Path], object], load_factory(spec))
    except AppLoadError as exc:
        raise CrashHarnessError(
            f"{exc}; --app names module:factory, the module importable from the working "
            "directory or the Python path"
        ) from exc
    except (Exception, SystemExit) as exc:  # the module's own code ran, and raised
        raise CrashHarnessError(
            f"importing {module!r} for {spec} raised {type(exc).__name__}: {exc}; fix the "
            f"module until `python -c 'import {module}'` runs cleanly"
        ) from exc
    try:
        app = factory(Path(workdir))
    except TetherError:
        raise
    except Exception as exc:  # the user's code: name it, whatever it raised
        raise CrashHarnessError(
            f"{spec}(workdir) raised {type(exc).__name__}: {exc}; the factory takes the "
            "working directory and returns the app"
        ) from exc
    if not isinstance(app, CrashApp):
        raise CrashHarnessError(
            f"{spec}(workdir) returned {type(app).__name__}, which lacks prepare(run_id), "
            "runtime(store, run_id, crash) or effects(run_id): see tether.testing.crash_harness"
        )
    return app


def run_crash_harness(
    app: str,
    *,
    trials: int = 3,
    points: Iterable[CrashPoint] | None = None,
    store_url: str | None = None,
    workdir: Path | None = None,
    jobs: int = 1,
    recoveries: int = 2,
    child_timeout_s: float = CHILD_TIMEOUT_S,
    progress: Callable[[int, int, str], None] | None = None,
) -> CrashReport:
    """Put the app ``module:factory`` through every pass of every crash point (or ``points``).

    ``progress(done, total, what)`` is called after the clean run and after each
    trial (from the worker threads, one call at a time), for a progress bar.

    ``store_url`` defaults to a SQLite file in ``workdir``; ``workdir`` to a
    new temporary directory, removed afterwards if the report passed and kept
    (named in the report) if not, so its runs can be inspected.
    """
    for name, value, high in (
        ("trials", trials, 10_000),
        ("jobs", jobs, 64),
        ("recoveries", recoveries, 10),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise CrashHarnessError(
                f"{name} must be a whole number from 1 to {high}, not {value!r}"
            )
    try:
        chosen = list(dict.fromkeys(CrashPoint if points is None else map(CrashPoint, points)))
    except ValueError as exc:
        known = [p.value for p in CrashPoint]
        raise CrashHarnessError(f"{exc}; the crash points are {known}") from exc
    made = workdir is None
    home = Path(tempfile.mkdtemp(prefix="tether-crashtest-")) if workdir is None else Path(workdir)
    report = None
    try:
        _make_workdir(home)
        harness = _Harness(
            spec=app,
            app=load_app(app, home),
            workdir=home,
            store_url=store_url or f"sqlite:///{home / 'tether.sqlite'}",
            recoveries=recoveries,
            timeout_s=child_timeout_s,
        )
        report = harness.run(chosen, trials, jobs, progress)
    finally:
        # A temporary directory outlives only a report that failed: its runs
        # are what a person opens next. An error says everything itself.
        if made and (report is None or report.passed):
            shutil.rmtree(home, ignore_errors=True)
    return report


class _Harness:
    """One harness run: the app, where its runs live, and how children are started."""

    def __init__(
        self,
        *,
        spec: str,
        app: CrashApp,
        workdir: Path,
        store_url: str,
        recoveries: int,
        timeout_s: float,
    ) -> None:
        self.spec = spec
        self.app = app
        self.workdir = workdir
        self.store_url = store_url
        self.recoveries = recoveries
        self.timeout_s = timeout_s
        self.reports = workdir / "reports"  # made by _make_workdir
        # One store may serve many harness runs: ids carry this run's token.
        self.token = secrets.token_hex(3)
        self.env = _child_env(spec)

    def run(
        self,
        chosen: list[CrashPoint],
        trials: int,
        jobs: int,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> CrashReport:
        """The clean run, then ``trials`` trials at every pass of every chosen point."""
        if progress is not None:
            progress(0, 1, "clean run")
        baseline = self.clean_run()
        cells = [
            (point, hit) for point in chosen for hit in range(1, baseline.passes.get(point, 0) + 1)
        ]
        wanted = [(point, hit, n) for point, hit in cells for n in range(1, trials + 1)]
        finished = [0]
        lock = threading.Lock()

        def one(point: CrashPoint, hit: int, n: int) -> Trial:
            trial = self.trial(baseline, point, hit, n)
            if progress is not None:
                with lock:
                    finished[0] += 1
                    progress(finished[0], len(wanted), f"{point.value} hit {hit}")
            return trial

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(lambda each: one(*each), wanted))
        return CrashReport(
            app=self.spec,
            store_url=self.store_url,
            workdir=self.workdir,
            trials=trials,
            recoveries=self.recoveries,
            baseline=baseline,
            cells=tuple(
                Cell(point, hit, tuple(t for t in done if (t.point, t.hit) == (point, hit)))
                for point, hit in cells
            ),
            unreached=tuple(p for p in chosen if not baseline.passes.get(p)),
        )

    def clean_run(self) -> Baseline:
        """The unarmed run: it must end in a settled phase with every effect receipted."""
        run_id = f"ct-{self.token}-clean"
        self._prepare(run_id)
        done, report = self._child("clean", run_id)
        if report is None:
            raise CrashHarnessError(
                f"the app's run fails without any crash (exit {done.returncode}): "
                f"{_tail(done.stderr)}"
            )
        settled = Settled.from_json(report)
        passes = {CrashPoint(p): int(n) for p, n in report["passes"].items()}
        if not passes:
            raise CrashHarnessError(
                "the run passed no crash point: build the Runtime with crash=crash "
                "(the plan the harness hands to runtime())"
            )
        if not Phase(settled.phase).terminal:
            raise CrashHarnessError(
                f"the app's run ends in {settled.phase} without any crash "
                f"{list(settled.reviews) or ''}; the harness compares crashed runs with a "
                "clean one, so the clean run must end (completed, failed or cancelled)"
            )
        world = self._effects(run_id)
        unmatched = {
            kind: (world.get(kind, 0), settled.committed.get(kind, 0))
            for kind in {*world, *settled.committed}
            if world.get(kind, 0) != settled.committed.get(kind, 0)
        }
        if unmatched:
            detail = ", ".join(
                f"{kind}: the world received {w}, the ledger has {c} receipt(s)"
                for kind, (w, c) in sorted(unmatched.items())
            )
            raise CrashHarnessError(
                f"without any crash, effects() and the run's ledger disagree ({detail}); "
                "count by action kind, for this run only, what the real systems received"
            )
        return Baseline(settled.phase, world, passes)

    def trial(self, baseline: Baseline, point: CrashPoint, hit: int, n: int) -> Trial:
        """Kill a fresh run at the ``hit``-th pass of ``point``, recover it, judge the world."""
        run_id = f"ct-{self.token}-{point.value}-{hit}-{n}"
        # A trial that could not be judged is that trial's error, whatever the
        # app's code raised: it must not stop the others and hide their verdicts.
        try:
            self._prepare(run_id)
        except CrashHarnessError as exc:
            return Trial(point, hit, run_id, Verdict.ERROR, detail=str(exc))

        def error(detail: str) -> Trial:
            # The world is shown if it can be counted.
            try:
                world = self._effects(run_id)
            except CrashHarnessError as exc:
                world, detail = {}, f"{detail}; {exc}"
            return Trial(point, hit, run_id, Verdict.ERROR, world, detail=detail)

        killed, _ = self._child("start", run_id, point, hit)
        if killed.returncode != -9:
            if killed.returncode == 0:
                return error(
                    f"the run ended without passing {point.value} {hit} time(s), as the clean "
                    "run did: the app must run the same way every time"
                )
            return error(f"the armed run exited {killed.returncode}: {_tail(killed.stderr)}")
        report = None
        for _ in range(self.recoveries):
            recovered, report = self._child("recover", run_id)
            if report is None:
                return error(f"recovery exited {recovered.returncode}: {_tail(recovered.stderr)}")
        settled = Settled.from_json(cast(dict[str, Any], report))
        try:
            world = self._effects(run_id)
        except CrashHarnessError as exc:
            return Trial(
                point,
                hit,
                run_id,
                Verdict.ERROR,
                phase=settled.phase,
                reviews=settled.reviews,
                detail=f"the run recovered to {settled.phase}, but {exc}",
            )
        found = judge(baseline.effects, baseline.phase, world, settled)
        return Trial(
            point,
            hit,
            run_id,
            found.verdict,
            world,
            found.duplicates,
            found.lost,
            found.phantom,
            found.missing,
            settled.phase,
            settled.reviews,
        )

    def _child(
        self, stage: str, run_id: str, point: CrashPoint | None = None, hit: int = 1
    ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
        """Run one stage in a fresh interpreter; its report, if it wrote one."""
        report = self.reports / f"{run_id}.{stage}.json"
        report.unlink(missing_ok=True)
        cmd = [sys.executable, *["-O"] * sys.flags.optimize, "-m", "tether.testing._crashchild"]
        cmd += [stage, "--app", self.spec, "--workdir", str(self.workdir)]
        cmd += ["--store", self.store_url, "--run", run_id, "--report", str(report)]
        if point is not None:
            cmd += ["--point", point.value, "--hit", str(hit)]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                check=False,
                stdin=subprocess.DEVNULL,
                env=self.env,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else ""
            done = subprocess.CompletedProcess(
                cmd, -1, "", f"no end after {self.timeout_s:g} s {stderr}"
            )
        if done.returncode != 0 or not report.exists():
            return done, None
        return done, json.loads(report.read_text())

    def _prepare(self, run_id: str) -> None:
        try:
            self.app.prepare(run_id)
        except Exception as exc:  # the user's code: name it, whatever it raised
            raise CrashHarnessError(
                f"app.prepare({run_id!r}) raised {type(exc).__name__}: {exc}"
            ) from exc

    def _effects(self, run_id: str) -> dict[str, int]:
        try:
            counted = self.app.effects(run_id)
        except Exception as exc:  # the user's code: name it, whatever it raised
            raise CrashHarnessError(
                f"app.effects({run_id!r}) raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(counted, Mapping) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in counted.items()
        ):
            raise CrashHarnessError(
                f"app.effects({run_id!r}) must map action kinds to counts (str -> int >= 0), "
                f"not {counted!r}"
            )
        return dict(counted)


def _make_workdir(home: Path) -> None:
    """Make ``home`` and its ``reports`` directory if missing; a path that cannot be one is
    the caller's to change."""
    if home.exists() and not home.is_dir():
        raise CrashHarnessError(
            f"workdir {home} is not a directory; name a directory (it is made if missing)"
        )
    try:
        (home / "reports").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CrashHarnessError(
            f"workdir {home} cannot be made or written ({exc.strerror or exc}); name a "
            "directory you can write to (it is made if missing)"
        ) from exc


def _child_env(spec: str) -> dict[str, str]:
    """This environment, with the directory the app's module was imported from on the path.

    A child must import the app as this process did, even when it came from a
    directory only this process had on ``sys.path`` (the working directory of
    ``tether crashtest``, a test runner's root).
    """
    module_name = spec.partition(":")[0]
    module = sys.modules.get(module_name)
    env = dict(os.environ)
    origin = getattr(module, "__file__", None)
    if origin is None:
        return env
    root = Path(origin).resolve().parent
    for _ in range(module_name.count(".") + (Path(origin).name == "__init__.py")):
        root = root.parent
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def _tail(text: str) -> str:
    """The last lines of a child's stderr, on one line."""
    return " | ".join(text.strip()[-_STDERR_TAIL:].splitlines()) or "(no output)"
