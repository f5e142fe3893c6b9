"""The shutdown bound's last resort: a C library timer that ends the process without Python.

:class:`~kinbox.ops.shutdown.ShutdownBound` ends a stop from a Python thread,
and a Python thread runs only while it holds the GIL. A thread blocked in C
*with* the GIL keeps every other one from running, the bound's included.
confluent-kafka's binding does that: after a rebalance callback it calls
librdkafka's ``incremental_unassign`` (or ``assign``, and
``rebalance_protocol``) holding the GIL, and those wait without a timeout for
librdkafka's group thread, which may never answer while the consumer closes
in the middle of a rebalance
(https://github.com/confluentinc/librdkafka/issues/4884, /4041). A worker
SIGTERMed then hangs in ``Consumer.close()`` for good, its bound silent.

:func:`arm` starts a POSIX timer (``timer_create`` with ``SIGEV_THREAD``) on
``CLOCK_MONOTONIC``: when it expires, the C library starts a thread of its
own that calls ``_exit(status)`` — no Python, no GIL. The timer's value,
handed to that function, is the status: a ``union sigval`` whose pointer
member holds it travels in the first integer register, where ``_exit``
reads its ``int`` (x86-64 and AArch64 alike). Shortly before, faulthandler's
watchdog thread (also C) writes every thread's Python stack to stderr, so the
log says where the process was stuck. Linux only (64-bit); elsewhere
:func:`arm` does nothing and says so by returning ``False``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import sys

_CLOCK_MONOTONIC = 1
_SIGEV_THREAD = 2
_SIGEVENT_SIZE = 64
"""``sizeof(struct sigevent)`` on Linux: the fields below, then padding."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):
    # struct sigevent with SIGEV_THREAD's members of its union (64-bit Linux).
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),  # union sigval, by its pointer member
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_notify_function", ctypes.c_void_p),
        ("sigev_notify_attributes", ctypes.c_void_p),
        ("_pad", ctypes.c_char * (_SIGEVENT_SIZE - 32)),
    ]


def arm(seconds: float, status: int, stacks_before: float = 0.0) -> bool:
    """End the process with ``status`` in ``seconds``, whatever its threads are doing.

    Nothing can disarm it: call it only once the process is on its way out.

    Args:
        seconds: from now, on the monotonic clock.
        status: the exit status (0-255).
        stacks_before: this many seconds earlier, write every thread's Python
            stack to stderr (0: not at all).

    Returns:
        Whether the timer is set; ``False`` where the C library has no such
        timer (not Linux, not 64-bit) or refused it.
    """
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        create, settime = libc.timer_create, libc.timer_settime
    except AttributeError:  # the C library before glibc 2.34 keeps them in librt
        try:
            rt = ctypes.CDLL("librt.so.1", use_errno=True)
        except OSError:
            return False
        create, settime = rt.timer_create, rt.timer_settime
    event = _Sigevent(
        sigev_value=status,
        sigev_notify=_SIGEV_THREAD,
        sigev_notify_function=ctypes.cast(libc._exit, ctypes.c_void_p).value,
    )
    timer = ctypes.c_void_p()
    if create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
        return False
    whole = int(seconds)
    due = _Itimerspec(it_value=_Timespec(whole, max(1, int((seconds - whole) * 1e9))))
    if settime(timer, 0, ctypes.byref(due), None) != 0:
        return False
    if stacks_before > 0:
        # No stderr to write to (closed, or not a file): the exit alone, then.
        with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
            faulthandler.dump_traceback_later(max(seconds - stacks_before, 0.001), exit=False)
    return True
