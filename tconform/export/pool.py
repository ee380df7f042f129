"""The export pool: `export_jobs` makes any list of (case, settings, folder) jobs current at once.

A model whose cache key and bytes match its manifest is reused; one current in another folder is
copied; the rest are exported, each distinct key once, biggest graphs first, in worker processes
that are spawned (forking after torch starts its threads can hang), kept for the next call (their
torch and exporter warm) and end with this process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from tconform import registry
from tconform.export.artifacts import (
    ArtifactsFolder,
    ExportRecord,
    export_case,
    is_current,
    staging_dir,
)
from tconform.export.settings import ExportSettings, cache_key
from tconform.registry import Case
from tconform.spawning import children_import_this_tconform


def _export_by_name(
    name: str, settings: ExportSettings, out_dir: Path, folder: str
) -> ExportRecord:
    """An export worker's job: cases do not pickle, so workers find them by name; relative
    paths mean what they mean in the calling process's current `folder`."""
    os.chdir(folder)
    return export_case(registry.exportable_case(name), settings, out_dir)


@dataclass(frozen=True)
class ExportJob:
    """One model to have current: `case` at `settings` in `out_dir`/<case>/model.onnx."""

    case: Case
    settings: ExportSettings
    out_dir: Path


# Biggest graphs first (by the case's size class), so that the longest export never starts last;
# a class not listed here goes last.
_SIZE_ORDER = ("model", "stack", "layer", "component")


def _size_rank(case: Case) -> int:
    return _SIZE_ORDER.index(case.tolerance) if case.tolerance in _SIZE_ORDER else len(_SIZE_ORDER)


def export_jobs(
    jobs: Iterable[ExportJob],
    on_done: Callable[[ExportRecord], None] | None = None,
    force: bool = False,
    workers: int | None = None,
) -> list[ExportRecord]:
    """Make every job's model current and keep each folder's manifest current.

    A model whose cache key and bytes match its manifest is reused; one whose key matches a
    model current in another folder is copied; the rest are exported, each distinct key once,
    in `workers` processes (default: one per core, at most two: each export is
    single-threaded Python tracing). `on_done` reports every record as it is settled. A file
    that tconform did not write, or that changed since, is refused unless `force`. Each folder
    is locked for the whole call, so concurrent runs on one folder wait for each other.
    """
    jobs = list(jobs)
    new = {job.out_dir for job in jobs if not job.out_dir.exists()}
    with ExitStack() as stack:
        folders: dict[Path, ArtifactsFolder] = {}
        for out_dir in sorted({job.out_dir for job in jobs}):  # one order: no lock cycles
            settings = next(job.settings for job in jobs if job.out_dir == out_dir)
            folders[out_dir] = ArtifactsFolder(out_dir, settings, stack)
        try:
            records = _settle_jobs(jobs, folders, on_done, force, workers)
        except BaseException:  # Ctrl-C, SIGTERM, an export's error: the workers are gone
            for out_dir in folders:  # still locked: what is staged is this call's alone
                shutil.rmtree(staging_dir(out_dir), ignore_errors=True)
                if out_dir in new:  # made by this call, and nothing placed in it: gone again
                    with contextlib.suppress(OSError):
                        out_dir.rmdir()
            raise
        for out_dir in folders:
            with contextlib.suppress(OSError):  # empty once every staged model is placed
                staging_dir(out_dir).rmdir()
        return records


def _settle_jobs(jobs, folders, on_done, force, workers) -> list[ExportRecord]:
    records: dict[int, ExportRecord] = {}
    current: dict[str, ExportRecord] = {}  # key -> a current model (its folder holds it)
    todo: dict[str, list[int]] = {}  # key -> indices of the jobs that need that model
    for n, job in enumerate(jobs):
        key = cache_key(job.case, job.settings)
        previous = folders[job.out_dir].models.get(job.case.name)
        path = job.out_dir / job.case.name / "model.onnx"
        if is_current(path, key, previous, force, job.out_dir):
            records[n] = ExportRecord.from_manifest(previous, job.out_dir)
            current.setdefault(key, records[n])
            if on_done:
                on_done(records[n])
        else:
            todo.setdefault(key, []).append(n)

    def settle(key: str, record: ExportRecord) -> None:
        """Place one settled model in every folder that needs it: the staged export where it
        was made, a copy of the placed file everywhere else."""
        source = None if record.staged else Path(record.location)
        for n in todo[key]:
            folder = folders[jobs[n].out_dir]
            if source is None and Path(record.folder) == folder.out_dir:
                staged = Path(record.staged)
            else:
                staged = folder.stage_copy(record, source or Path(record.staged))
            records[n] = folder.place(replace(record, cached=False), staged)
            source = source or Path(records[n].location)
            if on_done:
                on_done(records[n])

    to_export = []
    for key in todo:
        if key in current:
            settle(key, current[key])
        else:
            to_export.append(key)
    to_export.sort(key=lambda k: _size_rank(jobs[todo[k][0]].case))
    first = {key: jobs[todo[key][0]] for key in to_export}
    # A model needed in several folders is exported into the first; the others copy it.
    for key in to_export:
        todo[key].sort(key=lambda n: jobs[n].out_dir != first[key].out_dir)
    count = min(workers or min(2, os.cpu_count() or 1), len(to_export))
    if count <= 1:
        for key in to_export:
            job = first[key]
            settle(key, export_case(job.case, job.settings, job.out_dir))
    else:
        for key, record in _export_in_workers(to_export, first, count):
            settle(key, record)
    return [records[n] for n in range(len(jobs))]


class _Workers:
    """The export worker processes of this process, kept between calls: a worker pays for
    importing torch and warming its exporter (seconds) once, not once per call. They end with
    this process; on an error, Ctrl-C or SIGTERM during a call they are terminated, and the
    next call spawns new ones. Their temporary files go in a folder of the pool's (`scratch`),
    which this process removes once they have ended: a worker terminated mid-export cleans up
    nothing itself."""

    pool = None
    count = 0
    scratch: Path | None = None

    @classmethod
    def get(cls, count: int):
        if cls.pool is not None and cls.count == count:
            return cls.pool
        cls.close()
        cls.scratch = Path(tempfile.mkdtemp(prefix="tconform-export-"))
        cls.pool, cls.count = _spawn_pool(count, cls.scratch), count
        return cls.pool

    @classmethod
    def close(cls) -> None:
        """Close and join: with nothing pending the workers finish on their own, whereas
        terminating them mid-exit leaves their interpreter's semaphores registered with the
        resource tracker, which then warns of a leak at this process's exit."""
        if cls.pool is not None:
            cls.pool.close()
            cls.pool.join()
        cls._ended()

    @classmethod
    def terminate(cls) -> None:
        if cls.pool is not None:
            cls.pool.terminate()
            cls.pool.join()
        cls._ended()

    @classmethod
    def _ended(cls) -> None:
        cls.pool = None
        if cls.scratch is not None:
            shutil.rmtree(cls.scratch, ignore_errors=True)
            cls.scratch = None


# At exit, before the pool's own finalizer (priority 15) would terminate them, also in a
# process that multiprocessing started (which runs its finalizers before atexit's hooks).
multiprocessing.util.Finalize(None, _Workers.close, exitpriority=20)


def _export_in_workers(keys: list[str], first: dict[str, ExportJob], count: int):
    """(key, record) as each export finishes, from `count` worker processes (kept for the
    next call): on an error, Ctrl-C or SIGTERM they are terminated before it propagates, and a
    worker whose parent dies (even by SIGKILL) exits on its own."""
    pool = _Workers.get(count)
    folder = os.getcwd()  # the workers' own is the one they were spawned in
    try:
        pending = {
            key: pool.apply_async(
                _export_by_name,
                (first[key].case.name, first[key].settings, first[key].out_dir, folder),
            )
            for key in keys
        }
        while pending:
            done = [key for key, result in pending.items() if result.ready()]
            for key in done:
                yield key, pending.pop(key).get()
            if not done:
                next(iter(pending.values())).wait(0.2)
    except BaseException:
        _Workers.terminate()
        raise


def _spawn_pool(count: int, scratch: Path):
    """`count` spawned worker processes that leave Ctrl-C to this one, their temporary files
    in `scratch`."""
    context = multiprocessing.get_context("spawn")  # fork after torch starts threads can hang
    # Ctrl-C reaches the whole process group, and only the parent should act on it, by
    # terminating the pool. Workers start with SIGINT ignored (an ignored signal stays ignored
    # across exec, and Python then installs no KeyboardInterrupt handler). The parent's main
    # thread also blocks it while spawning (Linux never drops a blocked signal as ignored), so a
    # Ctrl-C in that window of a few milliseconds reaches it once its handler is back, unless
    # another thread (torch's) took it meanwhile: then that one Ctrl-C is lost, a second works.
    blocking = hasattr(signal, "pthread_sigmask")  # not on Windows
    if blocking:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with children_import_this_tconform():
            return context.Pool(
                count, initializer=_worker_init, initargs=(os.getpid(), str(scratch))
            )
    finally:
        signal.signal(signal.SIGINT, previous)
        if blocking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _worker_init(parent_pid: int, scratch: str) -> None:
    """Export workers leave Ctrl-C to the parent, end when it ends, and keep their temporary
    files where it removes them."""
    tempfile.tempdir = scratch
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it spawned us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGTERM when the parent dies, SIGKILL included
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except OSError:
            pass
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    """Polls for the parent, where prctl is missing or the parent died before it was set."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def export_cases(
    cases: Iterable[Case],
    settings: ExportSettings,
    out_dir: Path,
    on_done: Callable[[ExportRecord], None] | None = None,
    force: bool = False,
    jobs: int | None = None,
) -> list[ExportRecord]:
    """Export (or reuse) every case at one setting into one folder (see export_jobs)."""
    return export_jobs(
        (ExportJob(case, settings, out_dir) for case in cases), on_done, force, workers=jobs
    )
