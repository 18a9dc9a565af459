"""The audit's timeout: stop an audited call that has not returned by its deadline.

A watchdog thread waits for the deadline, then raises `Expired` in the audited thread with
`PyThreadState_SetAsyncExc`, and raises it again every 50 ms until the call has left (code that
catches BaseException and goes on is stopped again). `Expired` is a BaseException, so the audited
code's `except Exception:` does not swallow it. It is held back while the thread is importing a
module (torch imports parts of itself lazily on a first call): an import cut in half leaves a
module broken for the rest of the process.

What it can stop: Python code, a pure-Python loop included (the interpreter checks for an
asynchronous exception between bytecodes), and a loop of torch calls. What it cannot: one C call
that does not return (`time.sleep`, a lock or queue wait without a timeout, one long kernel or a
socket read): the exception is delivered when that C call returns to Python, and never if it
never does; nor a loop that catches BaseException and goes on forever. A signal (SIGALRM) would
interrupt a sleep, but only in the main thread, and it would take the timer that pytest-timeout and
other tools already use.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading

from . import syncs

__all__ = ["Expired", "Deadline", "check_timeout"]

_RETRY_S = 0.05


class Expired(BaseException):
    """Raised asynchronously in the audited thread at its deadline (the audit turns it into AuditTimeout)."""


def _async_raise(tid: int, exc) -> None:
    """Raise `exc` (a class) in thread `tid` at its next bytecode; `exc=None` clears a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc) if exc else None)


def check_timeout(timeout_s):
    """None, or a positive finite number of seconds; ValueError otherwise (the caller names it)."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    return float(timeout_s)


def _importing(tid: int) -> bool:
    f = sys._current_frames().get(tid)
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            return True
        f = f.f_back
    return False


class Deadline:
    """`with Deadline(s):` raises Expired in this thread once `s` seconds have passed inside the block
    (`s=None`: no deadline). On exit the watchdog is stopped and a pending Expired is cleared, so
    nothing is raised after the block."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.fired = 0

    def __enter__(self):
        if self.seconds is None:
            return self
        self.tid = threading.get_ident()
        self.lock, self.stop, self.done = threading.Lock(), threading.Event(), False
        self.thread = threading.Thread(target=self._watch, name="sync-audit-deadline", daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        wait = self.seconds
        while not self.stop.wait(wait):
            wait = _RETRY_S
            with self.lock:
                if self.done:
                    return
                if _importing(self.tid):
                    continue
                _async_raise(self.tid, Expired)
                self.fired += 1

    def __exit__(self, et, e, tb):
        if self.seconds is None:
            return False
        with self.lock:
            self.done = True
        self.stop.set()
        if self.fired:
            _async_raise(self.tid, None)  # one may still be pending: raise it here, once
            if not isinstance(e, Expired):
                raise Expired() from e
        return False


syncs.tool_file(__file__)
