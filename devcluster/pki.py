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
