"""The server's checks of a submitted script and its words for a state store it cannot write."""

import hashlib

import pytest
from sqlalchemy.exc import OperationalError

from shoal.server.jobs import JobError, checked_script_digest
from shoal.server.limits import store_failure
from shoal.server.main import _redacted
from shoal.server.schemas import JobSubmit


def test_a_script_is_stored_with_the_digest_of_its_bytes_and_a_wrong_one_is_refused():
    script = "#!/bin/sh\necho 'a\rb' \xff\udcfe\n"
    data = script.encode("utf-8", "surrogateescape")
    assert checked_script_digest(script, None) == hashlib.sha256(data).hexdigest()
    assert checked_script_digest(script, hashlib.sha256(data).hexdigest()) == hashlib.sha256(data).hexdigest()
    with pytest.raises(JobError) as e:
        checked_script_digest(script, "0" * 64)
    assert e.value.status == 422 and "changed on the way" in e.value.message
    with pytest.raises(JobError) as e:
        checked_script_digest("#!/bin/sh\n\ud800", None)  # a surrogate no byte stands for
    assert "not valid UTF-8" in e.value.message


def test_script_base64_carries_bytes_json_cannot():
    body = JobSubmit(workdir="/tmp", script_base64="IyEvYmluL3NoCv/+Cg==")
    assert body.script.encode("utf-8", "surrogateescape") == b"#!/bin/sh\n\xff\xfe\n"
    with pytest.raises(ValueError, match="not both"):
        JobSubmit(workdir="/tmp", script="#!/bin/sh\n", script_base64="IyEvYmluL3NoCg==")
    with pytest.raises(ValueError, match="not base64"):
        JobSubmit(workdir="/tmp", script_base64="#!/bin/sh")


@pytest.mark.parametrize("said, cause", [
    ("database or disk is full", "the disk under its state store is full"),
    ('could not extend file "base/16384/2619": No space left on device', "the disk under its state store is full"),
    ("attempt to write a readonly database", "its state store is read-only"),
    ("cannot execute INSERT in a read-only transaction", "its state store is read-only"),
])
def test_a_store_that_cannot_be_written_is_named_with_the_databases_words(said, cause):
    exc = OperationalError("INSERT ...", {}, Exception(said))
    assert store_failure(exc) == f"the Shoal server cannot save its state: {cause} ({said})"
    assert store_failure(ValueError(said)) is None


def test_a_database_url_is_shown_without_its_password():
    assert _redacted("postgresql://shoal:s3cret@db:5432/shoal") == "postgresql://shoal:***@db:5432/shoal"
    assert _redacted("sqlite:////var/lib/shoal/shoal.db") == "sqlite:////var/lib/shoal/shoal.db"
