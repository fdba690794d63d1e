"""The pure part of signed apps: the cosign payload, key formats, verdicts and the policy."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pydantic import ValidationError

from atrium.distribution import signing
from atrium.distribution.signing import Signature, Trust, TrustedKey, Verdict

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def pair() -> tuple[ec.EllipticCurvePrivateKey, str]:
    private_pem, public_pem = signing.generate_key_pair()
    return signing.load_private_key(private_pem), public_pem.decode()


def signed(key: ec.EllipticCurvePrivateKey, digest: str = DIGEST) -> Signature:
    payload = signing.build_payload("127.0.0.1:5000/apps/x", digest)
    return Signature(payload, signing.sign(key, payload))


def test_the_payload_is_cosigns_simple_signing_document() -> None:
    payload = signing.build_payload("reg/apps/x", DIGEST)
    assert json.loads(payload) == {
        "critical": {
            "identity": {"docker-reference": "reg/apps/x"},
            "image": {"docker-manifest-digest": DIGEST},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    assert signing.payload_digest(payload) == DIGEST
    assert signing.signature_tag(DIGEST) == "sha256-" + "a" * 64 + ".sig"


@pytest.mark.parametrize(
    "payload",
    [b"", b"[]", b'{"critical": {}}', b"x" * (signing.MAX_PAYLOAD + 1),
     json.dumps({"critical": {"image": {"docker-manifest-digest": DIGEST}, "type": "other"}}).encode()],
)  # fmt: skip
def test_anything_else_names_no_digest(payload: bytes) -> None:
    assert signing.payload_digest(payload) is None


def test_a_trusted_signature_of_the_digest_is_signed_by_its_key_name() -> None:
    key, public = pair()
    keys = {"alice": signing.load_public_key(public)}
    assert signing.verify_signatures([signed(key)], DIGEST, keys) == Verdict("signed", "alice")


def test_verdicts_unsigned_unknown_invalid() -> None:
    key, _ = pair()
    _, stranger = pair()
    keys = {"stranger": signing.load_public_key(stranger)}
    assert signing.verify_signatures([], DIGEST, keys).status == "unsigned"
    assert signing.verify_signatures([signed(key)], DIGEST, keys).status == "unknown_signer"
    assert signing.verify_signatures([signed(key, OTHER)], DIGEST, keys).status == "invalid"
    # a signature whose bytes were changed verifies under no key
    good = signed(key)
    forged = Signature(good.payload.replace(b"apps/x", b"apps/y"), good.signature)
    own = {"own": signing.load_public_key(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())}  # fmt: skip
    assert signing.verify_signatures([forged], DIGEST, own).status == "unknown_signer"
    assert signing.verify_signatures([Signature(good.payload, "%%%")], DIGEST, own).status == (
        "unknown_signer"
    )


def test_only_require_refuses_and_only_what_is_not_signed() -> None:
    for status in ("unsigned", "unknown_signer", "invalid"):
        verdict = Verdict(status)
        assert signing.refuses("require", verdict)
        assert not signing.refuses("warn", verdict)
        assert not signing.refuses("off", verdict)
    assert not signing.refuses("require", Verdict("signed", "alice"))


def test_ssh_keys_are_accepted_and_keep_their_fingerprint() -> None:
    _, public = pair()
    loaded = signing.load_public_key(public)
    line = signing.ssh_public_line(loaded)
    assert line.startswith("ecdsa-sha2-nistp256 ")
    assert signing.fingerprint(signing.load_public_key(line + " me@host")) == (
        signing.fingerprint(loaded)
    )
    ed = ed25519.Ed25519PrivateKey.generate().public_key()
    ed_line = ed.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert signing.key_type(signing.load_public_key(ed_line.decode())) == "ed25519"


@pytest.mark.parametrize(
    "text",
    [
        "not a key",
        "ssh-rsa AAAAB3NzaC1yc2E",
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    ],
)
def test_other_keys_are_refused(text: str) -> None:
    with pytest.raises(signing.KeyProblem):
        signing.load_public_key(text)


def test_a_trust_store_has_unique_names_and_valid_keys() -> None:
    _, public = pair()
    trust = Trust(
        policy="warn", keys=[TrustedKey(name="b", key=public), TrustedKey(name="a", key=public)]
    )
    assert [k.name for k in trust.keys] == ["a", "b"]
    assert trust.allowed_signers().splitlines()[0].startswith("a ecdsa-sha2-nistp256 ")
    with pytest.raises(ValidationError):
        Trust(keys=[TrustedKey(name="a", key=public), TrustedKey(name="a", key=public)])
    with pytest.raises(ValidationError):
        TrustedKey(name="a", key="garbage")
    with pytest.raises(ValidationError):
        TrustedKey(name="../x", key=public)
    with pytest.raises(ValidationError):
        Trust.model_validate({"policy": "maybe"})


@pytest.mark.parametrize("name", ["x\n* ecdsa-sha2-nistp256 AAAA", "a b", "-x", "", "x" * 65])
def test_a_key_name_cannot_write_another_allowed_signers_line(name: str) -> None:
    _, public = pair()
    with pytest.raises(ValidationError):
        TrustedKey(name=name, key=public)
