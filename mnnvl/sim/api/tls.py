"""A certificate for the simulated API server's HTTPS, made at start with the standard library.

kubectl sends a kubeconfig's credentials only over TLS: client-go's ``DirectClientConfig
.ClientConfig`` reads the user's token "only ... if we are secure"
(kubernetes/client-go ``tools/clientcmd/client_config.go``, v0.32.4), so against a plain
``http://`` server every kubectl request is ``system:anonymous`` and RBAC refuses it. ``mnnvl sim
up`` therefore serves HTTPS with a fresh self-signed certificate for 127.0.0.1 (RSA 2048,
SHA-256, one year), which its kubeconfigs carry as ``certificate-authority-data``.
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
import time

E = 65537
SMALL_PRIMES = [p for p in range(3, 2000, 2) if all(p % d for d in range(3, math.isqrt(p) + 1, 2))]


def _probably_prime(n: int, rounds: int = 20) -> bool:
    if any(n % p == 0 for p in SMALL_PRIMES):
        return n in SMALL_PRIMES
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for _ in range(rounds):  # Miller-Rabin with random bases
        x = pow(secrets.randbelow(n - 3) + 2, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def _prime(bits: int) -> int:
    while True:
        n = secrets.randbits(bits) | (3 << (bits - 2)) | 1  # top two bits: n*m has 2*bits bits
        if math.gcd(n - 1, E) == 1 and _probably_prime(n):
            return n


def _der(tag: int, *parts: bytes) -> bytes:
    body = b"".join(parts)
    n = len(body)
    size = bytes([n]) if n < 0x80 else bytes([0x80 | (n.bit_length() + 7) // 8])
    if n >= 0x80:
        size += n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + size + body


def _seq(*parts: bytes) -> bytes:
    return _der(0x30, *parts)


def _int(v: int) -> bytes:
    return _der(0x02, v.to_bytes(v.bit_length() // 8 + 1, "big"))


def _oid(dotted: str) -> bytes:
    first, second, *rest = (int(p) for p in dotted.split("."))
    body = bytearray([40 * first + second])
    for p in rest:
        chunk = [p & 0x7F]
        while p > 0x7F:
            p >>= 7
            chunk.append(0x80 | (p & 0x7F))
        body += bytes(reversed(chunk))
    return _der(0x06, bytes(body))


def _pem(kind: str, der: bytes) -> str:
    text = base64.encodebytes(der).decode().replace("\n", "")
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return "\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----", ""])


NULL = b"\x05\x00"
SHA256_RSA = _seq(_oid("1.2.840.113549.1.1.11"), NULL)


def self_signed(common_name: str = "mnnvl-sim", days: int = 365) -> tuple[str, str]:
    """(certificate PEM, private key PEM) for 127.0.0.1 and localhost."""
    p, q = _prime(1024), _prime(1024)
    n, d = p * q, pow(E, -1, (p - 1) * (q - 1))
    name = _seq(_der(0x31, _seq(_oid("2.5.4.3"), _der(0x0C, common_name.encode()))))
    now = time.time()
    validity = _seq(
        *(_der(0x17, time.strftime("%y%m%d%H%M%SZ", time.gmtime(t)).encode())
          for t in (now - 3600, now + days * 86400))
    )  # fmt: skip
    rsa_key = _seq(
        _seq(_oid("1.2.840.113549.1.1.1"), NULL), _der(0x03, b"\0", _seq(_int(n), _int(E)))
    )
    alt_names = _seq(_der(0x87, bytes([127, 0, 0, 1])), _der(0x82, b"localhost"))
    extensions = _der(0xA3, _seq(_seq(_oid("2.5.29.17"), _der(0x04, alt_names))))
    tbs = _seq(
        _der(0xA0, _int(2)),  # v3
        _int(secrets.randbits(63) | 1),
        SHA256_RSA,
        name,
        validity,
        name,
        rsa_key,
        extensions,
    )
    digest_info = _seq(
        _seq(_oid("2.16.840.1.101.3.4.2.1"), NULL), _der(0x04, hashlib.sha256(tbs).digest())
    )
    size = (n.bit_length() + 7) // 8
    padded = b"\0\1" + b"\xff" * (size - len(digest_info) - 3) + b"\0" + digest_info  # PKCS #1 v1.5
    signature = pow(int.from_bytes(padded, "big"), d, n).to_bytes(size, "big")
    cert = _seq(tbs, SHA256_RSA, _der(0x03, b"\0", signature))
    key = _seq(*(_int(v) for v in (0, n, E, d, p, q, d % (p - 1), d % (q - 1), pow(q, -1, p))))
    return _pem("CERTIFICATE", cert), _pem("RSA PRIVATE KEY", key)
