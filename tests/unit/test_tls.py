"""The cluster CA and the server's certificate: made once, kept, renewed when the names change."""

from __future__ import annotations

import pytest
from cryptography import x509

from shoal.server import tls
from shoal.store.engine import make_engine, migrate, session_factory


@pytest.fixture
def sessions(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'shoal.db'}")
    migrate(engine)
    yield session_factory(engine)
    engine.dispose()


def sans(path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*ext.get_values_for_type(x509.DNSName), *map(str, ext.get_values_for_type(x509.IPAddress))}


@pytest.mark.parametrize("mode,host,served", [
    ("auto", "127.0.0.1", False), ("auto", "127.0.3.7", False), ("auto", "localhost", False),
    ("auto", "0.0.0.0", True), ("auto", "10.0.0.1", True), ("auto", "::", True),
    ("on", "127.0.0.1", True), ("off", "10.0.0.1", False),
])
def test_https_is_the_default_off_loopback(mode, host, served):
    assert tls.serves_tls(mode, host) is served


def test_the_certificate_covers_the_listen_address_the_host_and_the_advertised_name(sessions, tmp_path):
    names = tls.subject_names("10.1.2.3", "head.example.org")
    assert {"10.1.2.3", "head.example.org", "localhost", "127.0.0.1"} <= set(names)
    files = tls.prepare(sessions, tmp_path, names)
    assert set(names) <= sans(files.cert)
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(ca)
    assert files.key.stat().st_mode & 0o077 == 0  # the key is the server's alone


def test_a_restart_keeps_the_ca_and_the_certificate_and_new_names_get_a_new_certificate(sessions, tmp_path):
    first = tls.prepare(sessions, tmp_path, ["localhost", "10.1.2.3"])
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    again = tls.prepare(sessions, tmp_path, ["localhost", "10.1.2.3"])
    assert (again.ca.read_bytes(), again.cert.read_bytes()) == (ca, cert)
    moved = tls.prepare(sessions, tmp_path, ["localhost", "10.1.2.3", "head2"])
    assert moved.ca.read_bytes() == ca and moved.cert.read_bytes() != cert and "head2" in sans(moved.cert)


def test_servers_sharing_a_store_share_the_ca_but_not_their_certificates(sessions, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = tls.prepare(sessions, tmp_path / "a", ["head1"])
    b = tls.prepare(sessions, tmp_path / "b", ["head2"])
    assert a.ca.read_bytes() == b.ca.read_bytes()
    assert "head1" in sans(a.cert) and "head2" in sans(b.cert) and "head2" not in sans(a.cert)


def test_an_agent_gets_a_certificate_for_its_key_its_node_name_and_its_address(sessions, tmp_path):
    from shoal.agent.certs import AgentCertificate

    files = tls.prepare(sessions, tmp_path, ["localhost"])
    mine = AgentCertificate(tmp_path / "node", "gpu07")
    pem = tls.ClusterCA(sessions).issue_agent("gpu07", "10.0.0.7", mine.request())
    context = mine.accept(pem, files.ca.read_text())  # the key it kept matches the certificate
    assert context is not None and mine.ca_file.read_bytes() == files.ca.read_bytes()
    assert (tmp_path / "node" / "tls" / "agent.key").stat().st_mode & 0o077 == 0
    assert sans(tmp_path / "node" / "tls" / "agent.crt") == {"gpu07", "10.0.0.7"}
    cert = x509.load_pem_x509_certificate(pem.encode())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(files.ca.read_bytes()))
    assert not mine.renewal_due(cert.not_valid_after_utc.timestamp() - 31 * 86400)
    assert mine.renewal_due(cert.not_valid_after_utc.timestamp() - 29 * 86400)  # the agent registers again
    wildcard = tmp_path / "wildcard.crt"  # an agent listening on every address: its node name alone
    wildcard.write_text(tls.ClusterCA(sessions).issue_agent("gpu08", "0.0.0.0", AgentCertificate(tmp_path, "x").request()))
    assert sans(wildcard) == {"gpu08"}
    with pytest.raises(tls.TLSError, match="not a PEM CSR"):
        tls.ClusterCA(sessions).issue_agent("gpu07", "10.0.0.7", "junk")
