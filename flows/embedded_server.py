"""The embedded Prefect API server process that `flows/cli.py` starts
(`python -m flows.embedded_server PORT [PARENT_PID [READY_FD]]`).

uvicorn serving Prefect's app as `prefect server start` does, with one difference that matters to a CLI:
after SIGTERM (the CLI stopping it, or the CLI's death through PR_SET_PDEATHSIG) the process is gone
within GRACE_S seconds even when the graceful shutdown hangs (and it stops by itself once orphaned): a server left running would keep its
port, ~200 MB, and whatever output pipe the CLI was started with (a caller reading the CLI's output
to its end would wait forever). Exit code 3 when it could not start (e.g. the port was taken), as
uvicorn's own command. READY_FD: a pipe's write end that gets one byte once the app has started and the port
listens, so the CLI waits without polling /health (every poll is a request the booting server must serve,
on the cores it boots on).
Deliberately imports no Prefect here: uvicorn imports the app factory itself.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import uvicorn

GRACE_S = 10.0
STARTUP_FAILURE = 3


class _Server(uvicorn.Server):
    ready_fd: int | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.ready_fd is not None:
            os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)
            self.ready_fd = None

    def handle_exit(self, sig, frame) -> None:
        timer = threading.Timer(GRACE_S, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
        super().handle_exit(sig, frame)


def _exit_when_orphaned(server: _Server, parent: int) -> None:
    """Belt and braces for the parent-death signal (seen not to arrive): poll the parent pid."""
    while not server.should_exit:
        if os.getppid() != parent:
            server.handle_exit(signal.SIGTERM, None)
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    port, parent = int(args[0]), int(args[1]) if len(args) > 1 else os.getppid()
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on", timeout_graceful_shutdown=5)
    server = _Server(config)
    server.ready_fd = int(args[2]) if len(args) > 2 else None
    threading.Thread(target=_exit_when_orphaned, args=(server, parent), daemon=True).start()
    server.run()
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())
