"""An OpenAI-compatible HTTP teacher for DriveMind's prompt generator (the paper's GPT-4o-mini).

``HttpTeacher(base_url, model="gpt-4o-mini")`` posts one chat completion per request to
``<base_url>/chat/completions`` (``base_url`` is the API root, e.g. ``https://api.openai.com/v1``
or ``http://localhost:8000/v1`` for a local vLLM/llama.cpp/Ollama server; a root without
``/v1`` gets it appended). The messages are the paper's Fig. 3 system prompt and teacher prompt,
with the BEV (coloured by :func:`~drivemind.bev.renderer.masks_to_rgb`) attached as a base64
PNG data URL. The answer's text is returned raw: the caller parses the JSON contract and counts
malformed answers.

The API key is read from the environment variable named by ``api_key_env`` (default
``OPENAI_API_KEY``) only, never from configuration. Without it, a localhost server is called
without an ``Authorization`` header; any other host is refused at construction with one error
naming the variable. Failures raise :class:`TeacherError` with one clear message: an unreachable
server (names the URL, host:port and the timeout), a non-200 status (status and an excerpt of
the body), or a body that is not a chat completion.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import socket
import urllib.error
import urllib.parse
import urllib.request

from .prompts import SYSTEM_PROMPT, TEACHER_PROMPT, PromptRequest
from .smolvlm import request_image

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


class TeacherError(RuntimeError):
    """The HTTP teacher could not give an answer (unreachable, refused, or not a chat reply)."""


def chat_url(base_url: str) -> str:
    """``<base_url>/chat/completions``, appending ``/v1`` to a bare server root."""
    if not isinstance(base_url, str) or not base_url.strip():
        raise ValueError(f"base_url must be an http(s) URL such as https://api.openai.com/v1, got {base_url!r}")
    u = urllib.parse.urlsplit(base_url.strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"base_url must be an http(s) URL such as https://api.openai.com/v1, got {base_url!r}")
    path = u.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        if not path.endswith("/v1"):
            path += "/v1"
        path += "/chat/completions"
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, ""))


def png_data_url(rgb) -> str:
    """A ``data:image/png;base64,...`` URL of an (H, W, 3) uint8 image."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class HttpTeacher:
    """GPT-4o-mini (or any OpenAI-compatible chat model with image input) as the teacher."""

    stand_in = False

    def __init__(self, base_url: str = "https://api.openai.com/v1", model: str = "gpt-4o-mini", *,
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 30.0, max_tokens: int = 256,
                 temperature: float = 0.0, image_size: int | None = None, bev_config=None,
                 extra_body: dict | None = None):
        self.url = chat_url(base_url)
        parts = urllib.parse.urlsplit(self.url)
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int)
                                       or image_size <= 0):
            raise ValueError(f"image_size must be a positive integer or None, got {image_size!r}")
        if not isinstance(api_key_env, str) or not api_key_env:
            raise ValueError(f"api_key_env must name an environment variable, got {api_key_env!r}")
        self.model, self.timeout, self.max_tokens = model, float(timeout), max_tokens
        self.temperature, self.image_size = float(temperature), image_size
        self.bev_config, self.extra_body = bev_config, dict(extra_body or {})
        self.api_key_env = api_key_env
        self._key = os.environ.get(api_key_env) or None
        self.local = self.host in LOCAL_HOSTS or self.host.startswith("127.")
        if self._key is None and not self.local:
            raise ValueError(
                f"the HTTP teacher at {self.url} needs an API key in the environment variable "
                f"${api_key_env}, which is not set; export it (keys are never read from "
                f"configuration), or point base_url at a local server (localhost needs no key)")
        self.name = f"http:{model}"
        self.calls = 0

    def payload(self, request: PromptRequest) -> dict:
        rgb = request_image(request, self.bev_config)
        if self.image_size is not None and rgb.shape[:2] != (self.image_size, self.image_size):
            import numpy as np
            from PIL import Image

            rgb = np.asarray(Image.fromarray(rgb).resize((self.image_size, self.image_size),
                                                         Image.NEAREST))
        body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": [
                        {"type": "text", "text": TEACHER_PROMPT},
                        {"type": "image_url", "image_url": {"url": png_data_url(rgb)}}]}]}
        body.update(self.extra_body)
        return body

    def generate(self, request: PromptRequest) -> str:
        """The model's answer text (raw; may be malformed JSON, which the caller counts)."""
        data = json.dumps(self.payload(request)).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        self.calls += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            try:
                excerpt = e.read(300).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001
                excerpt = ""
            raise TeacherError(f"the HTTP teacher at {self.url} answered {e.code} {e.reason}: "
                               f"{excerpt.strip()[:300]!r}") from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TeacherError(f"the HTTP teacher at {self.url} ({self.host}:{self.port}) is "
                               f"unreachable within the {self.timeout:g} s timeout ({reason}); "
                               f"check base_url and that the server runs") from None
        try:
            obj = json.loads(raw.decode("utf-8"))
            content = obj["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise TeacherError(f"the HTTP teacher at {self.url} did not return a chat completion "
                               f"(expected choices[0].message.content): "
                               f"{raw[:200].decode('utf-8', 'replace')!r}") from None
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise TeacherError(f"the HTTP teacher at {self.url} returned non-text content "
                               f"{type(content).__name__}")
        return content

    def __repr__(self) -> str:  # never shows the key
        key = f"${self.api_key_env} {'set' if self._key else 'unset'}"
        return f"HttpTeacher(url={self.url!r}, model={self.model!r}, key={key}, timeout={self.timeout:g})"
