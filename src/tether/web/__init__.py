"""The operator web page (``tether serve``): runs, one run, the inbox, and signed actions.

Needs the ``[web]`` extra (starlette, jinja2, uvicorn, python-multipart).
Templates and static files ship in this package; the page loads nothing
from elsewhere. It reads through the public API of ``runtime``, ``core``,
``crypto`` and ``store`` and signs with core's own document builders.
"""

from tether.web._actions import ActionRefusedError, Prepared
from tether.web._app import WebConfig, create_app
from tether.web._server import serve

__all__ = ["ActionRefusedError", "Prepared", "WebConfig", "create_app", "serve"]
