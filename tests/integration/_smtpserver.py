"""A real SMTP server on loopback (aiosmtpd) that delivers into a Maildir, with hostile modes.

Run as ``python -m tests.integration._smtpserver MAILDIR MODE``; it prints
its port on one line when it listens.

- ``ok``: accept and deliver.
- ``drop_after_data``: deliver the message, then drop the connection before
  the final reply (the client cannot know it was accepted).
- ``slow_reply``: deliver, then wait 30 s before replying (a client timeout).
- ``drop_before_delivery``: drop the connection once the message is in, without
  delivering it (the client cannot know; nothing landed).
- ``tempfail``: answer ``451`` to DATA; nothing is delivered.
- ``reject``: answer ``550`` to RCPT; nothing is delivered.

A file ``MAILDIR.next`` holding a mode name applies that mode to the next
message only (then it is removed): a test switches behaviour without a restart.
"""

from __future__ import annotations

import asyncio
import mailbox
import socket
import sys
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP


class Handler:
    def __init__(self, maildir: Path, mode: str) -> None:
        self.box = mailbox.Maildir(maildir, create=True)
        self.mode = mode
        self.next_mode = maildir.with_name(maildir.name + ".next")

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.mode == "reject":
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mode = self.mode
        if self.next_mode.exists():
            mode = self.next_mode.read_text().strip()
            self.next_mode.unlink()
        if mode == "tempfail":
            return "451 4.3.0 try again later"
        if mode == "drop_before_delivery":
            server.transport.abort()  # nothing delivered, and the client hears nothing
            return "451 4.3.0 never sent"
        message = message_from_bytes(envelope.original_content, policy=default_policy)
        self.box.add(message)  # delivered: the world has it now
        if mode == "drop_after_data":
            server.transport.abort()
            return "250 OK"
        if mode == "slow_reply":
            await asyncio.sleep(30)
        return "250 OK"


async def serve(maildir: Path, mode: str) -> None:
    handler = Handler(maildir, mode)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(handler, hostname="mail.test"), sock=sock)
    print(sock.getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), sys.argv[2]))
