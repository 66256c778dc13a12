"""The commit layer: every change to a table is one transaction (transaction.py), run by one
template (change.py), holding a lease (leases.py) and, for upserts, a lock (locks.py)."""
