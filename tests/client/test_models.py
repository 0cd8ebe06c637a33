"""Round trips of every wire shape, with samples written from the spec."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from fashiontag_pipeline._models import (
    BulkContext,
    BulkTaskRequest,
    BulkTaskResponse,
    Context,
    Detection,
    Image,
    ImageType,
    SingleTagRequest,
    TaggingRequest,
    TaggingResponse,
    Task,
    TaskListResponse,
    TaskResultsResponse,
    TaskStatus,
    TaskStatusResponse,
    format_time,
    parse_time,
)
from fashiontag_pipeline.cli.client_commands import _task_table

TAG = {
    "info": [{"id": "i1", "name": "long sleeve"}],
    "category": {"id": "c1", "name": "TOP"},
    "position": {"x": 0.5, "y": 0.25},
    "colors": [{"id": "col1", "name": "navy", "confidence": 0.91}],
    "colorDetails": [{"code": "1F2A44", "name": "Midnight", "pixelFraction": 0.6}],
    "item": {"id": "it1", "name": "shirt", "confidence": 0.12},
    "details": [{"id": "d1", "name": "pocket", "confidence": 0.4}],
    "prints": [{"id": "p1", "name": "stripe", "confidence": 0.3}],
    "textures": [{"id": "t1", "name": "knit", "confidence": 0.5}],
    "looks": [{"id": "l1", "name": "casual", "confidence": 0.7}],
    "length": {"id": "len1", "name": "regular", "confidence": 0.6},
    "sleeveLength": {"id": "sl1", "name": "long"},
    "neckLine": {"id": "n1", "name": "crew", "confidence": 0.8},
    "fit": {"id": "f1", "name": "slim", "confidence": 0.55},
    "shape": {"id": "s1", "name": "straight", "confidence": 0.45},
    "mainMaterials": [{"id": "m1", "name": "cotton", "confidence": 0.66}],
    "subMaterials": [{"id": "m2", "name": "elastane", "confidence": 0.21}],
    "someFutureField": {"nested": True},
}
SHOE_TAG = {
    "category": {"id": "c9", "name": "SHOES"},
    "pairIndex": 3,
    "heelHeight": {"id": "h1", "name": "flat", "confidence": 0.9},
    "toeType": {"id": "to1", "name": "round", "confidence": 0.8},
    "heelShape": {"id": "hs1", "name": "block", "confidence": 0.7},
    "soleType": {"id": "so1", "name": "rubber", "confidence": 0.6},
}
TAGGING_RESPONSE = {
    "status": "success",
    "data": {
        "imageinfo": [{"id": "img", "name": "photo"}],
        "genderInfo": {"id": "g2", "name": "female"},
        "objects": [
            {"type": "CLOTHING", "tags": [TAG]},
            {"type": "SHOES", "tags": [SHOE_TAG, SHOE_TAG]},
            {"type": "BAGS", "tags": []},
        ],
        "notmatchedobjects": [{"type": "CLOTHING", "tags": [TAG]}],
    },
}


def test_tagging_response_keeps_every_attribute_and_ignores_unknown_fields() -> None:
    raw = msgspec.json.encode(TAGGING_RESPONSE)
    decoded = msgspec.json.decode(raw, type=TaggingResponse)
    assert decoded.ok
    assert decoded.data is not None
    top = decoded.data.objects[0].tags[0]
    assert top.sleeve_length is not None and top.sleeve_length.name == "long"
    assert top.neck_line is not None and top.neck_line.confidence == 0.8
    assert top.color_details[0].pixel_fraction == 0.6
    assert top.main_materials[0].name == "cotton" and top.sub_materials[0].confidence == 0.21
    shoe = decoded.data.objects[1].tags[0]
    assert shoe.pair_index == 3 and shoe.heel_height is not None and shoe.sole_type is not None
    assert decoded.data.gender_info is not None and decoded.data.gender_info.name == "female"
    assert decoded.data.notmatchedobjects[0].type == "CLOTHING"
    # Re-encoding gives back the sample without the unknown field and without unset ones.
    expected = msgspec.json.decode(raw)
    del expected["data"]["objects"][0]["tags"][0]["someFutureField"]
    del expected["data"]["notmatchedobjects"][0]["tags"][0]["someFutureField"]
    assert msgspec.json.decode(msgspec.json.encode(decoded)) == expected


def test_failed_tagging_response_carries_error_and_any_non_success_status_is_failure() -> None:
    for status in ("failure", "fail", "FAILURE"):
        body = {
            "status": status,
            "error": {"code": 803, "message": "image URL could not be fetched"},
        }
        decoded = msgspec.json.decode(msgspec.json.encode(body), type=TaggingResponse)
        assert not decoded.ok
        assert decoded.error is not None and decoded.error.code == 803


def test_requests_omit_unset_fields_and_use_camel_case() -> None:
    single = SingleTagRequest(
        image=Image(type=ImageType.BASE64, content="data:image/png;base64,AAAA"),
        context=Context(age="20s", product_content_name="Blue shirt", detection=[Detection.TOP]),
    )
    assert msgspec.json.decode(msgspec.json.encode(single)) == {
        "image": {"type": "base64", "content": "data:image/png;base64,AAAA"},
        "context": {"detection": ["TOP"], "age": "20s", "productContentName": "Blue shirt"},
    }
    bulk = BulkTaskRequest(
        tagging_request=[
            TaggingRequest(
                image=Image(type=ImageType.URL, content="https://cdn.example/1.jpg"),
                context=BulkContext(id="sku-1", age=["20s", "30s"]),
            )
        ],
        default_detection=[Detection.SHOES],
        description="run token",
    )
    assert msgspec.json.decode(msgspec.json.encode(bulk)) == {
        "taggingRequest": [
            {
                "image": {"type": "url", "content": "https://cdn.example/1.jpg"},
                "context": {"id": "sku-1", "age": ["20s", "30s"]},
            }
        ],
        "defaultDetection": ["SHOES"],
        "description": "run token",
    }


def test_bulk_context_requires_id_and_list_age() -> None:
    with pytest.raises(msgspec.ValidationError, match="id"):
        msgspec.convert({"detection": ["TOP"]}, BulkContext)
    with pytest.raises(msgspec.ValidationError, match="age"):
        msgspec.convert({"id": "a", "age": "20s"}, BulkContext)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "a", "detection": ["SOCKS"]}, BulkContext)


@pytest.mark.parametrize("spelling", ["taskExpiredAt", "taskExpireAt"])
def test_bulk_response_accepts_both_expiry_spellings(spelling: str) -> None:
    body = {
        "taskId": "t-1",
        "albumName": "album",
        spelling: "2026-11-22T03:46:13.123Z",
        "validation": {"accept": 2, "failure": 1},
        "failureList": [
            {
                "request": {
                    "image": {"type": "url", "content": "ftp://x"},
                    "context": {"id": "bad", "age": "not-a-list"},
                },
                "errorMessage": "image.content must be an http(s) URL",
            }
        ],
        "brandNewField": 1,
    }
    decoded = msgspec.json.decode(msgspec.json.encode(body), type=BulkTaskResponse)
    assert decoded.expires_at == datetime(2026, 11, 22, 3, 46, 13, 123000, tzinfo=UTC)
    assert decoded.validation.accept == 2
    assert decoded.failure_list[0].context_id == "bad"
    assert decoded.failure_list[0].error_message.startswith("image.content")


def test_task_envelopes_round_trip() -> None:
    task = {
        "taskId": "t-1",
        "count": {"total": 3, "done": 1, "processing": 1, "failure": 1},
        "description": "ftp:run:1",
        "taskStatus": "TASK_DONE",
        "taskExpireAt": "2026-11-22T03:56:13.000Z",
        "resultExpiredAt": "2026-11-29T03:46:13.000Z",
        "createDate": "2026-11-22T03:46:13.000Z",
    }
    listing = msgspec.json.decode(
        msgspec.json.encode({"status": "success", "data": {"tasks": [task]}, "error": None}),
        type=TaskListResponse,
    )
    assert listing.data is not None
    (decoded,) = listing.data.tasks
    assert decoded.done and decoded.task_status is TaskStatus.DONE
    assert decoded.count.failure == 1
    assert decoded.expires_at == datetime(2026, 11, 22, 3, 56, 13, tzinfo=UTC)
    assert decoded.results_expire_at == datetime(2026, 11, 29, 3, 46, 13, tzinfo=UTC)
    status = msgspec.json.decode(
        msgspec.json.encode({"status": "success", "data": task}), type=TaskStatusResponse
    )
    assert status.data == decoded
    processing = msgspec.convert({"taskId": "t-2", "taskStatus": "TASK_PROCESSING"}, Task)
    assert not processing.done and processing.results_expire_at is None


def test_results_page_round_trip() -> None:
    page = {
        "status": "success",
        "data": {
            "taskInfo": {"totalCount": 2, "offset": 0, "size": 100},
            "results": [
                {"id": "a", "taggingResult": TAGGING_RESPONSE},
                {
                    "id": "b",
                    "taggingResult": {"status": "failure", "error": {"code": 803, "message": "x"}},
                },
            ],
        },
    }
    decoded = msgspec.json.decode(msgspec.json.encode(page), type=TaskResultsResponse)
    assert decoded.data is not None
    assert decoded.data.task_info.total_count == 2
    assert [r.id for r in decoded.data.results] == ["a", "b"]
    assert decoded.data.results[0].tagging_result.ok
    assert not decoded.data.results[1].tagging_result.ok


def test_times_parse_loosely_and_format_with_milliseconds() -> None:
    moment = datetime(2026, 11, 22, 3, 46, 13, 123456, tzinfo=UTC)
    assert format_time(moment) == "2026-11-22T03:46:13.123Z"
    assert parse_time("2026-11-22T03:46:13.123Z") == moment.replace(microsecond=123000)
    assert parse_time("2026-11-22T12:46:13+09:00") == moment.replace(microsecond=0)
    assert parse_time("2026-11-22 03:46:13") == moment.replace(microsecond=0)
    assert parse_time(None) is None and parse_time("") is None
    # An HTTP date, epoch seconds and epoch milliseconds (forms real services use).
    whole = moment.replace(microsecond=0)
    assert parse_time("Sun, 22 Nov 2026 03:46:13 GMT") == whole
    assert parse_time(str(int(whole.timestamp()))) == whole
    assert parse_time(str(int(whole.timestamp() * 1000) + 123)) == moment.replace(
        microsecond=123000
    )
    for garbage in ("next tuesday", "nan", "1e400"):
        with pytest.raises(ValueError, match="unrecognised time"):
            parse_time(garbage)
    # A task's expiry no form reads is an unknown one, never an error in the engine.
    assert Task(task_id="t", result_expired_at="next tuesday").results_expire_at is None


def test_times_written_as_json_numbers_are_read() -> None:
    """A service writing its times as epoch numbers (a Java service's default): before, such a
    task list, status or write answer was unreadable (the run stopped, exit 1)."""
    whole = datetime(2026, 11, 22, 3, 46, 13, tzinfo=UTC)
    seconds, millis = int(whole.timestamp()), int(whole.timestamp() * 1000) + 123
    listed = msgspec.json.decode(
        b'{"taskId":"t","taskExpireAt":%d,"resultExpiredAt":0,"createDate":%d}' % (millis, seconds),
        type=Task,
    )
    assert listed.expires_at == whole.replace(microsecond=123000)
    assert listed.results_expire_at is None  # 0: a field left unset, not 1970
    assert listed.created_at == whole
    assert msgspec.json.decode(msgspec.json.encode(listed))["createDate"] == seconds  # as given
    written = msgspec.json.decode(
        b'{"taskId":"t","taskExpiredAt":%d.5}' % seconds, type=BulkTaskResponse
    )
    assert written.expires_at == whole.replace(microsecond=500000)
    # ``tasks list`` shows such a time in UTC, the newest task first.
    older = msgspec.json.decode(b'{"taskId":"o","createDate":"2026-01-01T00:00:00Z"}', type=Task)
    table = _task_table([older, listed], None).splitlines()
    assert table[1].split()[0] == "t" and "2026-11-22 03:46:13" in table[1]
    assert table[2].split()[0] == "o" and "2026-01-01 00:00:00" in table[2]
