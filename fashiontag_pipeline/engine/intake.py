"""Intake: the stage between the source and the writer (validate, dedupe, route).

Each row batch is validated (:class:`~.validate.Validator`: every rule a client can check, one
``client`` reject per bad row), deduplicated run-wide in the state store (the first row of an
id wins, each later row is a ``duplicate id`` reject), and routed: URL rows to the bulk writer,
local files and ``data:`` images to the single endpoint. The batch's rejects, its new ids and
the validated watermark (V) are committed in one transaction before any of its rows is sent.

On resume, rows at or below the chunked watermark (W) are skipped, and rows up to V were
validated before: their rejects are not written again.

With ``--reuse`` (``reuse``: a :class:`~.reuse.ReuseHook`), each batch's bulk rows are looked
up in the result store first; the journal writes the rows answered from it in the batch's
transaction and hands back only the rows to send.
"""

from __future__ import annotations

from typing import Any

import anyio

from .reuse import ReuseHook
from .single import merge_routes, pending_ops, split_routes
from .sinks import Reject
from .source import RowBatch
from .state import POS_SHIFT, Journal, split_position
from .validate import STAGE_CLIENT, Item, SingleItem, Validator

__all__ = ["intake"]

_LINE_MASK = (1 << POS_SHIFT) - 1


async def intake(
    receive: anyio.abc.ObjectReceiveStream[RowBatch],
    send: anyio.abc.ObjectSendStream[list[Item]],
    single_send: anyio.abc.ObjectSendStream[list[SingleItem]],
    *,
    validator: Validator,
    journal: Journal,
    names: list[str],
    chunked: int,
    validated: int,
    reuse: ReuseHook | None = None,
) -> None:
    """Validate, dedupe and route every batch of ``receive`` (see the module docstring)."""
    async with receive, send, single_send:
        async for batch in receive:
            items, singles, rejects = validator.route(batch, skip_upto=chunked)
            fresh = [r for pos, r in rejects if pos > validated]
            last = batch.rows[-1][0]
            watermark = (batch.source << POS_SHIFT) | last
            if not items and not singles and not fresh and watermark <= validated:
                continue
            rows: list[Any] = items
            routed = None
            if singles:
                # Both routes in position order: the first row of an id wins.
                rows = merge_routes(items, singles)

                def routed(keep: list[int], rows: list[Any] = rows) -> list[tuple[str, Any]]:
                    return pending_ops(split_routes(rows, keep, validated)[1])

            keyed = [(ident, pos) for ident, pos, _ in rows]

            def make_dup(i: int, first: int, keyed: list[tuple[str, int]] = keyed) -> Reject:
                ident, pos = keyed[i]
                src, line = split_position(first)
                return Reject(
                    ident,
                    f"duplicate id (first seen at {names[src]} line {line})",
                    STAGE_CLIENT,
                    pos & _LINE_MASK,
                    names[pos >> POS_SHIFT],
                )

            plan = await reuse.plan(rows) if reuse is not None and items else None
            keep = await journal.intake(
                keyed, fresh, make_dup, max(watermark, validated), validated, routed, plan
            )
            if singles:
                bulk, routed_rows = split_routes(rows, keep, validated)
                if routed_rows:
                    await single_send.send(routed_rows)
                if bulk:
                    await send.send(bulk)
            elif keep:
                await send.send([items[i] for i in keep])
