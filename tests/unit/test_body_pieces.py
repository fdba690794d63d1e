"""`BodyPieces`, the request body the HTTP edge hands the app: the bytes as sent, in order, with
no copy for one piece and a bounded number of objects for a body sent in tiny chunks."""

from __future__ import annotations

from atrium.api.server import SMALL_PIECE, BodyPieces


def test_one_piece_reaches_the_app_as_the_same_object() -> None:
    piece = b"x" * 100_000
    body = BodyPieces()
    body += piece
    assert bytes(body) is piece
    assert len(body) == 100_000


def test_an_empty_body_is_empty_bytes() -> None:
    assert bytes(BodyPieces()) == b""
    assert len(BodyPieces()) == 0


def test_pieces_of_every_size_come_out_in_order() -> None:
    sizes = [1, SMALL_PIECE, 7, 3, SMALL_PIECE - 1, 70_000, 2, 2, SMALL_PIECE + 1, 5]
    pieces = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    body = BodyPieces()
    for piece in pieces:
        body += piece
    assert bytes(body) == b"".join(pieces)
    assert len(body) == sum(sizes)


def test_a_body_sent_in_one_byte_chunks_is_held_in_one_buffer() -> None:
    body = BodyPieces()
    for n in range(65_536):
        body += bytes([n % 256])
    assert body.held == 1
    assert bytes(body) == bytes(n % 256 for n in range(65_536))


def test_alternating_small_and_large_pieces_stay_few_objects() -> None:
    body = BodyPieces()
    for _ in range(16):  # 64 KiB of large pieces: uvicorn pauses reading past that
        body += b"a"
        body += b"b" * SMALL_PIECE
    assert body.held == 32
