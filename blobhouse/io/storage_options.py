"""The names of storage options: those Lance reads (its own, and object_store's for S3, Azure,
GCS and every HTTP client), in every spelling Lance accepts.

Lance ignores a name it does not know -- a misspelled ``aws_endpiont`` sends its requests to
AWS itself -- so blobhouse refuses one, naming the closest: :func:`check_option_names`. Names
are compared without case, as Lance lowercases them. The lists follow object_store 0.14 (the
crate pylance 14.0.2 links) and Lance's own keys; docs/object-storage.md describes them.

>>> check_option_names({"AWS_REGION": "us-east-1", "azure_storage_account_name": "a"})
>>> check_option_names({"aws_endpiont": "http://127.0.0.1:9000"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
blobhouse.errors.UnknownOptionError: unknown storage option 'aws_endpiont' (did you mean \
'aws_endpoint'?)...
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from blobhouse.errors import UnknownOptionError, closest

# every store's HTTP client; also with a store's prefix (aws_timeout, azure_timeout, ...)
CLIENT = (
    "allow_http",
    "allow_invalid_certificates",
    "disable_system_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_max_frame_size",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
)
# S3: each also without its aws_ prefix
S3 = (
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_default_region",
    "aws_region",
    "aws_bucket",
    "aws_bucket_name",
    "aws_endpoint",
    "aws_endpoint_url",
    "aws_endpoint_url_s3",
    "aws_session_token",
    "aws_token",
    "aws_virtual_hosted_style_request",
    "aws_s3_express",
    "aws_imdsv1_fallback",
    "aws_metadata_endpoint",
    "aws_unsigned_payload",
    "aws_checksum_algorithm",
    "aws_container_credentials_relative_uri",
    "aws_container_credentials_full_uri",
    "aws_container_authorization_token_file",
    "aws_web_identity_token_file",
    "aws_role_arn",
    "aws_role_session_name",
    "aws_endpoint_url_sts",
    "aws_skip_signature",
    "aws_copy_if_not_exists",
    "aws_conditional_put",
    "aws_disable_tagging",
    "aws_disable_bulk_delete",
    "aws_request_payer",
    "aws_server_side_encryption",
    "aws_sse_kms_key_id",
    "aws_sse_bucket_key_enabled",
    "aws_sse_customer_key_base64",
)
# Azure: each also with an azure_ prefix
AZURE = (
    "account_key",
    "access_key",
    "master_key",
    "storage_account_key",
    "storage_access_key",
    "storage_master_key",
    "account_name",
    "storage_account_name",
    "client_id",
    "storage_client_id",
    "client_secret",
    "storage_client_secret",
    "tenant_id",
    "authority_id",
    "storage_tenant_id",
    "storage_authority_id",
    "authority_host",
    "storage_authority_host",
    "sas_key",
    "sas_token",
    "storage_sas_key",
    "storage_sas_token",
    "token",
    "bearer_token",
    "storage_token",
    "use_emulator",
    "storage_use_emulator",
    "endpoint",
    "storage_endpoint",
    "msi_endpoint",
    "identity_endpoint",
    "object_id",
    "msi_resource_id",
    "federated_token_file",
    "use_fabric_endpoint",
    "use_azure_cli",
    "skip_signature",
    "container_name",
    "disable_tagging",
    "credential_type",
    "encryption_key",
)
# GCS: each also with a google_ prefix
GOOGLE = (
    "service_account",
    "service_account_path",
    "service_account_key",
    "bucket",
    "bucket_name",
    "base_url",
    "application_credentials",
    "bearer_token",
    "skip_signature",
)
# read by Lance itself, not by object_store
LANCE = (
    "download_retry_count",
    "client_max_retries",
    "client_retry_timeout",
    "use_opendal",
    "expires_at_millis",
    "google_storage_token",
    "s3_express",
    *(
        f"lance_aimd_{name}"
        for name in (
            "initial_rate",
            "min_rate",
            "max_rate",
            "decrease_factor",
            "additive_increment",
            "burst_capacity",
            "max_retries",
            "min_backoff_ms",
            "max_backoff_ms",
        )
    ),
)
# families of names: a header Lance sends (headers.<name>), Azure's Fabric settings
PREFIXES = ("headers.", "fabric_", "azure_fabric_")


def _known() -> frozenset[str]:
    names = set(LANCE)
    names.update(CLIENT, (f"{p}_{n}" for p in ("aws", "azure", "google") for n in CLIENT))
    names.update(S3, (n.removeprefix("aws_") for n in S3))
    names.update(AZURE, (f"azure_{n}" for n in AZURE))
    names.update(GOOGLE, (f"google_{n}" for n in GOOGLE))
    return frozenset(names)


KNOWN = _known()


# spellings object_store reads as one key (after a store's prefix is dropped)
_ONE_KEY = {
    "s3": {"default_region": "region", "bucket_name": "bucket", "endpoint_url": "endpoint",
           "session_token": "token"},
    "azure": {"access_key": "account_key", "master_key": "account_key",
              "authority_id": "tenant_id", "sas_token": "sas_key", "bearer_token": "token",
              "identity_endpoint": "msi_endpoint"},
    "google": {"service_account_path": "service_account", "bucket_name": "bucket"},
}  # fmt: skip


def _meanings(name: str) -> set[tuple[str, str]]:
    """The (store, key) pairs object_store or Lance reads ``name`` as.

    >>> sorted(_meanings("AWS_REGION")), sorted(_meanings("timeout"))[0]
    ([('s3', 'region')], ('azure', 'timeout'))
    """
    lower = name.lower()
    if lower in LANCE:
        return {("lance", lower)}
    meanings = set()
    for store, prefix, names in (("s3", "aws_", S3), ("azure", "azure_", AZURE),
                                 ("google", "google_", GOOGLE)):  # fmt: skip
        bare = lower.removeprefix(prefix)
        if bare in CLIENT and (bare == lower or lower.startswith(prefix)):
            meanings.add((store, bare))
        elif f"aws_{bare}" in names if store == "s3" else bare in names:
            bare = bare.removeprefix("storage_") if store == "azure" else bare
            meanings.add((store, _ONE_KEY[store].get(bare, bare)))
    return meanings


def check_option_names(options: Mapping[str, object] | Iterable[str]) -> None:
    """Refuse a storage option name Lance does not read (case aside), naming the closest, and
    two spellings of one option (Lance would take either); both
    :class:`~blobhouse.errors.UnknownOptionError`."""
    seen: dict[tuple[str, str], str] = {}
    for name in options:
        for meaning in _meanings(name):
            if meaning in seen and seen[meaning] != name:
                raise UnknownOptionError(
                    f"storage options {seen[meaning]!r} and {name!r} are one option: Lance "
                    "would take either of them; give it once"
                )
            seen[meaning] = name
    for name in options:
        lower = name.lower()
        if lower in KNOWN or lower.startswith(PREFIXES):
            continue
        near = closest(lower, KNOWN)
        hint = f" (did you mean {near!r}?)" if near else ""
        raise UnknownOptionError(
            f"unknown storage option {name!r}{hint}: Lance would ignore it silently. Storage "
            "options use Lance's names (docs/object-storage.md), e.g. aws_endpoint, aws_region, "
            "account_name, service_account, timeout"
        )


# what gives access to a store (keys, secrets, tokens, signed URLs, headers that may carry
# them): never kept where others read it, such as a Spark catalog
_SECRET = re.compile(
    r"secret|token|password|sas_|^sas|access_key|account_key|master_key|encryption_key"
    r"|customer_key|^headers\.",
    re.IGNORECASE,
)


def is_secret(name: str) -> bool:
    """Whether the storage option ``name`` gives access to a store (a key, a secret, a token).

    >>> [is_secret(n) for n in ("aws_secret_access_key", "account_key", "sas_token", "aws_region")]
    [True, True, True, False]
    """
    # a ``*_file`` option names a file holding a secret, not the secret
    return not name.lower().endswith("_file") and _SECRET.search(name) is not None
