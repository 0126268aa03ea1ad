"""A certificate authority made at test time, for TLS listeners on 127.0.0.1.

``TestCA.create(directory)`` writes a CA (``ca.pem``), a server certificate it signed for
``localhost`` and ``127.0.0.1`` (``server.pem``, ``server.key``, and ``server.p12``, a PKCS12
keystore a JVM broker reads), a client certificate it signed (``client.pem``, with its key
in ``client.key``, encrypted with ``client_key_password``) for listeners that require one,
and a second, unrelated CA (``other-ca.pem``) for tests of a certificate the client must
refuse. Keys are EC P-256: quick to make.
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
CLIENT_KEY_PASSWORD = "flowkit-client-key"
# The keystore's key and certificates under one round of PBKDF2 (20,000 by default): the
# broker reads it once or more for each TLS listener at every start, and 20,000 rounds of
# the JVM's SHA-256 (compiled by C1 only, tests/apache_kafka.py) took about 0.4 s a read,
# seconds a start. A test password guards nothing.
_KEYSTORE_ENCRYPTION = (
    serialization.PrivateFormat.PKCS12.encryption_builder()
    .kdf_rounds(1)
    .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
    .hmac_hash(hashes.SHA256())
    .build(KEYSTORE_PASSWORD.encode())
)


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
    client_cert: Path
    """PEM of a client certificate the CA signed (``ssl_certfile``)."""
    client_key: Path
    """Its key, PKCS8 PEM encrypted with ``client_key_password`` (``ssl_keyfile``)."""
    keystore_password: str = KEYSTORE_PASSWORD
    client_key_password: str = CLIENT_KEY_PASSWORD

    @classmethod
    def create(cls, directory: Path) -> TestCA:
        directory.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = _self_signed_ca("flowkit test CA")
        _, other_cert = _self_signed_ca("flowkit untrusted CA")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _signed(ca_key, ca_cert, key, "localhost", ExtendedKeyUsageOID.SERVER_AUTH)
        client_key = ec.generate_private_key(ec.SECP256R1())
        client_cert = _signed(
            ca_key, ca_cert, client_key, "flowkit client", ExtendedKeyUsageOID.CLIENT_AUTH
        )
        files = cls(
            ca_file=directory / "ca.pem",
            other_ca_file=directory / "other-ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server.key",
            keystore=directory / "server.p12",
            client_cert=directory / "client.pem",
            client_key=directory / "client.key",
        )
        files.ca_file.write_bytes(_pem(ca_cert))
        files.other_ca_file.write_bytes(_pem(other_cert))
        files.server_cert.write_bytes(_pem(cert) + _pem(ca_cert))
        files.server_key.write_bytes(_key_pem(key, serialization.NoEncryption()))
        files.keystore.write_bytes(
            pkcs12.serialize_key_and_certificates(
                b"broker",
                key,
                cert,
                [ca_cert],
                _KEYSTORE_ENCRYPTION,
            )
        )
        files.client_cert.write_bytes(_pem(client_cert))
        encrypted = serialization.BestAvailableEncryption(CLIENT_KEY_PASSWORD.encode())
        files.client_key.write_bytes(_key_pem(client_key, encrypted))
        return files


def _key_pem(
    key: ec.EllipticCurvePrivateKey, encryption: serialization.KeySerializationEncryption
) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def _signed(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    common_name: str,
    usage: x509.ObjectIdentifier,
) -> x509.Certificate:
    """A certificate for ``common_name`` (and for localhost/127.0.0.1, which a server
    certificate needs) that the CA signed, for ``usage`` (server or client)."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
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
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
