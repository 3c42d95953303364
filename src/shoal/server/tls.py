"""The cluster CA, the server's certificate and the agents', made at first start (as kubeadm
makes its PKI) and at each agent's registration (as the kubelet's serving certificate is).

The CA (10 years) is kept in the store, so every server sharing it is trusted through the
same ``ca.crt``; each server writes it to its state dir for agents and clients, and makes
its own certificate (1 year, renewed at start when a month is left or its names changed)
for the names it is reached by: its listen address, its host names and addresses, and
``--advertise-url``'s host. An agent that serves HTTPS sends a CSR when it registers (its
key never leaves the node) and is given a certificate for its node name and address; the
server and srun check it against the same CA, with the node name as the host name.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shoal.api_client.tls import WILDCARDS, cluster_context, serves_tls  # noqa: F401 (serves_tls: for server.main)
from shoal.server.core import write_private
from shoal.store.lease import shared_secret

CA_CERT, SERVER_CERT, SERVER_KEY = "ca.crt", "server.crt", "server.key"
CA_SECRET = "cluster-ca"  # the CA's key and certificate (PEM) in the store's secrets
CA_DAYS, CERT_DAYS, RENEW_DAYS = 3650, 365, 30


class TLSError(ValueError):
    """TLS cannot be set up as asked; the message says why."""


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


def subject_names(listen_host: str, advertise_host: str | None) -> list[str]:
    """The names a server's certificate covers: how anyone may reach it."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()]
    if listen_host not in WILDCARDS:
        names.append(listen_host.strip("[]"))
    else:
        try:
            names += socket.gethostbyname_ex(socket.gethostname())[2]
        except OSError:
            pass
    if advertise_host:
        names.append(advertise_host)
    return sorted({n.lower() for n in names if n})


def prepare(sessions, state_dir: Path, names: list[str], now: datetime.datetime | None = None) -> TLSFiles:
    """Make (or reuse) the cluster CA and this server's certificate; return their paths."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    ca_key, ca_cert = _load_ca(sessions, now)
    files = TLSFiles(state_dir / CA_CERT, state_dir / SERVER_CERT, state_dir / SERVER_KEY)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    if not files.ca.exists() or files.ca.read_bytes() != ca_pem:
        files.ca.write_bytes(ca_pem)  # public: agents and clients are given it
        files.ca.chmod(0o644)
    if not _current(files, ca_cert, names, now):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(key.public_key(), ca_key, ca_cert, names, now)
        write_private(files.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca_pem)
    return files


class ClusterCA:
    """The cluster CA as the running server uses it (loaded from the store at first use): it
    issues agents their serving certificates, and verifies the agents the server calls."""

    def __init__(self, sessions) -> None:
        self.sessions = sessions
        self._loaded: tuple | None = None
        self._context: ssl.SSLContext | None = None

    def _ca(self):
        if self._loaded is None:
            self._loaded = _load_ca(self.sessions, datetime.datetime.now(datetime.timezone.utc))
        return self._loaded

    def pem(self) -> str:
        return self._ca()[1].public_bytes(serialization.Encoding.PEM).decode()

    def client_context(self) -> ssl.SSLContext:
        """Verifies an agent's certificate (its node name is the host name to check)."""
        if self._context is None:
            self._context = cluster_context(ca_data=self.pem())
        return self._context

    def issue_agent(self, node: str, address: str, csr_pem: str, now: datetime.datetime | None = None) -> str:
        """A serving certificate (PEM, then the CA's) for the key in the agent's CSR. Its names
        are the server's choice, not the CSR's: the node name, which callers verify, and the
        address the agent advertised."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except ValueError:
            raise TLSError("the agent's certificate signing request is not a PEM CSR") from None
        if not csr.is_signature_valid:
            raise TLSError("the agent's certificate signing request has an invalid signature")
        ca_key, ca_cert = self._ca()
        names = [node] + ([address.strip("[]")] if address not in WILDCARDS and address != node else [])
        cert = _certificate(csr.public_key(), ca_key, ca_cert, names, now, f"shoal agent {node}")
        return (cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM)).decode()


def _load_ca(sessions, now: datetime.datetime):
    """The cluster CA's key and certificate, made and stored at the first call on a new store."""
    with sessions() as s, s.begin():
        pem = shared_secret(s, CA_SECRET, _new_ca(now))
    return serialization.load_pem_private_key(pem, None), x509.load_pem_x509_certificate(pem)


def _new_ca(now: datetime.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal cluster CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()) + cert.public_bytes(serialization.Encoding.PEM)


def _alt_names(names: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _certificate(public_key, ca_key, ca_cert: x509.Certificate, names: list[str], now: datetime.datetime,
                 subject: str = "shoal server"):
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(ca_cert.subject).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(_alt_names(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))


def _current(files: TLSFiles, ca_cert: x509.Certificate, names: list[str], now: datetime.datetime) -> bool:
    """Whether the certificate on disk is this CA's, covers ``names`` and has a month left."""
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        if not files.key.exists():
            return False
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    covered = {str(v).lower() for v in have.get_values_for_type(x509.DNSName)} | \
              {str(v) for v in have.get_values_for_type(x509.IPAddress)}
    wanted = {str(ipaddress.ip_address(n)) if _is_ip(n) else n for n in names}
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return wanted <= covered and cert.not_valid_after_utc - now > datetime.timedelta(days=RENEW_DAYS)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False
