"""The I/O layer: objects on local disk and object stores (``objects``), URIs in one form,
storage options Lance reads, the page cache, threads kept for the process, Lance and ``fork()``,
and what stands where blobhouse creates a small object exclusively (``leftovers``)."""
