"""Property tests of buffer sizing from observed arrivals (the ready-host buffer)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_notebookos.scheduler import HostSpec, RunCell, Scheduler
from jupyter_notebookos.scheduler.arrivals import ArrivalLog, poisson_quantile

means = st.floats(min_value=0, max_value=200, allow_nan=False)
probabilities = st.floats(min_value=0.01, max_value=0.999)


def _cdf(mean: float, k: int) -> float:
    return sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k + 1))


@given(st.floats(min_value=0.01, max_value=50), probabilities)
def test_the_poisson_quantile_is_the_smallest_count_reaching_the_probability(mean, probability):
    k = poisson_quantile(mean, probability)
    assert _cdf(mean, k) >= probability - 1e-12
    assert k == 0 or _cdf(mean, k - 1) < probability


@given(means, means, probabilities)
def test_more_expected_arrivals_never_mean_fewer_ready_hosts(a, b, probability):
    low, high = sorted((a, b))
    assert poisson_quantile(low, probability) <= poisson_quantile(high, probability)


@given(
    st.lists(st.tuples(st.floats(0, 7200), st.sampled_from([1, 4, 8])), max_size=60),
    st.integers(0, 4),
    st.integers(0, 10),
)
def test_the_buffer_stays_within_its_floor_and_ceiling_and_counts_only_the_window(arrivals, floor, ceiling):
    log = ArrivalLog(1800.0)
    for t, gpus in sorted(arrivals):
        log.record(t, gpus)
    now = 7200.0
    buffer = log.ready_buffer(now, 8, 240.0, 0.99, floor, ceiling)
    assert floor <= buffer.hosts <= max(floor, ceiling)
    assert buffer.arrivals == sum(1 for t, g in arrivals if g >= 8 and t > now - 1800.0)
    assert buffer.expected == pytest.approx(buffer.arrivals / 1800.0 * 240.0)
    assert "ready" in str(buffer)


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        ArrivalLog(0)
    with pytest.raises(ValueError):
        poisson_quantile(1.0, 1.0)
    assert poisson_quantile(0.0, 0.99) == 0
    assert poisson_quantile(10_000.0, 0.5) == pytest.approx(10_000, abs=2)


def _busy_scheduler(probability: float) -> Scheduler:
    return Scheduler(
        hosts=[HostSpec(f"h{i}", 8) for i in range(12)],
        min_hosts=1,
        ready_host_buffer=3,
        ready_host_probability=probability,
        ready_host_min=1,
        ready_host_max=6,
        scale_in_delay_s=0,
    )


def test_a_burst_of_large_cells_raises_the_autoscaling_target_and_a_quiet_hour_lowers_it():
    busy = _busy_scheduler(0.99)
    for n in range(6):  # six 8-GPU cells in 10 minutes: 0.8 expected per 4-minute lead time -> 3 ready hosts
        busy.start_kernel(f"k{n}", 8, 0.0)
        assert isinstance(busy.request_cell(f"k{n}", "c", 100.0 * n), RunCell)
    burst = busy.ready_buffer(600.0)
    assert burst.arrivals == 6 and burst.hosts == poisson_quantile(6 / 1800 * 240, 0.99) >= 3
    assert f"+ {burst.hosts} ready" in busy.autoscale(600.0).reason
    quiet = busy.ready_buffer(600.0 + 3600.0)
    assert quiet.arrivals == 0 and quiet.hosts == 1  # the floor
    assert "+ 1 ready" in busy.autoscale(600.0 + 3600.0).reason
    fixed = _busy_scheduler(0.0)
    fixed.start_kernel("k", 8, 0.0)
    assert "+ 3 ready" in fixed.autoscale(4000.0).reason
