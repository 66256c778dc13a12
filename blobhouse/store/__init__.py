"""The table's content-addressed store (``dedup="global"``): each payload once for the whole table.

Layout under the table root::

    _blobs/packs/<write id>-<uuid>.pack   payloads back to back, written once, never modified
    _blobs/index/                         a Lance dataset: blake3 -> (pack, position, size)

``_blobs`` is registered in the table's manifest as the Lance base path ``blobhouse-store``, so a
row references its payload as a Lance external blob (kind 3) whose ``blob_id`` is that base's id
and whose uri is the pack's path relative to it: stock Lance readers resolve it like any blob, and
Lance's own cleanup never deletes files under a base.

The index is a cache of what the packs hold. A writer looks payloads up in it before writing them
and appends what it wrote after its table commit; when it lags, dedup is lower, never wrong.
gc reclaims an unreferenced indexed pack in two steps, retire (tombstone, out of the index) then
reap after a grace period, and a writer checks right before its commit that the packs it took
from the index were not retired meanwhile: the argument is in docs/global-dedup.md.
"""
