"""The rows' JSON bodies: overrides and logged decisions, to text and back.

An override's body names the scheme of the key digests it holds (`key_scheme`); a body written
before keyed digests names none, and decodes as unkeyed (`sha256`).

A tenant's load is a flat list (14 figures) rather than an object: a key frame of a pool of
10,000 tenants holds 10,000 of them.
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.core.overrides import Override
from controlplane.core.snapshot import TelemetryView, TenantLoad
from controlplane.decision_log import DecisionOutcome, DecisionRecord, LoggedDecision
from slotshift.demand import LatencySummary
from slotshift.keys import UNKEYED_SCHEME


class CodecError(ValueError):
    """A stored body that does not decode (written by another version, or damaged)."""


def encode_override(override: Override) -> str:
    return json.dumps(
        {
            "pool": override.pool,
            "config_version": override.config_version,
            "kind": override.kind,
            "tenant": override.tenant,
            "settings": dict(override.settings),
            "clear": list(override.clear),
            "policy": override.policy,
            "key_digests": [d.hex() for d in override.key_digests],
            "key_scheme": override.key_scheme,
            "allow_no_key": override.allow_no_key,
            "file_fields": dict(override.file_fields),
            "stored_at_wall_s": override.stored_at_wall_s,
        },
        separators=(",", ":"),
    )


def decode_override(text: str) -> Override:
    try:
        data = json.loads(text)
        return Override(
            pool=data["pool"],
            config_version=int(data["config_version"]),
            kind=data["kind"],
            tenant=data["tenant"],
            settings=dict(data["settings"]),
            clear=tuple(data["clear"]),
            policy=data["policy"],
            key_digests=tuple(bytes.fromhex(d) for d in data["key_digests"]),
            # Rows written before keyed digests name no scheme: theirs was unkeyed SHA-256.
            key_scheme=str(data.get("key_scheme", UNKEYED_SCHEME)),
            allow_no_key=bool(data.get("allow_no_key", False)),
            file_fields=dict(data["file_fields"]),
            stored_at_wall_s=float(data["stored_at_wall_s"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"an override that does not decode: {exc}") from exc


def encode_decision(entry: LoggedDecision) -> str:
    record = entry.record
    telemetry = record.telemetry
    return json.dumps(
        {
            "id": record.id,
            "pool": record.pool,
            "decided_at_wall_s": record.decided_at_wall_s,
            "policy": record.policy,
            "trigger": record.trigger,
            "outcome": record.outcome.value,
            "reason": record.reason,
            "version": record.version,
            "budget_slots": record.budget_slots,
            "inputs": {name: _load_row(load) for name, load in record.inputs.items()},
            "telemetry": None
            if telemetry is None
            else [
                telemetry.age_s,
                telemetry.fresh,
                telemetry.kv_cache_usage_perc,
                telemetry.num_requests_running,
                telemetry.num_requests_waiting,
                telemetry.gpu_available,
                telemetry.gpu_emulated,
                telemetry.gpu_utilization_pct,
            ],
            "outputs": dict(record.outputs),
            "duration_ms": record.duration_ms,
            "fallback": record.fallback,
            "inputs_gone": list(entry.inputs_gone),
            "outputs_gone": list(entry.outputs_gone),
            "keyframe": entry.keyframe,
        },
        separators=(",", ":"),
    )


def decode_decision(text: str) -> LoggedDecision:
    try:
        data = json.loads(text)
        telemetry = data["telemetry"]
        record = DecisionRecord(
            id=int(data["id"]),
            pool=data["pool"],
            decided_at_wall_s=float(data["decided_at_wall_s"]),
            policy=data["policy"],
            trigger=data["trigger"],
            outcome=DecisionOutcome(data["outcome"]),
            reason=data["reason"],
            version=int(data["version"]),
            budget_slots=int(data["budget_slots"]),
            inputs={name: _load_of(row) for name, row in data["inputs"].items()},
            telemetry=None
            if telemetry is None
            else TelemetryView(
                age_s=float(telemetry[0]),
                fresh=bool(telemetry[1]),
                kv_cache_usage_perc=float(telemetry[2]),
                num_requests_running=float(telemetry[3]),
                num_requests_waiting=float(telemetry[4]),
                gpu_available=bool(telemetry[5]),
                gpu_emulated=bool(telemetry[6]),
                gpu_utilization_pct=float(telemetry[7]),
            ),
            outputs={name: int(limit) for name, limit in data["outputs"].items()},
            duration_ms=float(data["duration_ms"]),
            fallback=data["fallback"],
        )
        return LoggedDecision(
            record,
            inputs_gone=tuple(data["inputs_gone"]),
            outputs_gone=tuple(data["outputs_gone"]),
            keyframe=bool(data["keyframe"]),
        )
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CodecError(f"a decision that does not decode: {exc}") from exc


def _load_row(load: TenantLoad) -> list[Any]:
    return [
        load.in_flight,
        load.queued,
        *_summary_row(load.ttft),
        *_summary_row(load.e2e),
        load.admitted_total,
        load.completed_total,
        load.rejected_total,
        load.demand_age_s,
    ]


def _summary_row(summary: LatencySummary) -> list[Any]:
    return [summary.count, summary.p50_ms, summary.p90_ms, summary.p99_ms]


def _load_of(row: list[Any]) -> TenantLoad:
    if len(row) != 14:
        raise ValueError(f"a tenant load of {len(row)} figures, not 14")
    return TenantLoad(
        in_flight=int(row[0]),
        queued=int(row[1]),
        ttft=LatencySummary(int(row[2]), float(row[3]), float(row[4]), float(row[5])),
        e2e=LatencySummary(int(row[6]), float(row[7]), float(row[8]), float(row[9])),
        admitted_total=int(row[10]),
        completed_total=int(row[11]),
        rejected_total=int(row[12]),
        demand_age_s=None if row[13] is None else float(row[13]),
    )
