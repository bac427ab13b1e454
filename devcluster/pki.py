"""Keys and certificates for the local control plane (made once per state dir with openssl)."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import UserFacingError


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def apiserver_cert(self) -> Path:
        """Self-signed serving certificate; also the cluster CA handed to clients and pods."""
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def token_file(self) -> Path:
        return self.directory / "tokens.csv"

    def admin_token(self) -> str:
        return self.token_file.read_text().split(",", 1)[0]

    @property
    def kubelet_client_cert(self) -> Path:
        """The apiserver's client certificate towards real kubelets (logs, exec, port-forward)."""
        return self.directory / "kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.directory / "kubelet-client.key"

    def token_of(self, user: str) -> str | None:
        for line in self.token_file.read_text().splitlines():
            fields = line.split(",")
            if len(fields) >= 2 and fields[1] == user:
                return fields[0]
        return None

    def ensure_token(self, user: str, uid: str, groups: str = "") -> str:
        """A static token for `user` (kept across restarts; the apiserver reads the file when it starts)."""
        token = self.token_of(user)
        if token is None:
            token = secrets.token_hex(24)
            line = f"{token},{user},{uid}" + (f',"{groups}"' if groups else "")
            with self.token_file.open("a") as tokens:
                tokens.write(line + "\n")
        return token

    def ensure_kubelet_client_cert(self) -> None:
        """Signed by the cluster CA, in group system:masters so that every kubelet's webhook allows it."""
        self._ensure_signed(
            self.kubelet_client_cert,
            self.kubelet_client_key,
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
        )

    @property
    def kueue_serving_dir(self) -> Path:
        """Kueue's webhook serving certificate and key, named as its webhook server reads them."""
        return self.directory / "kueue"

    def ensure_kueue_serving_cert(self) -> Path:
        """Signed by the cluster CA for 127.0.0.1, where the apiserver calls Kueue's webhooks (the caBundle it
        is given is the CA's certificate). Returns the folder."""
        folder = self.kueue_serving_dir
        folder.mkdir(exist_ok=True)
        self._ensure_signed(
            folder / "tls.crt",
            folder / "tls.key",
            "/CN=kueue-webhook",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        return folder

    def _ensure_signed(self, cert: Path, key: Path, subject: str, extensions: str = "") -> None:
        """A new key and a certificate for it signed by the cluster CA, unless the certificate exists."""
        if cert.exists():
            return
        request = cert.with_suffix(".csr")
        _openssl(
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
            "-subj", subject,
        )  # fmt: skip
        extfile = cert.with_suffix(".ext")
        extfile.write_text(extensions)
        _openssl(
            "x509", "-req", "-in", str(request), "-CA", str(self.apiserver_cert), "-CAkey", str(self.apiserver_key),
            "-CAcreateserial", "-out", str(cert), "-days", "3650", *(["-extfile", str(extfile)] if extensions else []),
        )  # fmt: skip
        request.unlink(missing_ok=True)
        extfile.unlink(missing_ok=True)


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise UserFacingError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def ensure_pki(directory: Path) -> Pki:
    """Creates whatever is missing; existing keys are kept so restarts keep tokens valid."""
    if shutil.which("openssl") is None:
        raise UserFacingError(
            "`openssl` is needed to make the cluster's certificates; install it (apt-get install openssl)."
        )
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    if not pki.service_account_key.exists():
        _openssl("genrsa", "-out", str(pki.service_account_key), "2048")
        _openssl("rsa", "-in", str(pki.service_account_key), "-pubout", "-out", str(pki.service_account_pub))
    if not pki.apiserver_cert.exists():
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(pki.apiserver_key), "-out", str(pki.apiserver_cert), "-days", "3650",
            "-subj", "/CN=kube-apiserver",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1",
        )  # fmt: skip
    if not pki.token_file.exists():
        pki.token_file.write_text(f"{secrets.token_hex(24)},admin,admin,system:masters\n")
        pki.token_file.chmod(0o600)
    return pki


def ensure_serving_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for a server on 127.0.0.1 (a host process the apiserver calls, such as a
    webhook): `tls.crt` and `tls.key` in `directory`, as controller-runtime's webhook server reads them; the
    certificate is its own CA bundle. Made once; kept while the folder is."""
    if shutil.which("openssl") is None:
        raise UserFacingError("`openssl` is needed to make a serving certificate (apt-get install openssl).")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    if not cert.exists() or not key.exists():
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "365", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        )  # fmt: skip
    return cert, key
