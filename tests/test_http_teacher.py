"""OpenAI-compatible HTTP teacher (drivemind.vlm.http_teacher).

The remote API is replaced by a **test double**: a local HTTP server started in this module
(``http.server``) that answers ``/v1/chat/completions`` with canned, malformed or failing
responses and records what it was sent. The client code under test (urllib, payload, key
handling, error messages) is the real one."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from drivemind.bev.renderer import masks_to_rgb
from drivemind.vlm.http_teacher import HttpTeacher, TeacherError, chat_url
from drivemind.vlm.prompts import (SYSTEM_PROMPT, TEACHER_PROMPT, MalformedPrompt, PrivilegedTeacher,
                                   PromptRequest, parse_prompt_json)

GOOD = PrivilegedTeacher().prompts({"speed_kmh": 30.0, "lead_distance": 8.0}).to_json()


class _Api(BaseHTTPRequestHandler):
    """Test double of the chat-completions API; ``server.mode`` picks the answer."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        srv = self.server
        srv.seen.append({"path": self.path, "headers": dict(self.headers),
                         "body": json.loads(self.rfile.read(n))})
        mode = srv.mode
        if mode == "error":
            return self._send(500, b'{"error": {"message": "model overloaded"}}')
        if mode == "not_json":
            return self._send(200, b"<html>gateway</html>")
        content = {"good": "```json\n" + GOOD + "\n```", "malformed": '{"present_prompt": "x",',
                   "parts": [{"type": "text", "text": GOOD}]}[mode]
        body = {"id": "c1", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}]}
        self._send(200, json.dumps(body).encode())

    def _send(self, code, data):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    srv.mode, srv.seen = "good", []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def api(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.mode, server.seen[:] = "good", []
    return server


def _url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"


def _request():
    rng = np.random.default_rng(0)
    bev = ((rng.random((15, 48, 48)) > 0.8) * 255).astype(np.uint8)
    return PromptRequest(facts={"speed_kmh": 30.0}, bev=bev)


def test_payload_and_canned_answer(api, monkeypatch):
    monkeypatch.setenv("DM_TEST_KEY", "sk-test-123")
    t = HttpTeacher(_url(api), model="gpt-4o-mini", api_key_env="DM_TEST_KEY", timeout=5)
    req = _request()
    text = t.generate(req)
    assert parse_prompt_json(text).present == parse_prompt_json(GOOD).present
    (seen,) = api.seen
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["Authorization"] == "Bearer sk-test-123"
    body = seen["body"]
    assert body["model"] == "gpt-4o-mini" and body["max_tokens"] == 256
    system, user = body["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["content"][0] == {"type": "text", "text": TEACHER_PROMPT}
    url = user["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    np.testing.assert_array_equal(img, masks_to_rgb(req.bev))  # the BEV, coloured, lossless
    assert "sk-test-123" not in repr(t)


def test_localhost_needs_no_key_and_content_parts_are_joined(api):
    t = HttpTeacher(_url(api), timeout=5)
    api.mode = "parts"
    assert parse_prompt_json(t.generate(_request())).ideal == parse_prompt_json(GOOD).ideal
    assert "Authorization" not in api.seen[0]["headers"]


def test_malformed_answer_is_returned_raw_for_the_caller_to_count(api):
    api.mode = "malformed"
    text = HttpTeacher(_url(api), timeout=5).generate(_request())
    assert text == '{"present_prompt": "x",'
    with pytest.raises(MalformedPrompt):
        parse_prompt_json(text)


def test_non_200_and_non_chat_bodies_raise_one_clear_error(api):
    t = HttpTeacher(_url(api), timeout=5)
    api.mode = "error"
    with pytest.raises(TeacherError, match=r"answered 500 .*model overloaded"):
        t.generate(_request())
    api.mode = "not_json"
    with pytest.raises(TeacherError, match=r"did not return a chat completion.*gateway"):
        t.generate(_request())


def test_unreachable_server_names_url_and_timeout():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t = HttpTeacher(f"http://127.0.0.1:{port}", timeout=1.5)
    with pytest.raises(TeacherError) as e:
        t.generate(_request())
    msg = str(e.value)
    assert f"127.0.0.1:{port}" in msg and "1.5 s timeout" in msg and "/v1/chat/completions" in msg


def test_key_comes_from_the_environment_only(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"\$OPENAI_API_KEY, which is not set"):
        HttpTeacher("https://api.openai.com/v1")
    with pytest.raises(TypeError):
        HttpTeacher("https://api.openai.com/v1", api_key="sk-nope")  # no such option
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    t = HttpTeacher("https://api.openai.com/v1")
    assert t.url == "https://api.openai.com/v1/chat/completions" and t.port == 443
    assert "sk-env" not in repr(t) and "$OPENAI_API_KEY set" in repr(t)


def test_chat_url_and_bad_options():
    assert chat_url("http://localhost:8000") == "http://localhost:8000/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
    for bad in ("", "ftp://x/v1", "localhost:8000"):
        with pytest.raises(ValueError, match="base_url"):
            chat_url(bad)
    with pytest.raises(ValueError, match="timeout"):
        HttpTeacher("http://localhost:1", timeout=0)
    with pytest.raises(ValueError, match="max_tokens"):
        HttpTeacher("http://localhost:1", max_tokens=0)


def test_distillation_counts_malformed_and_unreachable_teachers(api):
    pytest.importorskip("peft")
    from drivemind.vlm.generators import make_generator

    gen = make_generator("tiny_smolvlm", max_new_tokens=4, teacher="http",
                         teacher_kwargs={"base_url": _url(api), "timeout": 5})
    req = _request()
    gen.generate(req)  # a canned good answer: one distillation step
    api.mode = "malformed"
    gen.generate(req)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    gen.teacher = HttpTeacher(f"http://127.0.0.1:{port}/v1", timeout=1)
    assert isinstance(gen.generate(req), str)  # the student still answers
    st = gen.stats()
    assert (st["distill_steps"], st["teacher_malformed"], st["teacher_errors"]) == (1, 1, 1)
