"""https for the scripted OpenAI-compatible server (openai_stub.py): certificates made in the
test with `cryptography` (a CA, and leaves for names or addresses, trusted or not, current or
expired), and `served_over_tls`, which puts an OpenAIStub behind TLS before it starts."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from openai_stub import OpenAIStub


@dataclass
class Issued:
    cert: Path  # PEM
    key: Path   # PEM, unencrypted
    _cert: x509.Certificate
    _key: ec.EllipticCurvePrivateKey


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(where: Path, label: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    where.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = where / f"{label}.pem", where / f"{label}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Issued(cert_path, key_path, cert, key)


def make_ca(where: Path, label: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(label)).issuer_name(_name(label))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return _write(where, label, cert, key)


def issue(ca: Issued, where: Path, label: str, names: tuple[str, ...] = (), ips: tuple[str, ...] = (),
          expired: bool = False) -> Issued:
    """A server certificate from `ca` for `names` (DNS) and `ips`; `expired`: it ended yesterday."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = (now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)) if expired else (
        now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
    alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    cert = (x509.CertificateBuilder().subject_name(_name(names[0] if names else ips[0])).issuer_name(ca._cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca._key.public_key()), critical=False)
            .sign(ca._key, hashes.SHA256()))
    return _write(where, label, cert, key)


def served_over_tls(stub: OpenAIStub, leaf: Issued, host: str = "localhost") -> OpenAIStub:
    """`stub`, not started yet, serving https with `leaf` at https://`host`:port/v1. Each
    connection's handshake runs in its handler's thread; one that fails is recorded in
    `stub.handshake_errors` (the client refusing the certificate is an alert the server reads)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert, leaf.key)
    server = stub.server
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    stub.handshake_errors = []  # type: ignore[attr-defined]
    plain = server.RequestHandlerClass

    class TLSHandler(plain):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            self.request.settimeout(30)
            try:
                self.request.do_handshake()
            except (ssl.SSLError, OSError) as e:
                stub.handshake_errors.append(str(e))  # type: ignore[attr-defined]
                raise
            super().setup()

    server.RequestHandlerClass = TLSHandler
    server.handle_error = lambda *_args: None  # type: ignore[method-assign]  # a refused handshake is the test's point
    stub.endpoint = f"https://{host}:{stub.port}/v1"
    return stub


def certificates(tmp: Path) -> dict[str, Any]:
    """The test's CA (trusted through SSL_CERT_FILE) and one leaf for each case."""
    ca, stranger = make_ca(tmp, "wisp-test-ca"), make_ca(tmp, "untrusted-ca")
    return {
        "ca": ca,
        "localhost": issue(ca, tmp, "localhost", names=("localhost",)),
        "ip": issue(ca, tmp, "ip", ips=("127.0.0.1",)),
        "other-name": issue(ca, tmp, "other-name", names=("other.example",)),
        "expired": issue(ca, tmp, "expired", names=("localhost",), expired=True),
        "untrusted": issue(stranger, tmp, "untrusted", names=("localhost",)),
    }
