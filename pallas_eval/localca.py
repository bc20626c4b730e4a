"""A throwaway certificate authority for tests and the local replay (never for a deployment).

:class:`LocalCA` makes a self-signed CA and issues leaf certificates that serve both as gRPC
server and client certificates (extended key usage serverAuth + clientAuth), written as PEM files
that :mod:`pallas_common.tls` reads. In a cluster the certificates come from cert-manager instead
(docs/security.md).

Needs the ``cryptography`` package (the ``dev`` extra), imported when this module is.
Keys are ECDSA P-256; validity is given in seconds from now (tests make short-lived ones).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pallas_common.tls import TlsFiles

__all__ = ["LocalCA"]

def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    """DNS names, IP addresses (parsed) and URIs (anything with ``://``, e.g. SPIFFE ids)."""
    out: list[x509.GeneralName] = []
    for n in names:
        if "://" in n:
            out.append(x509.UniformResourceIdentifier(n))
            continue
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(out)


class LocalCA:
    """A self-signed CA (``name`` is its subject CN) that issues leaf certificates.

    Args:
        name: the CA's common name; two CAs of the same name still have different keys, so a
            certificate of one never verifies against the other.
        valid_s: validity of the CA certificate, seconds from now.
    """

    def __init__(self, name: str = "pallas-test-ca", valid_s: float = 86400.0) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(seconds=valid_s))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256()))

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM (the trust bundle peers load)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, sans: list[str] | None = None,
              valid_s: float = 3600.0) -> tuple[bytes, bytes]:
        """A leaf certificate for ``common_name`` with subject alternative names ``sans``
        (default ``[common_name, "localhost", "127.0.0.1"]``).

        Returns ``(cert_pem, key_pem)``; the key is PKCS#8 PEM, unencrypted.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        names = sans if sans is not None else [common_name, "localhost", "127.0.0.1"]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(seconds=valid_s))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(_san(names), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False)
            .sign(self.key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def write(self, directory: str | Path, common_name: str, sans: list[str] | None = None,
              valid_s: float = 3600.0, *, stem: str | None = None) -> TlsFiles:
        """Issue a certificate (see :meth:`issue`) and write ``<stem>.crt``, ``<stem>.key`` and
        ``ca.crt`` into ``directory`` (created; ``stem`` defaults to ``common_name``). The key file
        is made readable by its owner only. Returns the three paths (what
        :class:`pallas_common.tls.CertWatcher` reads)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        cert_pem, key_pem = self.issue(common_name, sans, valid_s)
        stem = stem or common_name
        files = TlsFiles(d / f"{stem}.crt", d / f"{stem}.key", d / "ca.crt")
        files.ca.write_bytes(self.cert_pem)
        files.key.touch(mode=0o600)
        files.key.write_bytes(key_pem)
        files.cert.write_bytes(cert_pem)
        return files
