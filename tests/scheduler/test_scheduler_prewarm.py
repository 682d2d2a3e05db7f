"""Property tests of pre-warming: the standby window a culled kernel gets from its session's own history."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_notebookos.scheduler import PrewarmSettings, standby_window
from jupyter_notebookos.scheduler.prewarm import nearest_rank

gaps = st.lists(st.floats(min_value=0, max_value=30 * 86400, allow_nan=False), max_size=40)
quantiles = st.floats(min_value=0.01, max_value=1.0)
settings_st = st.builds(
    PrewarmSettings,
    quantile=quantiles,
    max_standby_s=st.floats(min_value=0, max_value=86400),
    min_history=st.integers(min_value=0, max_value=5),
    default_standby_s=st.floats(min_value=0, max_value=86400),
    margin=st.floats(min_value=1, max_value=3),
)


@given(gaps, settings_st)
def test_the_window_is_never_negative_nor_past_the_cap(history, settings):
    window = standby_window("k", history, settings)
    assert 0 <= window.standby_s <= settings.max_standby_s
    assert window.kernel_id == "k" and "k" in str(window)


@given(gaps, settings_st)
def test_a_session_with_too_little_history_gets_the_default(history, settings):
    window = standby_window("k", history, settings)
    if len(history) < max(1, settings.min_history):
        assert window.standby_s == min(settings.default_standby_s, settings.max_standby_s)


@given(st.lists(st.floats(min_value=0, max_value=86400), min_size=1, max_size=40), quantiles)
def test_the_window_covers_at_least_the_quantile_of_past_returns(history, quantile):
    settings = PrewarmSettings(quantile=quantile, max_standby_s=10 * 86400, margin=1.0)
    window = standby_window("k", history, settings)
    covered = sum(1 for g in history if window.covers(g))
    if window.standby_s > 0:
        assert covered >= quantile * len(history) - 1e-9


@given(st.lists(st.floats(min_value=0, max_value=86400), min_size=1, max_size=40), quantiles, quantiles)
def test_a_higher_quantile_never_shortens_the_window(history, q1, q2):
    low, high = sorted((q1, q2))
    a = standby_window("k", history, PrewarmSettings(quantile=low)).standby_s
    b = standby_window("k", history, PrewarmSettings(quantile=high)).standby_s
    assert a <= b


@given(st.lists(st.floats(min_value=0, max_value=86400), min_size=1, max_size=40), st.floats(0, 86400))
def test_a_longer_return_never_shortens_the_next_window(history, extra):
    settings = PrewarmSettings(quantile=0.9, max_standby_s=10 * 86400)
    before = standby_window("k", history, settings).standby_s
    after = standby_window("k", [*history, max(history) + extra], settings).standby_s
    assert after >= before


@given(gaps)
def test_quantile_zero_or_no_cap_turns_it_off(history):
    assert standby_window("k", history, PrewarmSettings(quantile=0.0, default_standby_s=600)).standby_s == 0
    assert standby_window("k", history, PrewarmSettings(max_standby_s=0, default_standby_s=600)).standby_s == 0
    assert not standby_window("k", history, PrewarmSettings(quantile=0.0)).covers(0.0)


def test_nearest_rank_and_bad_settings():
    assert nearest_rank([5, 1, 3, 2, 4], 0.5) == 3
    assert nearest_rank([5, 1, 3, 2, 4], 1.0) == 5
    assert nearest_rank([7], 0.01) == 7
    for bad in ({"quantile": 1.5}, {"max_standby_s": -1}, {"min_history": -1}, {"margin": 0.5}):
        with pytest.raises(ValueError):
            PrewarmSettings(**bad)
