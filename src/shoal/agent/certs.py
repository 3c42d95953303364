"""The agent's serving certificate. Its key is made on the node and never leaves it: the
agent sends a CSR when it registers and the server's cluster CA issues the certificate (for
the node name, which callers check, and the advertised address). Key, certificate and CA
are kept in WORKDIR/tls, so a restarted agent serves HTTPS at once, before it registers again.
Every registration brings a new certificate; an agent that runs on registers again when its
certificate has a month left (as the kubelet rotates its serving certificate).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from shoal.agent.supervise import write_private

KEY, CERT, CA = "agent.key", "agent.crt", "ca.crt"
RENEW_S = 30 * 86400  # a certificate this close to its end is renewed


class AgentCertificate:
    def __init__(self, workdir: Path, node: str) -> None:
        self.dir = workdir / "tls"
        self.node = node
        self._pending: bytes | None = None  # the key of the CSR sent last, until its certificate comes
        self.not_after: float | None = None  # when the certificate served now ends (epoch seconds)

    @property
    def ca_file(self) -> Path:
        """The cluster CA as the server sent it (jobs' srun verifies the other agents with it)."""
        return self.dir / CA

    def request(self) -> str:
        """A new key, held until its certificate arrives, and its CSR (PEM)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        self._pending = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"shoal agent {self.node}")]))
               .sign(key, hashes.SHA256()))
        return csr.public_bytes(serialization.Encoding.PEM).decode()

    def accept(self, certificate: str, ca: str) -> ssl.SSLContext:
        """Keep the certificate the CA issued for the pending key; the context to serve with."""
        if self._pending is None:
            raise ValueError("a certificate came without a request")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, data, private in ((KEY, self._pending, True), (CERT, certificate.encode(), False),
                                    (CA, ca.encode(), False)):
            tmp = self.dir / f".{name}.tmp"
            if private:
                write_private(tmp, data)
            else:
                tmp.write_bytes(data)
                tmp.chmod(0o644)
            os.replace(tmp, self.dir / name)
        self._pending = None
        ctx = self.context()
        if ctx is None:
            raise ValueError(f"the certificate the server issued cannot be loaded from {self.dir}")
        return ctx

    def context(self) -> ssl.SSLContext | None:
        """The server context from the kept key and certificate; None when there are none (yet)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.dir / CERT, self.dir / KEY)
        except (OSError, ssl.SSLError):
            return None
        from cryptography import x509

        cert = x509.load_pem_x509_certificate((self.dir / CERT).read_bytes())
        self.not_after = cert.not_valid_after_utc.timestamp()
        return ctx

    def renewal_due(self, now: float) -> bool:
        """Whether the certificate served now is within a month of its end (or past it)."""
        return self.not_after is not None and now >= self.not_after - RENEW_S
