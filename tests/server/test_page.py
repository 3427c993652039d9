"""The web chat page in a real headless Chromium (Debian's package, driven by Playwright):
two messages, streamed replies, the cached-token count rising on the second turn, the TTFT
chart and the session list; a screenshot goes to results/serve/page.png.

Needs the browser: ``scripts/chromium`` installs it when missing (the test calls it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from suffixmem.server.serving import namespace
from tests.server.conftest import KEY_A, KEY_B, Server

pytest.importorskip("playwright")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    out = subprocess.run([str(ROOT / "scripts" / "chromium")], capture_output=True, text=True,
                         check=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def test_page_two_turns(server: Server, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium(), headless=True, args=FLAGS,
            viewport={"width": 1100, "height": 720})
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#api-key", KEY_A)
            page.dispatch_event("#api-key", "change")
            page.keyboard.press("Alt+n")  # keyboard: new chat
            replies = page.locator(".msg.assistant")
            chunks = []
            for n, text in enumerate(("Hello! Name three fruits.", "Which one is yellow?"), 1):
                page.fill("#input", text)
                page.press("#input", "Enter")
                # streaming: the reply is on the page (growing) before the turn's figures are
                reply = replies.nth(n - 1)
                expect(reply.locator(".text")).not_to_have_text("", timeout=60_000)
                expect(reply.locator(".stats")).to_have_count(1, timeout=120_000)
                # the reply arrived as many SSE deltas, each appended as it came
                chunks.append(int(reply.get_attribute("data-chunks") or 0))
            stats = page.locator(".msg.assistant .stats")
            cached = [int(stats.nth(i).get_attribute("data-cached") or -1) for i in range(2)]
            prompt = [int(stats.nth(i).get_attribute("data-prompt") or -1) for i in range(2)]
            assert min(chunks) > 1
            assert cached[1] > cached[0] >= 0
            assert prompt[1] > prompt[0] > 0
            assert "cached" in stats.nth(1).inner_text() and "TTFT" in stats.nth(1).inner_text()
            expect(page.locator("#ttft-chart rect")).to_have_count(2)
            expect(page.locator("#sessions button")).not_to_have_count(0)
            sid = page.locator("#session-label").inner_text().split()[-1]
            stored = server.manager.history(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
            texts = [replies.nth(i).locator(".text").inner_text() for i in range(2)]
            assert [m.content.strip() for m in stored if m.role == "assistant"] == \
                [t.strip() for t in texts]
            out = ROOT / "results" / "serve"
            out.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out / "page.png"))
            # an edit (a client resends the chat with its second question changed) abandons the
            # second turn; reopened, each reply shows its own turn's figures (pairing by order
            # showed the abandoned turn's beside the new reply)
            sent = [{"role": m.role, "content": m.content} for m in stored[:2]]
            edit = httpx.post(
                server.url + "/v1/chat/completions", timeout=120,
                headers={"Authorization": f"Bearer {KEY_A}", "X-Session-ID": sid},
                json={"model": server.model, "max_tokens": 8, "temperature": 0, "messages": [
                    *sent, {"role": "user", "content": "Which of those three fruits is usually "
                                                       "red when it is ripe, and why?"}]}).json()
            assert edit["suffixmem"]["history"] == "rewritten"
            page.locator(f'#sessions button[title^="{sid} "]').click()
            expect(page.locator(".msg.assistant .text").nth(1)).to_have_text(
                edit["choices"][0]["message"]["content"])
            second = page.locator(".msg.assistant .stats").nth(1)
            assert int(second.get_attribute("data-prompt") or -1) == \
                edit["usage"]["prompt_tokens"] != prompt[1]
            expect(page.locator("#ttft-chart rect")).to_have_count(2)  # not the abandoned turn
            # a session whose id is not Latin-1 (a client's prompt_cache_key) opens and goes on
            # in the page (fetch refused it in the X-Session-ID header)
            wide = "café-日本"
            httpx.post(server.url + "/v1/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {KEY_A}"},
                       json={"model": server.model, "max_tokens": 4, "temperature": 0,
                             "prompt_cache_key": wide,
                             "messages": [{"role": "user", "content": "Name a fruit."}]}
                       ).raise_for_status()
            page.reload()
            page.locator(f'#sessions button[title^="{wide} "]').click()
            expect(page.locator("#log .msg.assistant")).to_have_count(1)
            page.fill("#input", "And another one?")
            page.press("#input", "Enter")
            expect(page.locator(".msg.assistant .stats")).to_have_count(2, timeout=120_000)
            expect(page.locator("#log .msg.error")).to_have_count(0)
            assert len(server.manager.history(namespace(KEY_A) + wide)) == 4  # type: ignore[attr-defined]
            # another key is another namespace: the conversation leaves the screen (it stayed,
            # and the next message went to that key's session of the same name)
            page.fill("#api-key", KEY_B)
            page.dispatch_event("#api-key", "change")
            expect(page.locator("#log .msg")).to_have_count(0)
            page.fill("#api-key", "not-a-key")
            page.dispatch_event("#api-key", "change")
            expect(page.locator("#log .msg.error")).to_have_count(1)  # a wrong key says so
            expect(page.locator("#sessions button")).to_have_count(0)
        finally:
            browser.close()
