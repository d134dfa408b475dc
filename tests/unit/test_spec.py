"""Task specs and policies load strictly and name the field that is wrong."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import make_policy, make_task
from tether.core import Policy, SpecError, TaskSpec, digest

FP = "sha256:" + "a" * 64


def task_doc(**changes: Any) -> dict[str, Any]:
    doc = make_task(FP).to_json()
    doc.update(changes)
    return doc


def test_a_valid_task_round_trips_through_json() -> None:
    """A task spec written by to_json loads back equal, with the same fingerprint."""
    task = make_task(FP)
    again = TaskSpec.from_json(json.dumps(task.to_json()))
    assert again == task and again.fingerprint == task.fingerprint


def test_a_fingerprint_made_once_is_the_digest_of_each_object() -> None:
    """A policy's and a task's fingerprints are their documents' digests, a replaced copy its own."""
    policy, task = make_policy(), make_task(FP)
    assert policy.fingerprint == digest(policy.to_json()) == policy.fingerprint
    assert task.fingerprint == digest(task.to_json())
    stricter = replace(policy, approval_ttl_s=policy.approval_ttl_s + 1)
    assert stricter.fingerprint == digest(stricter.to_json()) != policy.fingerprint
    assert stricter == replace(policy, approval_ttl_s=policy.approval_ttl_s + 1)
    other = replace(task, budgets=replace(task.budgets, steps=task.budgets.steps + 1))
    assert other.fingerprint == digest(other.to_json()) != task.fingerprint
    assert other.scenario_fingerprint == task.scenario_fingerprint


def test_duplicate_keys_are_refused() -> None:
    """A document with a key twice is refused rather than silently keeping one."""
    text = json.dumps(task_doc())[:-1] + ', "task_id": "other"}'
    with pytest.raises(SpecError, match="duplicate key 'task_id'"):
        TaskSpec.from_json(text)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(constant: str) -> None:
    """NaN and Infinity are not JSON and are refused."""
    text = json.dumps(task_doc()).replace('"cost": 100', f'"cost": {constant}')
    with pytest.raises(SpecError, match="not JSON"):
        TaskSpec.from_json(text)


@pytest.mark.parametrize("value", [True, 1.5, "3", None])
def test_a_non_integer_budget_is_refused_naming_the_field(value: object) -> None:
    """A boolean, float, string or null where an integer belongs names budgets.steps."""
    doc = task_doc()
    doc["budgets"]["steps"] = value
    with pytest.raises(SpecError) as caught:
        TaskSpec.from_json(doc)
    assert caught.value.field == "budgets.steps"


def test_unknown_fields_are_refused_naming_the_field() -> None:
    """An extra field, top level or nested, is named in the error."""
    with pytest.raises(SpecError) as caught:
        TaskSpec.from_json(task_doc(colour="blue"))
    assert caught.value.field == "colour"
    doc = task_doc()
    doc["verifier"]["shell"] = True
    with pytest.raises(SpecError) as caught:
        TaskSpec.from_json(doc)
    assert caught.value.field == "verifier.shell"


def test_a_missing_field_is_named() -> None:
    """A missing required field is named."""
    doc = task_doc()
    del doc["budgets"]["cost"]
    with pytest.raises(SpecError) as caught:
        TaskSpec.from_json(doc)
    assert (caught.value.field, caught.value.problem) == ("budgets.cost", "missing")


@pytest.mark.parametrize(
    "path", ["../etc/passwd", "a/../b", "./a", "a//b", "/abs", "a\\b", "", "a/./b", "a\x00b"]
)
def test_traversal_and_non_canonical_paths_are_refused(path: str) -> None:
    """Allowed paths must be canonical, relative and free of traversal."""
    with pytest.raises(SpecError) as caught:
        TaskSpec.from_json(task_doc(allowed_paths=[path]))
    assert caught.value.field == "allowed_paths[0]"


def test_directory_prefixes_allow_only_what_is_under_them() -> None:
    """ "src/" allows src/a.py but not src2/a.py or src itself."""
    task = TaskSpec.from_json(task_doc(allowed_paths=["src/"]))
    assert task.allows_target("src/a.py")
    assert not task.allows_target("src2/a.py")
    assert not task.allows_target("src")


def test_fingerprint_changes_with_any_content() -> None:
    """Editing a task without bumping its version still changes its fingerprint."""
    assert make_task(FP).fingerprint != make_task(FP, budgets={"steps": 21}).fingerprint
    assert (
        make_task(FP).scenario_fingerprint != make_task("sha256:" + "b" * 64).scenario_fingerprint
    )


def test_policy_refuses_unknown_risk_and_bad_types() -> None:
    """A policy with an unknown risk class, or a bool for its TTL, names the field."""
    doc = make_policy().to_json()
    doc["kinds"]["file.write"]["risk"] = "spicy"
    with pytest.raises(SpecError) as caught:
        Policy.from_json(doc)
    assert caught.value.field == "kinds.file.write.risk"
    doc = make_policy().to_json()
    doc["approval_ttl_s"] = True
    with pytest.raises(SpecError) as caught:
        Policy.from_json(doc)
    assert caught.value.field == "approval_ttl_s"


def test_invalid_utf8_is_refused() -> None:
    """Bytes that are not UTF-8 are refused as a document error."""
    with pytest.raises(SpecError, match="not UTF-8"):
        TaskSpec.from_json(b'{"task_id": "\xff"}')


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("policy", {"approval_ttl_s": 10**12}),
        ("task", {"budgets": {"wall_time_s": 10**12}}),
        ("task", {"budgets": {"steps": 10**13}}),
        ("task", {"verifier": {"argv": ["python"], "timeout_s": 10**9}}),
    ],
)
def test_numbers_past_their_documented_maxima_fail_at_load(where: str, change: dict) -> None:
    """A huge ttl, budget or timeout is a SpecError at load, never an overflow mid-run."""
    from tests.conftest import make_policy, make_task

    with pytest.raises(SpecError, match="must be <="):
        if where == "policy":
            make_policy(**change)
        else:
            make_task("sha256:" + "0" * 64, **change)


def test_sensitive_is_optional_and_leaves_older_policies_unchanged() -> None:
    """A policy that never says "sensitive" (or says false) keeps the fingerprint it had."""
    plain = make_policy()
    doc = plain.to_json()
    assert "sensitive" not in json.dumps(doc)
    doc["kinds"]["file.write"]["sensitive"] = False
    assert Policy.from_json(doc).fingerprint == plain.fingerprint
    doc["kinds"]["file.write"]["sensitive"] = True
    marked = Policy.from_json(doc)
    assert marked.kinds["file.write"].sensitive and not marked.kinds["file.read"].sensitive
    assert marked.fingerprint != plain.fingerprint
    assert Policy.from_json(marked.to_json()).kinds["file.write"].sensitive


@pytest.mark.parametrize("value", ["yes", None, 1])
def test_sensitive_must_be_a_boolean(value: object) -> None:
    """A sensitive flag that is not true or false (null included) names its field."""
    doc = make_policy().to_json()
    doc["kinds"]["file.write"]["sensitive"] = value
    with pytest.raises(SpecError) as caught:
        Policy.from_json(doc)
    assert caught.value.field == "kinds.file.write.sensitive"


def test_a_policy_silent_on_authority_keeps_its_fingerprint_and_defaults() -> None:
    """Authority is written only when set: older policies keep their fingerprints."""
    policy = make_policy()
    assert "authority" not in policy.to_json()
    assert policy.authority.recover == frozenset({"worker", "operator"})
    assert policy.authority.rewind == frozenset({"operator", "reviewer"})
    custom = make_policy(authority={"rewind": ["agent", "operator"]})
    assert custom.fingerprint != policy.fingerprint
    assert Policy.from_json(json.dumps(custom.to_json())) == custom


@pytest.mark.parametrize(
    ("authority", "field"),
    [
        ({"recover": ["agent"]}, "authority.recover"),
        ({"rewind": ["janitor"]}, "authority.rewind"),
        ({"read_secrets": "operator"}, "authority.read_secrets"),
        ({"secrets_withheld": "shrug"}, "authority.secrets_withheld"),
        ({"policy_change": "anything"}, "authority.policy_change"),
        ({"recover": ["worker"], "extra": 1}, "authority.extra"),
    ],
)
def test_authority_refuses_unknown_roles_and_values(authority: Any, field: str) -> None:
    """Only the agent may be named beyond the principal roles, and only for a rewind."""
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        make_policy(authority=authority)


def test_a_task_may_name_no_verifier_and_a_task_that_names_one_keeps_its_fingerprint() -> None:
    """Leaving the verifier out parses (None) and changes both fingerprints; naming one is as before."""
    named = make_task("sha256:" + "a" * 64)
    body = named.to_json()
    assert body["verifier"] == {"argv": ["python", "-c", "pass"], "timeout_s": 30}
    body.pop("verifier")
    bare = TaskSpec.from_json(json.dumps(body))
    assert bare.verifier is None and "verifier" not in bare.to_json()
    assert bare.fingerprint != named.fingerprint
    assert bare.scenario_fingerprint != named.scenario_fingerprint
    assert TaskSpec.from_json(json.dumps(named.to_json())).fingerprint == named.fingerprint
