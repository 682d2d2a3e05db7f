"""Quotas and fair share: who waits, who is refused and who is picked first, asserted on decision objects."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from jupyter_notebookos.scheduler import (
    HostSpec,
    KernelSpec,
    Limits,
    Owner,
    Placement,
    PlacementRefused,
    QueueDispatch,
    QuotaExceeded,
    Quotas,
    QuotasChanged,
    QuotaWait,
    RejectCell,
    RunCell,
    Scheduler,
    WaitInQueue,
)
from jupyter_notebookos.scheduler.usage import DAY_S, QuotaClock

ALICE = Owner("alice", ("ml",))
BOB = Owner("bob")
CAROL = Owner("carol", ("ml", "vision"))


def cluster(hosts: int = 3, gpus: int = 2, **knobs: object) -> Scheduler:
    return Scheduler(hosts=[HostSpec(f"h{i}", gpus) for i in range(hosts)], **knobs)


def start(s: Scheduler, kernel_id: str, gpus: int, owner: Owner | None, now: float = 0.0) -> None:
    assert isinstance(s.start_kernel(kernel_id, gpus, now, owner), Placement)


# --- the quota values -----------------------------------------------------------------------------------


def test_a_users_limits_come_from_their_entry_then_the_most_generous_group_then_the_default() -> None:
    quotas = Quotas.from_config(
        {
            "default": {"gpus": 2, "kernels": 4, "gpu_hours_per_day": 10},
            "users": {"alice": {"gpus": 6}, "dave": {"gpus": "unlimited"}},
            "groups": {
                "ml": {"gpus": 16, "per_member": {"gpus": 4, "kernels": 8}, "weight": 2},
                "vision": {"per_member": {"kernels": 6, "gpu_hours_per_day": 20}},
            },
        }
    )
    assert quotas.resolve(ALICE, "gpus") == 6  # her own entry, although ml gives members 4
    assert quotas.resolve(CAROL, "gpus") == 4  # ml's per-member value beats the default
    assert quotas.resolve(CAROL, "kernels") == 8  # the most generous of ml (8) and vision (6)
    assert quotas.resolve(CAROL, "gpu_hours_per_day") == 20
    assert quotas.resolve(BOB, "gpus") == 2  # the default
    assert quotas.resolve(Owner("dave"), "gpus") == float("inf")  # "unlimited" lifts the default
    assert quotas.weight(CAROL) == 2 and quotas.weight(BOB) == 1
    assert quotas.group_totals(CAROL, "gpus") == [("ml", 16.0)]
    assert Quotas.from_config(quotas.to_config()) == quotas


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"default": {"gpus": -1}}, "quotas: default.gpus must be >= 0, got -1"),
        ({"users": {"alice": {"gpu": 2}}}, "quotas: users.alice has unknown keys gpu"),
        ({"groups": {"ml": {"weight": 0}}}, "quotas: groups.ml.weight must be > 0"),
        ({"user": {}}, "quotas: unknown keys user"),
        ({"default": {"kernels": "many"}}, "quotas: default.kernels must be a number or 'unlimited', got 'many'"),
    ],
)
def test_a_bad_quota_entry_is_named(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        Quotas.from_config(config)
    with pytest.raises(TraitError, match="quotas"):
        Scheduler(quotas=config)


def test_calendar_windows_start_at_midnight_and_on_monday() -> None:
    clock = QuotaClock()
    assert clock.window(0.0, "day") == (0.0, DAY_S)
    assert clock.window(0.0, "week") == (-3 * DAY_S, 4 * DAY_S)  # 1970-01-01 was a Thursday
    shifted = QuotaClock(offset_s=1000.0, utc_offset_h=2.0)  # scheduler time 0 is Unix 1000, at UTC+2
    start, end = shifted.window(0.0, "day")
    assert start + 1000.0 == -2 * 3600.0 and end - start == DAY_S


# --- admission ------------------------------------------------------------------------------------------


def test_a_kernel_over_the_kernel_quota_is_refused_and_says_so() -> None:
    s = cluster(quotas={"default": {"kernels": 2}})
    start(s, "a1", 1, ALICE)
    start(s, "a2", 1, ALICE)
    refused = s.start_kernel("a3", 1, 0.0, ALICE)
    assert isinstance(refused, PlacementRefused) and not refused.scale_out_would_help
    assert refused.quota == QuotaExceeded("kernels", 2, 2, 1)
    assert "you have 2 kernels of your 2; stop one to start another" in str(refused)
    start(s, "b1", 1, BOB)  # bob has his own two
    s.stop_kernel("a1", 1.0)
    start(s, "a3", 1, ALICE, now=1.0)


def test_a_kernel_asking_more_gpus_per_cell_than_its_quota_is_refused_at_start() -> None:
    s = cluster(quotas={"users": {"alice": {"gpus": 1}}})
    refused = s.start_kernel("a1", 2, 0.0, ALICE)
    assert isinstance(refused, PlacementRefused) and refused.quota is not None
    assert "this kernel asks for 2 GPUs per cell but your quota allows 1 GPU at once" in refused.reason
    start(s, "a2", 1, ALICE)
    rejected = s.request_cell("a2", "c1", 1.0, gpus=2)
    assert isinstance(rejected, RejectCell) and rejected.quota is not None and rejected.quota.limit == "gpus"


def test_a_cell_over_the_gpu_quota_waits_with_the_standard_notice_and_runs_when_the_user_frees_one() -> None:
    s = cluster(quotas={"users": {"alice": {"gpus": 4}}})
    for k in ("a1", "a2", "a3"):
        start(s, k, 2, ALICE)
    assert isinstance(s.request_cell("a1", "c1", 1.0), RunCell)
    assert isinstance(s.request_cell("a2", "c2", 1.0), RunCell)
    waiting = s.request_cell("a3", "c3", 1.0)
    assert isinstance(waiting, WaitInQueue) and not waiting.scale_out_would_help
    assert waiting.quota is not None and waiting.quota.as_tuple() == ("gpus", 4, 4)
    assert waiting.reason == "you are using 4 of your 4 GPUs"
    assert s.quota_wait("a3") == waiting.quota
    # the cluster still has room: another user's cell runs at once
    start(s, "b1", 2, BOB)
    assert isinstance(s.request_cell("b1", "c4", 1.0), RunCell)
    assert s.dispatch_queued(2.0).started == ()  # alice still holds 4
    s.cell_finished("a1", "c1", 3.0)
    dispatched = s.dispatch_queued(3.0)
    assert [d.cell_id for d in dispatched.started] == ["c3"]
    assert s.quota_wait("a3") is None


def test_a_group_total_binds_its_members_together() -> None:
    s = cluster(hosts=4, quotas={"groups": {"ml": {"gpus": 3}}})
    start(s, "a1", 2, ALICE)
    start(s, "c1", 1, CAROL)
    start(s, "c2", 1, CAROL)
    start(s, "b1", 2, BOB)
    assert isinstance(s.request_cell("a1", "x1", 1.0), RunCell)
    assert isinstance(s.request_cell("c1", "x2", 1.0), RunCell)
    waiting = s.request_cell("c2", "x3", 1.0)
    assert isinstance(waiting, WaitInQueue) and waiting.quota == QuotaWait("gpus", 3, 3, 1, "ml")
    assert waiting.reason == "your group ml is using 3 of its 3 GPUs"
    assert isinstance(s.request_cell("b1", "x4", 1.0), RunCell)  # bob is not in ml


def test_a_quota_wait_does_not_ask_for_hosts() -> None:
    s = cluster(hosts=3, gpus=2, quotas={"users": {"alice": {"gpus": 2}}}, min_hosts=3, ready_host_buffer=0)
    for k in ("a1", "a2"):
        start(s, k, 2, ALICE)
    s.request_cell("a1", "c1", 1.0)
    s.request_cell("a2", "c2", 1.0)
    assert s.dispatcher.gpus_waiting() == 0  # more hosts would not run c2
    assert s.autoscale(60.0).add_hosts == 0


def test_spent_gpu_hours_refuse_the_next_cell_until_the_day_resets() -> None:
    s = cluster(quotas={"default": {"gpu_hours_per_day": 2}})
    start(s, "a1", 2, ALICE)
    assert isinstance(s.request_cell("a1", "c1", 0.0), RunCell)
    s.cell_finished("a1", "c1", 3600.0)  # 2 GPUs for an hour: 2 GPU-hours
    refused = s.request_cell("a1", "c2", 3700.0)
    assert isinstance(refused, RejectCell) and refused.quota is not None
    assert refused.quota.limit == "gpu_hours_per_day" and refused.quota.resets_at == DAY_S
    assert str(refused.quota) == "you have used 2.0 of your 2 GPU-hours this day; the limit resets in 22 h 59 min"
    assert isinstance(s.request_cell("a1", "c3", 3700.0, gpus=0), RunCell)  # a cell without GPUs still runs
    s.cell_finished("a1", "c3", 3701.0)
    assert isinstance(s.request_cell("a1", "c4", DAY_S + 1.0), RunCell)


def test_a_cell_queued_when_the_hours_ran_out_is_refused_at_dispatch() -> None:
    s = cluster(hosts=3, gpus=1, quotas={"users": {"alice": {"gpu_hours_per_week": 1}}})
    start(s, "a1", 1, ALICE)
    start(s, "a2", 1, ALICE)
    start(s, "b1", 1, BOB)
    start(s, "b2", 1, BOB)
    s.request_cell("b1", "x", 0.0)
    s.request_cell("b2", "y", 0.0)
    assert isinstance(s.request_cell("a1", "c1", 0.0), RunCell)
    assert isinstance(s.request_cell("a2", "c2", 10.0), WaitInQueue)  # no GPU free, the hours not spent yet
    s.cell_finished("a1", "c1", 3600.0)
    d = s.dispatch_queued(3600.0)
    assert isinstance(d, QueueDispatch) and d.started == ()
    assert [r.cell_id for r in d.rejected] == ["c2"] and d.rejected[0].quota is not None
    assert "refused c2 of a2" in str(d)
    assert s.queued_cells() == ()


def test_the_admin_raises_a_quota_at_runtime_and_the_waiting_cell_runs() -> None:
    s = cluster(quotas={"users": {"alice": {"gpus": 2}}})
    start(s, "a1", 2, ALICE)
    start(s, "a2", 2, ALICE)
    s.request_cell("a1", "c1", 0.0)
    assert isinstance(s.request_cell("a2", "c2", 0.0), WaitInQueue)
    with pytest.raises(ValueError, match=r"users\.alice\.gpus"):
        s.set_quotas({"users": {"alice": {"gpus": -4}}}, 1.0)
    assert s.settings.quotas.users["alice"] == Limits(gpus=2)  # unchanged
    changed = s.set_quotas(Quotas(users={"alice": Limits(gpus=4)}), 1.0)
    assert isinstance(changed, QuotasChanged)
    assert str(changed) == "quotas changed: users.alice: gpus 2.0 -> 4.0; 1 queued cells wait on a quota"
    assert [d.cell_id for d in s.dispatch_queued(1.0).started] == ["c2"]


def test_usage_survives_a_restart_through_its_records() -> None:
    knobs = {"quotas": {"default": {"gpu_hours_per_day": 1}}, "quota_clock_offset_s": 5000.0}
    s = cluster(**knobs)
    start(s, "a1", 1, ALICE)
    s.request_cell("a1", "c1", 0.0)
    s.cell_finished("a1", "c1", 3600.0)
    records = s.usage_records()
    assert {(r.kind, r.name): r.day_gpu_s for r in records} == {("user", "alice"): 3600.0, ("group", "ml"): 3600.0}
    # the new gateway's monotonic clock starts elsewhere: 1000 s later in Unix time is 0 for it
    again = Scheduler(
        hosts=[HostSpec("h0", 2)],
        kernels=[KernelSpec("a1", 1, ALICE)],
        usage=records,
        quotas=knobs["quotas"],
        quota_clock_offset_s=5000.0 + 3700.0,
    )
    refused = again.request_cell("a1", "c2", 0.0)
    assert isinstance(refused, RejectCell) and refused.quota is not None
    view = {(u.kind, u.name): u for u in again.usage(0.0)}
    assert view[("user", "alice")].gpu_hours_today == 1.0 and view[("user", "alice")].kernels == 1
    assert view[("group", "ml")].gpu_hours_today == 1.0


# --- fair share -----------------------------------------------------------------------------------------


def flooded(fair_share: bool = True, **knobs: object) -> Scheduler:
    """One host of 2 GPUs: alice's two kernels hold both, her third waits; bob has run nothing."""
    s = Scheduler(hosts=[HostSpec("h0", 2)], replicas_per_kernel=1, fair_share=fair_share, **knobs)
    for k in ("a1", "a2", "a3"):
        start(s, k, 1, ALICE)
    start(s, "b1", 1, BOB)
    s.request_cell("a1", "c1", 0.0)
    s.request_cell("a2", "c2", 0.0)
    assert isinstance(s.request_cell("a3", "c3", 1.0), WaitInQueue)
    assert isinstance(s.request_cell("b1", "x1", 2.0), WaitInQueue)
    return s


def test_a_user_who_holds_no_gpu_runs_at_the_next_release_ahead_of_the_flooding_user() -> None:
    s = flooded()
    assert [c.cell_id for c in s.queued_cells()] == ["x1", "c3"]  # the order they will be offered GPUs
    s.cell_finished("a1", "c1", 10.0)
    d = s.dispatch_queued(10.0)
    assert [x.cell_id for x in d.started] == ["x1"]
    picked = d.started[0]
    assert isinstance(picked, RunCell)
    assert picked.picked.startswith("fair share: bob ranks 1 of 2 users waiting by decayed GPU-hours / weight")
    assert "picked: fair share: bob ranks 1 of 2" in str(picked)


def test_without_fair_share_the_queue_is_first_come_first_served() -> None:
    s = flooded(fair_share=False)
    s.cell_finished("a1", "c1", 10.0)
    d = s.dispatch_queued(10.0)
    assert [x.cell_id for x in d.started] == ["c3"] and d.started[0].picked == ""


def test_weights_trade_usage_for_priority() -> None:
    # alice has used 20 GPU-seconds, bob 10: bob goes first unless alice's weight is more than twice his
    for weight, first in ((1.0, "x2"), (3.0, "c3")):
        s = Scheduler(hosts=[HostSpec("h0", 1)], replicas_per_kernel=1, quotas={"users": {"alice": {"weight": weight}}})
        start(s, "a1", 1, ALICE)
        start(s, "b1", 1, BOB)
        s.request_cell("a1", "c1", 0.0)
        s.cell_finished("a1", "c1", 20.0)
        s.request_cell("b1", "x1", 20.0)
        s.cell_finished("b1", "x1", 30.0)
        s.request_cell("a1", "c2", 30.0)  # runs: the host is free
        s.request_cell("a1", "c3", 31.0)
        s.request_cell("b1", "x2", 32.0)
        s.cell_finished("a1", "c2", 40.0)
        assert [d.cell_id for d in s.dispatch_queued(40.0).started] == [first]


def test_one_user_alone_keeps_the_round_robin_order() -> None:
    s = Scheduler(hosts=[HostSpec("h0", 1)], replicas_per_kernel=1)
    for k in ("a1", "a2", "a3"):
        start(s, k, 1, ALICE)
    s.request_cell("a1", "c1", 0.0)
    s.request_cell("a2", "c2", 1.0)
    s.request_cell("a3", "c3", 2.0)
    s.cell_finished("a1", "c1", 3.0)
    d = s.dispatch_queued(3.0)
    assert [x.cell_id for x in d.started] == ["c2"] and d.started[0].picked == ""


def test_a_cell_past_the_wait_bound_goes_first_whatever_its_users_usage() -> None:
    for bound, first in ((100.0, "c2"), (0.0, "x1")):
        s = Scheduler(hosts=[HostSpec("h0", 1)], replicas_per_kernel=1, fair_share_max_wait_s=bound)
        start(s, "a1", 1, ALICE)
        start(s, "a2", 1, ALICE)
        start(s, "b1", 1, BOB)
        start(s, "c1", 1, CAROL)
        s.request_cell("a1", "c1", 0.0)
        s.cell_finished("a1", "c1", 50.0)  # alice has used 50 GPU-seconds, bob nothing
        s.request_cell("c1", "y1", 50.0)  # carol holds the GPU until 160
        assert isinstance(s.request_cell("a2", "c2", 51.0), WaitInQueue)
        assert isinstance(s.request_cell("b1", "x1", 140.0), WaitInQueue)
        s.cell_finished("c1", "y1", 160.0)
        d = s.dispatch_queued(160.0)
        assert [x.cell_id for x in d.started] == [first]
        if bound:
            assert "waited 109 s, past the fair-share bound of 100 s" in str(d.started[0])


def test_an_aged_cell_that_cannot_fit_holds_back_new_cells_of_others() -> None:
    s = Scheduler(hosts=[HostSpec("h0", 2)], replicas_per_kernel=1, fair_share_max_wait_s=100.0)
    start(s, "a1", 2, ALICE)
    start(s, "b1", 1, BOB)
    start(s, "c1", 1, CAROL)
    s.request_cell("b1", "x1", 0.0)
    assert isinstance(s.request_cell("a1", "big", 1.0), WaitInQueue)
    assert s.dispatch_queued(150.0).started == ()  # big has waited past the bound but needs both GPUs
    held = s.request_cell("c1", "y1", 151.0)  # one GPU is idle, and big counts on it
    assert isinstance(held, WaitInQueue) and "GPUs are held for cell big of kernel a1" in held.reason
    s.cell_finished("b1", "x1", 152.0)
    assert [x.cell_id for x in s.dispatch_queued(152.0).started] == ["big"]
