"""The statements of manifest leases (:mod:`.leases`): the database's clock decides every
lease, and a fenced write locks its manifest's row so that no takeover slips in before its
commit."""

from __future__ import annotations

__all__ = ["ACQUIRE_SQL", "FENCE_SQL", "FREE", "LEASE_COLUMNS", "RELEASE_SQL", "RENEW_SQL"]

LEASE_COLUMNS = (
    "c.id, c.name, c.sha256, c.owner, c.epoch, extract(epoch FROM c.lease_expires_at)::float8"
)

# The database's clock decides every lease: statement_timestamp() is its time when the statement
# began (now() would be the transaction's start, early in a long transaction).
#: Claims in flight that no daemon holds: never leased, released, or their lease ended.
FREE = "status = 'claimed' AND (owner IS NULL OR lease_expires_at <= statement_timestamp())"

ACQUIRE_SQL = f"""
WITH free AS (
    SELECT id FROM claims
    WHERE {FREE} AND NOT id = ANY(%(skip)s::bigint[])
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE claims AS c
SET owner = %(owner)s, epoch = c.epoch + 1,
    lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s)
FROM free WHERE c.id = free.id
RETURNING {LEASE_COLUMNS}
"""

RENEW_SQL = f"""
UPDATE claims AS c
SET lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s)
FROM unnest(%(ids)s::bigint[], %(epochs)s::bigint[]) AS held(id, epoch)
WHERE c.id = held.id AND c.epoch = held.epoch AND c.owner = %(owner)s
  AND c.status = 'claimed' AND c.lease_expires_at > statement_timestamp()
RETURNING {LEASE_COLUMNS}
"""

RELEASE_SQL = """
UPDATE claims SET owner = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND owner = %(owner)s AND epoch = %(epoch)s AND status = 'claimed'
"""

# FOR KEY SHARE conflicts with FOR UPDATE only: the takeover's explicit FOR UPDATE (SKIP
# LOCKED) passes over a fenced transaction in progress, while renewals (UPDATEs of non-key
# columns, FOR NO KEY UPDATE) go on beside it. FOR SHARE would make every renewal wait for the
# fenced transactions, and back-to-back commits could starve the renewals until the lease ended.
FENCE_SQL = """
SELECT 1 FROM claims
WHERE id = %(id)s AND owner = %(owner)s AND epoch = %(epoch)s AND status = 'claimed'
  AND lease_expires_at > statement_timestamp()
FOR KEY SHARE
"""
