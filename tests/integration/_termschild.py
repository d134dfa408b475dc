"""A child process for the terms-binding test: places one order over HTTP, and may die.

``python -m tests.integration._termschild DIR URL VERSION``: ``DIR`` holds the run's
SQLite store and keyring; ``URL`` is the shop's order endpoint. ``v1`` sends no
Idempotency-Key and declares nothing, and kills itself with SIGKILL right after the
shop answered the POST (before tether recorded the receipt). ``v2`` is the upgraded
code: it sends ``tether.current_key()`` as the Idempotency-Key and declares
``idempotent=True``. Prints the call's outcome (or the review reason it raised) and the run's phase.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import tether
from tests.integration._fnchild import runtime
from tether import effects
from tether.core import NeedsReviewError


def _post(url: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def main(root: Path, url: str, version: str) -> None:
    if version == "v1":

        @tether.effect("shop.order")
        def order(item: str) -> dict[str, Any]:
            answer = _post(url, {"item": item}, None)
            os.kill(os.getpid(), signal.SIGKILL)  # the shop holds the order; no receipt yet
            return answer

    else:

        @tether.effect("shop.order", idempotent=True)
        def order(item: str) -> dict[str, Any]:
            return _post(url, {"item": item}, tether.current_key())

    with effects.run(runtime(root, order.adapter), "r") as run:
        try:
            said = order("book").outcome
        except NeedsReviewError as caught:
            said = f"review:{caught.reason}"
        print(said, run.phase.value)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
