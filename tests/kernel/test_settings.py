"""A replica's numeric settings from its environment: defaults, and clear errors for malformed values."""

from __future__ import annotations

import pytest

from jupyter_notebookos.kernel.settings import ReplicaConfigError, ReplicaSettings
from jupyter_notebookos.replication import protocol as p

BASE = {p.ENV_KERNEL_ID: "k", p.ENV_REPLICA_ID: "r0", p.ENV_ETCD_ENDPOINTS: "127.0.0.1:2379", p.ENV_KEY: "secret"}


def test_numeric_settings_default_and_are_read() -> None:
    settings = ReplicaSettings.from_env(BASE)
    assert settings.hold_empty_records_ms == p.DEFAULT_HOLD_EMPTY_RECORDS_MS
    assert settings.checkpoint_every == p.DEFAULT_CHECKPOINT_EVERY
    settings = ReplicaSettings.from_env({**BASE, p.ENV_HOLD_EMPTY_RECORDS_MS: " 0 ", p.ENV_CHECKPOINT_EVERY: "4"})
    assert (settings.hold_empty_records_ms, settings.checkpoint_every) == (0, 4)


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (p.ENV_HOLD_EMPTY_RECORDS_MS, "0.1", "is not a whole number"),
        (p.ENV_HOLD_EMPTY_RECORDS_MS, "-5", "is too small"),
        (p.ENV_CHECKPOINT_EVERY, "0", "is too small"),
        (p.ENV_LEASE_TTL, "five", "is not a whole number"),
    ],
)
def test_a_malformed_numeric_setting_is_refused_by_name(name: str, raw: str, message: str) -> None:
    with pytest.raises(ReplicaConfigError, match=f"{name}=.*{message}"):
        ReplicaSettings.from_env({**BASE, name: raw})
