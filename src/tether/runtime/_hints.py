"""What a refusal tells a person to do next: the commands to run, written once.

The runtime's refusals name commands of the ``tether`` CLI; keeping their
spelling here means a renamed option is changed in one place, and a test
(``tests/unit/test_setup_messages.py``) reads each message a new user meets.
"""

from __future__ import annotations

from tether.crypto import Role, TrustRoots


def trusts(trust: TrustRoots | None, role: Role) -> bool:
    """Whether ``trust`` names anyone in ``role`` (so their signatures can be checked)."""
    return trust is not None and role in trust.roles()


def trust_roots(role: Role | str, *, given: bool = False) -> str:
    """How to give a runtime the trust roots that let it check what a ``role`` signs."""
    name = Role(role).value
    have = (
        f"this runtime's trust roots name no {name}"
        if given
        else "this runtime was given no trust roots"
    )
    article = "an" if name[0] in "aeiou" else "a"
    return (
        f"{have}, so it cannot check what {article} {name} signs: make the {name}'s key "
        f"(`tether keys new --role {name} --id NAME --out people`; NAME.key stays with the "
        f"person), trust its public half (`tether trust add people/NAME.trust.json --out "
        f'trust.json`) and give the runtime trust=tether.TrustRoots.from_file("trust.json")'
    )


def review(run_id: str, case_id: str | None) -> str:
    """How a reviewer decides an open review case."""
    case = case_id or "CASE"
    return (
        f"a reviewer decides it: `tether review {run_id} {case} --decision DECISION --store "
        f"STORE --key REVIEWER.key` (`tether inspect {run_id}` shows the case); nothing is "
        "sent again until then"
    )
