"""The read path: one version's rows, as scans, takes, blob bytes or references
(``table_reader``), and decoded frames of video columns (``video``)."""
