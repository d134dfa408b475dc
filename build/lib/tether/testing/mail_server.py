"""A reference mail server: SMTP on loopback (aiosmtpd) delivering every message into a Maildir.

It ships with tether for the support-desk demo, beside the reference effects
service. The Maildir is the recipient's side of the world: what it holds is
what was really delivered, counted apart from anything the run believes, and
:class:`~tether.adapters.MaildirLookup` can search it by ``Message-ID``.

Run it as ``python -m tether.testing.mail_server --maildir DIR [--port 0]``;
it prints one JSON line ``{"host": ..., "port": ...}`` when it listens and
serves until it is terminated. It needs ``aiosmtpd`` (``pip install
'tether[demo]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mailbox
import socket
import sys
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path

from aiosmtpd.smtp import SMTP, Envelope, Session

HOST = "127.0.0.1"


class MaildirHandler:
    """Accepts every recipient and delivers each message into one Maildir before replying."""

    def __init__(self, maildir: Path) -> None:
        self.box = mailbox.Maildir(maildir, create=True)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        # Delivered before the 250 goes out, as a real server commits before it
        # answers: a client that dies waiting for the reply left a message behind.
        self.box.add(message_from_bytes(content, policy=default_policy))
        return "250 OK delivered"


async def serve(maildir: Path, port: int) -> None:
    """Listen on loopback (``port`` 0: any free one), print where, deliver until cancelled."""
    handler = MaildirHandler(maildir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(16)  # connections queue from now on, before the loop serves them
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(handler, hostname="mail.demo.test"), sock=sock)
    print(json.dumps({"host": HOST, "port": sock.getsockname()[1]}), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Serve the Maildir named on the command line."""
    parser = argparse.ArgumentParser(prog="python -m tether.testing.mail_server")
    parser.add_argument("--maildir", type=Path, required=True, help="where messages are delivered")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0: any free one)")
    args = parser.parse_args(argv)
    # Ctrl-C at the demo's terminal reaches its services too: stop, without a traceback.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.maildir, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
