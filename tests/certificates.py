"""A certificate authority made at test time, for TLS listeners on 127.0.0.1.

``TestCA.create(directory)`` writes a CA (``ca.pem``), a server certificate it signed for
``localhost`` and ``127.0.0.1`` (``server.pem``, ``server.key``, and ``server.p12``, a PKCS12
keystore a JVM broker reads), and a second, unrelated CA (``other-ca.pem``) for tests of a
certificate the client must refuse. Keys are EC P-256: quick to make.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TestCA"]

KEYSTORE_PASSWORD = "flowkit-test"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _self_signed_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


@dataclass(frozen=True)
class TestCA:
    """The files of a test CA and the server certificate it signed."""

    __test__ = False  # a helper, not a test class

    ca_file: Path
    """PEM of the CA: a client's ``ssl_cafile``."""
    other_ca_file: Path
    """PEM of an unrelated CA that did not sign the server's certificate."""
    server_cert: Path
    server_key: Path
    keystore: Path
    """PKCS12 with the server's key and certificate chain, password ``keystore_password``."""
    keystore_password: str = KEYSTORE_PASSWORD

    @classmethod
    def create(cls, directory: Path) -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = _self_signed_ca("flowkit test CA")
        _, other_cert = _self_signed_ca("flowkit untrusted CA")
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("localhost"))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        files = cls(
            ca_file=directory / "ca.pem",
            other_ca_file=directory / "other-ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server.key",
            keystore=directory / "server.p12",
        )
        files.ca_file.write_bytes(_pem(ca_cert))
        files.other_ca_file.write_bytes(_pem(other_cert))
        files.server_cert.write_bytes(_pem(cert) + _pem(ca_cert))
        files.server_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        files.keystore.write_bytes(
            pkcs12.serialize_key_and_certificates(
                b"broker",
                key,
                cert,
                [ca_cert],
                serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode()),
            )
        )
        return files
