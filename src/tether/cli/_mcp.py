"""`tether mcp`: put tether between an agent and an MCP server (see tether.integrations.mcp)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tether.cli._options import add_store


def add_mcp(sub: Any, seconds: Any) -> None:
    """Register ``tether mcp`` on the ``tether`` parser."""
    p = sub.add_parser(
        "mcp",
        help="serve an MCP server's tools over stdio, each effect guarded by a tether run",
        description="An MCP server (stdio) that offers the agent the tools of an upstream MCP "
        "server unchanged and forwards each call through tether run RUN: a read the policy "
        "names passes through, traced; every other tool is an effect, sent once under a key "
        "persisted first, its answer recorded, and never sent again for the same tool and "
        "arguments in the run (a restarted agent gets the recorded answer). The upstream is "
        "started as a child (`-- COMMAND ARGS...`) or reached over streamable HTTP "
        "(--upstream URL). Logs go to stderr; stdout is the MCP channel.",
    )
    add_store(p)
    p.add_argument(
        "--run",
        required=True,
        type=run_id,
        metavar="RUN",
        help="the run every session continues (no spaces, no '/')",
    )
    p.add_argument("--policy", type=Path, help="the gateway's policy file (JSON; default: none)")
    p.add_argument(
        "--keyring",
        type=Path,
        help="the keyring sealing the run's checkpoints (default: $TETHER_KEYRING_FILE)",
    )
    p.add_argument(
        "--trust",
        type=Path,
        help="trust file: the approvers and reviewers whose signatures count (needed when the "
        "policy gates a tool)",
    )
    p.add_argument(
        "--approver-key",
        type=Path,
        metavar="KEY",
        help="an approver's private key (tether keys new --role approver; --trust must name "
        "it): where the agent's MCP client fills in forms (elicitation), a call the policy "
        "gates is put to the person in the client, and their yes is signed with this key as "
        "the operator page signs; without it, or with a client that does not, the call waits "
        "for tether approve",
    )
    p.add_argument(
        "--worker-key",
        type=Path,
        help="this gateway's own signing key, when the trust file names worker principals",
    )
    p.add_argument("--upstream", metavar="URL", help="the upstream's streamable HTTP URL")
    p.add_argument(
        "--upstream-header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header sent to the --upstream URL on every request (repeatable); ${VAR} in the "
        "value is read from the environment, so a token stays out of the command line",
    )
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="TETHER_NAME",
        help="a TETHER_* variable the upstream started after -- may see (repeatable); it sees "
        "every other variable of the gateway's environment, and none of tether's own (keyring, "
        "secret keys, tokens) unless named here",
    )
    p.add_argument(
        "--instance",
        help="the upstream's identity in the run (default: the name the upstream gives itself)",
    )
    p.add_argument(
        "--upstream-moved",
        action="store_true",
        help="continue run RUN with an upstream started or reached otherwise than it was (the "
        "same server at another path or URL); without it, another upstream is refused",
    )
    p.add_argument("--task-id", help="the run's task id (default: mcp:INSTANCE)")
    p.add_argument(
        "--lease-ttl",
        type=seconds,
        default=15.0,
        help="seconds a gateway that died keeps the run held (default 15)",
    )
    p.add_argument(
        "--call-timeout",
        type=seconds,
        default=300.0,
        help="seconds to wait for the upstream's answer to one call (default 300); past it "
        "the outcome is unknown",
    )
    p.add_argument(
        "--print-rules",
        action="store_true",
        help="print the run's task and tether policy (JSON) derived from the upstream's tools "
        "and the policy file, and exit: the policy a person admits with `tether admit --policy` "
        "after the policy file changed",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print --print-rules and a refusal at start as one JSON object on one line "
        "(while serving, stdout is the MCP channel either way)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the upstream MCP server to start as a child, after --",
    )
    p.set_defaults(func=cmd_mcp)


def run_id(text: str) -> str:
    """``--run``: a run id a person can type back (not empty, no whitespace, no ``/``)."""
    if not text or text != text.strip() or any(c.isspace() or c == "/" for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a run id: give a non-empty name without spaces or '/'"
        )
    return text


def cmd_mcp(args: argparse.Namespace) -> int:
    from tether.core import SpecError, TetherError
    from tether.crypto import Keyring, Signer, TrustRoots

    try:
        import anyio

        from tether.integrations.mcp import (
            Gateway,
            GatewayConfig,
            GatewayPolicy,
            Upstream,
            expanded_header,
            stdio_target,
        )
    except ImportError as exc:
        raise TetherError(
            f"tether mcp needs the mcp extra: pip install 'tether[mcp]' ({exc})"
        ) from exc

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if bool(command) == bool(args.upstream):
        raise TetherError(
            "give the upstream either as a command after -- or as --upstream URL (one of them)"
        )
    keyring = Keyring.from_file(args.keyring) if args.keyring else Keyring.from_environ()
    policy = GatewayPolicy()
    if args.policy:
        try:
            text = args.policy.read_bytes()
        except OSError as exc:
            raise SpecError("--policy", f"cannot read {args.policy}: {exc.strerror}") from None
        policy = GatewayPolicy.from_json(text)
    config = GatewayConfig(
        store=args.store,
        run_id=args.run,
        keyring=keyring,
        policy=policy,
        trust=TrustRoots.from_file(args.trust) if args.trust else None,
        principal=Signer.from_file(args.worker_key) if args.worker_key else None,
        instance=args.instance,
        task_id=args.task_id,
        lease_ttl_s=float(args.lease_ttl),
        upstream_moved=bool(args.upstream_moved),
        approver=Signer.from_file(args.approver_key) if args.approver_key else None,
    )
    target = args.upstream if args.upstream else stdio_target(command, os.getcwd(), args.pass_env)
    headers = dict(expanded_header(h, os.environ) for h in args.upstream_header)
    upstream = Upstream(target, timeout_s=float(args.call_timeout), headers=headers)
    gateway = Gateway(config, upstream)
    if args.print_rules:
        rules = anyio.run(gateway.rules_only)
        body = {"task": rules.task.to_json(), "policy": rules.policy.to_json()}
        print(json.dumps(body, sort_keys=True, indent=None if args.json else 2))
        return 0
    anyio.run(gateway.serve_stdio)
    return 0
