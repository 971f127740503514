"""`set_graph_mode` / `set_graph_updates`: set by a call, a `with` block or a decorator."""

import threading

import pytest

import pytree_graph as pg
from pytree_graph._graph_mode import resolve_modes


@pytest.mark.parametrize("switch", [pg.set_graph_mode, pg.set_graph_updates])
def test_with_block_restores_the_value_before_it(switch):
    assert switch.current_value() is True
    with switch(False):
        assert switch.current_value() is False
        with switch(True):
            assert switch.current_value() is True
        assert switch.current_value() is False
    assert switch.current_value() is True


@pytest.mark.parametrize("switch", [pg.set_graph_mode, pg.set_graph_updates])
def test_a_plain_call_holds_until_changed(switch):
    try:
        switch(False)
        assert switch.current_value() is False
        assert resolve_modes(None, None) == (
            switch is not pg.set_graph_mode,
            switch is not pg.set_graph_updates,
        )
    finally:
        switch(True)
    assert switch.current_value() is True


def test_decorator_sets_the_value_for_each_call_only():
    @pg.set_graph_mode(False)
    def inside():
        return pg.set_graph_mode.current_value()

    assert pg.set_graph_mode.current_value() is True
    assert inside() is False
    assert pg.set_graph_mode.current_value() is True


def test_decorator_restores_after_an_exception():
    @pg.set_graph_updates(False)
    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fails()
    assert pg.set_graph_updates.current_value() is True


def test_each_thread_has_its_own_setting():
    seen = []
    with pg.set_graph_mode(False):
        thread = threading.Thread(target=lambda: seen.append(pg.set_graph_mode.current_value()))
        thread.start()
        thread.join()
    assert seen == [True]


def test_explicit_arguments_win_over_the_switch():
    with pg.set_graph_mode(False), pg.set_graph_updates(False):
        assert resolve_modes(True, True) == (True, True)
        assert resolve_modes(None, None) == (False, False)


@pytest.mark.parametrize("bad", [0, 1, "no", None])
def test_non_booleans_are_refused(bad):
    with pytest.raises(TypeError, match="set_graph_mode takes True or False"):
        pg.set_graph_mode(bad)
    assert pg.set_graph_mode.current_value() is True
    with pytest.raises(TypeError, match="graph= takes True, False or None"):
        resolve_modes(1, None)
