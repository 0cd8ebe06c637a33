"""The metrics of the contract: every name and listed label value exported from start-up,
batch updates, +Inf for a min over no task, a registry of their own."""

from __future__ import annotations

import math

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from fashiontag_pipeline.daemon.metrics import DaemonMetrics

GAUGES = (
    "fashiontag_manifests_active",
    "fashiontag_manifests_queued",
    "fashiontag_tasks_live",
    "fashiontag_rows_pending",
    "fashiontag_oldest_pending_seconds",
    "fashiontag_task_expiry_headroom_seconds",
    "fashiontag_result_expiry_headroom_seconds",
)


def samples(metrics: DaemonMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the text exposition, parsed by prometheus-client's own parser."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_every_metric_is_exported_from_start_up() -> None:
    s = samples(DaemonMetrics())
    for outcome in ("tagged", "failed", "rejected", "reused"):
        assert s[("fashiontag_rows_total", (("outcome", outcome),))] == 0
    for status in ("done", "failed", "duplicate"):
        assert s[("fashiontag_manifests_total", (("status", status),))] == 0
    for op in ("create", "append", "list", "status", "results", "single"):
        code = "202" if op in ("create", "append") else "200"
        assert s[("fashiontag_requests_total", (("code", code), ("op", op)))] == 0
        assert s[("fashiontag_request_duration_seconds_count", (("op", op),))] == 0
        assert s[("fashiontag_request_duration_seconds_bucket", (("le", "+Inf"), ("op", op)))] == 0
    assert s[("fashiontag_retries_total", ())] == 0
    assert s[("fashiontag_rate_limited_total", ())] == 0
    for gauge in GAUGES:
        expected = math.inf if "headroom" in gauge else 0.0
        assert s[(gauge, ())] == expected, gauge


def test_batch_updates_and_min_over_no_task() -> None:
    metrics = DaemonMetrics()
    metrics.count_rows("tagged", 100)
    metrics.count_rows("tagged", 0)
    metrics.count_rows("rejected", 3)
    metrics.count_manifest("done")
    metrics.observe_request("append", 202, 0.03)
    metrics.observe_request("append", 429, 0.01)
    metrics.observe_request("results", 200, 0.2)
    metrics.count_retries(2)
    metrics.set_manifests(active=2, queued=5)
    metrics.set_engine(
        tasks_live=3,
        rows_pending=1500,
        oldest_pending_seconds=4.5,
        task_expiry_headroom_seconds=540.0,
        result_expiry_headroom_seconds=None,
    )
    s = samples(metrics)
    assert s[("fashiontag_rows_total", (("outcome", "tagged"),))] == 100
    assert s[("fashiontag_rows_total", (("outcome", "rejected"),))] == 3
    assert s[("fashiontag_manifests_total", (("status", "done"),))] == 1
    assert s[("fashiontag_requests_total", (("code", "202"), ("op", "append")))] == 1
    assert s[("fashiontag_requests_total", (("code", "429"), ("op", "append")))] == 1
    assert s[("fashiontag_request_duration_seconds_count", (("op", "append"),))] == 2
    assert s[("fashiontag_rate_limited_total", ())] == 1
    assert s[("fashiontag_retries_total", ())] == 2
    assert s[("fashiontag_manifests_active", ())] == 2
    assert s[("fashiontag_manifests_queued", ())] == 5
    assert s[("fashiontag_tasks_live", ())] == 3
    assert s[("fashiontag_rows_pending", ())] == 1500
    assert s[("fashiontag_oldest_pending_seconds", ())] == 4.5
    assert s[("fashiontag_task_expiry_headroom_seconds", ())] == 540.0
    assert s[("fashiontag_result_expiry_headroom_seconds", ())] == math.inf
    metrics.set_engine(
        tasks_live=0,
        rows_pending=0,
        oldest_pending_seconds=None,
        task_expiry_headroom_seconds=None,
        result_expiry_headroom_seconds=12.0,
    )
    s = samples(metrics)
    assert s[("fashiontag_task_expiry_headroom_seconds", ())] == math.inf
    assert s[("fashiontag_result_expiry_headroom_seconds", ())] == 12.0
    assert s[("fashiontag_oldest_pending_seconds", ())] == 0.0


def test_unknown_label_values_are_refused() -> None:
    metrics = DaemonMetrics()
    with pytest.raises(ValueError, match="outcome"):
        metrics.count_rows("lost", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        metrics.count_manifest("partial")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="op"):
        metrics.observe_request("delete", 200, 0.1)  # type: ignore[arg-type]


def test_registries_are_private() -> None:
    first, second = DaemonMetrics(), DaemonMetrics()  # would raise "Duplicated timeseries"
    first.count_rows("tagged", 5)
    assert samples(second)[("fashiontag_rows_total", (("outcome", "tagged"),))] == 0
    assert REGISTRY.get_sample_value("fashiontag_rows_total", {"outcome": "tagged"}) is None
