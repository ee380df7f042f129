"""Run code tconform did not write in a child process, so that nothing it does can end the
command without a verdict.

    value = run_in_child(function, args, on_message, what="examples.tiny_gpt:make")

`function(send, *args)` runs in a process started by multiprocessing's spawn method (a fresh
interpreter: forking after torch has started its threads can hang), and its return value comes
back. Whatever ends that process early is one UsageError line naming `what` and how it ended:
`sys.exit(0)` or `os._exit(0)` in the user's code, `raise GeneratorExit`, a segmentation fault,
the kernel's out-of-memory killer. The child:

- starts with SIGINT ignored (Ctrl-C reaches the whole process group; only the parent acts on
  it), and turns SIGTERM into `Terminated`, so its `finally` blocks run and no temporary file is
  left behind;
- dies with its parent (prctl PR_SET_PDEATHSIG on Linux, and a thread that polls the parent
  where that is missing);
- sends what `send(message)` is given to `on_message` in the parent as it goes (progress lines);
- imports this tconform, whatever the current folder holds, and what it spawns in turn does not
  run tconform's entry script again (tconform.spawning).

On Ctrl-C or SIGTERM in the parent, and on any error there, the child is terminated (SIGTERM,
then SIGKILL after a grace period) before the exception goes on.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil

from tconform.errors import (
    EXIT_USAGE,
    TconformError,
    Terminated,
    UsageError,
    first_line,
    how_it_ended,
)
from tconform.spawning import children_import_this_tconform, forget_entry_script

GRACE_SECONDS = 5.0  # for a terminated child to unwind before it is killed
POLL_SECONDS = 0.2


def run_in_child(
    function: Callable[..., Any],
    args: Sequence[object],
    on_message: Callable[[object], None],
    what: str,
    ended_early: Callable[[str], str] | None = None,
) -> Any:
    """`function(send, *args)` in a spawned child; its return value (see the module docstring).
    A TconformError raised there is raised here with its message and exit code. A child that
    ends without either is a UsageError: `ended_early(how it ended)` when given, else one line
    naming `what`."""
    context = multiprocessing.get_context("spawn")
    _quiet_resource_tracker()
    receive, send = context.Pipe(duplex=False)
    # Started with SIGINT ignored: an ignored signal stays ignored across exec, and Python then
    # installs no KeyboardInterrupt handler. Blocked meanwhile, so that a Ctrl-C in this window
    # reaches the parent once its handler is back (as tconform.export's workers do).
    blocking = hasattr(signal, "pthread_sigmask")
    if blocking:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = context.Process(
            target=_child_main, args=(send, os.getpid(), what, function, tuple(args))
        )
        with _main_file_that_exists(), children_import_this_tconform():
            process.start()
    finally:
        signal.signal(signal.SIGINT, previous)
        if blocking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    send.close()  # the child holds the only writing end: its death is an end of file here
    try:
        while True:
            if not receive.poll(POLL_SECONDS):
                if process.is_alive():
                    continue
                process.join(POLL_SECONDS)
                if receive.poll(0):  # sent just before it ended
                    continue
                break
            try:
                kind, payload = receive.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # a message that cannot be unpickled here
                raise UsageError(
                    f"{what}: its result could not be read: {first_line(exc)}"
                ) from None
            if kind == "message":
                on_message(payload)
            elif kind == "return":
                return payload
            else:  # "error": (message, exit code)
                message, code = payload
                raise TconformError.with_code(message, code)
        process.join(GRACE_SECONDS)
        how = how_it_ended(process.exitcode)
        if ended_early is not None:
            raise UsageError(ended_early(how))
        raise UsageError(f"{what}: its process {how} before it finished")
    finally:
        receive.close()
        _stop(process)


@contextlib.contextmanager
def _main_file_that_exists() -> Iterator[None]:
    """A spawned child runs the parent's main script again (under another name) when it has a
    file; one that does not exist (`python - < script`) would end the child at once, so it is
    hidden for the start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or path is None:
        yield
        return
    if os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (which every spawned process shares) with its
    stderr on /dev/null, unless it runs already: a child that dies without cleaning up (the
    case this module exists for) makes it print a warning at exit, which is not tconform's one
    line. It still removes what the child left."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_fd", None) is not None:
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _stop(process) -> None:
    """The child ended: asked to stop (SIGTERM: it unwinds), then killed if it does not; and
    whatever is left of its process group (what the user's code forked) with it, and of what
    it had started that left the group (a new session, `setsid`)."""
    started = _descendants(process.pid) if process.is_alive() else []
    if process.is_alive():
        process.terminate()
        process.join(GRACE_SECONDS)
    if process.is_alive():
        process.kill()
        process.join()
    if process.pid is not None and process.pid != os.getpgid(0):
        with contextlib.suppress(OSError):  # no group left (or none made): nothing to end
            os.killpg(process.pid, signal.SIGKILL)
    for left in started:
        with contextlib.suppress(psutil.Error):  # gone, or its pid now another's: not ours
            left.kill()


def _descendants(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _child_main(
    send, parent_pid: int, what: str, function: Callable[..., Any], args: tuple
) -> None:
    """The child's whole life: signals set up, `function` run, its outcome sent."""
    forget_entry_script()  # what the user's code spawns from here imports no tconform
    # A process group of its own, which the command ends with it: what the user's code forks
    # never outlives the command (holding its stdout open for whoever reads it).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # What the user's code prints goes to stderr, beside the progress lines: stdout holds the
    # results the command prints, which a script reads.
    if sys.stdout is not None:  # None where the command was started with stdout closed
        sys.stdout.flush()
    with contextlib.suppress(OSError):  # stderr closed too: nothing to send it to
        os.dup2(2, 1)
    sys.stdout = sys.stderr
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_terminated)
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGTERM when the parent dies, SIGKILL included
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()

    def message(payload: object) -> None:
        send.send(("message", payload))

    try:
        outcome = ("return", function(message, *args))
    except Terminated:
        os._exit(128 + signal.SIGTERM)
    except TconformError as exc:
        outcome = ("error", (str(exc), exc.exit_code))
    except OSError as exc:
        outcome = ("error", (_os_error_line(what, exc), EXIT_USAGE))
    except MemoryError:
        outcome = ("error", ("out of memory", EXIT_USAGE))
    except BaseException as exc:  # anything else, never a traceback: one line
        outcome = ("error", (f"{what}: {first_line(exc)}", EXIT_USAGE))
    # From here on a SIGTERM (the parent giving up waiting) just ends the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        send.send(outcome)
    except ConnectionError:  # the parent stopped listening (interrupted): no one to tell
        return
    except Exception as exc:  # a result that cannot be pickled
        with contextlib.suppress(ConnectionError):
            send.send(("error", (f"{what}: its result could not be sent: {first_line(exc)}", 2)))
    send.close()
    # A normal exit, so that multiprocessing's finalizers release what the check held; a thread
    # the user's code left running only delays it (the parent ends it after a grace period).


def _os_error_line(what: str, exc: OSError) -> str:
    """An OSError's one line; where the user's code closed a standard stream of the check's
    process (whose progress and results go through them), which one."""
    closed = [name for fd, name in enumerate(("stdin", "stdout", "stderr")) if not _is_open(fd)]
    if exc.errno == errno.EBADF and closed:
        return f"{what}: its code closed the check's {', '.join(closed)} ({exc.strerror})"
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _exit_with_parent(parent_pid: int) -> None:
    """Polls for the parent, where prctl is missing or the parent died before it was set."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
