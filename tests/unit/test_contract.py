"""The local-only deployment contract: recorded in every checkpoint, refused where it cannot hold."""

from __future__ import annotations

import pytest

from tests.conftest import ScriptedAgent, World, write
from tether.adapters import Adapters, HttpEffect, SmtpEffect, external_effects
from tether.core import (
    Contract,
    ContractMismatchError,
    ExternalEffectsError,
    RunState,
    SpecError,
    UnknownFieldError,
)


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "hello\n")])


def test_a_local_only_run_records_its_contract_in_every_checkpoint(world: World) -> None:
    """Sandbox only: allowed; the contract is in the signed state, also after a recovery."""
    rt = world.runtime(agent(), contract="local-only")
    session = rt.start("r1")
    session.step()
    session.land_deferred()  # the write's receipt rides on the next commit: land it now
    assert session.state.contract is Contract.LOCAL_ONLY
    assert session.state.to_json()["contract"] == "local-only"
    again = world.runtime(agent(), contract=Contract.LOCAL_ONLY).recover("r1")
    assert again.state.contract is Contract.LOCAL_ONLY and again.state.writes_committed == 1


def test_adapters_that_reach_the_world_are_refused_under_local_only(world: World) -> None:
    """HTTP and SMTP declare external effects: a local-only runtime refuses them at construction."""
    smtp = SmtpEffect("127.0.0.1", 25, sender="a@b.test", domain="b.test", instance_id="i")
    with HttpEffect("http://127.0.0.1:9") as http:
        both = Adapters(world.sandbox, http, smtp)
        assert external_effects(both) == ("http", "smtp")
        assert external_effects(world.sandbox) == ()
        with pytest.raises(ExternalEffectsError) as caught:
            world.runtime(agent(), adapter=both, contract="local-only")
        assert caught.value.external == ("http", "smtp")
        world.runtime(agent(), adapter=both)  # the standard contract allows them


def test_a_recovery_under_another_contract_is_refused(world: World) -> None:
    """The run was judged under its own contract; recovering it under another fails closed."""
    world.runtime(agent()).start("r2")
    world.runtime(agent(), contract="local-only").start("r1").step()
    with pytest.raises(ContractMismatchError) as caught:
        world.runtime(agent()).recover("r1")
    assert caught.value.expected == "standard" and caught.value.actual == "local-only"
    with pytest.raises(ContractMismatchError):
        world.runtime(agent(), contract="local-only").recover("r2")


def test_a_checkpoint_written_before_the_contract_existed_reads_as_standard(world: World) -> None:
    """An older payload without the field still loads; an unknown contract is refused."""
    state = world.runtime(agent()).start("r1").state
    older = state.to_json()
    del older["contract"]
    assert RunState.from_json(older).contract is Contract.STANDARD
    with pytest.raises(UnknownFieldError):
        RunState.from_json({**older, "contract": "mostly-local"})


def test_an_unknown_contract_name_is_a_spec_error(world: World) -> None:
    """A typo never silently means the standard contract."""
    with pytest.raises(SpecError):
        world.runtime(agent(), contract="local_only")
