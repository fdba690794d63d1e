"""The lifecycle table: every one of the 14 x 14 pairs is allowed exactly when the spec says so."""

from __future__ import annotations

import itertools

import pytest

from atrium.lifecycle.states import (
    HOOK_BEFORE,
    TRANSITIONS,
    Hook,
    InstanceState,
    hook_before,
    is_allowed,
)

S = InstanceState

#: the table of docs/api.md "States" written out once more, row by row
SPEC_ROWS: dict[InstanceState, set[InstanceState]] = {
    S.INSTALLED: {S.CREATING},
    S.CREATING: {S.CREATED, S.ERROR},
    S.CREATED: {S.STARTING},
    S.STARTING: {S.STARTED},
    S.STARTED: {S.RESUMING, S.STOPPING},
    S.RESUMING: {S.RESUMED},
    S.RESUMED: {S.PAUSING},
    S.PAUSING: {S.PAUSED},
    S.PAUSED: {S.RESUMING, S.STOPPING},
    S.STOPPING: {S.STOPPED},
    S.STOPPED: {S.STARTING, S.DESTROYING},
    S.DESTROYING: {S.DESTROYED},
    S.DESTROYED: {S.INSTALLED},
    S.ERROR: {S.CREATING, S.DESTROYING, S.INSTALLED},
}


def test_there_are_fourteen_states() -> None:
    assert len(InstanceState) == 14
    assert set(TRANSITIONS) == set(InstanceState)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_a_move_is_allowed_exactly_when_the_table_lists_it(
    current: InstanceState, target: InstanceState
) -> None:
    assert is_allowed(current, target) is (target in SPEC_ROWS[current])


@pytest.mark.parametrize(
    ("current", "target", "hook"),
    [
        (S.CREATING, S.CREATED, Hook.ON_CREATE),
        (S.CREATED, S.STARTING, Hook.ON_START),
        (S.STOPPED, S.STARTING, Hook.ON_START),
        (S.STARTED, S.RESUMING, Hook.ON_RESUME),
        (S.PAUSED, S.RESUMING, Hook.ON_RESUME),
        (S.PAUSING, S.PAUSED, Hook.ON_PAUSE),
        (S.STARTED, S.STOPPING, Hook.ON_STOP),
        (S.PAUSED, S.STOPPING, Hook.ON_STOP),
        (S.STOPPED, S.DESTROYING, Hook.ON_DESTROY),
        (S.ERROR, S.DESTROYING, Hook.ON_DESTROY),
    ],
)
def test_each_hook_runs_before_its_moves(
    current: InstanceState, target: InstanceState, hook: Hook
) -> None:
    assert hook_before(current, target) is hook


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.INSTALLED, S.CREATING),
        (S.CREATING, S.ERROR),
        (S.STARTING, S.STARTED),
        (S.RESUMING, S.RESUMED),
        (S.RESUMED, S.PAUSING),
        (S.STOPPING, S.STOPPED),
        (S.DESTROYING, S.DESTROYED),
        (S.DESTROYED, S.INSTALLED),
        (S.ERROR, S.INSTALLED),
        (S.ERROR, S.CREATING),
    ],
)
def test_marker_moves_run_no_hook(current: InstanceState, target: InstanceState) -> None:
    assert hook_before(current, target) is None


def test_an_illegal_move_has_no_hook() -> None:
    assert hook_before(S.INSTALLED, S.RESUMING) is None


def test_every_hook_target_is_reachable() -> None:
    reachable = set().union(*TRANSITIONS.values())
    assert set(HOOK_BEFORE) <= reachable
