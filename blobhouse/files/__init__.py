"""The table's file format: a data file's blob sidecars and session (``session``), the hashes
recorded in it (``checksums``), its footer (``footer``), Lance's blob descriptors turned into
references (``references``) and ranged reads of referenced payloads (``ranges``)."""
