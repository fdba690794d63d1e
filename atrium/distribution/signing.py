"""Signed apps: the cosign-style signature payload, keys, the trust store's format and the policy
decision (docs/api.md "Trust"; decisions.md "Signed apps").

Pure: bytes in, verdicts out; the registry and git I/O is the fetchers' and publishers'.

An OCI artifact's signature lives beside it the way cosign keeps one: a manifest under the tag
``sha256-<hex>.sig`` whose layer is a simple-signing payload naming the artifact's manifest digest,
with the base64 DER ECDSA signature over the payload bytes in the layer annotation
``dev.cosignproject.cosign/signature``. A signature counts only when a trusted key verifies it AND
its payload names the digest being installed: a valid signature of another digest proves nothing
about this one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pydantic import Field, field_validator

from atrium.wire import WireModel

SIGNATURE_ANNOTATION: Final = "dev.cosignproject.cosign/signature"
PAYLOAD_MEDIA_TYPE: Final = "application/vnd.dev.cosign.simplesigning.v1+json"
PAYLOAD_TYPE: Final = "cosign container image signature"
#: a payload is a few hundred bytes; anything much larger is not one
MAX_PAYLOAD: Final = 64 << 10
MAX_SIGNATURES: Final = 16
TRUST_FILE: Final = "trust.json"
KEY_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DIGEST_HEX_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")

Policy = Literal["off", "warn", "require"]
Status = Literal["signed", "unsigned", "unknown_signer", "invalid"]
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class KeyProblem(ValueError):
    """A key file that is not a usable key; the message says why."""


# -- keys ---------------------------------------------------------------------------------------


def load_public_key(text: str) -> PublicKey:
    """A PEM public key (cosign's ``cosign.pub``: ECDSA P-256) or an OpenSSH public key line
    (``ecdsa-sha2-nistp256`` or ``ssh-ed25519``)."""
    data = text.strip().encode()
    try:
        if data.startswith(b"-----BEGIN PUBLIC KEY-----"):
            key: object = serialization.load_pem_public_key(data)
        elif data.startswith((b"ssh-ed25519 ", b"ecdsa-sha2-nistp256 ")):
            key = serialization.load_ssh_public_key(data.splitlines()[0])
        else:
            raise KeyProblem(
                "not a public key: give a PEM public key (-----BEGIN PUBLIC KEY-----, as "
                "`atrium keygen` and cosign write) or an SSH public key line (ssh-ed25519 or "
                "ecdsa-sha2-nistp256)"
            )
    except (ValueError, UnsupportedAlgorithm) as err:
        if isinstance(err, KeyProblem):
            raise
        raise KeyProblem(f"the public key cannot be read: {err}") from err
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise KeyProblem(f"an ECDSA key must be on P-256, not {key.curve.name}")
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise KeyProblem(f"unsupported key type {type(key).__name__}: use ECDSA P-256 or Ed25519")


def key_type(key: PublicKey) -> str:
    return "ecdsa-p256" if isinstance(key, ec.EllipticCurvePublicKey) else "ed25519"


def fingerprint(key: PublicKey) -> str:
    """``SHA256:<base64>`` of the key's DER SubjectPublicKeyInfo (stable across PEM and SSH)."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "SHA256:" + base64.b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")


def ssh_public_line(key: PublicKey) -> str:
    """The key as an OpenSSH public key line (for git's allowed-signers file)."""
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def generate_key_pair() -> tuple[bytes, bytes]:
    """A fresh ECDSA P-256 pair: (private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)."""
    private = ec.generate_private_key(ec.SECP256R1())
    return (
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def load_private_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise KeyProblem(f"the signing key cannot be read (an unencrypted PEM key): {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise KeyProblem("the signing key must be an ECDSA P-256 key (`atrium keygen` writes one)")
    return key


# -- the payload --------------------------------------------------------------------------------


def signature_tag(digest: str) -> str:
    """cosign's tag for the signatures of ``digest``: ``sha256-<hex>.sig``."""
    algorithm, _, hex_part = digest.partition(":")
    return f"{algorithm}-{hex_part}.sig"


def build_payload(docker_reference: str, digest: str) -> bytes:
    """The simple-signing payload cosign signs for ``digest`` (compact JSON, cosign's order)."""
    document = {
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def payload_digest(payload: bytes) -> str | None:
    """The manifest digest a payload names, or None when it is not a simple-signing payload."""
    if len(payload) > MAX_PAYLOAD:
        return None
    try:
        document = json.loads(payload)
        critical = document["critical"]
        digest = critical["image"]["docker-manifest-digest"]
        kind = critical["type"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if kind != PAYLOAD_TYPE or not isinstance(digest, str) or not DIGEST_HEX_RE.fullmatch(digest):
        return None
    return digest


def sign(private: ec.EllipticCurvePrivateKey, payload: bytes) -> str:
    """The base64 DER ECDSA-SHA256 signature over ``payload`` (the annotation's value)."""
    return base64.b64encode(private.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()


def verifies(key: PublicKey, payload: bytes, signature_b64: str) -> bool:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, payload)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature found beside an artifact: the payload bytes and the annotation's value."""

    payload: bytes
    signature: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the signatures of one artifact prove: ``signer`` is the trusted key's name."""

    status: Status
    signer: str | None = None
    reason: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.signer is not None:
            out["signer"] = self.signer
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def verify_signatures(
    signatures: Sequence[Signature], digest: str, keys: Mapping[str, PublicKey]
) -> Verdict:
    """``signed`` when some trusted key verifies a signature whose payload names ``digest``;
    ``unknown_signer`` when the signatures name ``digest`` but no trusted key verifies them;
    ``invalid`` when every signature names another digest or is not a payload; ``unsigned`` when
    there is none."""
    if not signatures:
        return Verdict("unsigned")
    for_digest = [s for s in signatures[:MAX_SIGNATURES] if payload_digest(s.payload) == digest]
    if not for_digest:
        return Verdict("invalid", reason=f"no signature names the digest {digest}")
    for found in for_digest:
        for name, key in sorted(keys.items()):
            if verifies(key, found.payload, found.signature):
                return Verdict("signed", name)
    return Verdict("unknown_signer", reason="no trusted key verifies the signature")


def refuses(policy: Policy, verdict: Verdict) -> bool:
    """``require`` refuses everything but a trusted signature; ``warn`` and ``off`` refuse nothing."""
    return policy == "require" and verdict.status != "signed"


# -- the trust store ----------------------------------------------------------------------------


class TrustedKey(WireModel):
    """One trusted key of a scope: its name and its public key text (PEM or an SSH line)."""

    name: str = Field(max_length=64)
    key: str = Field(min_length=1, max_length=8192)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # whole-string match: the name is written into git's allowed-signers file, where a
        # newline or space would add a line of the caller's choosing
        if not KEY_NAME_RE.fullmatch(value):
            raise ValueError(
                "a key name is letters, digits, '.', '_', '-' (at most 64, starting with a "
                "letter or digit)"
            )
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        # KeyProblem is a ValueError: pydantic reports it on the field. Kept in one canonical
        # form (a PEM block, or the SSH line without its comment), whatever surrounded it
        key = load_public_key(value)
        if value.lstrip().startswith("-----BEGIN"):
            pem = key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            return pem.decode()
        return ssh_public_line(key) + "\n"


class Trust(WireModel):
    """A scope's ``trust.json``: the policy and the trusted keys, names unique."""

    policy: Policy = "off"
    keys: list[TrustedKey] = Field(default_factory=list, max_length=64)

    @field_validator("keys")
    @classmethod
    def _unique(cls, value: list[TrustedKey]) -> list[TrustedKey]:
        names = [k.name for k in value]
        if len(set(names)) != len(names):
            raise ValueError("key names must be unique")
        return sorted(value, key=lambda k: k.name)

    def public_keys(self) -> dict[str, PublicKey]:
        return {k.name: load_public_key(k.key) for k in self.keys}

    def describe(self) -> list[dict[str, str]]:
        out = []
        for k in self.keys:
            loaded = load_public_key(k.key)
            out.append(
                {
                    "name": k.name,
                    "type": key_type(loaded),
                    "fingerprint": fingerprint(loaded),
                    "key": k.key,
                }
            )
        return out

    def allowed_signers(self) -> str:
        """git's allowed-signers file: ``<name> <ssh key>`` per trusted key."""
        return "".join(f"{k.name} {ssh_public_line(load_public_key(k.key))}\n" for k in self.keys)
