"""Changes to a table's rows and schema: update, merge_insert and delete (mutations.py), column
backfill (backfill.py), schema and property changes (schema_changes.py); each commits through
:mod:`blobhouse.commit`."""
