"""A child process that cannot outlive its parent: Linux's parent-death signal.

Used for the local services of :mod:`kinbox.devstack` and for the members of
``kinbox worker --processes N``: if the parent dies for any reason, even
SIGKILL, the kernel signals the child, so nothing it started is left running
(no broker, no postgres, no group member consuming on its own).
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int, parent: int | None = None) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies.

    The signal is tied to the parent *thread* that started this process, and
    is cleared by a change of credentials: call this after ``setuid``.

    Args:
        signum: the signal to receive.
        parent: the pid the caller expects as its parent. The kernel only
            covers a parent that dies after the call; if this one is gone
            already (the process was re-parented), ``signum`` is raised now.

    Raises:
        OSError: the kernel refused the request.
    """
    if not sys.platform.startswith("linux"):
        return  # no parent-death signal elsewhere; the parent's own cleanup must do
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)
