"""Object storage URIs and the file system built from them (no server: nothing is requested)."""

from __future__ import annotations

import pytest

from seglogfs.engine.object_store import (
    ObjectStore,
    is_object_store_uri,
    open_file_system,
    parse_location,
)


def test_uris_name_a_bucket_and_a_prefix() -> None:
    assert is_object_store_uri("s3://bucket/prefix") and is_object_store_uri("GS://b")
    assert not is_object_store_uri("/var/lib/kafka") and not is_object_store_uri("file:///x")
    assert not is_object_store_uri("s3:bucket")
    location = parse_location("s3://bucket//a/b/?region=eu-west-1")
    assert (location.bucket, location.prefix, dict(location.options)) == ("bucket", "a/b", {"region": "eu-west-1"})
    assert location.display == "s3://bucket/a/b"
    assert parse_location("s3://bucket").display == "s3://bucket"


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("s3:///prefix", "s3:///prefix: no bucket in the URI"),
        ("s3://b/a/../c", "'.' and '..' are not names in a bucket"),
        ("s3://b/p?bogus=1", "unknown option 'bogus'"),
        ("s3://b/p?retries=x", "option retries='x' is not a number"),
        ("s3://b/p?request_timeout=-1", "option request_timeout='-1' is negative"),
        ("s3://b/p?connect_timeout=nan", "option connect_timeout='nan' is negative"),
        ("http://b/p", "not an object store URI"),
    ],
)
def test_malformed_uris_are_refused_by_what_is_wrong(uri: str, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_location(uri)
    assert said in str(refused.value)


def test_keys_in_a_uri_are_taken_but_never_shown() -> None:
    location = parse_location("s3://KEYID:SECRET@bucket/prefix?secret_key=OTHER")
    assert location.options["access_key"] == "KEYID"
    assert location.options["secret_key"] == "OTHER"  # (the query's wins)
    for shown in (location.display, repr(location)):
        assert "SECRET" not in shown and "OTHER" not in shown and "KEYID" not in shown
    with pytest.raises(ValueError) as refused:
        parse_location("s3://KEYID:SECRET@bucket/p?bogus=1")
    assert "SECRET" not in str(refused.value) and "KEYID" not in str(refused.value)


def settings_of(file_system: object) -> dict[str, object]:
    """What an S3FileSystem was built with (what it pickles)."""
    _, (settings,) = file_system.__reduce__()  # type: ignore[misc]
    return dict(settings)


def test_the_endpoint_comes_from_the_environment_and_the_uri_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow's constructor ignores AWS_ENDPOINT_URL: the store reads it (and the S3 one first)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://general:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9001")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = ObjectStore(parse_location("s3://bucket/prefix"))
    settings = settings_of(store.file_system)
    assert (settings["endpoint_override"], settings["scheme"], settings["region"]) == (
        "s3-only:9001",
        "http",
        "eu-west-1",
    )
    assert (settings["connect_timeout"], settings["request_timeout"]) == (5.0, 10.0)
    overridden = settings_of(open_file_system(parse_location("s3://b/p?endpoint_override=https://uri:9002&retries=0")))
    assert (overridden["endpoint_override"], overridden["scheme"]) == ("uri:9002", "https")
    assert store.name("t-0/0.log") == "s3://bucket/prefix/t-0/0.log"
    assert store.path("t-0/0.log") == "bucket/prefix/t-0/0.log"
