"""The HTTP edge holds against hostile input (issue 13): topic globs that used to backtrack for
hours, lone surrogates in bodies, half-sent and oversized request heads, foreign `Host` names, and
a slow event subscriber that the bus drops."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from atrium.api.server import MAX_HEAD_BYTES
from atrium.events import MAX_GLOB_LENGTH, MAX_GLOBS
from tests.integration.conftest import (
    DEADLINE,
    RunningShell,
    ServeProcess,
    SseReader,
    StartShell,
    serving,
    wait_for,
)

pytestmark = pytest.mark.integration

#: `**` sixty times then a letter no topic ends with: the regex the shell built from it took
#: about an hour against `kv:changed` (measured growth: x3.7 per two more `**`)
PATHOLOGICAL_GLOB = "**" * 60 + "z"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeProcess]:
    """`atrium serve` as a real process (a stuck event loop must not stall the test itself), then
    SIGKILL: a loop stuck in a regex never runs a signal handler."""
    with serving(tmp_path / "home", stop=signal.SIGKILL) as shell:
        yield shell


def publish(shell: RunningShell, topic: str, payloads: list[dict[str, object]]) -> None:
    """Publish on the shell's own loop, as a service would, in one callback."""
    loop = shell.server._loop
    assert loop is not None
    done = threading.Event()

    def run() -> None:
        for payload in payloads:
            shell.shell.bus.publish(topic, payload)
        done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(DEADLINE)


# --- topic globs (row 4) ---------------------------------------------------------------------


def test_a_pathological_topic_glob_does_not_stall_the_shell(served: ServeProcess) -> None:
    """One subscription with `**…**z` used to freeze the event loop at the next event."""
    auth = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=auth, timeout=10) as api:
        attacker = SseReader(api, {"topics": PATHOLOGICAL_GLOB})
        watcher = SseReader(api, {"topics": "kv:*"})
        assert attacker.status == 200
        put = api.put("/api/kv/os/probe", json={"value": 1})  # publishes kv:changed
        assert put.status_code == 200
        (event,) = watcher.wait(1, "kv:changed")
        assert event.data == {"type": "kv:changed", "namespace": "os", "key": "probe"}
        assert api.get("/api/version").status_code == 200
        assert attacker.events == []


def test_topic_globs_have_bounded_length_and_number(shell: RunningShell, api: httpx.Client) -> None:
    long_glob = "a" * (MAX_GLOB_LENGTH + 1)
    response = api.get("/api/events", params={"topics": long_glob})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"
    assert f"the limit is {MAX_GLOB_LENGTH}" in response.json()["error"]["message"]

    many = ",".join(f"t{n}:*" for n in range(MAX_GLOBS + 1))
    response = api.get("/api/events", params={"topics": many})
    assert response.status_code == 400
    assert f"the limit is {MAX_GLOBS}" in response.json()["error"]["message"]
    assert response.json()["error"]["problems"][0]["field"] == "topics"

    # the same glob repeated counts once; exactly the limit is fine
    at_limit = ",".join([f"t{n}:*" for n in range(MAX_GLOBS)] + ["t0:*"] * 10)
    reader = SseReader(api, {"topics": at_limit})
    assert reader.status == 200


# --- lone surrogates (row 9) -----------------------------------------------------------------

LONE_ESCAPED = b'"\\ud800"'
LONE_RAW = b'"\xed\xa0\x80"'  # the surrogate's own UTF-8-style bytes, not valid UTF-8


@pytest.mark.parametrize("lone", [LONE_ESCAPED, LONE_RAW], ids=["escaped", "raw"])
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/api/kv/os/probe", b'{"value":%s}'),
        ("PUT", "/api/kv/app/com.example.a/k", b'{"value":{"nested":[%s]}}'),
        ("POST", "/api/os/themes/select", b'{"themeIdLight":%s}'),
        ("POST", "/api/dist/install", b'{"ref":%s}'),
        ("POST", "/api/dist/install/preview", b'{"ref":%s}'),
        ("POST", "/api/dist/update/com.example.a", b'{"approvedDigest":%s}'),
        ("POST", "/api/intents/resolve", b'{"action":%s}'),
        ("PUT", "/api/scopes/global/git-repo", b'{"url":%s}'),
        ("POST", "/api/dist/publish", b'{"path":%s,"to":"x","tag":"1"}'),
    ],
)
def test_a_lone_surrogate_in_a_body_is_a_bad_request(
    api: httpx.Client, method: str, path: str, body: bytes, lone: bytes
) -> None:
    response = api.request(
        method, path, content=body % lone, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert "not valid JSON" in error["message"]


def test_an_app_sending_a_lone_surrogate_to_its_own_kv_gets_400(shell: RunningShell) -> None:
    """Apps can call kv PUT: the answer is theirs too, not a 500 in the shell's log."""
    app_id = "com.atrium.notes"
    token = shell.shell.app_tokens.issue(
        app_id, f"{app_id}-1", "default"
    )  # as a running instance holds
    with shell.client(token) as app:
        response = app.put(
            f"/api/kv/app/{app_id}/k",
            content=b'{"value":"\\udfff"}',
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


# --- request heads ---------------------------------------------------------------------------


def connect(shell: RunningShell) -> socket.socket:
    return socket.create_connection(("127.0.0.1", shell.settings.port), timeout=DEADLINE)


def head(shell: RunningShell, line: str, *headers: str, token: bool = False) -> bytes:
    """A complete request head for ``shell``: ``line``, its Host, the user's token when asked,
    then ``headers``."""
    lines = [line, f"Host: 127.0.0.1:{shell.settings.port}"]
    if token:
        lines.append(f"Authorization: Bearer {shell.token}")
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


def json_put(shell: RunningShell, key: str, *headers: str, token: bool = False) -> bytes:
    """The head of a JSON `PUT /api/kv/os/<key>`, with ``headers`` (its framing) after it."""
    return head(
        shell,
        f"PUT /api/kv/os/{key} HTTP/1.1",
        "Content-Type: application/json",
        *headers,
        token=token,
    )


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the shell sends until it closes the connection (fails on the timeout)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_half_sent_request_line_is_closed_after_the_head_deadline(
    start_shell: StartShell,
) -> None:
    shell = start_shell(header_timeout_seconds=0.5)
    with connect(shell) as sock:
        sock.sendall(b"GET /api/ver")
        assert read_until_closed(sock) == b""  # closed, no answer


def test_half_sent_headers_after_a_kept_alive_request_are_closed(start_shell: StartShell) -> None:
    shell = start_shell(header_timeout_seconds=0.5)
    with connect(shell) as sock:
        sock.sendall(head(shell, "GET /api/version HTTP/1.1"))
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        host = f"127.0.0.1:{shell.settings.port}"
        sock.sendall(f"GET /api/version HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
        assert read_until_closed(sock) == b""


def test_a_busy_kept_alive_connection_outlives_its_first_deadline(start_shell: StartShell) -> None:
    """The deadline moves with each request: the connection's one timer, set for the first head,
    must not close a connection that has kept sending complete requests since."""
    shell = start_shell(header_timeout_seconds=0.5)
    with connect(shell) as sock:
        for _ in range(8):  # 8 x 0.2 s: well past the first deadline
            sock.sendall(head(shell, "GET /api/version HTTP/1.1"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.2)


def test_an_idle_kept_alive_connection_is_closed_after_five_seconds(
    start_shell: StartShell,
) -> None:
    """docs/api.md "Conventions": an idle connection is closed after 5 s, whatever the head
    deadline (here longer), and one that keeps sending requests is not."""
    shell = start_shell(header_timeout_seconds=30)
    with connect(shell) as sock:
        sock.sendall(head(shell, "GET /api/version HTTP/1.1"))
        started = time.monotonic()
        answer = read_until_closed(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 200")
    assert 4.5 < waited < 8, waited


def test_a_connection_answered_before_its_body_arrived_is_closed_when_idle(
    start_shell: StartShell,
) -> None:
    """An early answer (here 401, before the announced body came; curl's `Expect:
    100-continue` uploads meet this) followed by silence: closed 5 s after the answer like any
    idle connection, not held open for ever (found by an attack on the one-clock change)."""
    shell = start_shell(header_timeout_seconds=30)
    with connect(shell) as sock:
        sock.sendall(json_put(shell, "early", "Content-Length: 100000") + b'{"value": ')
        started = time.monotonic()
        answer = read_until_closed(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 401")
    assert waited < 8, waited


def test_the_head_deadline_runs_after_the_idle_time_was_cut_short(
    start_shell: StartShell,
) -> None:
    """A connection that starts its next head (so it is no longer idle) and never ends it is
    closed by the head deadline, even one shorter than the keep-alive time."""
    shell = start_shell(header_timeout_seconds=1)
    with connect(shell) as sock:
        sock.sendall(head(shell, "GET /api/version HTTP/1.1"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /api/version HTTP/1.1\r\n")
        started = time.monotonic()
        assert read_until_closed(sock) == b""
        assert time.monotonic() - started < 3


def test_a_stalled_request_body_is_closed_after_the_stall_time(start_shell: StartShell) -> None:
    """A client that sends a head and part of its body, then nothing: closed once no byte has
    come for the stall time (it held a connection and a waiting request for ever)."""
    shell = start_shell(stall_seconds=0.5)
    with connect(shell) as sock:
        sock.sendall(json_put(shell, "stalled", "Content-Length: 100", token=True) + b'{"value": ')
        started = time.monotonic()
        assert read_until_closed(sock) == b""  # closed, no answer
        assert time.monotonic() - started < 5
    with shell.client() as api:
        assert api.get("/api/kv/os/stalled").status_code == 404  # nothing half-written


def test_a_slow_but_steady_body_is_not_cut(start_shell: StartShell) -> None:
    """The stall time is between two pieces of a body, not a deadline for the whole of it."""
    shell = start_shell(stall_seconds=0.5)
    body = json.dumps({"value": "x" * 40}).encode()
    with connect(shell) as sock:
        sock.sendall(
            json_put(
                shell,
                "steady",
                f"Content-Length: {len(body)}",
                "Connection: close",
                token=True,
            )
        )
        for start in range(0, len(body), 6):  # ~9 pieces, 0.25 s apart: ~2 s in all
            time.sleep(0.25)
            sock.sendall(body[start : start + 6])
        answer = read_until_closed(sock)
    assert re.match(rb"HTTP/1\.1 20[01] ", answer), answer[:200]


def test_pipelined_requests_are_answered_in_order(shell: RunningShell) -> None:
    """Requests sent back to back before any answer (HTTP/1.1 pipelining) are each answered, in
    the order sent: the next one starts when the previous answer is complete."""
    with connect(shell) as sock:
        sock.sendall(
            b"".join(
                head(shell, f"GET {path} HTTP/1.1")
                for path in ("/api/version", "/api/nope", "/api/version")
            )
            + head(shell, "GET /api/version HTTP/1.1", "Connection: close")
        )
        answers = read_until_closed(sock)
    # each body runs straight into the next status line: find the status lines by pattern
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answers) == [b"200", b"404", b"200", b"200"]


def test_an_open_event_stream_outlives_the_head_deadline(start_shell: StartShell) -> None:
    """The deadline is for heads only: a long answer (the event stream) is not cut."""
    shell = start_shell(header_timeout_seconds=0.3)
    with shell.client() as api:
        reader = SseReader(api, {"topics": "t:*"})
        time.sleep(1.0)  # several deadlines pass while the stream is open
        publish(shell, "t:late", [{"n": 1}])
        (event,) = reader.wait(1)
        assert event.data["n"] == 1
        assert not reader.ended.is_set()


def test_an_oversized_request_head_is_431_and_closed(shell: RunningShell) -> None:
    with connect(shell) as sock:
        sock.sendall(
            f"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1:{shell.settings.port}\r\n".encode()
        )
        filler = b"X-Filler: " + b"a" * 8000 + b"\r\n"
        sent = 0
        try:
            while sent <= MAX_HEAD_BYTES * 4:
                sock.sendall(filler)
                sent += len(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending: fine, the answer is what counts
        answer = read_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    error = json.loads(body)["error"]
    assert error["code"] == "headers_too_large"
    assert error["limit"] == MAX_HEAD_BYTES


MALFORMED = {
    "a space in a header name": (b"Bad Header: x\r\n\r\n", "Invalid header token"),
    "two Content-Lengths": (
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "Duplicate Content-Length",
    ),
    "a chunk size that is no number": (
        b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n",
        "Invalid character in chunk size",
    ),
}


def split_answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """Each answer's status line and body, in order (every answer here has a Content-Length)."""
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
        answers.append((head.split(b"\r\n")[0], rest[:length]))
        data = rest[length:]
    return answers


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_gets_the_error_shape_naming_what_is_wrong(
    shell: RunningShell, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/api.md "Errors": the shell's own failures are JSON, and say what was wrong (it was
    uvicorn's text "Invalid HTTP request received." and a warning in the log for each)."""
    tail, detail = MALFORMED[case]
    with caplog.at_level(logging.INFO), connect(shell) as sock:
        sock.sendall(head(shell, "POST /api/kv/os/x HTTP/1.1", token=True)[:-2] + tail)
        [(status, body)] = split_answers(read_until_closed(sock))
    assert status.startswith(b"HTTP/1.1 400 "), status
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request"
    assert detail in error["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_answers_before_a_malformed_pipelined_request_come_first(shell: RunningShell) -> None:
    """Requests pipelined before a malformed one are answered, in order, and the 400 comes
    last: it answers the malformed one (uvicorn wrote it at once and closed, so the client read
    it as the answer to its first request)."""
    with connect(shell) as sock:
        sock.sendall(
            head(shell, "GET /api/version HTTP/1.1")
            + head(shell, "GET /api/nope HTTP/1.1")
            + head(shell, "GET /api/version HTTP/1.1", "Bad Header: x")
        )
        answers = split_answers(read_until_closed(sock))
    assert [status.split(b" ")[1] for status, _ in answers] == [b"200", b"404", b"400"]
    assert json.loads(answers[0][1])["api"] == 1
    assert "Invalid header token" in json.loads(answers[2][1])["error"]["message"]


def test_a_refused_request_behind_others_is_closed_at_the_head_deadline(
    start_shell: StartShell,
) -> None:
    """After the 400 that answers a broken request pipelined behind another, the connection
    closes at the head deadline (it was held for ever: the refused request stayed "being
    answered" for the clock)."""
    shell = start_shell(header_timeout_seconds=1)
    with connect(shell) as sock:
        sock.sendall(
            head(shell, "GET /api/version HTTP/1.1")
            + head(shell, "POST /api/kv/os/x HTTP/1.1", "Transfer-Encoding: chunked", token=True)
            + b"zz\r\n"
        )
        started = time.monotonic()
        answers = split_answers(read_until_closed(sock))
        assert time.monotonic() - started < 4
    assert [status.split(b" ")[1] for status, _ in answers] == [b"200", b"400"]


@pytest.mark.parametrize("target", ["http://a:99999/", "http://[/"])
def test_a_request_target_that_is_no_url_is_answered_last_and_alone(
    shell: RunningShell, target: str
) -> None:
    """A target the URL parser refuses gets its own 400, after the answers to the requests
    before it: those run (the PUT is stored) and their answers are theirs (the 400 was taken
    for the first request's answer, and the PUT never ran)."""
    with connect(shell) as sock:
        sock.sendall(
            json_put(shell, "before", "Content-Length: 11", token=True)
            + b'{"value":1}'
            + head(shell, "GET /api/nope HTTP/1.1")
            + head(shell, f"GET {target} HTTP/1.1")
        )
        answers = split_answers(read_until_closed(sock))
    assert [status.split(b" ")[1] for status, _ in answers] == [b"200", b"404", b"400"]
    assert "not a valid URL" in json.loads(answers[2][1])["error"]["message"]
    with shell.client() as api:
        assert api.get("/api/kv/os/before").json()["value"] == 1


def test_a_request_target_that_is_no_url_on_a_kept_alive_connection_gets_its_400(
    shell: RunningShell,
) -> None:
    with connect(shell) as sock:
        sock.sendall(head(shell, "GET /api/version HTTP/1.1"))
        assert read_answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.1)  # the first answer is complete
        sock.sendall(head(shell, "GET http://a:99999/ HTTP/1.1"))
        answers = split_answers(read_until_closed(sock))
    assert [status.split(b" ")[1] for status, _ in answers] == [b"400"]


@pytest.mark.parametrize("after_a_request", [False, True])
def test_an_oversized_head_sent_in_one_write_is_431(
    shell: RunningShell, after_a_request: bool
) -> None:
    """A head over the limit that arrives in one read (or ends in the read it began in) was
    served: only reads in which no head ended were counted."""
    with connect(shell) as sock:
        first = head(shell, "GET /api/version HTTP/1.1") if after_a_request else b""
        sock.sendall(first + head(shell, "GET /api/version HTTP/1.1", "X-Big: " + "a" * 120_000))
        answers = split_answers(read_until_closed(sock))
    statuses = [status.split(b" ")[1] for status, _ in answers]
    assert statuses == ([b"200", b"431"] if after_a_request else [b"431"])


def test_trailers_over_the_head_limit_are_431(shell: RunningShell) -> None:
    """A chunked body's trailers are header lines: past `MAX_HEAD_BYTES` they are refused
    (uvicorn kept every one, ~23 bytes of memory per byte sent, for as long as they came)."""
    with connect(shell) as sock:
        sock.sendall(
            head(shell, "PUT /api/kv/os/t HTTP/1.1", "Transfer-Encoding: chunked", token=True)
            + b"0\r\n"
        )
        try:
            for _ in range(40):  # 40 x 6,000 trailer lines: ~240 KB, well past the limit
                sock.sendall(b"a:b\r\n" * 6000)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while still sending: the answer is what counts
        answers = split_answers(read_until_closed(sock))
    assert [status.split(b" ")[1] for status, _ in answers] == [b"431"]


def test_a_refused_upload_that_expected_a_go_ahead_gets_no_stray_write(
    shell: RunningShell, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken chunked body behind `Expect: 100-continue`: the 400 and nothing else (the
    handler's first read then wrote `100 Continue` after the half-close, an error in the log)."""
    with caplog.at_level(logging.INFO), connect(shell) as sock:
        sock.sendall(
            head(
                shell,
                "PUT /api/kv/os/e HTTP/1.1",
                "Expect: 100-continue",
                "Transfer-Encoding: chunked",
                token=True,
            )
            + b"zz\r\n"
        )
        answer = read_until_closed(sock)
        time.sleep(0.2)  # the handler has run by now
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"100 Continue" not in answer
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_client_that_pipelines_and_never_reads_is_reset_after_the_stall_time(
    start_shell: StartShell, caplog: pytest.LogCaptureFixture
) -> None:
    """The answers wait on a client that reads none of them: after the stall time the
    connection is reset (it held the handler for ever), and leaving meanwhile is no error in
    the log (the handler answering wrote on into the closed transport: two tracebacks)."""
    shell = start_shell(stall_seconds=1)
    request = head(shell, "GET /api/openapi.json HTTP/1.1")
    with caplog.at_level(logging.INFO):
        for leaves_early in (True, False):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", shell.settings.port))
            with sock:
                sock.sendall(request * 2000)  # never read
                if leaves_early:
                    time.sleep(0.5)
                    continue
                wait_for(partial(hung_up, sock), "the reset", timeout=5)
        time.sleep(0.5)
    assert "read nothing for 1 s" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_closing_connection_whose_client_never_reads_is_reset(
    start_shell: StartShell, caplog: pytest.LogCaptureFixture
) -> None:
    """A close waits for what is unsent: a client that asked for large answers, the last with
    `Connection: close`, and reads none of them held the closing connection (an fd, memory, and
    megabytes of kernel buffers) for as long as it liked. It is reset after the stall time."""
    shell = start_shell(stall_seconds=1)
    with shell.client() as api:
        assert api.put("/api/kv/os/big", json={"value": "b" * 900_000}).status_code == 200
    ask = head(shell, "GET /api/kv/os/big HTTP/1.1", token=True)
    last = head(shell, "GET /api/kv/os/big HTTP/1.1", "Connection: close", token=True)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", shell.settings.port))
    with caplog.at_level(logging.INFO), sock:
        sock.sendall(ask * 3 + last)  # never read
        wait_for(partial(hung_up, sock), "the reset", timeout=10)
    assert "read nothing for 1 s" in caplog.text


def test_the_rest_of_an_answered_body_does_not_keep_the_connection_open(
    start_shell: StartShell,
) -> None:
    """After an early answer (401 to an upload), body bytes trickled below the stall time no
    longer hold the connection past its idle close: each one used to count as activity."""
    shell = start_shell(stall_seconds=1)
    with connect(shell) as sock:
        sock.sendall(json_put(shell, "trickle", "Content-Length: 100000") + b'{"value": ')
        assert read_answer(sock).startswith(b"HTTP/1.1 401")
        started = time.monotonic()
        while not hung_up(sock):
            assert time.monotonic() - started < 8, "still open past the idle close"
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
            time.sleep(0.5)


def test_an_upgrade_request_with_a_body_is_refused_not_answered_without_it(
    shell: RunningShell,
) -> None:
    """The parser takes what follows an upgrade request as the new protocol's: its body was
    dropped and the request answered as if it had none. It is refused, saying why."""
    with connect(shell) as sock:
        sock.sendall(
            head(
                shell,
                "PUT /api/kv/os/up HTTP/1.1",
                "Connection: Upgrade",
                "Upgrade: foo",
                "Content-Type: application/json",
                "Content-Length: 11",
                token=True,
            )
        )
        time.sleep(0.1)
        with contextlib.suppress(OSError):
            sock.sendall(b'{"value":1}')
        [(status, body)] = split_answers(read_until_closed(sock))
    assert status.startswith(b"HTTP/1.1 400"), status
    assert "Upgrade" in json.loads(body)["error"]["message"]
    with shell.client() as api:
        assert api.get("/api/kv/os/up").status_code == 404


def test_a_request_to_switch_protocols_is_answered_then_closed(
    shell: RunningShell, caplog: pytest.LogCaptureFixture
) -> None:
    """No protocol to switch to: the request is answered as plain HTTP and the connection
    closes at once (a request pipelined behind it waited 5 s for the idle close, unanswered),
    with nothing in the log (uvicorn warned twice per request, advising to install a WebSocket
    library)."""
    with caplog.at_level(logging.INFO), connect(shell) as sock:
        sock.sendall(
            head(shell, "GET /api/version HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade")
            + head(shell, "GET /api/version HTTP/1.1")
        )
        started = time.monotonic()
        answers = split_answers(read_until_closed(sock))
        waited = time.monotonic() - started
    assert [status.split(b" ")[1] for status, _ in answers] == [b"200"]
    assert waited < 2, waited
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_large_complete_request_is_still_served(shell: RunningShell, api: httpx.Client) -> None:
    """A body far larger than the head limit is not a head: a 1 MiB kv value is stored."""
    response = api.put("/api/kv/os/big", json={"value": "v" * ((1 << 20) - 100)})
    assert response.status_code == 200
    response = api.get("/api/version", headers={"X-Filler": "a" * 30000})
    assert response.status_code == 200


def read_answer(sock: socket.socket) -> bytes:
    """The first answer's head (fails on the socket's timeout when none comes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(shell: RunningShell) -> None:
    """A JSON route refuses a body declared over 2 MiB at once, without reading (or waiting
    for) a byte of it: the shell never holds a body of the caller's choosing."""
    with connect(shell) as sock:
        sock.sendall(json_put(shell, "huge", "Content-Length: 1000000000", token=True))
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"larger than 2097152 bytes" in answer


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(shell: RunningShell) -> None:
    """A chunked body has no declared length: it is counted as it arrives and refused once past
    2 MiB, while the caller is still sending (before: read whole, of any size, then refused)."""
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    with connect(shell) as sock:
        sock.sendall(json_put(shell, "huge", "Transfer-Encoding: chunked", token=True))
        for _ in range(40):  # 2.5 MiB, and the body never ends
            sock.sendall(chunk)
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"larger than 2097152 bytes" in answer
    with shell.client() as api:
        assert api.get("/api/kv/os/huge").status_code == 404  # nothing was stored


def test_a_client_leaving_mid_body_is_not_an_internal_error(
    shell: RunningShell, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller that goes away while sending a JSON body is an everyday event, not a fault of
    the shell: no traceback for it in the log (any caller could fill the log with them)."""
    with caplog.at_level(logging.INFO, logger="atrium"):
        for _ in range(3):
            with connect(shell) as sock:
                sock.sendall(
                    json_put(shell, "left", "Content-Length: 1000", token=True) + b'{"value": '
                )
                time.sleep(0.2)
        with shell.client() as api:  # the shell has seen each leave by the time it answers
            wait_for(lambda: caplog.text.count("/api/kv/os/left") >= 3, "the departures logged")
            assert api.get("/api/kv/os/left").status_code == 404
    assert "unexpected error" not in caplog.text
    assert "Traceback" not in caplog.text


# --- Host allow-list ---------------------------------------------------------------------------


OWN_NAMES = ["localhost:{port}", "LOCALHOST:{port}", "127.0.0.1:{port}", "[::1]:{port}"]
OWN_NAMES += ["localhost", "127.0.0.1"]
FOREIGN_NAMES = [
    "attacker.example:{port}",
    "attacker.example",
    "localhost:{other}",
    "127.0.0.1:{other}",
    "localhost.attacker.example:{port}",
    "127.0.0.1.nip.io:{port}",
    "xlocalhost:{port}",
    "abcdefabcdef.attacker.example:{port}",
    "abcdefabcdef.localhost:{other}",
    "not-a-slug.localhost:{port}",
    "",
]


def test_the_shells_own_names_are_served(shell: RunningShell) -> None:
    with shell.client() as api:
        for host in OWN_NAMES:
            value = host.format(port=shell.settings.port)
            response = api.get("/api/apps", headers={"Host": value})
            assert response.status_code == 200, value


def test_a_foreign_host_is_misdirected(shell: RunningShell) -> None:
    """A DNS-rebinding page sends its own name: refused before any route, open ones included
    (the version, the data proxy, the event stream, the host page)."""
    port = shell.settings.port
    other = port + 1 if port < 65535 else 1
    with shell.client() as api:
        for host in FOREIGN_NAMES:
            value = host.format(port=port, other=other)
            for path in ["/api/version", "/api/data/x/y", "/api/events", "/"]:
                response = api.get(path, headers={"Host": value})
                assert response.status_code == 421, (value, path)
                error = response.json()["error"]
                assert error["code"] == "misdirected_request"
                assert error.get("host", "") == value


def test_a_request_without_host_is_misdirected(shell: RunningShell) -> None:
    with connect(shell) as sock:
        sock.sendall(b"GET /api/version HTTP/1.0\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 421")
    assert b'"misdirected_request"' in answer


@pytest.mark.parametrize("second", ["attacker.example", "localhost"])
def test_two_host_headers_are_a_bad_request(shell: RunningShell, second: str) -> None:
    """RFC 9112 3.2: a request with more than one Host is 400, whichever comes first (a server
    or proxy beside the shell could read the other one)."""
    with connect(shell) as sock:
        sock.sendall(
            head(shell, "GET /api/version HTTP/1.1", f"Host: {second}", "Connection: close")
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert b"more than one Host" in answer


@pytest.mark.parametrize("around", [("\t", ""), ("", "\t"), (" ", " \t"), ("\t", " ")])
def test_whitespace_around_the_host_is_not_part_of_it(
    shell: RunningShell, around: tuple[str, str]
) -> None:
    """RFC 9110 5.5: a field value's leading and trailing spaces and tabs are not part of it (a
    client or proxy that keeps a tab after the name must not be misdirected)."""
    before, after = around
    with connect(shell) as sock:
        sock.sendall(
            f"GET /api/version HTTP/1.1\r\nHost:{before}127.0.0.1:{shell.settings.port}{after}"
            "\r\nConnection: close\r\n\r\n".encode()
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_app_origins_pass_the_host_check(shell: RunningShell) -> None:
    """`<slug>.localhost:<port>` reaches the app-origin dispatcher (no view cookie here: 404/401,
    not 421)."""
    with shell.anonymous() as client:
        response = client.get(
            "/", headers={"Host": f"abcdefabcdef.localhost:{shell.settings.port}"}
        )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


# --- a dropped slow event subscriber -----------------------------------------------------------


def hung_up(sock: socket.socket) -> bool:
    """The peer closed or reset the connection (seen without reading what is buffered)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return any(
        mask & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, mask in poller.poll(0)
    )


def test_a_dropped_slow_subscriber_is_disconnected(shell: RunningShell) -> None:
    """A client that stops reading fills its queue and is dropped; its connection must end, not
    hang forever on a write the client never reads (issue 14, row 8)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(DEADLINE)
    with sock:
        sock.connect(("127.0.0.1", shell.settings.port))
        sock.sendall(
            f"GET /api/events?topics=slow:* HTTP/1.1\r\nHost: 127.0.0.1:{shell.settings.port}\r\n"
            f"Authorization: Bearer {shell.token}\r\n\r\n".encode()
        )
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        wait_for(lambda: shell.shell.bus.subscriber_count == 1, "the subscription")
        frame: dict[str, object] = {"pad": "p" * 32768}
        # enough to fill every buffer between the shell and the client that does not read
        for _ in range(20):
            publish(shell, "slow:fill", [frame] * 20)
            time.sleep(0.01)
        publish(shell, "slow:overflow", [frame] * 1100)
        wait_for(lambda: shell.shell.bus.subscriber_count == 0, "the slow subscriber dropped")
        wait_for(lambda: hung_up(sock), "the shell to end the dropped subscriber's connection")
    with shell.client() as api:
        assert api.get("/api/version").status_code == 200
