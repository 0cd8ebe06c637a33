"""The answer to a bulk write (create or append) read: its ids and task id as the service sent
them (data: a base URL's password masked in a refused row's echoed id made the refusal name no
row of the write, the row taken for accepted and sent again), the words of its refusals with
the keys sent masked (a refusal may quote the key)."""

from __future__ import annotations

import msgspec

from . import _exceptions as exc
from ._http import HttpExchange, Response
from ._models import BulkTaskResponse
from ._responses import front_end_answer, no_task_named, unreadable_write

__all__ = ["read_write_answer"]

# The bulk answers' counts (``count``, ``validation``, ``taskInfo``) are read as integers
# whether the service writes ``1000`` or ``"1000"`` (a JSON writer that quotes 64-bit integers)
# or ``1000.0``: ``strict=False``. No text field takes a number for text that way.
_bulk_response_decoder = msgspec.json.Decoder(BulkTaskResponse, strict=False)


def read_write_answer(
    http: HttpExchange, response: Response, method: str, path: str, task_id: str | None
) -> BulkTaskResponse:
    """The 2xx ``response`` to a write, read (an answer that cannot be: its error, raised)."""
    try:
        answer = http.decode(_bulk_response_decoder, response, method, path)
        if answer.task_id:
            for item in answer.failure_list:
                item.error_message = http.masked(item.error_message)
            return answer
    except exc.DecodeError:
        pass
    # Unreadable, or naming no task: quoted in the error, so read masked.
    response = msgspec.structs.replace(response, body=http.masked_body(response.body))
    try:
        answer = http.decode(_bulk_response_decoder, response, method, path)
        if task_id is None and not answer.task_id:  # a create's: see no_task_named
            raise no_task_named(response, method, path)
        return answer
    except exc.DecodeError as err:
        page = front_end_answer(response, method, path, task_id)
        error = unreadable_write(response, method, path, err, page, create=task_id is None)
        http.stats.ambiguous_writes += isinstance(error, exc.AmbiguousWriteError)
        raise error from err
