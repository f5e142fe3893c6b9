"""Running the console: bind, say where to log in, serve under uvicorn until stopped.

The socket is bound before anything is printed, so the URL printed is the
one that answers (``--port 0`` picks a free port). The URL with the token is
printed once, on standard output, and only when the token was generated
here: a token given by flag or environment is already known to whoever
started the console. uvicorn's access log is off, since a login URL carries
the token in its query; errors still go to kinbox's log, secrets masked.
"""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn

from kinbox.console.app import create_app
from kinbox.console.settings import ConsoleSettings
from kinbox.console.state import Console
from kinbox.kafka.publisher import dead_letter_publisher

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (IPv6 when ``host`` is one).

    Raises:
        OSError: the address is taken or not this machine's.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(settings: ConsoleSettings, *, token_generated: bool) -> None:
    """Serve the console until SIGINT or SIGTERM."""
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    base = f"http://{shown_host}:{port}"
    if token_generated:
        print(f"kinbox console: open {base}/login?token={settings.token}", flush=True)
    else:
        print(f"kinbox console: open {base}/login (with the token you gave)", flush=True)
    mode = "actions allowed" if settings.allow_actions else "read-only"
    log.info("kinbox console serving on %s (%s)", base, mode)
    if not settings.loopback:
        log.warning(
            "the console listens on %s, reachable from other machines: it is plain HTTP, "
            "so put it behind a TLS proxy", settings.host,
        )  # fmt: skip
    console = Console(settings, dead_letter_publisher)
    config = uvicorn.Config(
        create_app(console), log_config=None, access_log=False, server_header=False,
        lifespan="on", timeout_graceful_shutdown=5,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    sys.stdout.flush()
