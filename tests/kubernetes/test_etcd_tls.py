"""etcd client TLS, as the chart deploys it with external etcd: a real etcd with client-cert auth.

The Coordinator (gateway and replicas alike) uses a TLS channel when given :class:`EtcdTls`; the replica reads
the PEM paths from ``NOTEBOOKOS_ETCD_CA_CERT`` / ``_CERT`` / ``_KEY`` (the paths where the launcher mounts the
TLS secret).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from support import free_port

from jupyter_notebookos.coordination.client import Coordinator, EtcdTls
from jupyter_notebookos.coordination.errors import CoordinationError, EtcdUnavailable
from jupyter_notebookos.embedded.etcd import EtcdBinaryMissing, find_etcd_binary
from jupyter_notebookos.kernel.settings import ReplicaConfigError, ReplicaSettings
from jupyter_notebookos.replication import protocol


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer_name, issuer_key = issuer or (_name(subject), key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        names = [
            x509.DNSName("etcd-0.etcd"),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if not ca:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    crt, pem = path.with_suffix(".crt"), path.with_suffix(".key")
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(crt), str(pem)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A 1-member etcd that serves TLS and requires client certificates; yields its endpoint and PEM paths."""
    try:
        binary = find_etcd_binary()
    except EtcdBinaryMissing as err:
        pytest.skip(str(err))
    root = tmp_path_factory.mktemp("etcd-tls")
    ca_cert, ca_key = _issue("notebookos-test-ca", None, ca=True)
    ca_crt, _ = _write(root / "ca", ca_cert, ca_key)
    server_crt, server_key = _write(root / "server", *_issue("etcd-0", (ca_cert.subject, ca_key), server=True))
    client_crt, client_key = _write(root / "client", *_issue("notebookos-gateway", (ca_cert.subject, ca_key)))
    client_port, peer_port = free_port(), free_port()
    url = f"https://127.0.0.1:{client_port}"
    process = subprocess.Popen(
        [
            str(binary.path),
            "--name",
            "tls0",
            "--data-dir",
            str(root / "data"),
            "--listen-client-urls",
            url,
            "--advertise-client-urls",
            url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"tls0=http://127.0.0.1:{peer_port}",
            "--cert-file",
            server_crt,
            "--key-file",
            server_key,
            "--trusted-ca-file",
            ca_crt,
            "--client-cert-auth",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "etcd.log").open("wb"),
    )
    deadline = time.monotonic() + 15
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", client_port)) == 0:
                break
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"TLS etcd did not start: {(root / 'etcd.log').read_text()[-2000:]}")
        time.sleep(0.05)
    try:
        yield f"127.0.0.1:{client_port}", {"ca": ca_crt, "cert": client_crt, "key": client_key}
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.asyncio
async def test_coordinator_talks_tls_with_a_client_certificate(tls_etcd: tuple[str, dict[str, str]]) -> None:
    endpoint, pem = tls_etcd
    tls = EtcdTls(ca_cert=pem["ca"], cert=pem["cert"], key=pem["key"])
    async with await Coordinator.connect([endpoint], timeout=5, tls=tls) as co:
        await co.put("/tls-test/a", "1")
        value = await co.get("/tls-test/a")
        assert value is not None and value.value == b"1"
    # A host name checks the certificate's DNS name (as the chart's etcd-0.etcd... endpoints do).
    named = EtcdTls(ca_cert=pem["ca"], cert=pem["cert"], key=pem["key"], server_name="etcd-0.etcd")
    async with await Coordinator.connect([endpoint.replace("127.0.0.1", "localhost")], timeout=5, tls=named) as co:
        assert (await co.get("/tls-test/a")) is not None


@pytest.mark.asyncio
async def test_plain_or_certless_clients_are_refused(tls_etcd: tuple[str, dict[str, str]]) -> None:
    endpoint, pem = tls_etcd
    with pytest.raises(EtcdUnavailable):
        await Coordinator.connect([endpoint], timeout=1.5)  # no TLS at all
    with pytest.raises(CoordinationError):
        # TLS, but no client certificate: etcd's --client-cert-auth refuses the handshake.
        await Coordinator.connect([endpoint], timeout=1.5, tls=EtcdTls(ca_cert=pem["ca"]))


@pytest.mark.asyncio
async def test_a_missing_pem_file_is_named_in_the_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "ca.crt")
    with pytest.raises(CoordinationError, match=f"cannot read the etcd TLS CA certificate {missing}"):
        await Coordinator.connect(["127.0.0.1:2379"], timeout=0.5, tls=EtcdTls(ca_cert=missing))


def test_replica_reads_tls_paths_from_its_environment() -> None:
    base = {
        protocol.ENV_KERNEL_ID: "k",
        protocol.ENV_REPLICA_ID: "0",
        protocol.ENV_ETCD_ENDPOINTS: "etcd-0.etcd:2379",
        protocol.ENV_KEY: "secret",
    }
    assert ReplicaSettings.from_env(base).etcd_tls is None
    env = {
        **base,
        protocol.ENV_ETCD_CA_CERT: "/etc/notebookos/etcd-tls/ca.crt",
        protocol.ENV_ETCD_CERT: "/etc/notebookos/etcd-tls/tls.crt",
        protocol.ENV_ETCD_KEY: "/etc/notebookos/etcd-tls/tls.key",
    }
    tls = ReplicaSettings.from_env(env).etcd_tls
    assert tls == EtcdTls(
        "/etc/notebookos/etcd-tls/ca.crt", "/etc/notebookos/etcd-tls/tls.crt", "/etc/notebookos/etcd-tls/tls.key"
    )
    assert tls.target_name(["etcd-0.etcd:2379", "etcd-1.etcd:2379"]) == "etcd-0.etcd"
    assert tls.target_name(["10.0.0.3:2379"]) == ""
    with pytest.raises(ReplicaConfigError, match="both a client certificate and its key"):
        ReplicaSettings.from_env({**base, protocol.ENV_ETCD_CERT: "/x/tls.crt"})
