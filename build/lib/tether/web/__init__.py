"""The operator web page (``tether serve``): runs, one run, the inbox, and signed actions.

Needs the ``[web]`` extra (starlette, jinja2, uvicorn, python-multipart).
Templates and static files ship in this package; the page loads nothing
from elsewhere. It reads and prepares documents through ``tether.runtime``'s operator
layer (the same the CLI uses) and the public API of ``core``, ``crypto``
and ``store``.
"""

from tether.web._actions import ActionRefusedError, Draft
from tether.web._app import WebConfig, create_app
from tether.web._server import serve

__all__ = ["ActionRefusedError", "Draft", "WebConfig", "create_app", "serve"]
